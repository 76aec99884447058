#!/usr/bin/env python3
"""One training step's kernels from an `ncu --csv` log, as a table: each kernel's launches in the step,
its time (gpu__time_duration.sum, caches flushed between kernels as ncu runs them), its share of the
step's kernel time, and its achieved compute and memory throughput as percentages of the GPU's peak
(sm__throughput and gpu__compute_memory_throughput, the speed-of-light section), from which the bound
is read: the larger of the two, or latency where both are low.

The step is the kernels after the last-but-one run of kernels matching --boundary (the optimizer's, which
ends a step) up to the end of the last run.

    ncu --csv --metrics gpu__time_duration.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed,\\
        gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed <command> \\
      | python3 scripts/ncu_step_table.py --boundary tf_adamw

or a saved report's raw page (`ncu --import R.ncu-rep --page raw --csv`: a column a metric, their units in
the second row), where the profiled program's own output on stdout would mix with ncu's CSV. Metrics the
input lacks leave their columns blank.
"""
import argparse
import csv
import re
import sys
from collections import OrderedDict

TIME = "gpu__time_duration.sum"
SM = "sm__throughput.avg.pct_of_peak_sustained_elapsed"
MEMORY = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed"


# A time's unit in the raw page, in nanoseconds.
NANOSECONDS = {"ns": 1.0, "nsecond": 1.0, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6, "s": 1e9, "second": 1e9}


def launches(lines):
    """Each profiled launch in order: (kernel name, {metric: value}), times in nanoseconds."""
    rows = list(csv.reader(line for line in lines if line.startswith('"')))
    if not rows:
        sys.exit("ncu_step_table: no CSV rows in the input")
    head = rows[0]
    if "Metric Name" not in head:
        return raw_launches(head, rows[1], rows[2:])
    at = {name: head.index(name) for name in ("ID", "Kernel Name", "Metric Name", "Metric Value")}
    by_id = OrderedDict()
    for row in rows[1:]:
        name, metrics = by_id.setdefault(row[at["ID"]], (row[at["Kernel Name"]], {}))
        metrics[row[at["Metric Name"]]] = float(row[at["Metric Value"]].replace(",", ""))
    return list(by_id.values())


def raw_launches(head, units, rows):
    """launches() of the raw page: a row a launch, a column a metric, `units` their units."""
    name = head.index("Kernel Name")
    columns = {metric: head.index(metric) for metric in (TIME, SM, MEMORY) if metric in head}
    scale = {metric: NANOSECONDS.get(units[at], 1.0) if metric == TIME else 1.0 for metric, at in columns.items()}
    return [(row[name], {metric: float(row[at].replace(",", "")) * scale[metric] for metric, at in columns.items()})
            for row in rows]


def last_step(kernels, boundary):
    """The launches after the last-but-one run of boundary kernels, through the last run."""
    ends = [i for i, (name, _) in enumerate(kernels) if re.search(boundary, name)]
    runs = []  # the index after each run of consecutive boundary launches
    for i in ends:
        if runs and runs[-1] == i:
            runs[-1] = i + 1
        else:
            runs.append(i + 1)
    if len(runs) < 2:
        sys.exit(f"ncu_step_table: fewer than two runs of kernels matching {boundary!r}")
    return kernels[runs[-2]:runs[-1]]


def bound(sm, memory):
    if max(sm, memory) < 40:
        return "latency"
    return "compute" if sm >= memory else "memory"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boundary", required=True, help="a regex matching the kernel(s) that end a step")
    args = parser.parse_args()
    step = last_step(launches(sys.stdin), args.boundary)
    table = OrderedDict()
    for name, metrics in step:
        short = name.split("(")[0]
        entry = table.setdefault(short, {"launches": 0, "ns": 0.0, "sm": 0.0, "memory": 0.0})
        ns = metrics.get(TIME, 0.0)
        entry["launches"] += 1
        entry["ns"] += ns
        entry["sm"] += metrics.get(SM, 0.0) * ns
        entry["memory"] += metrics.get(MEMORY, 0.0) * ns
    total = sum(e["ns"] for e in table.values())
    print(f"{len(step)} launches, {total / 1e3:.1f} µs of kernel time in the step")
    print("| kernel | launches | µs | share | SM % of peak | memory % of peak | bound |")
    print("|---|---|---|---|---|---|---|")
    # Without the throughput metrics (a report of times alone), their columns and the bound are blank.
    measured = all(SM in metrics and MEMORY in metrics for _, metrics in step)
    for name, e in sorted(table.items(), key=lambda item: -item[1]["ns"]):
        sm, memory = e["sm"] / max(e["ns"], 1.0), e["memory"] / max(e["ns"], 1.0)
        share = 100 * e["ns"] / max(total, 1.0)
        rates = f"{sm:.0f} | {memory:.0f} | {bound(sm, memory)}" if measured else "— | — | —"
        print(f"| `{name}` | {e['launches']} | {e['ns'] / 1e3:.1f} | {share:.1f} % | {rates} |")


if __name__ == "__main__":
    main()
