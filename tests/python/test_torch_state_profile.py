"""test_torch_state_profile.py — what an IgradState checkpoint weighs, and
the profile broadcast.

  - state_dict() holds the residuals once: its one tensor is the engine
    state file (uint8), and its torch.save size is within 2 % of the
    residuals' 4 B per entry (before: 2.48 x, the residuals as tensors and
    inside the state file, kept as bytes, which torch.save inflates);
    state_residuals(sd) reads them by name from the state file, equal bit
    for bit to the engine's own residual memory (read through ctypes);
    a state loaded from it continues the run bit for bit; a dict of the
    older form (with a "residuals" entry) still loads.
  - broadcast_profile on 2 gloo ranks: rank 0 alone reads the profile
    file (rank 1 has no path), both ranks get a profile whose JSON equals
    the file byte for byte, and both run an `ig` step with it; an error
    on rank 0 (a missing file) is raised on both ranks.
Run with /usr/bin/python3 (torch 1.13); IGRAD_LIBRARY points at the built
libigrad (set by CTest).
"""
import copy
import io
import os
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402
from igrad.torch.checkpoint import _state_file_bytes  # noqa: E402


def tensors_in(obj):
    """Every torch.Tensor inside nested dicts/lists/tuples."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_in(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_in(v)]
    return []


def train(model, sync, steps):
    for step in steps:
        model.zero_grad()
        model(*H.batch(0, step)).backward()
        sync.synchronize(step)


def grads(model):
    return [p.grad.clone() for p in model.parameters()]


class StateDictSize(unittest.TestCase):
    def test_residuals_once_and_round_trip(self):
        torch.manual_seed(0)
        model = H.TinyLlama(vocab=64, dim=64, hidden=160)
        twin = copy.deepcopy(model)
        state = it.IgradState(model, method="topk_sync", density=0.05)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        train(model, sync, range(3))

        sd = state.state_dict()
        held_tensors = tensors_in(sd)
        self.assertEqual(len(held_tensors), 1, "state_dict holds tensors besides the state file")
        self.assertIs(held_tensors[0], sd["engine_state"])
        self.assertEqual(sd["engine_state"].dtype, torch.uint8)
        entries = sum(p.numel() for p in model.parameters())
        buf = io.BytesIO()
        torch.save(sd, buf)
        ratio = buf.tell() / (4.0 * entries)
        print("state_dict: %d residual entries, torch.save %d B = %.4f x the residuals"
              % (entries, buf.tell(), ratio))
        self.assertGreaterEqual(ratio, 1.0)
        self.assertLess(ratio, 1.02, "state_dict is %.3f x the residuals" % ratio)

        # the residuals by name, from the state file = the engine's memory
        held = it.state_residuals(sd)
        live = H.residuals(state)
        self.assertEqual(list(held), [n for n, _ in model.named_parameters()])
        for (n, p), r in zip(model.named_parameters(), live):
            self.assertEqual(tuple(held[n].shape), tuple(p.shape), n)
            self.assertTrue(torch.equal(held[n].reshape(-1), r), n)
            self.assertTrue(torch.equal(held[n], state.residuals()[n]), n)
        self.assertGreater(sum(float(r.abs().sum()) for r in live), 0.0)

        # resumed from the dict (through torch.save/load) = the run continued
        buf.seek(0)
        resumed_state = it.IgradState(twin, method="topk_sync", density=0.05)
        resumed_state.load_state_dict(torch.load(buf))
        for p, q in zip(twin.parameters(), model.parameters()):
            with torch.no_grad():
                p.copy_(q)
        resumed = it.GradientSynchronizer(twin.named_parameters(), resumed_state)
        for step in (3, 4):
            train(model, sync, [step])
            train(twin, resumed, [step])
            for a, b in zip(grads(model), grads(twin)):
                self.assertTrue(torch.equal(a, b), "step %d differs after the resume" % step)
        for n, r in state.residuals().items():
            self.assertTrue(torch.equal(r, resumed_state.residuals()[n]), n)

        # a dict of the older form, residuals as tensors beside the state file
        old = dict(sd, residuals={n: t.clone() for n, t in held.items()},
                   engine_state=_state_file_bytes(sd["engine_state"]))
        again = it.IgradState(copy.deepcopy(model), method="topk_sync", density=0.05)
        again.load_state_dict(old)
        self.assertEqual(again.iter, 3)
        self.assertTrue(torch.equal(it.state_residuals(old)[n], held[n]))

    def test_state_residuals_refuses_other_bytes(self):
        with self.assertRaises(igrad.FormatError):
            it.state_residuals({"engine_state": b"x" * 400, "names": ["a"], "shapes": [[1]]})
        with self.assertRaises(igrad.FormatError):
            it.state_residuals({"format": "igrad.torch.IgradState/1", "iter": 0})


def tiny_profile(path):
    """A profile for TinyLlama from a hand-made trace (every component
    active, with distinct activities)."""
    layout = it.layout_from_module(H.TinyLlama())
    trace = igrad.Trace.create(layout, "adtopk", 0.125)
    for s in range(3):
        for t in range(len(layout)):
            if layout.tensor(t)["component"] >= 0:
                trace.record(s, t, float(t + 1), 1)
    igrad.build_profile(trace, out=path)


def w_broadcast(rank, world):
    with tempfile.TemporaryDirectory() as d:  # one per rank: nothing shared
        path = os.path.join(d, "profile.json")
        if rank == 0:
            tiny_profile(path)
            with open(path, "rb") as f:
                want = f.read()
        prof = it.broadcast_profile(path if rank == 0 else None, src=0)
        assert (rank == 0) == os.path.exists(path)
        got_path = os.path.join(d, "got.json")
        prof.save_json(got_path)
        with open(got_path, "rb") as f:
            got = f.read()
        everyone = [None] * world
        dist.all_gather_object(everyone, got)
        if rank == 0:
            assert all(g == want for g in everyone), "a rank's profile differs from the file"

        model = H.TinyLlama()
        state = it.IgradState(model, profile=prof, method="ig", density=0.125)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        model(*H.batch(rank, 0)).backward()
        st = sync.synchronize(0)
        assert st["skipped"] == 0, st

        # an error on the source reaches every rank
        try:
            it.broadcast_profile(os.path.join(d, "missing.json") if rank == 0 else None)
            raise AssertionError("a missing profile file was accepted")
        except igrad.FileError as e:
            assert "missing.json" in str(e) and "rank 0" in str(e), e


class ProfileBroadcast(unittest.TestCase):
    def test_broadcast_from_rank0_on_2_ranks(self):
        H.spawn(w_broadcast)


if __name__ == "__main__":
    unittest_main.main()
