#!/usr/bin/env python3
"""The PyTorch twin of a `textnet fit` model file: builds the torch.nn.Sequential its `spec` metadata
describes, loads the file with load_state_dict(strict=True), and measures it on the same data; with --train,
trains the same spec in eager PyTorch with the same flags and prints its time and test figures, for
side-by-side timing on a GPU.

Images (`input.kind` "images"): the Fashion-MNIST or MNIST test split (the four IDX files, raw or .gz, from
--data, ./data/<name>, or /usr/share/datasets/fashion-mnist), pixels / 255, flat 784 or [1, 28, 28] as
the file's `input.shape` says. The loaded model's test accuracy and mean cross-entropy are the figures
`textnet fit --json` reports under "final" for the epoch the file holds (compare with --report REPORT.json).

Tables (`input.kind` "table"): the rows of --table FILE read with the file's schema (numeric columns, each
categorical column one-hot over its vocabulary, standardised with the stored means and deviations; date
columns are not read here), measured as `textnet fit --model M --predict FILE` measures them: accuracy
for a class target, MAE in the target's units for a numeric one.

usage:
  python3 benches/fit_torch.py MODEL [--data DIR] [--table FILE] [--report REPORT.json]
  python3 benches/fit_torch.py MODEL --train [--epochs 10] [--batch 64] [--lr 1e-3] [--optim adam] [--seed 1]
Prints one JSON object. Reads safetensors with safetensors.torch when installed, else parses the header
itself (json + struct).
"""
import argparse
import csv
import json
import os
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn

from torch_mnist import FILES, read_idx  # the IDX reader of the MNIST twin, beside this script


def read_safetensors(path):
    """(tensors as a dict of torch tensors, metadata dict)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    try:
        from safetensors.torch import load as st_load
        return st_load(data), meta
    except ImportError:
        pass
    tensors = {}
    for name, info in header.items():
        if info["dtype"] != "F32":
            raise SystemExit(f"{path}: tensor {name} is {info['dtype']}, not F32")
        start, end = info["data_offsets"]
        array = np.frombuffer(data[8 + n + start:8 + n + end], dtype="<f4").reshape(info["shape"])
        tensors[name] = torch.from_numpy(array.copy())
    return tensors, meta


def split_layers(spec):
    """The layers of a spec as (name, positional arguments, named arguments)."""
    layers, depth, current = [], 0, ""
    for c in spec:
        depth += c == "("
        depth -= c == ")"
        if c == "," and depth == 0:
            layers.append(current.strip())
            current = ""
        else:
            current += c
    layers.append(current.strip())
    out = []
    for text in layers:
        name, _, rest = text.partition("(")
        args, named = [], {}
        for a in filter(None, (x.strip() for x in rest.rstrip(")").split(","))):
            if "=" in a:
                k, v = a.split("=")
                named[k.strip()] = v.strip()
            else:
                args.append(a)
        out.append((name.strip().lower(), args, named))
    return out


def build(spec):
    """torch.nn.Sequential of a spec whose every width is written out (as the model file's `spec`)."""
    modules = []
    for name, args, named in split_layers(spec):
        if name == "linear":
            bias = named.get("bias", "true").lower() != "false"
            modules.append(nn.Linear(int(args[0]), int(args[1]), bias=bias))
        elif name == "conv2d":
            stride, padding = int(named.get("stride", args[3] if len(args) > 3 else 1)), int(
                named.get("padding", args[4] if len(args) > 4 else 0))
            modules.append(nn.Conv2d(int(args[0]), int(args[1]), int(args[2]), stride=stride, padding=padding))
        elif name == "maxpool2d":
            modules.append(nn.MaxPool2d(int(args[0])))
        elif name == "dropout":
            modules.append(nn.Dropout(float(args[0])))
        else:
            modules.append({"relu": nn.ReLU, "sigmoid": nn.Sigmoid, "tanh": nn.Tanh, "flatten": nn.Flatten,
                            "gelu": lambda: nn.GELU(approximate="tanh")}[name]())
    return nn.Sequential(*modules)


def images(dataset, data_dir, shape):
    name = "fashion-mnist" if dataset == "fashion" else "mnist"
    dirs = [data_dir] if data_dir else [f"./data/{name}"] + (["/usr/share/datasets/fashion-mnist"] if dataset == "fashion" else [])
    for d in dirs:
        paths = [next((p for p in (os.path.join(d, f), os.path.join(d, f + ".gz")) if os.path.isfile(p)), None) for f in FILES]
        if all(paths):
            def split(i):
                x = torch.from_numpy(read_idx(paths[i]).astype(np.float32) / 255.0).reshape([-1] + shape)
                return x, torch.from_numpy(read_idx(paths[i + 1]).astype(np.int64))
            return split(0), split(2)
    raise SystemExit(f"{dataset} not found in {' or '.join(dirs)}")


def table_rows(path, meta_input, loss, classes):
    schema = meta_input["schema"]
    if schema["date"]:
        raise SystemExit("this script does not read date columns")
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter=schema["delimiter"]))
    header = rows[0] if schema["header"] else schema.get("column_names")
    body = rows[1:] if schema["header"] else rows

    def column(spec):
        return int(spec) - 1 if spec.isdigit() else header.index(spec)

    numeric = [column(c) for c in schema["numeric"]]
    categorical = [column(c) for c in schema["categorical"]]
    target = column(schema["target"])
    x, y = [], []
    for r in body:
        features = [float(r[i]) for i in numeric]
        for i, vocabulary in zip(categorical, meta_input["vocabularies"]):
            features += [1.0 if r[i].strip() == v else 0.0 for v in vocabulary]
        x.append(features)
        value = r[target].strip() if target < len(r) else ""
        y.append(classes.index(value) if loss == "ce" and value in classes else
                 (float(value) if loss == "mse" and value else float("nan")))
    x = (torch.tensor(x) - torch.tensor(meta_input["feature_mean"])) / torch.tensor(meta_input["feature_std"])
    return x, torch.tensor(y)


