"""test_torch_user_guards.py — what stops a PyTorch user new to igrad,
each checked the way the user meets it:

  - a parameter frozen mid-run (requires_grad_(False), .grad = None) stays
    bit for bit where it is under AdamW with GradientSynchronizer and
    UpdateSynchronizer, its .grad stays None and its residual is kept for
    when it thaws;
  - an igrad error raised inside DDP's comm hook (2 gloo ranks with
    different densities) reaches the user as DDP's RuntimeError, and the
    typed error stays reachable as state.last_error; a state whose
    process_group is not DDP's is refused when it is attached;
  - a model whose blocks no name rule knows: a warning at attach when most
    parameters map to no layer, an error at construction for ig when none
    does; ig without a profile is refused at construction naming
    profile="auto"; hook(state, [tensors]) is a TypeError naming DDP's
    GradBucket and GradientSynchronizer;
  - ig with profile="auto" gets the library's default payload target (the
    CLI's --target-ratio default); an Adam(W) with beta1 > 0 given to a
    sparse method is warned about once;
  - bf16 parameters over gloo (which cannot all-reduce bf16 in torch 1.13):
    a warm-up step and a skipped (non-finite) step average in float32.
Run with /usr/bin/python3 (torch 1.13); IGRAD_LIBRARY points at the built
libigrad (set by CTest).
"""
import ctypes
import os
import sys
import unittest
import warnings

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402

FROZEN = "model.layers.0.mlp.up_proj.weight"


def _param(model, name):
    return dict(model.named_parameters())[name]


class FrozenParameter(unittest.TestCase):
    """Item: a parameter frozen mid-run kept moving (its released residual
    came back as a gradient, and AdamW applied it)."""

    def _run(self, use_update):
        torch.manual_seed(0)
        model = H.TinyLlama(seed=3)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.0, 0.95))
        state = it.IgradState(model, method="adtopk_sync", density=0.05)
        sync = (it.UpdateSynchronizer(model, opt, state) if use_update
                else it.GradientSynchronizer(model, state))
        t = state._index[FROZEN]
        p = _param(model, FROZEN)

        def step(i):
            model(*H.batch(0, i)).backward()
            if use_update:
                sync.step()
            else:
                sync.synchronize()
                opt.step()
            opt.zero_grad(set_to_none=True)

        for i in range(3):
            step(i)
        res = H.residuals(state)[t]
        self.assertGreater(float(res.abs().sum()), 0.0)  # something to release
        p.requires_grad_(False)
        p.grad = None
        before = p.detach().clone()
        for i in range(3, 8):
            step(i)
            self.assertIsNone(p.grad)
            self.assertTrue(torch.equal(p.detach(), before), "step %d moved %s by %g" % (
                i, FROZEN, float((p.detach() - before).abs().max())))
        self.assertTrue(torch.equal(H.residuals(state)[t], res))  # kept for the thaw
        # thawed: it moves again
        p.requires_grad_(True)
        step(8)
        self.assertFalse(torch.equal(p.detach(), before))

    def test_gradient_synchronizer(self):
        self._run(use_update=False)

    def test_update_synchronizer(self):
        self._run(use_update=True)


class Stages(nn.Module):
    """Blocks under names that no built-in rule knows (stage0, stage1)."""

    def __init__(self, n=2, dim=16):
        super().__init__()
        for i in range(n):
            setattr(self, "stage%d" % i, nn.Sequential(nn.Linear(dim, 4 * dim),
                                                       nn.Linear(4 * dim, dim)))


class NameRulesAndMisuse(unittest.TestCase):

    def test_unmapped_model_warns_at_attach(self):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            it.IgradState(Stages(), method="iad", profile="auto")
        msgs = [str(w.message) for w in seen if "map to no layer" in str(w.message)]
        self.assertEqual(len(msgs), 1, [str(w.message) for w in seen])
        self.assertIn("8 of 8 parameters", msgs[0])
        self.assertIn("stage0.0.weight", msgs[0])
        self.assertIn("name_map", msgs[0])
        # a model the rules know: no such warning
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            it.IgradState(H.TinyLlama(), method="iad", profile="auto")
        self.assertFalse([w for w in seen if "map to no layer" in str(w.message)])

    def test_ig_refuses_a_model_nothing_maps(self):
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "no parameter.*layer") as cm:
            it.IgradState(Stages(), method="ig", profile="auto")
        self.assertIn("name_map", str(cm.exception))
        state = it.IgradState(method="ig", profile="auto")  # attached later
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "no parameter.*layer"):
            it.GradientSynchronizer(Stages(), state)
        with self.assertRaises(igrad.StateError):  # refused: not attached
            state.layout

    def test_ig_without_profile_at_construction(self):
        for method in ("ig", "iad"):
            with self.assertRaisesRegex(igrad.InvalidArgumentError, "profile='auto'"):
                it.IgradState(method=method)

    def test_hook_without_ddp(self):
        model = H.TinyLlama()
        state = it.IgradState(model, method="topk_sync", density=0.1)
        model(*H.batch(0, 0)).backward()
        with self.assertRaises(TypeError) as cm:
            it.hook(state, [p.grad for p in model.parameters()])
        msg = str(cm.exception)
        self.assertIn("GradBucket", msg)
        self.assertIn("GradientSynchronizer", msg)
        self.assertIn("list", msg)


