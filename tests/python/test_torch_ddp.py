"""test_torch_ddp.py — the DDP communication hook and GradientSynchronizer
on 2 gloo processes (torch.multiprocessing.spawn, a free port, a deadline
per test so nothing hangs).

  - topk_sync / adtopk_sync: after the hook every gradient equals the
    average of every rank's selection computed independently in torch
    (stable sort, ties to the lower index, own error-feedback residuals);
    the engine's residuals equal the reference's; gradients are identical
    on both ranks.
  - ig with a profile, 30 steps: conservation per parameter
    (sum over ranks and steps of local gradients = P * sum of averaged
    results + sum over ranks of residuals), parameters identical across
    ranks after every step, and the hook's byte statistics equal a C
    engine's (self communicator, same layout/profile/config) step by step.
  - GradientSynchronizer in a manual loop = the DDP hook, bit for bit.
  - state_dict()/load_state_dict() and pickling mid-run: the continued run
    equals the uninterrupted one bit for bit.
  - non-finite gradients on one rank: every rank skips, residuals unchanged.
  - errors across ranks (config or profile differing on one rank): every
    rank raises, none hangs.
  - a parameter resized, replaced or cast to another dtype after attaching,
    on one rank only (also during warm-up): MismatchError on every rank,
    naming the parameter, instead of a heap overflow or a stale tensor.
Run with /usr/bin/python3 (torch 1.13); IGRAD_LIBRARY points at the built
libigrad (set by CTest).
"""
import io
import os
import pickle
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402

# Small buckets, so that DDP splits the tiny model into several.
BUCKET_MB = 0.004


def make_ddp(seed=0, gav=False, **state_kw):
    model = H.TinyLlama(seed=seed)
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB, gradient_as_bucket_view=gav)
    state = it.IgradState(ddp, **state_kw)
    ddp.register_comm_hook(state, it.hook)
    return model, ddp, state


def make_profile(model):
    """A deterministic profile for the model: synthetic activities whose
    fixed:0.5 split marks half the components important."""
    layout = it.layout_from_module(model)
    trace = igrad.Trace.create(layout, "adtopk", 0.125)
    comps = layout.components()
    for s in range(6):
        for t in range(len(layout)):
            info = layout.tensor(t)
            c = info["component"]
            if c < 0:
                continue
            # Activity decreasing with the component index, with a per-step wobble.
            act = (len(comps) - c) * (1.0 + 0.1 * ((s + c) % 3))
            trace.record(s, t, act * act * info["count"] / comps[c]["tensors"], 1)
    return igrad.build_profile(trace, method="fixed:0.5")


def all_equal_across_ranks(t):
    out = H.gather_flat(t)
    return all(torch.equal(out[0], o) for o in out[1:])


flat_params = H.flat_params


def maxdiff(a, b):
    return float((a.double() - b.double()).abs().max())


# ---------------------------------------------------------------------------
# workers (module level: spawn pickles them by name)
# ---------------------------------------------------------------------------

