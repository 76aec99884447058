#!/usr/bin/env python3
"""The Python package's `Sequential.fit` beside `textnet fit` for the same spec: Linear(784,128) -> ReLU
-> Linear(128,10), Adam lr 1e-3, batch 64, 10 epochs of Fashion-MNIST, seed 1, the test split measured
after every epoch (`validation_data`, as `textnet fit` measures its test split). Prints one JSON object:
the seconds of `fit` (the call, from the arrays to the trained model), of its setup (the device opened, the
samples handed over) and of its epochs with their evaluations (as `textnet fit`'s `wall_s.training`), of
loading the data, of everything from `import textnet` on, and the accuracy.

usage: python3 benches/python_fit.py [--device auto|cuda|cpu] [--epochs 10] [--batch 64] [--verbose 0|1]
"""
import argparse
import json
import time

started = time.perf_counter()
import textnet  # noqa: E402

SPEC = "Linear(784, 128), ReLU, Linear(128, 10)"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="auto")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--verbose", type=int, default=0, help="fit's verbose: 1 draws the progress bar")
    args = ap.parse_args()
    loading = time.perf_counter()
    (X, y), (X_test, y_test) = textnet.datasets.mnist("fashion")
    loaded = time.perf_counter()
    model = textnet.Sequential(SPEC, device=args.device)
    history = model.fit(X, y, epochs=args.epochs, batch_size=args.batch, validation_data=(X_test, y_test),
                        verbose=args.verbose)
    fitted = time.perf_counter()
    print(json.dumps({
        "device": history.device,
        "verbose": args.verbose,
        "fit_s": fitted - loaded,
        "fit_setup_s": history.setup_seconds,
        "fit_training_s": history.training_seconds,
        "epochs_s": sum(history.history["seconds"]),
        "load_s": loaded - loading,
        "total_s": fitted - started,
        "test_accuracy": history.history["val_accuracy"][-1],
        "test_loss": history.history["val_loss"][-1],
    }))


if __name__ == "__main__":
    main()
