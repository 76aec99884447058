#!/usr/bin/env python3
"""Summary of the quality runs over seeds (`scripts/device-check.sh seeds`): the validation loss of the GPU
kernels (textnet `bench quality --seed N`), of PyTorch (`benches/torch_baseline.py --quality`) and, where
given, of the CPU reference, matched by seed; per seed, and for each pair (GPU - PyTorch, GPU - CPU
reference, CPU reference - PyTorch) over the seeds both have: the mean relative difference and its
standard error in %, its range, the seeds where the first is higher, an exact two-sided sign test and
the paired t statistic (mean / standard error of the relative differences).

Files are read whatever their kind: textnet's JSON (pretty-printed objects one after another, error
lines in between are skipped), PyTorch's JSON Lines ("seed" from the dump directory's name; in the older
interleaved quality_seeds.json, an object without one belongs to the textnet object before it). A textnet
run with its CPU reference (no --no-cpu) gives that seed's CPU value too.

usage: scripts/quality-seeds-summary.py [FILE...] [--cpu TABLE] [--summary JSON] [--brief] [--json]
  --cpu TABLE     lines `seed val_loss` (the CPU reference, `cargo run --release --example quality_noise
                  -- 0 lr corpus/shakespeare.txt N`)
  --summary JSON  {"gpu": {seed: val_loss}, "torch": {...}, "cpu": {...}}, as in
                  benches/results/2026-11-23-h100-a965c8f/quality_seeds_summary.json
  --brief         no per-seed table (text output)
  --json          the same as one JSON object
"""
import argparse
import json
import math
import re
import statistics
import sys

SOURCES = ("gpu", "torch", "cpu")
NAMES = {"gpu": "GPU", "torch": "PyTorch", "cpu": "CPU reference"}
PAIRS = (("gpu", "torch"), ("gpu", "cpu"), ("cpu", "torch"))


def json_objects(text):
    """Every top-level JSON object in `text`, skipping whatever is not one (error lines, truncated output)."""
    decoder = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            yield obj
        i = text.find("{", end)


def seed_of_dir(directory):
    m = re.search(r"seed(\d+)/*$", str(directory))
    return int(m.group(1)) if m else None


class Data:
    def __init__(self):
        self.values = {s: {} for s in SOURCES}
        self.checks, self.errors, self.warnings = [], [], []

    def put(self, source, seed, value, where):
        seed, value = int(seed), float(value)
        old = self.values[source].get(seed)
        if old is not None and old != value:
            self.warnings.append(f"{where}: {source} seed {seed} given twice ({old} and {value}): the last is kept")
        self.values[source][seed] = value

    def read_results(self, path):
        with open(path, errors="replace") as f:
            text = f.read()
        for line in text.splitlines():
            if "error" in line and not line.lstrip().startswith(("{", '"')):
                self.errors.append(f"{path}: {line.strip()}")
        last_textnet = None  # seed of the textnet object before, still without its PyTorch twin
        for obj in json_objects(text):
            if "check" in obj:
                self.checks.append(obj)
            elif "error" in obj:
                self.errors.append(f"{path}: {obj.get('dir', '?')}: {obj['error']}")
            elif isinstance(obj.get("gpu"), dict) and "seed" in obj:  # textnet bench quality
                self.put("gpu", obj["seed"], obj["gpu"]["val_loss"], path)
                if isinstance(obj.get("cpu"), dict):
                    self.put("cpu", obj["seed"], obj["cpu"]["val_loss"], path)
                last_textnet = obj["seed"]
            elif "torch" in obj and "val_loss" in obj:  # torch_baseline.py --quality
                seed = obj.get("seed", seed_of_dir(obj["dir"]) if "dir" in obj else last_textnet)
                if seed is None:
                    self.warnings.append(f"{path}: a PyTorch result without a seed is skipped")
                else:
                    self.put("torch", seed, obj["val_loss"], path)
                last_textnet = None

    def read_cpu_table(self, path):
        with open(path) as f:
            for n, line in enumerate(f, 1):
                fields = line.split("#")[0].split()
                if not fields:
                    continue
                try:
                    seed, value = int(fields[0]), float(fields[1])
                except (ValueError, IndexError):
                    self.warnings.append(f"{path}:{n}: not `seed val_loss`: {line.strip()}")
                    continue
                self.put("cpu", seed, value, path)

    def read_summary(self, path):
        with open(path) as f:
            summary = json.load(f)
        for source in SOURCES:
            for seed, value in (summary.get(source) or {}).items():
                self.put(source, seed, value, path)