def w_sync_reference(rank, world):
    density = 0.125
    for method, sp, coll, gav in (("topk_sync", "topk", "auto", False),
                                  ("adtopk_sync", "adtopk", "gather", True),
                                  ("topk_sync", "topk", "reduce", False)):
        model, ddp, state = make_ddp(method=method, density=density, collective=coll, gav=gav)
        ref = H.TinyLlama()
        names = [n for n, _ in ref.named_parameters()]
        res = {r: {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
               for r in range(world)}
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(6):
            total = {n: torch.zeros_like(p) for n, p in ref.named_parameters()}
            for r in range(world):
                ref.zero_grad()
                ref(*H.batch(r, step)).backward()
                for n, p in ref.named_parameters():
                    s, res[r][n] = H.ref_select(p.grad, res[r][n], sp, density)
                    total[n] += s
            ddp.zero_grad()
            ddp(*H.batch(rank, step)).backward()
            got = dict(model.named_parameters())
            for n in names:
                want = total[n] / world
                d = maxdiff(got[n].grad, want)
                assert d <= 1e-7, "%s %s step %d: %s grad differs from the torch reference " \
                    "by %g" % (method, coll, step, n, d)
                assert all_equal_across_ranks(got[n].grad), "%s: %s differs across ranks" % (
                    method, n)
            held = it.state_residuals(state.state_dict())  # read from its state file
            for n in names:
                d = maxdiff(held[n], res[rank][n])
                assert d <= 1e-7, "%s step %d: residual of %s differs by %g" % (method, step,
                                                                                n, d)
            assert state.last_stats["skipped"] == 0
            opt.step()
            with torch.no_grad():
                for p, q in zip(model.parameters(), ref.parameters()):
                    q.copy_(p)


def w_ig_conservation(rank, world):
    model, ddp, state = None, None, None
    profile = make_profile(H.TinyLlama())
    model, ddp, state = make_ddp(profile=profile, method="ig", density=0.125,
                                 collective="gather", buckets=3, release_period=4,
                                 release_keep=0.5)
    # The C engine on one rank, same layout/profile/config: its byte statistics
    # are a function of the plan and step only.
    layout = it.layout_from_module(model)
    cfg = dict(state.config)
    c_engine = igrad.Engine(layout, profile, igrad.make_config(**cfg), igrad.Comm.self_())
    c_grads = [torch.zeros(p.numel()) for p in model.parameters()]
    ref = H.TinyLlama()
    sum_local = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    sum_avg = {n: torch.zeros_like(p, dtype=torch.float64) for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    deferred_seen = 0
    for step in range(30):
        with torch.no_grad():
            for p, q in zip(model.parameters(), ref.parameters()):
                q.copy_(p)
        ref.zero_grad()
        ref(*H.batch(rank, step)).backward()
        for n, q in ref.named_parameters():
            sum_local[n] += q.grad.double()
        ddp.zero_grad()
        ddp(*H.batch(rank, step)).backward()
        for n, p in model.named_parameters():
            sum_avg[n] += p.grad.double()
        st = state.last_stats
        assert st["skipped"] == 0 and st["step"] == step, st
        c_engine.sync(step, [g.data_ptr() for g in c_grads])
        cs = c_engine.stats()
        for key in ("payload_nbytes", "tensors_sent", "entries_sent", "deferred_components",
                    "released_components", "bucket_count", "bucket_loads", "gather_buckets"):
            assert st[key] == cs[key], "step %d: hook %s = %r, C engine %r" % (
                step, key, st[key], cs[key])
        assert st["payload_nbytes"] == c_engine.predict_payload(step)
        assert st["wire_nbytes"] == (world - 1) * st["payload_nbytes"], st
        deferred_seen += st["deferred_components"]
        opt.step()
        assert all_equal_across_ranks(flat_params(model)), "step %d: parameters differ " \
            "across ranks" % step
    assert deferred_seen > 0, "the profile deferred nothing: the test would prove nothing"
    res = state.residuals()
    for n, p in model.named_parameters():
        lhs = sum_local[n].clone()
        dist.all_reduce(lhs)
        e = res[n].double()
        dist.all_reduce(e)
        rhs = world * sum_avg[n] + e
        scale = max(1.0, float(lhs.abs().max()))
        d = maxdiff(lhs, rhs)
        assert d <= 2e-5 * scale, "%s: sum of gradients %g off from sent + residual" % (n, d)


def w_synchronizer_vs_hook(rank, world):
    profile = make_profile(H.TinyLlama())
    kw = dict(profile=profile, method="ig", density=0.125, buckets=2, start_iter=2)
    model_a, ddp, state_a = make_ddp(gav=True, **kw)  # .grad are views of the buckets
    model_b = H.TinyLlama()
    sync = it.GradientSynchronizer(model_b.named_parameters(), it.IgradState(**kw))
    opt_a = torch.optim.SGD(model_a.parameters(), lr=0.3, momentum=0.9)
    opt_b = torch.optim.SGD(model_b.parameters(), lr=0.3, momentum=0.9)
    for step in range(10):
        ddp.zero_grad()
        ddp(*H.batch(rank, step)).backward()
        opt_b.zero_grad()
        model_b(*H.batch(rank, step)).backward()
        local = [p.grad.clone() for p in model_b.parameters()]
        stats = sync.synchronize(step)
        assert stats["step"] == step and stats["skipped"] == 0
        # start_iter: the first steps are plain all-reduces, then igrad
        assert ("warmup" in stats) == (step < 2) == ("warmup" in state_a.last_stats), stats
        if step < 2:  # the engine's warm-up is the plain average, bit for bit
            for (n, p), g in zip(model_b.named_parameters(), local):
                dist.all_reduce(g)
                assert torch.equal(p.grad, g / world), "warm-up step %d: %s" % (step, n)
        for (n, a), b in zip(model_a.named_parameters(), model_b.parameters()):
            assert torch.equal(a.grad, b.grad), "step %d: %s: hook and synchronizer differ " \
                "by %g" % (step, n, maxdiff(a.grad, b.grad))
        opt_a.step()
        opt_b.step()


def _train(ddp, opt, rank, steps):
    for step in steps:
        ddp.zero_grad()
        ddp(*H.batch(rank, step)).backward()
        opt.step()


def w_state_roundtrip(rank, world):
    profile = make_profile(H.TinyLlama())
    kw = dict(profile=profile, method="ig", density=0.125, pack="risk", buckets=3)
    # uninterrupted
    model, ddp, state = make_ddp(**kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    _train(ddp, opt, rank, range(10))
    want = flat_params(model)

    # 5 steps, checkpoint through torch.save, a fresh process state, 5 more
    model, ddp, state = make_ddp(**kw)
    opt = torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.9)
    _train(ddp, opt, rank, range(5))
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                "igrad": state.state_dict()}, buf)
    pickled = pickle.dumps(state)
    assert state.state_dict()["iter"] == 5
    buf.seek(0)
    ck = torch.load(buf)
    model2, ddp2, state2 = make_ddp(seed=7, **kw)  # other init: everything comes from ck
    model2.load_state_dict(ck["model"])
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.3, momentum=0.9)
    opt2.load_state_dict(ck["opt"])
    state2.load_state_dict(ck["igrad"])
    _train(ddp2, opt2, rank, range(5, 10))
    got = flat_params(model2)
    assert torch.equal(got, want), "resumed run differs from the uninterrupted one by %g" % (
        maxdiff(got, want))

    # the same through pickling the state itself (PowerSGD convention)
    state3 = pickle.loads(pickled)
    assert state3.process_group is None and state3.iter == 5
    model3 = H.TinyLlama(seed=9)
    model3.load_state_dict(ck["model"])
    ddp3 = DDP(model3, bucket_cap_mb=BUCKET_MB)
    state3.attach(ddp3)
    ddp3.register_comm_hook(state3, it.hook)
    opt3 = torch.optim.SGD(model3.parameters(), lr=0.3, momentum=0.9)
    opt3.load_state_dict(ck["opt"])
    _train(ddp3, opt3, rank, range(5, 10))
    got = flat_params(model3)
    assert torch.equal(got, want), "run resumed from a pickled state differs by %g" % (
        maxdiff(got, want))

    # per-rank files (state.save / state.load)
    with tempfile.TemporaryDirectory() as d:
        path = state2.save(os.path.join(d, "igrad.bin"))
        assert path.endswith(".rank%d.bin" % rank), path
        loaded = state3.load(os.path.join(d, "igrad.bin"))
        assert loaded == path and state3.iter == state2.iter
        r2, r3 = state2.residuals(), state3.residuals()
        assert r2 and r2.keys() == r3.keys()
        for n in r2:
            assert torch.equal(r2[n], r3[n]), n

    # wrong checkpoints: another config, an unknown parameter name
    bad = dict(ck["igrad"])
    bad["config"] = dict(bad["config"], density=0.5)
    try:
        state2.load_state_dict(bad)
        raise AssertionError("a state_dict of another density was accepted")
    except igrad.MismatchError as e:
        assert "density" in str(e), e
    bad = dict(ck["igrad"])
    # (a dict saved when residuals were kept as tensors too names them there)
    bad["residuals"] = {"model.layers.9.mlp.up_proj.weight": torch.zeros(1)}
    try:
        state2.load_state_dict(bad)
        raise AssertionError("a state_dict with an unknown parameter was accepted")
    except igrad.InvalidArgumentError as e:
        assert "model.layers.9.mlp.up_proj.weight" in str(e), e


