#!/usr/bin/python3
"""grad16_inplace.py — a bf16 model's gradient sync through igrad with the
16-bit gradients read in place (IgradState(grads_in_place=True), config
grad_dtype BF16) vs staged through a float32 copy (grads_in_place=False).

One process (no torch.distributed: the self communicator), one thread, the
same bf16 model and batch for both, the two synchronizers interleaved
step by step (the order alternates), the first 2 steps dropped. Prints the
median GradientSynchronizer.synchronize() time of each (the staged path's
copies in and out included, which is what in place removes), the ratio,
and each engine's dataplane_nbytes_per_param (the staged path's float32
copy, 4 B/param, is held by the binding and not counted there).

Run from the repository root:
    OMP_NUM_THREADS=1 /usr/bin/python3 bench/grad16_inplace.py [--steps 12]
It prints timings; it asserts nothing about them.
"""
import argparse
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, "python")
import igrad.torch as it  # noqa: E402


def bf16_model(dim, hidden):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim),
                         nn.Linear(dim, hidden), nn.Linear(hidden, dim)).to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--method", default="adtopk_sync")
    ap.add_argument("--density", type=float, default=0.01)
    args = ap.parse_args()
    torch.set_num_threads(1)
    variants = (True, False)
    models = {b: bf16_model(1024, 4096) for b in variants}
    syncs = {}
    for b in variants:
        state = it.IgradState(method=args.method, density=args.density, grads_in_place=b,
                              threads=1)
        syncs[b] = it.GradientSynchronizer(models[b].named_parameters(), state)
    x = torch.randn(64, 1024).to(torch.bfloat16)
    times = {b: [] for b in variants}
    for step in range(args.steps):
        for b in (variants if step % 2 else variants[::-1]):
            m = models[b]
            for p in m.parameters():
                p.grad = None
            m(x).float().pow(2).mean().backward()
            t = time.perf_counter()
            syncs[b].synchronize(step)
            if step >= 2:
                times[b].append((time.perf_counter() - t) * 1e3)
    nparams = sum(p.numel() for p in models[True].parameters())
    print("bf16 model: %.2f M parameters, %s at density %g, one process, one thread, "
          "%d steps each, interleaved" % (nparams / 1e6, args.method, args.density, args.steps))
    for b in variants:
        print("%-9s median sync %7.1f ms  dataplane %.3f B/param" %
              ("in place" if b else "staged", statistics.median(times[b]),
               syncs[b].state.last_stats["dataplane_nbytes_per_param"]))
    print("in place / staged: %.3f" % (statistics.median(times[True]) /
                                       statistics.median(times[False])))


if __name__ == "__main__":
    main()
