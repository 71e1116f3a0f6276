#!/usr/bin/python3
"""select_vs_torch.py — igrad's fused error-feedback top-k against torch.topk.

Times torch.topk(x.abs(), k, sorted=False) on n fp32 standard normals (fixed
seed) with torch.set_num_threads(threads), median of reps, then runs
`<igrad> bench select --json` with the same n, density, threads and reps and
prints both times and the speed-up (target: igrad >= 20x faster). igrad's
time covers more work than torch's: the error-feedback add, the exact top-k
(ties to the lower index, indices ascending) and the residual update.

Run with Debian's /usr/bin/python3 (it has torch), from the repository root:
    /usr/bin/python3 bench/select_vs_torch.py --igrad build/igrad [--threads 2]
It prints timings; it asserts nothing about them.
"""
import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import torch


def budget(n, density):
    """igrad_budget: ceil(density * n), at least 1, at most n."""
    return max(1, min(n, math.ceil(density * n)))


def time_torch_topk(n, k, threads, reps, seed):
    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(n, generator=gen, dtype=torch.float32)
    torch.topk(x.abs(), k, sorted=False)  # warm-up: allocator, thread pool
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        values, indices = torch.topk(x.abs(), k, sorted=False)
        times.append((time.perf_counter() - t0) * 1e3)
        assert values.numel() == k and indices.numel() == k
    return statistics.median(times)


def run_igrad(igrad, n, density, threads, reps):
    cmd = [igrad, "bench", "select", "--json", "--n", str(n), "--density",
           repr(density), "--threads", str(threads), "--reps", str(reps),
           "--sort-reps", "1"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--igrad", default="build/igrad", help="igrad binary (default build/igrad)")
    ap.add_argument("--n", type=int, default=16777216, help="entries (default 16777216)")
    ap.add_argument("--density", type=float, default=0.01, help="kept fraction (default 0.01)")
    ap.add_argument("--threads", type=int, default=1, help="threads for both (default 1)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions, medians (default 5)")
    ap.add_argument("--seed", type=int, default=1234, help="seed of torch's data")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    if args.n < 1 or args.reps < 1 or args.threads < 1 or not 0 < args.density <= 1:
        ap.error("need n >= 1, reps >= 1, threads >= 1, 0 < density <= 1")

    k = budget(args.n, args.density)
    torch_ms = time_torch_topk(args.n, k, args.threads, args.reps, args.seed)
    try:
        ig = run_igrad(args.igrad, args.n, args.density, args.threads, args.reps)
    except (OSError, subprocess.CalledProcessError) as exc:
        sys.exit(f"select_vs_torch: running {args.igrad} failed: {exc}")
    speedup = torch_ms / ig["topk_ef_ms"]
    result = {
        "n": args.n, "density": args.density, "k": k, "threads": args.threads,
        "torch_version": torch.__version__,
        "torch_topk_ms": round(torch_ms, 3),
        "igrad_topk_ef_ms": ig["topk_ef_ms"],
        "igrad_stream_ms": ig["stream_ms"],
        "speedup": round(speedup, 2),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"top-k of n = {args.n} fp32 normals, k = {k} (density {args.density}), "
          f"{args.threads} thread(s), median of {args.reps}")
    print(f"  torch {torch.__version__} topk(x.abs(), k, sorted=False) {torch_ms:10.2f} ms")
    print(f"  igrad EF + exact topk + residual         {ig['topk_ef_ms']:10.2f} ms"
          f"   (one streaming pass: {ig['stream_ms']:.2f} ms)")
    print(f"  speed-up torch / igrad                   {speedup:10.1f}x   (target >= 20x)")


if __name__ == "__main__":
    main()