def w_nonfinite(rank, world):
    model, ddp, state = make_ddp(method="adtopk_sync", density=0.125)
    for step in range(5):
        ddp.zero_grad()
        loss = ddp(*H.batch(rank, step))
        if step == 2 and rank == 1:
            loss = loss * float("inf")  # an AMP-style overflow on one rank only
        before = state.residuals() if step == 2 else None
        loss.backward()
        st = state.last_stats
        if step == 2:
            assert st["skipped"] == 1 and state.skipped_steps == 1, st
            assert "non-finite" in st["reason"] or "overflow" in st["reason"], st
            after = state.residuals()
            for n in before:
                assert torch.equal(before[n], after[n]), "residual %s changed" % n
            # every rank sees the overflow (DDP's default all-reduce result)
            assert not all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
        else:
            assert st["skipped"] == 0, st
            assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    assert state.iter == 5


def w_errors(rank, world):
    # a config differing on one rank: every rank raises, none hangs
    model = H.TinyLlama()
    state = it.IgradState(method="topk_sync", density=0.125 if rank == 0 else 0.25)
    sync = it.GradientSynchronizer(model.named_parameters(), state)
    model(*H.batch(rank, 0)).backward()
    try:
        sync.synchronize(0)
        raise AssertionError("ranks with different densities were not refused")
    except igrad.MismatchError as e:
        assert "density" in str(e), e

    # a profile made for another model on rank 1 only: both ranks fail
    with tempfile.TemporaryDirectory() as d:
        other = H.TinyLlama(dim=8, hidden=24) if rank == 1 else H.TinyLlama()
        path = os.path.join(d, "p.json")
        make_profile(other).save_json(path)
        state = it.IgradState(profile=path, method="ig", density=0.125)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        try:
            sync.synchronize(0)
            raise AssertionError("a profile of another model was accepted")
        except igrad.MismatchError as e:
            assert ("another rank" in str(e)) if rank == 0 else ("p.json" in str(e)), e

    # a state_dict loaded on rank 0 only: every rank refuses instead of hanging
    state = it.IgradState(method="topk_sync", density=0.125)
    sync = it.GradientSynchronizer(model.named_parameters(), state)
    sync.synchronize(0)
    sd = state.state_dict()
    state = it.IgradState(method="topk_sync", density=0.125)
    sync = it.GradientSynchronizer(model.named_parameters(), state)
    if rank == 0:
        state.load_state_dict(sd)
    try:
        sync.synchronize(1)
        raise AssertionError("a state_dict loaded on one rank only was accepted")
    except igrad.StateError as e:
        assert "some ranks" in str(e), e

    # the same through DDP: the exception leaves backward() on every rank
    model = H.TinyLlama()
    ddp = DDP(model, bucket_cap_mb=BUCKET_MB)
    state = it.IgradState(ddp, method="topk_sync", density=0.125,
                          buckets=2 if rank == 0 else 3)
    ddp.register_comm_hook(state, it.hook)
    try:
        ddp(*H.batch(rank, 0)).backward()
        raise AssertionError("ranks with different bucket counts were not refused")
    except (igrad.IgradError, RuntimeError) as e:
        assert "buckets" in str(e), e