def measure(model, x, y, loss, target):
    model.eval()
    with torch.no_grad():
        out = torch.cat([model(x[i:i + 1024]) for i in range(0, len(x), 1024)])
    if loss == "ce":
        known = y >= 0
        return {"test_accuracy": (out.argmax(1)[known] == y[known].long()).float().mean().item(),
                "test_loss": nn.functional.cross_entropy(out[known], y[known].long()).item()}
    pred = out[:, 0] * target["std"] + target["mean"]
    known = ~torch.isnan(y)
    return {"test_mae": (pred[known] - y[known]).abs().mean().item()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model")
    p.add_argument("--data")
    p.add_argument("--table")
    p.add_argument("--report", help="a `textnet fit --json` report to compare with")
    p.add_argument("--train", action="store_true")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--optim", default="adam", choices=["sgd", "momentum", "adam", "adamw"])
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()

    tensors, meta = read_safetensors(args.model)
    meta_input, loss = json.loads(meta["input"]), meta["loss"]
    classes = json.loads(meta["class_names"]) if "class_names" in meta else None
    target = json.loads(meta["target"]) if "target" in meta else None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = build(meta["spec"])
    model.load_state_dict(tensors, strict=True)
    model.to(device)

    if meta_input["kind"] == "images":
        (train_x, train_y), (test_x, test_y) = images(meta_input["dataset"], args.data, meta_input["shape"])
        loaded = measure(model, test_x.to(device), test_y.to(device), loss, target)
    else:
        if not args.table:
            raise SystemExit("a table model needs --table FILE")
        all_x, all_y = table_rows(args.table, meta_input, loss, classes)
        # Every row, as `textnet fit --model M --predict FILE` measures them; --train trains on the first
        # 80 % in file order and tests on the rest.
        loaded = measure(model, all_x.to(device), all_y.to(device), loss, target)
        cut = int(0.8 * len(all_x))
        train_x, train_y, test_x, test_y = all_x[:cut], all_y[:cut], all_x[cut:], all_y[cut:]
        if loss == "mse":
            train_y = (train_y - target["mean"]) / target["std"]
    test_x, test_y = test_x.to(device), test_y.to(device)
    result = {"model": args.model, "spec": meta["spec"], "device": device, "loaded": loaded}
    if args.report:
        with open(args.report) as f:
            report = json.load(f)
        result["reported"] = {k: v for k, v in (report.get("final") or {}).items() if k in result["loaded"]}

    if args.train:
        torch.manual_seed(args.seed)
        fresh = build(meta["spec"]).to(device)
        optim = {"sgd": lambda ps: torch.optim.SGD(ps, lr=args.lr),
                 "momentum": lambda ps: torch.optim.SGD(ps, lr=args.lr, momentum=0.9),
                 "adam": lambda ps: torch.optim.Adam(ps, lr=args.lr),
                 "adamw": lambda ps: torch.optim.AdamW(ps, lr=args.lr)}[args.optim](fresh.parameters())
        x, y = train_x.to(device), train_y.to(device)
        criterion = nn.CrossEntropyLoss() if loss == "ce" else nn.MSELoss()
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(args.epochs):
            fresh.train()
            order = torch.randperm(len(x), device=device)
            for i in range(0, len(x), args.batch):
                idx = order[i:i + args.batch]
                out = fresh(x[idx])
                l = criterion(out, y[idx].long()) if loss == "ce" else criterion(out[:, 0], y[idx])
                optim.zero_grad(set_to_none=True)
                l.backward()
                optim.step()
            fresh.eval()
            measure(fresh, test_x, test_y, loss, target)  # every epoch, as textnet fit evaluates
        if device == "cuda":
            torch.cuda.synchronize()
        result["torch_train"] = {"seconds": time.perf_counter() - start, "epochs": args.epochs, "batch": args.batch,
                                 "lr": args.lr, "optim": args.optim, **measure(fresh, test_x, test_y, loss, target)}
    print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
