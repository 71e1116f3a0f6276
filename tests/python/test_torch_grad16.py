"""test_torch_grad16.py — bfloat16/float16 gradients read in place by the
engine (IgradState grads_in_place, config grad_dtype) on 2 gloo ranks:

  - GradientSynchronizer on a bf16 and on an f16 model (adtopk_sync with
    F32 and BF16 wire values, topk_sync, dense): the in-place run's
    gradients and residuals equal, bit for bit at every step, those of the
    same run staged through float32 (grads_in_place=False), and the
    in-place engine really reads 16-bit (its config says BF16/F16, the
    staged one's F32);
  - a model mixing float32 and bfloat16 parameters falls back to the
    float32 staging (grad_dtype F32) and still matches;
  - a NaN in one rank's bf16 gradient skips the step on every rank
    (nonfinite="keep": gloo in torch 1.13 has no bfloat16 all-reduce, which
    also rules out DDP, whose construction broadcasts bf16 parameters).
"""
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402,F401 (puts python/ on sys.path)

import torch  # noqa: E402

import igrad.torch as it  # noqa: E402


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(48, 96, bias=True)
        self.down = torch.nn.Linear(96, 48, bias=False)


def grads_at(model, rank, step, dtype):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return [(torch.randn(p.shape, generator=g) * (1.0 + i)).to(dtype)
            for i, p in enumerate(model.parameters())]


def run_sync(rank, dtype, in_place, steps=4, nan_step=None, mixed=False, **kw):
    torch.manual_seed(0)
    model = Net().to(dtype)
    if mixed:
        model.down.to(torch.float32)
    state = it.IgradState(grads_in_place=in_place, **kw)
    sync = it.GradientSynchronizer(model.named_parameters(), state)
    out = []
    for step in range(steps):
        for p, g in zip(model.parameters(), grads_at(model, rank, step, p_dtype(model))):
            p.grad = g.to(p.dtype)
        if step == nan_step and rank == 1:
            model.up.weight.grad[2, 3] = float("nan")
        st = sync.synchronize(step)
        out.append(([p.grad.clone() for p in model.parameters()], H.residuals(state),
                    st["skipped"]))
    return out, state._grad_dt


def p_dtype(model):
    return next(model.parameters()).dtype


def same_runs(a, b, what):
    for step, ((g1, r1, s1), (g2, r2, s2)) in enumerate(zip(a, b)):
        assert s1 == s2, "%s step %d: skipped %d vs %d" % (what, step, s1, s2)
        for x, y in zip(r1, r2):
            assert (x is None and y is None) or torch.equal(x, y), \
                "%s step %d: residuals differ" % (what, step)
        for x, y in zip(g1, g2):
            # bit for bit (a kept NaN too)
            assert x.dtype == y.dtype and torch.equal(x.view(torch.int16), y.view(torch.int16)), \
                "%s step %d: gradients differ" % (what, step)


def w_synchronizer(rank, world):
    cases = [("adtopk_sync", "F32"), ("adtopk_sync", "BF16"), ("topk_sync", "F32"),
             ("dense", "F32")]
    for dtype in (torch.bfloat16, torch.float16):
        for method, vd in cases:
            what = "%s %s/%s" % (dtype, method, vd)
            a, dt_a = run_sync(rank, dtype, True, method=method, density=0.1, value_dtype=vd)
            b, dt_b = run_sync(rank, dtype, False, method=method, density=0.1, value_dtype=vd)
            assert dt_a == dtype and dt_b == torch.float32, (what, dt_a, dt_b)
            same_runs(a, b, what)
            # the comparison can fail: the results are not all zero
            assert any(g.abs().sum() > 0 for g in a[-1][0]), what
    # a NaN on rank 1 skips the step on every rank, in place as staged
    a, _ = run_sync(rank, torch.bfloat16, True, nan_step=2, method="adtopk_sync", density=0.1,
                nonfinite="keep")
    b, _ = run_sync(rank, torch.bfloat16, False, nan_step=2, method="adtopk_sync", density=0.1,
                nonfinite="keep")
    assert [s for _, _, s in a] == [0, 0, 1, 0], [s for _, _, s in a]
    same_runs(a, b, "bf16 nan")
    # mixed dtypes: staged through float32
    a, dt_a = run_sync(rank, torch.bfloat16, True, mixed=True, method="topk_sync", density=0.1)
    b, _ = run_sync(rank, torch.bfloat16, False, mixed=True, method="topk_sync", density=0.1)
    assert dt_a == torch.float32, dt_a
    same_runs(a, b, "mixed")


class Grad16Test(unittest.TestCase):
    def test_synchronizer(self):
        H.spawn(w_synchronizer, deadline_s=240)


if __name__ == "__main__":
    unittest_main.main()
