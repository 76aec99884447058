#!/usr/bin/env python3
"""Loads a `textnet mnist --model cnn` model file into the same torch.nn model as benches/torch_mnist.py
(`Cnn`: the file's tensors carry PyTorch's state_dict names and layouts) and evaluates it on the test
split, to show the file means in PyTorch what it means in textnet. Reads .safetensors without the
safetensors package (8-byte header length, JSON header, little-endian data). Prints one JSON object.

usage: python3 benches/torch_load_cnn.py MODEL [--data DIR] [--device cuda|cpu]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_mnist import Cnn, find_files, read_idx  # noqa: E402


def load_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    meta = header.pop("__metadata__", {})
    base = 8 + size
    tensors = {}
    for name, info in header.items():
        assert info["dtype"] == "F32", f"{name}: {info['dtype']}"
        start, end = info["data_offsets"]
        tensors[name] = torch.from_numpy(np.frombuffer(raw[base + start:base + end], dtype="<f4").copy()).reshape(info["shape"])
    return tensors, meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--data", default=None)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    tensors, meta = load_safetensors(a.model)
    model = Cnn()
    model.load_state_dict(tensors)
    model.to(a.device).eval()
    _, paths = find_files(a.data)
    x = torch.tensor(read_idx(paths[2]).reshape(-1, 784), dtype=torch.float32, device=a.device) / 255.0
    y = torch.tensor(read_idx(paths[3]), dtype=torch.long, device=a.device)
    with torch.no_grad():
        logits = model(x)
    print(json.dumps({
        "model": a.model, "format": meta.get("format"), "dataset": meta.get("dataset"),
        "test_accuracy": (logits.argmax(1) == y).float().mean().item(),
        "test_loss": F.cross_entropy(logits, y).item(),
    }, indent=2))


if __name__ == "__main__":
    main()
