#!/usr/bin/env python3
"""ddp_hook_gpu.py — one DDP training step with the igrad hook vs plain DDP
on one GPU: a ~100M-parameter LLaMA-shaped model (tests/python's
TinyLlama with vocab 32000, dim 768, 8 layers, hidden 2048: 106M
parameters) on cuda:0, a one-rank NCCL process group, the same batch for
both. Each repetition times forward + backward (DDP's reduction included)
+ an SGD step of each, in alternating order (interleaved, so drift in
clocks or memory state hits both alike), after warm-up steps (the first
igrad step creates the CUDA engine). Prints per variant the median step
ms and the ratio hook / plain, then igrad's statistics of the last step:
bytes sent, select/pack/unpack ms and memory per rank (device and host
bytes per parameter, IgradState.last_stats).

With one rank the collectives are copies, so this measures igrad's own
cost on the GPU (selection, packing, unpacking, control plane), not the
traffic it saves. Exits non-zero if a step fails, is skipped, or leaves a
non-finite gradient. Run by scripts/gpu-check; needs torch with CUDA and
NCCL and libigrad built with CUDA (IGRAD_LIBRARY).
   bench/ddp_hook_gpu.py [--reps N] [--warmup N] [--density RHO]
"""
import argparse
import datetime
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "python"))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import igrad_torch_helpers as H  # noqa: E402
import igrad.torch as it  # noqa: E402

VOCAB, DIM, LAYERS, HEADS, HIDDEN = 32000, 768, 8, 12, 2048
BATCH, SEQ = 4, 256


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make(dev, state=None):
    model = H.TinyLlama(vocab=VOCAB, dim=DIM, layers=LAYERS, heads=HEADS, hidden=HIDDEN,
                        seed=0).to(dev)
    ddp = DDP(model, device_ids=[dev.index])
    if state is not None:
        state.attach(model)
        ddp.register_comm_hook(state, it.hook)
    return model, ddp, torch.optim.SGD(model.parameters(), lr=1e-4)


def step_ms(ddp, opt, x, y):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=False)
    ddp(x, y).backward()
    opt.step()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--density", type=float, default=0.01)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("ddp_hook_gpu: torch.cuda is not available")
        return 1
    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % free_port(), rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=120))
    try:
        state = it.IgradState(method="adtopk_sync", density=args.density)
        plain = make(dev)
        hooked = make(dev, state)
        nparams = sum(p.numel() for p in plain[0].parameters())
        x, y = (t.to(dev) for t in H.batch(0, 0, B=BATCH, T=SEQ, vocab=VOCAB))
        print("torch %s on %s; model %.1fM parameters, batch %dx%d, adtopk_sync density %g"
              % (torch.__version__, torch.cuda.get_device_name(0), nparams / 1e6, BATCH, SEQ,
                 args.density))
        for _ in range(args.warmup):
            step_ms(*plain[1:], x, y)
            step_ms(*hooked[1:], x, y)
        times = {"plain DDP": [], "DDP + igrad hook": []}
        for r in range(args.reps):
            order = (("plain DDP", plain), ("DDP + igrad hook", hooked))
            for name, (_, ddp, opt) in (order if r % 2 == 0 else order[::-1]):
                times[name].append(step_ms(ddp, opt, x, y))
                if name != "plain DDP":
                    st = state.last_stats
                    if st.get("skipped"):
                        print("FAIL: the igrad step was skipped: %s" % st.get("reason"))
                        return 1
        bad = [n for n, p in hooked[0].named_parameters()
               if not torch.isfinite(p.grad).all()]
        if bad:
            print("FAIL: non-finite gradients after the hook (first: %s)" % bad[0])
            return 1
        med = {k: statistics.median(v) for k, v in times.items()}
        print("%-18s %10s %10s %10s" % ("variant", "median ms", "min ms", "max ms"))
        for k, v in times.items():
            print("%-18s %10.2f %10.2f %10.2f" % (k, med[k], min(v), max(v)))
        print("ratio hook / plain: %.3f (%d interleaved reps)"
              % (med["DDP + igrad hook"] / med["plain DDP"], args.reps))
        st = state.last_stats
        print("igrad last step: payload %d B (%.4f B/param), select %.2f ms, pack %.2f ms, "
              "unpack %.2f ms, engine total %.2f ms, collectives (host time) %.2f ms"
              % (st["payload_nbytes"], st["payload_nbytes"] / nparams, st["select_ms"],
                 st["pack_ms"], st["unpack_ms"], st["total_ms"], st["collective_ms"]))
        print("igrad memory per rank: device %.3f B/param (%d B), host %.4f B/param (%d B)"
              % (st["device_nbytes_per_param"], st["device_nbytes"],
                 st["host_nbytes_per_param"], st["host_nbytes"]))
        return 0
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
