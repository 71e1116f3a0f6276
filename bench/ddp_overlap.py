#!/usr/bin/python3
"""ddp_overlap.py — plain DDP vs igrad's last-bucket DDP hook vs the
overlapped hook (IgradState(overlap=True): each igrad bucket's collective
issued during backward, as soon as its tensors' gradients are final).

Two gloo ranks (torch.multiprocessing.spawn), one thread each, the same
model in all three: a stack of Linear layers (a few million parameters,
DDP bucket_cap_mb 2, so several DDP buckets), the same data. Interleaved
rounds (the order of the three rotates every round, so the shared
machine's drift hits each alike); prints per variant the median step time
(forward + backward + sync) and the ratios, and for the hooks the medians
of the engine's stats and of the overlapped hook's close (agreement,
residuals, unpacking) and how many igrad buckets went out before the last
DDP bucket.

Run from the repository root:
    PYTHONPATH=python OMP_NUM_THREADS=1 /usr/bin/python3 bench/ddp_overlap.py \\
        [--rounds 6] [--steps 5] [--method adtopk_sync] [--density 0.01]
It prints timings; it asserts nothing about them.
"""
import argparse
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

VARIANTS = ("ddp", "last_bucket", "overlap")


class Stack(nn.Module):
    """layers x (Linear(dim, hidden), GELU, Linear(hidden, dim)) + a head."""

    def __init__(self, dim, hidden, layers):
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
            for _ in range(layers))
        self.head = nn.Linear(dim, dim)

    def forward(self, x):
        for b in self.blocks:
            x = x + b(x)
        return self.head(x)


def worker(rank, world, port, args, out):
    import igrad.torch as it  # after fork: each rank loads the library itself
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    models = {}
    for v in VARIANTS:
        torch.manual_seed(0)
        m = Stack(args.dim, args.hidden, args.layers)
        d = DDP(m, bucket_cap_mb=args.bucket_mb)
        st = None
        if v != "ddp":
            st = it.IgradState(d, method=args.method, density=args.density, buckets=args.buckets,
                               threads=1, overlap=(v == "overlap"))
            d.register_comm_hook(st, it.hook)
        models[v] = (m, d, st)
    g = torch.Generator().manual_seed(100 + rank)
    xs = [torch.randn(args.batch, args.dim, generator=g) for _ in range(4)]
    times = {v: [] for v in VARIANTS}
    stats = {v: [] for v in VARIANTS}

    def step(v, i):
        m, d, st = models[v]
        for p in m.parameters():
            p.grad = None
        dist.barrier()
        t0 = time.perf_counter()
        d(xs[i % len(xs)]).pow(2).mean().backward()
        t1 = time.perf_counter()
        return (t1 - t0) * 1e3, (dict(st.last_stats) if st is not None else {})

    for v in VARIANTS:  # warm-up: DDP rebuilds its buckets after the first iteration
        for i in range(2):
            step(v, i)
    for r in range(args.rounds):
        order = VARIANTS[r % 3:] + VARIANTS[:r % 3]
        for v in order:
            for i in range(args.steps):
                ms, s = step(v, i)
                times[v].append(ms)
                stats[v].append(s)
    if rank == 0:
        out.put((times, stats, sum(p.numel() for p in models["ddp"][0].parameters()),
                 len(list(models["ddp"][1].reducer._get_zeros_like_grad_buckets()))
                 if hasattr(models["ddp"][1].reducer, "_get_zeros_like_grad_buckets") else None))
    dist.destroy_process_group()


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--method", default="adtopk_sync")
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--buckets", type=int, default=8)
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bucket-mb", type=float, default=2.0)
    args = ap.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [ctx.Process(target=worker, args=(r, 2, port, args, out)) for r in range(2)]
    for p in procs:
        p.start()
    times, stats, nparams, _ = out.get()
    for p in procs:
        p.join()
    print("model: %.2f M parameters, %s at density %g, %d igrad buckets, DDP bucket_cap_mb %g; "
          "2 gloo ranks x 1 thread; %d rounds x %d steps per variant, interleaved"
          % (nparams / 1e6, args.method, args.density, args.buckets, args.bucket_mb,
             args.rounds, args.steps))
    base = med(times["ddp"])
    print("%-12s %10s %8s %9s %9s %9s %9s %6s" % ("variant", "step ms", "x DDP", "select",
                                                  "pack", "unpack", "close", "early"))
    for v in VARIANTS:
        s = [x for x in stats[v] if x and not x.get("skipped") and not x.get("warmup")]
        cols = [med([x.get(k, float("nan")) for x in s]) for k in
                ("select_ms", "pack_ms", "unpack_ms", "close_ms")] if s else [float("nan")] * 4
        early = med([x.get("early_buckets", 0) for x in s]) if s else float("nan")
        print("%-12s %10.1f %8.3f %9.2f %9.2f %9.2f %9.2f %6.0f"
              % (v, med(times[v]), med(times[v]) / base, *cols, early))
    lb, ov = med(times["last_bucket"]), med(times["overlap"])
    print("overlap / last_bucket: %.3f" % (ov / lb))


if __name__ == "__main__":
    main()
