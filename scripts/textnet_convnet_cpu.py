#!/usr/bin/env python3
"""Keras's `mnist_convnet` example as a textnet Keras-style `Sequential` on the CPU, timed in training
samples per second: the twin of `scripts/torch_convnet_cpu.py` for `scripts/convnet_cpu_compare.sh`.

The layers are the example's, as textnet spells them: Conv2d(1, 32, 3), ReLU, MaxPool2d(2), Conv2d(32, 64,
3), ReLU, MaxPool2d(2), Flatten, Dropout(0.5), Linear(10) (the softmax folded into the cross-entropy),
batch 128, Adam (lr 1e-3), on seeded random 1x28x28 images. `fit` runs two epochs of `--batches` batches:
the first warms up (untimed), the second is timed by the epoch's own training seconds (the shuffled
batches gathered, the steps run; no evaluation).

usage: python3 scripts/textnet_convnet_cpu.py [--batches 50] [--batch 128] [--threads N]
`--threads` sets RAYON_NUM_THREADS (before textnet starts). Prints one JSON object: samples_per_s,
seconds, batches, batch, threads.
"""
import argparse
import json
import os

SPEC = ("Conv2d(1, 32, 3), ReLU, MaxPool2d(2), Conv2d(32, 64, 3), ReLU, MaxPool2d(2), Flatten, Dropout(0.5), "
        "Linear(10)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=50, help="steps of the timed epoch")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    if min(args.batches, args.batch, args.threads) < 1:
        ap.error("--batches, --batch and --threads must be at least 1")
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    import numpy as np
    import textnet

    rng = np.random.default_rng(1)
    samples = args.batches * args.batch
    images = rng.standard_normal((samples, 1, 28, 28), dtype=np.float32)
    labels = rng.integers(0, 10, samples)
    model = textnet.Sequential(SPEC, device="cpu", optimizer="adam", lr=1e-3, input_shape=(1, 28, 28))
    history = model.fit(images, labels, epochs=2, batch_size=args.batch, verbose=0)
    seconds = history.history["seconds"][-1]
    print(json.dumps({
        "framework": "textnet",
        "threads": args.threads,
        "batch": args.batch,
        "batches": args.batches,
        "seconds": seconds,
        "samples_per_s": samples / seconds,
    }))


if __name__ == "__main__":
    main()
