#!/usr/bin/env python3
"""cuda_vs_torch.py — torch.topk on the GPU on the tensors bench_cuda times.

For each OPT-125M- and LLaMA-7B-shaped matrix (the list in
bench/cuda_bench.c), fp32 standard normals on cuda:0: the median time of
torch.topk(x.abs(), k, sorted=False) with k = 1 % of the entries (flat, as
igrad's topk) and of torch.topk(x.abs(), ceil(1 % of cols), dim=1) (row-wise,
as ADTopk), with the bandwidth of one read of x. torch's time covers less
work than igrad's select_ms (no error-feedback add, no residual write, no
tie rule, no finiteness check). Run by scripts/gpu-check where torch has
CUDA; prints a table, asserts nothing.
"""
import math
import statistics

import torch

SHAPES = [
    ("OPT-125M", "q_proj 768x768", 768, 768),
    ("OPT-125M", "fc1 3072x768", 3072, 768),
    ("OPT-125M", "fc2 768x3072", 768, 3072),
    ("OPT-125M", "embed 50272x768", 50272, 768),
    ("LLaMA-7B", "q_proj 4096x4096", 4096, 4096),
    ("LLaMA-7B", "up 11008x4096", 11008, 4096),
    ("LLaMA-7B", "down 4096x11008", 4096, 11008),
    ("LLaMA-7B", "embed 32000x4096", 32000, 4096),
]
HBM_GBPS = 4800.0


def time_ms(fn, reps=7):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        stop.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def main():
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}")
    print(f"{'model':9} {'tensor':18} {'torch':14} {'ms':>9} {'GB/s':>9} {'of HBM':>7}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    for model, what, rows, cols in SHAPES:
        x = torch.randn(rows, cols, device="cuda", generator=gen)
        n = rows * cols
        k = max(1, math.ceil(0.01 * n))
        kr = max(1, math.ceil(0.01 * cols))
        flat = x.view(-1)
        for label, fn in (("topk flat", lambda: torch.topk(flat.abs(), k, sorted=False)),
                          ("topk dim=1", lambda: torch.topk(x.abs(), kr, dim=1, sorted=False))):
            ms = time_ms(fn)
            gbps = 4.0 * n / (ms * 1e6)
            print(f"{model:9} {what:18} {label:14} {ms:9.3f} {gbps:9.1f} {100 * gbps / HBM_GBPS:6.1f}%")
        del x
    print("DDP with the igrad hook vs plain DDP: bench/ddp_hook_gpu.py (the binding's CUDA "
          "engine; scripts/gpu-check runs it next)")


if __name__ == "__main__":
    main()
