#!/usr/bin/env python3
"""textnet's Transformer beside nanoGPT on nanoGPT's own Shakespeare recipe, in one run on one machine:
tokens/s, the best validation loss, and the wall time a user waits for it.

nanoGPT (github.com/karpathy/nanoGPT) is not part of textnet: pass a checkout of it. Its
data/shakespeare_char/input.txt is filled from corpus/tinyshakespeare.txt (the same 1,115,394 bytes its
prepare.py downloads), prepare.py is run, then, unchanged,

    python3 train.py config/train_shakespeare_char.py [--max_iters=N --lr_decay_iters=N]

(6 layers, 6 heads, 384 wide, block 256, batch 64, dropout 0.2, no biases, tied head, AdamW 1e-3 with 100
warm-up steps and cosine decay to 1e-4, β2 0.99, weight decay 0.1, gradient clip 1, bf16 autocast,
torch.compile, an evaluation of 200 batches every 250 iterations), and then the same recipe in textnet:

    textnet transformer corpus/tinyshakespeare.txt RECIPE --precision P --steps N

Each line either prints is stamped with the seconds since its command started, so the wall time to the
best checkpoint counts start-up, compilation (nanoGPT's torch.compile, textnet's NVRTC) and every
evaluation, as a user sees them. Prints one JSON object with, for each of "nanogpt" and "textnet":
  tokens_per_s    nanoGPT only: batch 64 × block 256 over the median "iter" time of the iterations without
                  an evaluation (textnet's step time is `textnet bench transformer --large --precision bf16`)
  best_val_loss, best_step, best_s   the lowest validation loss printed, its step and when it was printed
  wall_s          the whole command

usage: python3 benches/vs_nanogpt.py NANOGPT_DIR [--textnet target/release/textnet] [--precision bf16]
           [--steps 5000] [--only textnet|nanogpt] [--log-dir DIR]
"""
import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOKENS_PER_STEP = 64 * 256
RECIPE = ["--layers", "6", "--heads", "6", "--embed", "384", "--block", "256", "--batch", "64", "--dropout", "0.2",
          "--no-bias", "--tie-weights", "--lr", "1e-3", "--lr-schedule", "cosine", "--warmup", "100", "--min-lr", "1e-4",
          "--beta2", "0.99", "--weight-decay", "0.1", "--grad-clip", "1", "--eval-every", "250", "--eval-iters", "200"]


def stamped(command, cwd=None):
    """Runs `command`, returning (seconds, line) for each line of its stdout and stderr, and the wall time."""
    start = time.time()
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [(time.time() - start, line.rstrip("\n")) for line in proc.stdout]
    if proc.wait() != 0:
        sys.exit(f"{command[0]} failed:\n" + "\n".join(text for _, text in lines[-20:]))
    return lines, time.time() - start


def write_log(log_dir, name, lines):
    if log_dir:
        with open(os.path.join(log_dir, name), "w") as f:
            f.writelines(f"{at:9.3f}  {text}\n" for at, text in lines)


def best_of(evals):
    best = min(evals, key=lambda e: e["val_loss"])
    return {"best_val_loss": best["val_loss"], "best_step": best["step"], "best_s": best["s"]}


def nanogpt(args):
    data = os.path.join(args.nanogpt, "data", "shakespeare_char")
    here = os.path.dirname(os.path.abspath(__file__))
    shutil.copyfile(os.path.join(here, "..", "corpus", "tinyshakespeare.txt"), os.path.join(data, "input.txt"))
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, stdout=subprocess.DEVNULL)
    command = [sys.executable, "train.py", "config/train_shakespeare_char.py"]
    if args.steps != 5000:
        command += [f"--max_iters={args.steps}", f"--lr_decay_iters={args.steps}"]
    lines, wall_s = stamped(command, cwd=args.nanogpt)
    write_log(args.log_dir, "nanogpt.log", lines)
    iter_ms, evals = [], []
    for at, text in lines:
        m = re.match(r"step (\d+): train loss ([\d.]+), val loss ([\d.]+)", text)
        if m:
            evals.append({"step": int(m[1]), "train_loss": float(m[2]), "val_loss": float(m[3]), "s": at})
        m = re.match(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", text)
        if m and int(m[1]) >= 10 and int(m[1]) % 250 != 0:  # nanoGPT evaluates before iterations 0, 250, ...
            iter_ms.append(float(m[2]))
    ms = statistics.median(iter_ms)
    return {"command": " ".join(command), "ms_per_step": ms, "tokens_per_s": TOKENS_PER_STEP / (ms / 1e3),
            **best_of(evals), "wall_s": wall_s, "evals": evals}


def textnet(args):
    out = os.path.join(tempfile.mkdtemp(), "recipe.safetensors")
    command = [args.textnet, "transformer", "corpus/tinyshakespeare.txt", *RECIPE, "--precision", args.precision,
               "--steps", str(args.steps), "--seed", str(args.seed), "-o", out, "--json"]
    lines, wall_s = stamped(command)
    write_log(args.log_dir, f"textnet-{args.precision}.log", lines)
    report = json.loads(next(text for _, text in reversed(lines) if text.startswith("{")))
    evals = []
    for at, text in lines:
        m = re.match(r"step (\d+)/\d+: train loss ([\d.]+), val loss ([\d.]+)", text)
        if m:
            evals.append({"step": int(m[1]), "train_loss": float(m[2]), "val_loss": float(m[3]), "s": at})
    # train_s counts the evaluations too; a step's time is the bench's (`bench transformer --large`).
    train_s = report["final"]["train_s"]
    return {"command": " ".join(command), "train_s": train_s, **best_of(evals), "wall_s": wall_s, "evals": evals}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("nanogpt")
    ap.add_argument("--textnet", default="target/release/textnet")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--steps", type=int, default=5000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=["textnet", "nanogpt"], help="run one side only")
    ap.add_argument("--log-dir")
    args = ap.parse_args()
    result = {}
    if args.only != "nanogpt":
        result["textnet"] = textnet(args)
    if args.only != "textnet":
        result["nanogpt"] = nanogpt(args)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
