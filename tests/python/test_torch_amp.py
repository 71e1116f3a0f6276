"""test_torch_amp.py — AMP loss scales and 16-bit wire values in the
PyTorch binding (one process, GradientSynchronizer over the self
communicator):

  - grad_scaler: gradients scaled by a loss scale that changes mid-run
    (2^16 -> 2^15 -> 2^17) with an Inf step in between (skipped, residuals
    unchanged) give, divided by the scale, exactly the gradients of the
    same run with scale 1, and exactly its residuals at every step, for F32
    and BF16 wire values; the same scaled run without grad_scaler does not
    (its residuals mix scales), which shows the comparison can fail;
  - a GradScaler-like object (get_scale()) is accepted, anything else is
    refused naming grad_scaler, and a scale of 0 fails the step naming it;
  - value_dtype="BF16" sends 2 bytes less per entry than F32;
  - the DDP hook on 2 gloo ranks: a loss scaled by a changing scale, with
    an overflow step on one rank, gives the scale-1 run's gradients (/ S)
    and residuals bit for bit, and the same parameters.
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

SCALES = [2.0**16, 2.0**16, 2.0**15, 2.0**15, 2.0**17, 2.0**17, 2.0**17]
INF_STEP = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(48, 96, bias=True)
        self.down = torch.nn.Linear(96, 48, bias=False)


def grads_at(model, step):
    """Unscaled gradients of `step`, deterministic (one per parameter)."""
    g = torch.Generator().manual_seed(1000 + step)
    return [torch.randn(p.shape, generator=g) * (1.0 + i) for i, p in
            enumerate(model.parameters())]


residuals = H.residuals



def run(value_dtype, scaled, tell_scaler, steps=len(SCALES)):
    """[(grads after sync, residuals)] per step; grads divided by the scale."""
    torch.manual_seed(0)
    model = Net()
    cur = {"s": 1.0}
    state = it.IgradState(method="adtopk_sync", density=0.1, value_dtype=value_dtype,
                          grad_scaler=(lambda: cur["s"]) if tell_scaler else None)
    sync = it.GradientSynchronizer(model.named_parameters(), state)
    out = []
    for step in range(steps):
        s = SCALES[step] if scaled else 1.0
        cur["s"] = s
        for p, g in zip(model.parameters(), grads_at(model, step)):
            p.grad = g * s
        if step == INF_STEP:
            model.up.weight.grad[3, 5] = float("inf")
        stats = sync.synchronize(step)
        got = [p.grad.clone() / s for p in model.parameters()]
        out.append((got, residuals(state), stats))
    return out


def w_ddp_amp(rank, world):
    """Two DDP runs on the same data: A scales the loss by S (changing, with
    an Inf on rank 0 at INF_STEP) and tells the state; B has scale 1."""
    runs = []
    for scaled in (False, True):
        model = H.TinyLlama(seed=0)
        ddp = DDP(model, bucket_cap_mb=0.05)
        cur = {"s": 1.0}
        state = it.IgradState(ddp, method="adtopk_sync", density=0.125, value_dtype="BF16",
                              grad_scaler=(lambda: cur["s"]) if scaled else None)
        ddp.register_comm_hook(state, it.hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        hist = []
        for step in range(len(SCALES)):
            s = SCALES[step] if scaled else 1.0
            cur["s"] = s
            opt.zero_grad()
            loss = ddp(*H.batch(rank, step)) * s
            if step == INF_STEP and rank == 0:
                loss = loss * float("inf")
            loss.backward()
            skipped = state.last_stats["skipped"]
            assert skipped == (1 if step == INF_STEP else 0), (step, state.last_stats)
            grads = [p.grad / s for p in model.parameters()]
            hist.append((grads, residuals(state), skipped))
            if not skipped:  # what GradScaler does: unscale, or skip on Inf
                for p in model.parameters():
                    p.grad.div_(s)
                opt.step()
        runs.append((hist, [p.detach().clone() for p in model.parameters()]))
    (h1, p1), (h2, p2) = runs
    for step, ((g1, r1, sk), (g2, r2, _)) in enumerate(zip(h1, h2)):
        for a, b in zip(r1, r2):
            assert torch.equal(a, b), "step %d: residuals differ" % step
        if not sk:
            for a, b in zip(g1, g2):
                assert torch.equal(a, b), "step %d: gradients differ" % step
    for a, b in zip(p1, p2):
        assert torch.equal(a, b), "parameters differ"


class AmpTest(unittest.TestCase):
    def check_same(self, value_dtype):
        ref = run(value_dtype, scaled=False, tell_scaler=False)
        amp = run(value_dtype, scaled=True, tell_scaler=True)
        for step, ((g1, r1, s1), (g2, r2, s2)) in enumerate(zip(ref, amp)):
            self.assertEqual(s1["skipped"], s2["skipped"], step)
            self.assertEqual(s2["skipped"], 1 if step == INF_STEP else 0, step)
            for a, b in zip(r1, r2):
                self.assertTrue(torch.equal(a, b), "%s step %d: residuals differ"
                                % (value_dtype, step))
            if step != INF_STEP:
                for a, b in zip(g1, g2):
                    self.assertTrue(torch.equal(a, b), "%s step %d: results differ"
                                    % (value_dtype, step))
        return ref

    def test_changing_scale_f32(self):
        ref = self.check_same("F32")
        # the control: scaled gradients without grad_scaler mix the scales
        naive = run("F32", scaled=True, tell_scaler=False)
        last = len(SCALES) - 1
        self.assertFalse(all(torch.equal(a / SCALES[last], b) for a, b in
                             zip(naive[last][1], ref[last][1])),
                         "the control run matched: the comparison cannot fail")

    def test_changing_scale_bf16(self):
        self.check_same("BF16")

    def test_scaler_objects(self):
        class Scaler:
            def get_scale(self):
                return 256.0
        state = it.IgradState(method="topk_sync", density=0.1, grad_scaler=Scaler())
        self.assertEqual(state._loss_scale(), 256.0)
        gs = torch.cuda.amp.GradScaler(enabled=False)  # CPU: scale 1
        self.assertEqual(it.IgradState(method="topk_sync", grad_scaler=gs)._loss_scale(), 1.0)
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            it.IgradState(method="topk_sync", grad_scaler=5)
        self.assertIn("grad_scaler", str(cm.exception))
        model = Net()
        state = it.IgradState(method="topk_sync", density=0.1, grad_scaler=lambda: 0.0)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        for p, g in zip(model.parameters(), grads_at(model, 0)):
            p.grad = g
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            sync.synchronize(0)
        self.assertIn("the loss scale is 0.0", str(cm.exception))

    def test_ddp_hook(self):
        H.spawn(w_ddp_amp)

    def test_bf16_payload(self):
        f32 = run("F32", scaled=False, tell_scaler=False, steps=1)[0][2]
        bf16 = run("BF16", scaled=False, tell_scaler=False, steps=1)[0][2]
        self.assertEqual(f32["entries_sent"], bf16["entries_sent"])
        self.assertEqual(f32["payload_nbytes"] - bf16["payload_nbytes"],
                         2 * f32["entries_sent"])
        self.assertGreaterEqual(bf16["dataplane_nbytes_per_param"], 4.0)


if __name__ == "__main__":
    unittest_main.main()
