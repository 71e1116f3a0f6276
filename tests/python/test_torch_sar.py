"""test_torch_sar.py — the sparse all-reduce through PyTorch
(IgradState(collective="sparse_reduce")) on 4 gloo ranks: the engine runs
the whole step with its own collectives, the two all-to-alls over
TorchComm.alltoallv (dist.all_to_all_single).

  - GradientSynchronizer, topk_sync, one 64x64 tensor (one bucket): every
    rank's gradients and residuals equal, bit for bit at every step, a
    torch re-implementation of architecture.md §5.7a computed here from
    every rank's inputs (a = g + e, top-k per rank; per index range
    owner: sums from 0 in rank order, keep the top ceil(k/P) by |sum|,
    ties to the lower index; result = kept / P; the rest into the owner's
    residual; the ranges equal at the first step, then the balanced split
    points of decision 0060 that the reference derives from what each owner
    received, per eighth of its range, in the step before), and the payload
    is 8 bytes per selected entry;
  - the same under DDP's comm hook (bit for bit against the same reference);
  - collective="auto" with auto_sparse_reduce chooses the sparse all-reduce
    where its fitted price is below the gather's (fixed 32-bit indices;
    with the default compact ones the same bucket stays a gather; the
    bucket counts say which), runs it through the engine's sync and gives
    every rank the same gradients;
  - overlap=True with collective="sparse_reduce" is refused by name.
"""
import math
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402 (puts python/ on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import igrad.torch as it  # noqa: E402
from igrad import _lib as L  # noqa: E402

WORLD = 4
DENSITY = 0.05
ROWS = COLS = 64


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(COLS, ROWS, bias=False)

    def forward(self, g):
        return (self.w.weight * g).sum()


def grads_at(rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(ROWS, COLS, generator=g)


HIST = 8  # parts of an owner's range counted (IGRAD__SAR_HIST)


def next_points(pts, hist, P):
    """Decision 0060's next split points, integer arithmetic: unchanged
    while the busiest owner is within 1.05 x the mean, else split point s
    where the cumulative count reaches floor(N s / P), read linearly inside
    the part that holds it."""
    got = [sum(hist[r * HIST:(r + 1) * HIST]) for r in range(P)]
    N, mean = sum(got), sum(got) // P
    nxt = list(pts)
    if N == 0 or P < 2 or (max(got) - mean) * 20 <= mean:
        return nxt
    before, s = 0, 1
    for r in range(P):
        lo, hi = pts[r], pts[r + 1]
        for j in range(HIST):
            c = hist[r * HIST + j]
            if s >= P or c == 0:
                continue
            a = lo + ((hi - lo) * j + HIST - 1) // HIST
            b = lo + ((hi - lo) * (j + 1) + HIST - 1) // HIST
            while s < P and N * s // P <= before + c:
                nxt[s] = a + (b - a) * (N * s // P - before) // c
                s += 1
            before += c
    for t in range(1, P):
        nxt[t] = max(nxt[t], nxt[t - 1])
    return nxt


def sar_reference(grads, res, split):
    """One step of §5.7a for every rank at once: grads[r], res[r] the
    ranks' gradients and residuals (updated in place); split: the split
    points this step uses (None: equal ranges), replaced by the next
    step's; returns the gradient every rank applies."""
    P, D = len(grads), grads[0].numel()
    k = min(D, max(1, math.ceil(DENSITY * D)))
    kout = math.ceil(k / P)
    sums = torch.zeros(D, dtype=torch.float32)
    sent = torch.zeros(D, dtype=torch.bool)
    count = torch.zeros(D, dtype=torch.int64)
    for r in range(P):
        sel, res[r] = H.ref_select(grads[r], res[r], "topk", DENSITY)
        sel = sel.reshape(-1)
        m = H.stable_topk_mask(sel, k) & (sel != 0)
        sums[m] = sums[m] + sel[m]  # rank order, from 0.0f
        sent |= m
        count += m.to(torch.int64)
    out = torch.zeros(D, dtype=torch.float32)
    pts = split[0] if split[0] else [D * o // P for o in range(P + 1)]
    hist = [0] * (P * HIST)
    for o in range(P):
        lo, hi = pts[o], pts[o + 1]
        idx = torch.arange(lo, hi)[sent[lo:hi]]  # ascending
        for x in idx.tolist():  # one entry per rank that sent x
            hist[o * HIST + (x - lo) * HIST // (hi - lo)] += int(count[x])
        if idx.numel() == 0:
            continue
        # largest |sum| first, ties to the lower index (a stable sort)
        order = torch.sort(-sums[idx].abs(), stable=True).indices
        keep, rest = idx[order[:kout]], idx[order[kout:]]
        out[keep] = sums[keep] / P
        flat = res[o].reshape(-1).clone()
        flat[rest] = flat[rest] + sums[rest]
        res[o] = flat.view(res[o].shape)
    split[0] = next_points(pts, hist, P)
    return out.view(grads[0].shape), k


def check_step(tag, step, model, state, res, st, split):
    grads = [grads_at(r, step) for r in range(WORLD)]
    want, k = sar_reference(grads, res, split)
    assert st["skipped"] == 0, st
    assert st["payload_nbytes"] == 8 * k, (tag, st["payload_nbytes"], k)
    got = model.w.weight.grad
    assert torch.equal(got, want), "%s step %d: gradient differs from the reference " \
        "(max |diff| %g)" % (tag, step, (got - want).abs().max())
    mine = H.residuals(state)[0]
    r = dist.get_rank()
    assert torch.equal(mine, res[r].reshape(-1)), "%s step %d: residual of rank %d " \
        "differs (max |diff| %g)" % (tag, step, r, (mine - res[r].reshape(-1)).abs().max())
    for x in H.gather_flat(got):
        assert torch.equal(x, got.reshape(-1)), "%s step %d: ranks differ" % (tag, step)


def w_synchronizer(rank, world):
    torch.manual_seed(0)
    model = Net()
    state = it.IgradState(method="topk_sync", sparsifier="topk", density=DENSITY,
                          collective="sparse_reduce", buckets=1, threads=1)
    sync = it.GradientSynchronizer(model.named_parameters(), state)
    res = [torch.zeros(ROWS, COLS) for _ in range(WORLD)]
    split = [None]  # the reference's split points
    for step in range(4):
        model.w.weight.grad = grads_at(rank, step).clone()
        st = sync.synchronize(step)
        check_step("synchronizer", step, model, state, res, st, split)


def w_ddp(rank, world):
    torch.manual_seed(0)
    model = Net()
    ddp = DDP(model)
    state = it.IgradState(ddp, method="topk_sync", sparsifier="topk", density=DENSITY,
                          collective="sparse_reduce", buckets=1, threads=1)
    ddp.register_comm_hook(state, it.hook)
    res = [torch.zeros(ROWS, COLS) for _ in range(WORLD)]
    split = [None]  # the reference's split points
    for step in range(3):
        ddp.zero_grad()
        # d sum(W * G) / dW is exactly G: the hook gets the test's inputs
        ddp(grads_at(rank, step)).backward()
        check_step("ddp", step, model, state, res, state.last_stats, split)


def w_auto(rank, world):
    torch.manual_seed(0)
    # auto prices the sparse all-reduce by its fitted time (route.h: 17
    # alpha + 9/5 of its wire bytes, 8 an entry): at latency 0 and P = 4 it
    # beats the gather's (P-1) s only above 7.2 gather bytes an entry. With
    # the default compact indices (F32 values: about 5 bytes an entry) the
    # bucket stays a gather; with fixed 32-bit indices (8) and k = 410
    # (density 0.1 of 4,096) it is 9/5 (3 (112 + 8 * 103) + 8 * 410 * 3/4)
    # = 9,482 bytes against 3 * 8 * 410 = 9,840: the sparse all-reduce
    for fixed in (False, True):
        extra = dict(index_code="fixed", index_dtype="u32") if fixed else {}
        model = Net()
        state = it.IgradState(method="topk_sync", sparsifier="topk", density=0.1,
                              collective="auto", auto_sparse_reduce=True, link=(0, 25000),
                              buckets=1, threads=1, **extra)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        auto_steps(rank, model, sync, 1 if fixed else 0)
    try:
        it.IgradState(method="topk_sync", collective="sparse_reduce", overlap=True)
    except L.InvalidArgumentError as e:
        assert "overlap" in str(e) and "sparse" in str(e), e
    else:
        raise AssertionError("overlap with collective sparse_reduce was accepted")


def auto_steps(rank, model, sync, want_sar):
    for step in range(3):
        model.w.weight.grad = grads_at(rank, step).clone()
        st = sync.synchronize(step)
        assert st["skipped"] == 0, st
        assert st["sparse_reduce_buckets"] == want_sar, st
        got = model.w.weight.grad
        for x in H.gather_flat(got):
            assert torch.equal(x, got.reshape(-1)), "auto step %d: ranks differ" % step


class SparseReduceTest(unittest.TestCase):
    def test_synchronizer_reference(self):
        H.spawn(w_synchronizer, world=WORLD, deadline_s=240)

    def test_ddp_reference(self):
        H.spawn(w_ddp, world=WORLD, deadline_s=240)

    def test_auto_and_refusals(self):
        H.spawn(w_auto, world=WORLD, deadline_s=240)


if __name__ == "__main__":
    unittest_main.main()
