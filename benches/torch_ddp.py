#!/usr/bin/env python3
"""PyTorch DistributedDataParallel twin of benches/torch_transformer.py: the same character-level decoder-only
Transformer (its `Transformer` class, imported), the same vocabulary and train split, AdamW on every parameter,
fp32 weights, TF32 off (--tf32: TF32 products; --bf16: bf16 autocast over the forward pass and loss), trained
data-parallel over N GPUs of one host: one process per GPU (torchrun's LOCAL_RANK), NCCL, the model wrapped in
torch.nn.parallel.DistributedDataParallel with its default buckets, so the gradient all-reduce overlaps the
backward pass. --compile compiles the DDP-wrapped module (PyTorch 2.x's DDPOptimizer splits the graph at the
bucket boundaries). NVLink multicast (NVLS) is kept off: NCCL_NVLS_ENABLE is set to 0.

Batches: each rank draws --batch-per-gpu offsets per step uniformly in [0, n_train - T - 1] from a
torch.Generator on its GPU seeded by seed * 1000 + rank; the global batch is N * --batch-per-gpu sequences.
Every rank starts from the same weights (torch.manual_seed(--seed), then DDP broadcasts rank 0's).

Timed: after --warmup untimed steps (their updates are kept), torch.cuda.synchronize() and dist.barrier(),
--steps steps by wall clock on every rank, ending with torch.cuda.synchronize(); the seconds reported are the
largest over the ranks. No evaluation. Rank 0 prints one JSON object (world_size, batch_per_gpu, block, steps,
ms_per_step, tokens_per_s = N * B * T * steps / seconds, bf16, compile, attention, last_loss: rank 0's loss
on its last step, torch, gpu); the other ranks print nothing on stdout.

usage: torchrun --standalone --nproc_per_node N benches/torch_ddp.py [CORPUS=corpus/shakespeare.txt]
    [--steps 100] [--warmup 10] [--batch-per-gpu 64] [--block 256] [--embed 384] [--heads 6] [--layers 6]
    [--vocab 256] [--lr 1e-3] [--weight-decay 0.01] [--seed 0] [--tf32] [--bf16] [--compile]
    [--attention manual|sdpa]
(without torchrun, `python3 benches/torch_ddp.py ...` runs it as a world of one)
"""
import os

os.environ["NCCL_NVLS_ENABLE"] = "0"  # before torch (and NCCL) loads: NVLink multicast stays off, whatever was set

import argparse
import json
import sys
import time
from collections import Counter


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus", nargs="?", default="corpus/shakespeare.txt")
    for flag, kind, default, what in [
            ("--steps", int, 100, "timed steps"), ("--warmup", int, 10, "untimed steps first"),
            ("--batch-per-gpu", int, 64, "sequences per GPU per step"), ("--block", int, 256, None),
            ("--embed", int, 384, None), ("--heads", int, 6, None), ("--layers", int, 6, None),
            ("--vocab", int, 256, "at most this many ids, unknown included"), ("--lr", float, 1e-3, None),
            ("--weight-decay", float, 0.01, None), ("--seed", int, 0, None)]:
        ap.add_argument(flag, type=kind, default=default, help=f"{what + ' ' if what else ''}(default {default})")
    ap.add_argument("--tf32", action="store_true", help="TF32 matrix products (off by default, as torch_transformer.py)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast around the forward pass and loss (fp32 weights)")
    ap.add_argument("--compile", action="store_true", help="torch.compile the DDP-wrapped model")
    ap.add_argument("--attention", choices=["manual", "sdpa"], default="manual", help="(default manual)")
    a = ap.parse_args()
    if min(a.steps, a.batch_per_gpu, a.block, a.embed, a.heads, a.layers) < 1 or a.warmup < 0 or a.vocab < 2:
        raise SystemExit("--steps, --batch-per-gpu, --block, --embed, --heads and --layers must be at least 1, "
                         "--warmup at least 0, --vocab at least 2")
    if a.embed % a.heads:
        raise SystemExit(f"--embed {a.embed} is not a multiple of --heads {a.heads}")
    return a


def main():
    a = parse_args()  # before torch is imported, so --help needs neither torch nor a GPU

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch_transformer as tt

    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29500")):
        os.environ.setdefault(k, v)  # torchrun sets all of these; plain python is a world of one
    if not torch.cuda.is_available():
        raise SystemExit("torch_ddp.py needs CUDA GPUs (NCCL)")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dev = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32

    # vocabulary and split as in torch_transformer.main (no --load here)
    with open(a.corpus, encoding="utf-8", newline="") as f:
        text = f.read()
    counts = Counter(text)
    vocabulary = [tt.UNKNOWN] + sorted(counts, key=lambda c: (-counts[c], ord(c)))[: a.vocab - 1]
    stoi = {c: i for i, c in enumerate(vocabulary) if i > 0}
    V, T, B = len(vocabulary), a.block, a.batch_per_gpu
    ids = torch.tensor([stoi.get(c, 0) for c in text], dtype=torch.long)
    n_train = len(ids) * 9 // 10
    if n_train < T + 1:
        raise SystemExit(f"--block {T} is too large for this corpus: train has {n_train} ids, it needs block + 1")
    train = ids[:n_train].to(dev)
    window = torch.arange(T + 1, device=dev)

    torch.manual_seed(a.seed)
    model = tt.Transformer(V, T, a.embed, a.heads, a.layers, a.attention == "sdpa").to(dev)
    ddp = DDP(model, device_ids=[local_rank], output_device=local_rank)
    fwd = torch.compile(ddp) if a.compile else ddp
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=a.weight_decay)
    gen = torch.Generator(device=dev).manual_seed(a.seed * 1000 + rank)

    def step():
        w = train[torch.randint(0, n_train - T, (B, 1), device=dev, generator=gen) + window]
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.bf16):
            loss = F.cross_entropy(fwd(w[:, :-1]).flatten(0, 1), w[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradients bucket by bucket as backward produces them
        opt.step()
        return loss.detach()

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    dist.barrier(device_ids=[local_rank])
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = step()
    torch.cuda.synchronize()
    seconds = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=dev)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank's time
    seconds = seconds.item()
    last_loss = loss.item()

    if rank == 0:
        print(json.dumps({
            "world_size": world, "batch_per_gpu": B, "block": T, "steps": a.steps,
            "ms_per_step": 1e3 * seconds / a.steps, "tokens_per_s": world * B * T * a.steps / seconds,
            "bf16": a.bf16, "compile": a.compile, "attention": a.attention, "last_loss": last_loss,
            "torch": torch.__version__, "gpu": torch.cuda.get_device_name(dev)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
