"""test_torch_overlap.py — the DDP hook with overlap=True (igrad buckets
issued during backward through the streamed step) against the last-bucket
hook (overlap=False), 2 gloo ranks, the same model and data:

  - topk_sync, adtopk_sync with a changing GradScaler scale (BF16 values),
    ig with online profiling and a dense warm-up (start_iter): gradients
    after the hook, residuals, stats payload and the trained parameters
    are bit for bit the same at every step, including an Inf step on rank
    0 (skipped on both ranks, residuals unchanged, DDP's all-reduce
    result returned as with nonfinite="allreduce");
  - with several DDP buckets, some igrad buckets were issued before the
    last DDP bucket arrived (the overlap happened);
  - a bad loss scale on one rank: that rank raises its error, the other
    one MismatchError naming it (the last-bucket hook's behaviour), no hang.
"""
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402,F401 (puts python/ on sys.path)

import torch  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

SCALES = [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**17, 2.0**17, 2.0**17, 2.0**16]
INF_STEP = 3


residuals = H.residuals



def run(rank, overlap, scaled, kw):
    torch.manual_seed(0)
    # over 1 MB of parameters: DDP's first bucket holds 1 MB, the others
    # bucket_cap_mb, so there are several DDP buckets after the rebuild
    model = H.TinyLlama(seed=0, dim=128, hidden=256)
    ddp = DDP(model, bucket_cap_mb=0.2)
    cur = {"s": 1.0}
    state = it.IgradState(ddp, overlap=overlap,
                          grad_scaler=(lambda: cur["s"]) if scaled else None, **kw)
    ddp.register_comm_hook(state, it.hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    hist, early = [], 0
    for step in range(len(SCALES)):
        s = SCALES[step] if scaled else 1.0
        cur["s"] = s
        opt.zero_grad()
        loss = ddp(*H.batch(rank, step)) * s
        if step == INF_STEP and rank == 0:
            loss = loss * float("inf")
        loss.backward()
        st = dict(state.last_stats)
        early += st.get("early_buckets", 0)
        grads = [p.grad.clone() for p in model.parameters()]
        hist.append((grads, residuals(state), st.get("skipped"), st.get("payload_nbytes")))
        if not st.get("skipped"):
            for p in model.parameters():
                p.grad.div_(s)
            opt.step()
    return hist, [p.detach().clone() for p in model.parameters()], early


CONFIGS = [
    ("topk_sync", dict(method="topk_sync", density=0.1, buckets=4), False),
    ("adtopk_sync scaled BF16", dict(method="adtopk_sync", density=0.125, buckets=3,
                                     value_dtype="BF16"), True),
    ("ig online, warm-up", dict(method="ig", profile="auto", profile_steps=2, density=0.1,
                                buckets=4, start_iter=1), False),
]


def w_same(rank, world):
    for name, kw, scaled in CONFIGS:
        h1, p1, _ = run(rank, False, scaled, kw)
        h2, p2, early = run(rank, True, scaled, kw)
        for step, (a, b) in enumerate(zip(h1, h2)):
            ga, ra, ska, pa = a
            gb, rb, skb, pb = b
            assert ska == skb and pa == pb, (name, step, a[2:], b[2:])
            if step == INF_STEP:
                assert ska == 1, (name, step, ska)
            for x, y in zip(ga, gb):
                same = torch.equal(x, y) or (ska and torch.equal(x.isnan(), y.isnan()))
                assert same, "%s step %d: gradients differ" % (name, step)
            for x, y in zip(ra, rb):
                assert (x is None and y is None) or torch.equal(x, y), \
                    "%s step %d: residuals differ" % (name, step)
        for x, y in zip(p1, p2):
            assert torch.equal(x, y), "%s: parameters differ" % name
        assert early > 0, "%s: no igrad bucket was issued before the last DDP bucket" % name


def w_bad_scale(rank, world):
    model = H.TinyLlama(seed=0, dim=128, hidden=256)
    ddp = DDP(model, bucket_cap_mb=0.2)
    cur = {"s": 1.0}
    state = it.IgradState(ddp, method="topk_sync", density=0.1, overlap=True,
                          grad_scaler=lambda: cur["s"])
    ddp.register_comm_hook(state, it.hook)
    for step in range(2):
        ddp(*H.batch(rank, step)).backward()
    if rank == 1:
        cur["s"] = 0.0  # refused on this rank only
    msg = ""
    try:
        ddp(*H.batch(rank, 2)).backward()
    except Exception as e:  # DDP re-raises the hook's error
        msg = str(e)
    want = "the loss scale is 0" if rank == 1 else "rank 1 refused the step"
    assert want in msg, (rank, msg)


class OverlapTest(unittest.TestCase):
    def test_overlap_equals_last_bucket(self):
        H.spawn(w_same, deadline_s=240)

    def test_refused_on_one_rank(self):
        H.spawn(w_bad_scale, deadline_s=120)


if __name__ == "__main__":
    unittest_main.main()