def sign_test_p(higher, lower):
    """Exact two-sided binomial test of `higher` against `lower` (ties left out), p = 1/2."""
    n = higher + lower
    if n == 0:
        return 1.0
    k = min(higher, lower)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def compare(values, first, second):
    seeds = sorted(set(values[first]) & set(values[second]))
    if not seeds:
        return None
    rel = [100 * (values[first][s] - values[second][s]) / values[second][s] for s in seeds]
    n = len(rel)
    mean = statistics.fmean(rel)
    se = statistics.stdev(rel) / math.sqrt(n) if n > 1 else None
    higher, lower = sum(d > 0 for d in rel), sum(d < 0 for d in rel)
    return {
        "pair": f"{first}-{second}", "first": first, "second": second, "n": n,
        "mean_percent": mean, "se_percent": se, "min_percent": min(rel), "max_percent": max(rel),
        "first_higher": higher, "ties": n - higher - lower, "sign_test_p": sign_test_p(higher, lower),
        "t": mean / se if se else None, "df": n - 1,
    }


def report(data):
    values = data.values
    present = [s for s in SOURCES if values[s]]
    seeds = sorted(set().union(*(values[s] for s in present))) if present else []
    common = sorted(set.intersection(*(set(values[s]) for s in present))) if present else []
    means = {s: {"n": len(values[s]), "mean": statistics.fmean(values[s].values())} for s in present}
    if len(present) > 1 and common:
        for s in present:
            means[s]["mean_common"] = statistics.fmean(values[s][k] for k in common)
    pairs = [c for c in (compare(values, a, b) for a, b in PAIRS) if c is not None]
    return {"seeds": {k: {s: values[s].get(k) for s in present} for k in seeds},
            "common_seeds": len(common), "means": means, "pairs": pairs,
            "checks": data.checks, "errors": data.errors, "warnings": data.warnings}


def fmt(x, spec):
    return "-" if x is None else format(x, spec)


def print_text(rep, brief):
    present = list(rep["means"])
    if not present:
        print("no results")
        return
    pairs = [(p["first"], p["second"]) for p in rep["pairs"]]
    if not brief:
        head = ["seed"] + [NAMES[s] for s in present] + [f"{NAMES[a]} - {NAMES[b]} %" for a, b in pairs]
        print(" | ".join(head))
        for seed, row in rep["seeds"].items():
            cells = [str(seed)] + [fmt(row[s], ".4f") for s in present]
            for a, b in pairs:
                va, vb = row.get(a), row.get(b)
                cells.append(fmt(None if va is None or vb is None else 100 * (va - vb) / vb, "+.3f"))
            print(" | ".join(cells))
        print()
    for s in present:
        m = rep["means"][s]
        line = f"{NAMES[s]}: mean validation loss {m['mean']:.4f} over {m['n']} seeds"
        if "mean_common" in m:
            line += f", {m['mean_common']:.4f} over the {rep['common_seeds']} seeds that all have"
        print(line)
    if rep["pairs"]:
        print()
        print("pair | n | mean % | standard error % | min % | max % | first higher | sign test p | t")
    for p in rep["pairs"]:
        print(f"{NAMES[p['first']]} - {NAMES[p['second']]} | {p['n']} | {p['mean_percent']:+.4f} | "
              f"{fmt(p['se_percent'], '.4f')} | {p['min_percent']:+.3f} | {p['max_percent']:+.3f} | "
              f"{p['first_higher']}" + (f" ({p['ties']} ties)" if p["ties"] else "") +
              f" | {p['sign_test_p']:.3g} | {fmt(p['t'], '+.2f')} (df {p['df']})")
    for c in rep["checks"]:
        print(f"check {c.get('check')}: {c.get('dir')}: eager {c.get('eager_val_loss')}, graph "
              f"{c.get('graph_val_loss')}, |diff| {c.get('abs_diff')}")
    for e in rep["errors"]:
        print(f"error: {e}")
    for w in rep["warnings"]:
        print(f"warning: {w}", file=sys.stderr)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="*", metavar="FILE", help="textnet bench quality JSON, PyTorch JSON Lines")
    ap.add_argument("--cpu", action="append", default=[], metavar="TABLE", help="lines `seed val_loss`")
    ap.add_argument("--summary", action="append", default=[], metavar="JSON",
                    help='{"gpu": {seed: val_loss}, "torch": {...}, "cpu": {...}}')
    ap.add_argument("--brief", action="store_true", help="no per-seed table (text output)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    data = Data()
    for path in args.summary:
        data.read_summary(path)
    for path in args.files:
        data.read_results(path)
    for path in args.cpu:
        data.read_cpu_table(path)
    rep = report(data)
    if args.json:
        print(json.dumps(rep, indent=1))
    else:
        print_text(rep, args.brief)


if __name__ == "__main__":
    main()