def _expect_refusal(rank, step_fn, local_words, what):
    """step_fn() must raise MismatchError on every rank: on rank 1 (the
    one whose model changed) with all of local_words in the message, on
    rank 0 naming rank 1's refusal."""
    try:
        step_fn()
    except igrad.MismatchError as e:
        msg = str(e)
        words = local_words if rank == 1 else ["rank 1 refused", local_words[0]]
        for w in words:
            assert w in msg, "%s, rank %d: %r not in %r" % (what, rank, w, msg)
        return
    raise AssertionError("%s on rank 1 only: rank %d raised nothing" % (what, rank))


def _small_batch(rank, step):
    x, y = H.batch(rank, step)
    return x % 16, y  # tokens of a 16-row embedding


def w_resized_on_one_rank(rank, world):
    # Resized on rank 1 only after two good steps (p.data = smaller): the
    # C engine would read 512 floats from a 256-float gradient there.
    model = H.TinyLlama()
    sync = it.GradientSynchronizer(model.named_parameters(),
                                   it.IgradState(method="topk_sync", density=0.125))
    for step in range(2):
        model.zero_grad()
        model(*_small_batch(rank, step)).backward()
        sync.synchronize(step)
    emb = model.model.embed_tokens.weight
    if rank == 1:
        emb.data = emb.data[:16].clone()
        emb.grad = None
    model.zero_grad()
    model(*_small_batch(rank, 2)).backward()
    _expect_refusal(rank, lambda: sync.synchronize(2),
                    ["model.embed_tokens.weight", "256 entries, the layout 512", "resized"],
                    "resize")