class Defaults(unittest.TestCase):

    def test_ig_auto_target_ratio_is_the_library_default(self):
        fn = igrad._lib.lib().dll.igrad_ig_default_target_ratio
        fn.restype, fn.argtypes = ctypes.c_double, []
        want = fn()
        self.assertEqual(want, 0.25)
        self.assertEqual(igrad.ig_default_target_ratio(), want)
        state = it.IgradState(H.TinyLlama(), method="ig", profile="auto")
        self.assertEqual(state.target_ratio, want)
        self.assertEqual(state.config["target_ratio"], want)
        # explicit values win, 0 turns it off; iad and other methods get none
        self.assertEqual(it.IgradState(H.TinyLlama(), method="ig", profile="auto",
                                       target_ratio=0.5).target_ratio, 0.5)
        self.assertIsNone(it.IgradState(H.TinyLlama(), method="ig", profile="auto",
                                        target_ratio=0).target_ratio)
        self.assertIsNone(it.IgradState(H.TinyLlama(), method="iad",
                                        profile="auto").target_ratio)

    def test_beta1_warning(self):
        def warned(method, betas, make):
            model = H.TinyLlama()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=betas)
            with warnings.catch_warnings(record=True) as seen:
                warnings.simplefilter("always")
                state = it.IgradState(model, method=method, density=0.1)
                make(model, opt, state)
                make(model, opt, state)  # once per state
            return [str(w.message) for w in seen if "beta1" in str(w.message)]

        def upd(model, opt, state):
            it.UpdateSynchronizer(model, opt, state)

        def grad(model, opt, state):
            it.GradientSynchronizer(model, state, optimizer=opt)

        for make in (upd, grad):
            msgs = warned("adtopk_sync", (0.9, 0.95), make)
            self.assertEqual(len(msgs), 1, msgs)
            self.assertIn("betas=(0.0, 0.95)", msgs[0])
            self.assertIn("0.9", msgs[0])
            self.assertEqual(warned("adtopk_sync", (0.0, 0.95), make), [])
            self.assertEqual(warned("dense", (0.9, 0.95), make), [])


# -- over 2 gloo ranks -----------------------------------------------------------

def _ddp_error_typed(rank, world):
    model = H.TinyLlama(seed=1)
    ddp = DDP(model, bucket_cap_mb=0.004)
    # a different density per rank: the engine's agreement refuses it
    state = it.IgradState(ddp, method="topk_sync", density=0.1 if rank == 0 else 0.2)
    ddp.register_comm_hook(state, it.hook)
    assert state.last_error is None
    try:
        ddp(*H.batch(rank, 0)).backward()
    except RuntimeError as e:
        assert not isinstance(e, igrad.IgradError), type(e)
        assert "MismatchError" in str(e), str(e)
    else:
        raise AssertionError("rank %d: the step did not fail" % rank)
    err = state.last_error
    assert isinstance(err, igrad.MismatchError), repr(err)
    assert "density" in str(err), str(err)
    try:
        state.raise_last_error()
    except igrad.MismatchError as e:
        assert e is err
    else:
        raise AssertionError("raise_last_error did not raise")

    # a state over another process group than DDP's is refused by name
    other = dist.new_group([0, 1])
    try:
        it.IgradState(ddp, process_group=other, method="topk_sync")
    except igrad.MismatchError as e:
        assert "process_group" in str(e), str(e)
    else:
        raise AssertionError("a state over another group was accepted")
    state2 = it.IgradState(process_group=other, method="topk_sync")
    try:
        state2.attach(ddp)
    except igrad.MismatchError as e:
        assert "process_group" in str(e), str(e)
    else:
        raise AssertionError("attach over another group was accepted")
    it.IgradState(ddp, process_group=ddp.process_group, method="topk_sync")  # the same: fine
    # new_group's store-based barrier may still poll rank 0's store: leave together
    dist.barrier()


def _bf16_gloo(rank, world):
    model = H.TinyLlama(seed=2).to(torch.bfloat16)
    ref = H.TinyLlama(seed=2).to(torch.bfloat16)
    state = it.IgradState(model, method="adtopk_sync", density=0.1, start_iter=1)
    sync = it.GradientSynchronizer(model, state)
    for step in range(3):
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        x, y = H.batch(rank, step)
        model(x, y).backward()
        ref(x, y).backward()
        if step == 2 and rank == 1:  # a non-finite gradient on one rank: skipped
            _param(model, FROZEN).grad[0, 0] = float("inf")
        # the float32 average of the bf16 gradients, rounded back to bf16
        want = []
        for p in ref.parameters():
            g = p.grad.float()
            dist.all_reduce(g)
            want.append(g.div_(world).to(torch.bfloat16))
        st = sync.synchronize(step)
        if step == 0:
            assert st.get("warmup") == 1, st
        if step == 2:
            assert st.get("skipped") == 1, st
            for (n, p), w in zip(model.named_parameters(), want):
                if n != FROZEN:
                    assert torch.equal(p.grad, w), n
        if step == 0:
            for (n, p), w in zip(model.named_parameters(), want):
                assert torch.equal(p.grad, w), n
        got = H.gather_flat(torch.cat([p.grad.float().reshape(-1)
                                       for p in model.parameters()]))
        if step != 2:  # the skipped step averages an inf: identical up to it
            assert torch.equal(got[0], got[1]), step


class OverGloo(unittest.TestCase):

    def test_ddp_error_is_typed_and_groups_compared(self):
        H.spawn(_ddp_error_typed, deadline_s=120)

    def test_bf16_warmup_and_skipped_step(self):
        H.spawn(_bf16_gloo, deadline_s=120)


if __name__ == "__main__":
    unittest_main.main()
