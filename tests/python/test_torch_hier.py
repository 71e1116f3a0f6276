"""test_torch_hier.py — the two-level sync through PyTorch
(IgradState(topology="hier")) on 4 gloo ranks in 2 "nodes" of 2: the
engine splits the process group with torch.distributed (new_group), sums
each tensor onto its owner (reduce) and broadcasts the result.

  - GradientSynchronizer with adtopk_sync and topk_sync: every rank's
    gradients equal, bit for bit at every step, a reference computed here
    from every rank's inputs with flat one-rank engines (igrad.core, self
    comm), one per node, run on the node's sum: (1/4) Σ_nodes of what each
    selects (a sum of two floats is the same in either order, so the
    node sums are exact references); the owners' residuals equal the
    reference engines', the others have none; the statistics split bytes
    into intra- and inter-node;
  - a NaN on one rank skips the step on every rank;
  - overlap=True with topology="hier" is refused by name.
"""
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402 (puts python/ on sys.path)

import torch  # noqa: E402

import igrad.core as core  # noqa: E402
import igrad.torch as it  # noqa: E402
from igrad import _lib as L  # noqa: E402

WORLD, RPN = 4, 2


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(48, 96, bias=True)
        self.down = torch.nn.Linear(96, 48, bias=False)
        self.norm = torch.nn.LayerNorm(48)


def grads_at(model, rank, step):
    g = torch.Generator().manual_seed(1000 * rank + step)
    return [torch.randn(p.shape, generator=g) * (1.0 + i)
            for i, p in enumerate(model.parameters())]


def w_reference(rank, world):
    torch.manual_seed(0)
    model = Net()
    for method in ("adtopk_sync", "topk_sync"):
        cfg = dict(method=method, density=0.1, threads=1, block_entries=512)
        state = it.IgradState(topology="hier", ranks_per_node=RPN, **cfg)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        layout = it.layout_from_module(model)
        refs = [core.Engine(layout, None, core.make_config(**cfg), core.Comm.self_())
                for _ in range(WORLD // RPN)]
        node = rank // RPN
        for step in range(5):
            mine = grads_at(model, rank, step)
            for p, g in zip(model.parameters(), mine):
                p.grad = g.clone()
            st = sync.synchronize(step)
            assert st["skipped"] == 0
            assert st["intra_wire_nbytes"] > 0 and st["inter_wire_nbytes"] > 0, st
            assert st["wire_nbytes"] == st["intra_wire_nbytes"] + st["inter_wire_nbytes"]
            want = [torch.zeros_like(p) for p in model.parameters()]
            for k, ref in enumerate(refs):
                a = grads_at(model, k * RPN, step)
                b = grads_at(model, k * RPN + 1, step)
                sums = [(x + y).contiguous() for x, y in zip(a, b)]
                ref.sync(step, [s.data_ptr() for s in sums])
                for w, s in zip(want, sums):
                    w.add_(s * 0.25)
            for i, (p, w) in enumerate(zip(model.parameters(), want)):
                assert torch.equal(p.grad, w), "%s step %d: tensor %d differs from the " \
                    "reference (max |diff| %g)" % (method, step, i, (p.grad - w).abs().max())
            for t, r in enumerate(H.residuals(state)):
                ref_addr = refs[node].residual_address(t)
                if r is None:
                    continue
                import ctypes
                n = r.numel()
                ref_r = torch.frombuffer((ctypes.c_float * n).from_address(ref_addr),
                                         dtype=torch.float32)
                assert torch.equal(r, ref_r), "%s step %d: residual %d" % (method, step, t)
        owned = sum(r is not None for r in H.residuals(state))
        counts = [torch.tensor([owned])]
        torch.distributed.all_reduce(counts[0])
        assert counts[0].item() == len(list(model.parameters())) * (WORLD // RPN), counts
        # a NaN on rank 3 skips the step on every rank
        for p, g in zip(model.parameters(), grads_at(model, rank, 9)):
            p.grad = g.clone()
        if rank == 3:
            model.up.weight.grad[1, 2] = float("nan")
        before = H.residuals(state)
        state.nonfinite = "keep"
        out = sync.synchronize(9)
        assert out["skipped"] == 1, out
        for x, y in zip(before, H.residuals(state)):
            assert (x is None and y is None) or torch.equal(x, y)
    try:
        it.IgradState(method="adtopk_sync", topology="hier", overlap=True)
    except L.InvalidArgumentError as e:
        assert "overlap" in str(e), e
    else:
        raise AssertionError("overlap with topology hier was accepted")


class HierTest(unittest.TestCase):
    def test_reference(self):
        H.spawn(w_reference, world=WORLD, deadline_s=240)


if __name__ == "__main__":
    unittest_main.main()