def w_resized_in_warmup_on_one_rank(rank, world):
    # The same during the warm-up steps (plain all-reduces, no engine).
    model = H.TinyLlama()
    sync = it.GradientSynchronizer(model, it.IgradState(method="topk_sync", density=0.125,
                                                        start_iter=5))
    if rank == 1:
        model.lm_head.weight.data = model.lm_head.weight.data[:, :8].clone()
    _expect_refusal(rank, lambda: sync.synchronize(0),
                    ["lm_head.weight", "256 entries, the layout 512", "resized"],
                    "resize in warm-up")


def w_replaced_on_one_rank(rank, world):
    # Replaced on rank 1 (the resize_token_embeddings pattern: a new
    # embedding module of the same shape): the old code synchronized the
    # stale tensor without a word.
    model = H.TinyLlama()
    sync = it.GradientSynchronizer(model.named_parameters(),
                                   it.IgradState(method="adtopk_sync", density=0.125))
    model(*H.batch(rank, 0)).backward()
    sync.synchronize(0)
    if rank == 1:
        model.model.embed_tokens = torch.nn.Embedding(32, 16)
    model.zero_grad()
    model(*H.batch(rank, 1)).backward()
    _expect_refusal(rank, lambda: sync.synchronize(1),
                    ["model.embed_tokens.weight", "was replaced after the state was attached"],
                    "replace")


def w_dtype_changed_on_one_rank(rank, world):
    # Another dtype on rank 1 (model.double() keeps the Parameter objects).
    # After a first step, so that the engine exists (its setup agreement
    # would catch a dtype differing before it).
    model = H.TinyLlama()
    sync = it.GradientSynchronizer(model.named_parameters(),
                                   it.IgradState(method="topk_sync", density=0.125))
    model(*H.batch(rank, 0)).backward()
    sync.synchronize(0)
    if rank == 1:
        model.double()
    model.zero_grad()
    _expect_refusal(rank, lambda: sync.synchronize(1),
                    ["model.embed_tokens.weight", "is float64, it was float32"], "dtype")


def w_hook_refusal_on_one_rank(rank, world):
    # In the DDP hook, a failure found before the engine runs (here: rank 1's
    # state was re-attached to another model of the same shapes, so DDP's
    # buckets hold parameters it does not know) used to raise on that rank
    # only, leaving rank 0 in the step's collectives until gloo's timeout.
    model, ddp, state = make_ddp(method="topk_sync", density=0.125)
    ddp(*H.batch(rank, 0)).backward()
    if rank == 1:
        state.attach(H.TinyLlama())
    try:
        ddp(*H.batch(rank, 1)).backward()
    except (igrad.MismatchError, RuntimeError) as e:
        msg = str(e)
        want = "not in this state's model" if rank == 1 else "rank 1 refused"
        assert want in msg and "MismatchError" in type(e).__name__ + msg, (rank, msg)
        return
    raise AssertionError("rank %d: the hook's refusal on rank 1 raised nothing here" % rank)


class DDPHook(unittest.TestCase):
    def test_sync_methods_match_torch_reference(self):
        H.spawn(w_sync_reference)

    def test_ig_conservation_agreement_and_bytes(self):
        H.spawn(w_ig_conservation)

    def test_synchronizer_equals_hook(self):
        H.spawn(w_synchronizer_vs_hook)

    def test_state_dict_roundtrip(self):
        H.spawn(w_state_roundtrip)

    def test_nonfinite_step_is_skipped_everywhere(self):
        H.spawn(w_nonfinite)

    def test_errors_raise_on_every_rank(self):
        H.spawn(w_errors)

    # A parameter changed after attaching, on rank 1 only: every rank raises.
    def test_resized_parameter_fails_every_rank(self):
        H.spawn(w_resized_on_one_rank)

    def test_resized_parameter_in_warmup_fails_every_rank(self):
        H.spawn(w_resized_in_warmup_on_one_rank)

    def test_replaced_parameter_fails_every_rank(self):
        H.spawn(w_replaced_on_one_rank)

    def test_dtype_change_fails_every_rank(self):
        H.spawn(w_dtype_changed_on_one_rank)

    def test_hook_refusal_on_one_rank_fails_every_rank(self):
        H.spawn(w_hook_refusal_on_one_rank, deadline_s=90)


if __name__ == "__main__":
    unittest_main.main()
