"""igrad.torch.profiler — recording the activity trace a profile is built
from (Profiler), and sending a profile to every rank (broadcast_profile).
"""
import os
import tempfile
import warnings

import torch
import torch.distributed as dist

from .. import _lib as L
from ..core import Config, Profile, SelectWorkspace, Trace, select_spec
from .layout import layout_from_module, named_trainable_parameters


def _profile_bytes(profile):
    with tempfile.TemporaryDirectory(prefix="igrad-prof-") as d:
        path = os.path.join(d, "p.json")
        profile.save_json(path)
        with open(path, "rb") as f:
            return f.read()


def _profile_from_bytes(data):
    with tempfile.TemporaryDirectory(prefix="igrad-prof-") as d:
        path = os.path.join(d, "p.json")
        with open(path, "wb") as f:
            f.write(data)
        return Profile.load(path)


def broadcast_profile(profile=None, src=0, group=None):
    """The importance profile of rank `src`, on every rank of the process
    group, sent over the group itself (no shared filesystem needed).
    Collective: every rank of `group` (None = the default group) calls it;
    `profile` is read on `src` (a rank of `group`) only: a Profile or the
    path of a profile JSON (igrad profile --out, build_profile(out=...)).
    Returns a Profile whose JSON equals src's byte for byte; pass it as
    IgradState(profile=...). An error on src (no profile, an unreadable
    file) is raised on every rank, so no rank is left waiting. Works on any
    backend torch.distributed.broadcast_object_list supports (gloo; NCCL
    with torch.cuda.set_device called)."""
    rank = dist.get_rank(group)
    global_src = src
    if group is not None:  # broadcast_object_list takes the global rank
        to_global = getattr(dist, "get_global_rank", None) or \
            dist.distributed_c10d._get_global_rank  # torch < 2.0
        global_src = to_global(group, src)
    msg = [None]
    if rank == src:
        try:
            if profile is None:
                raise L.InvalidArgumentError("broadcast_profile: rank %d (src) was given no "
                                             "profile" % src)
            if isinstance(profile, (str, bytes, os.PathLike)):
                profile = Profile.load(os.fspath(profile))
            msg[0] = ("ok", _profile_bytes(profile))
        except L.IgradError as e:
            msg[0] = ("error", type(e).__name__, e.message)
    dist.broadcast_object_list(msg, src=global_src, group=group)
    if msg[0][0] == "error":
        cls = getattr(L, msg[0][1], L.IgradError)
        raise cls("broadcast_profile on rank %d (src): %s" % (src, msg[0][2]))
    return _profile_from_bytes(msg[0][1])



class Profiler:
    """Records the activity trace of a run for building a profile.

        prof = Profiler(model, sparsifier="adtopk", density=0.01)
        for step ...: loss.backward(); prof.step(); optimizer.step(); ...
        prof.save("trace.csv")            # then igrad profile, or:
        profile = prof.build_profile(window=(20, None), out="profile.json")

    What it records: at each step(), for every trainable tensor inside a
    Transformer block, the sparsifier's selection of a = grad + e (the same
    C selection as the engine, ties to the lower index), where e is the
    Profiler's own error-feedback residual: the residual the sparsified
    *_sync run would have if its synchronized gradient equalled this
    .grad. The trace gets the selection's sum of squares and count per
    component (activity = sqrt(sum v^2) / sqrt(n_c)). Tensors that map to
    no component (OTHER) are skipped; when none maps, build_profile()
    raises naming that cause. Call it after the gradients are final (after DDP's
    averaging, or after GradientSynchronizer); every rank records the same
    values under DDP, so saving on rank 0 is enough.

    The residuals live on the CPU in float32 (one copy of the trainable
    block parameters). name_map: the user name rules of the run the profile
    is for (IgradState's name_map=; a profile is tied to the layout's
    components). Tensors inside blocks that no rule maps are named in a
    UserWarning: they get no trace rows. dense_below: as IgradState's (the
    run's; default 64): a tensor of fewer entries is selected whole, as the
    engine sends it."""

    def __init__(self, model, sparsifier="adtopk", density=0.01, interleave=False,
                 name_map=None, dense_below=None):
        self.named = named_trainable_parameters(model)
        self.layout = layout_from_module(self.named, name_map=name_map)
        report = self.layout.unmapped_report()
        if report:
            warnings.warn("igrad: " + report, stacklevel=2)
        self.sparsifier, self.density, self.interleave = sparsifier, density, interleave
        self.dense_below = int(Config.dense_below if dense_below is None else dense_below)
        self.trace = Trace.create(self.layout, sparsifier, density)
        self._ws = SelectWorkspace()
        self._tensors = []
        for t, (n, p) in enumerate(self.named):
            if self.layout.tensor(t)["component"] < 0:
                continue
            self._tensors.append((t, n, p, torch.zeros(p.numel(), dtype=torch.float32)))
        self._specs = {}
        self.steps = 0

    def _spec(self, t, shape, step):
        key = (t, bool(self.interleave) and step % 2 == 1)
        if key not in self._specs:
            numel = 1
            for d in shape:
                numel *= int(d)
            sp = "none" if numel < self.dense_below else self.sparsifier  # engine.c's rule
            self._specs[key] = select_spec(sp, self.density, shape, step, self.interleave)
        return self._specs[key]

    def step(self, step=None):
        """Records the current gradients as trace step `step` (default: the
        number of steps recorded so far). Parameters without .grad record
        nothing (activity 0)."""
        step = self.steps if step is None else int(step)
        for t, name, p, res in self._tensors:
            if p.grad is None:
                continue
            if p.grad.numel() != res.numel():  # the C selection reads res.numel() entries
                raise L.MismatchError(
                    "Profiler: the gradient of %s has %d entries, %d when the Profiler was "
                    "made (the parameter was resized); make a new Profiler"
                    % (name, p.grad.numel(), res.numel()))
            g = p.grad.detach()
            g = g.to(device="cpu", dtype=torch.float32).contiguous().view(-1)
            spec = self._spec(t, tuple(p.shape), step)
            sel = self._ws.select_ef(g.data_ptr(), res.data_ptr(), spec, name)
            self.trace.record(step, t, sel.sumsq, sel.count)
        self.steps = step + 1

    def save(self, path):
        """Writes the trace CSV (igrad_trace_save)."""
        self.trace.save(os.fspath(path))

    def _no_mapped_tensor(self):
        """The error for a Profiler that traces nothing because no trainable
        tensor maps to a component (its trace has no rows)."""
        names = [n for n, _ in self.named][:3]
        return L.InvalidArgumentError(
            "Profiler: no traced tensor mapped to a component: none of the model's %d "
            "trainable tensors (%s%s) maps to one, so the trace has no rows (a custom model, "
            "or PEFT/LoRA names the built-in rules do not know). List them with `igrad "
            "layout --unmapped` or Layout.unmapped(); map them with user rules: "
            "Profiler(name_map=...) and IgradState(name_map=...) (--map FILE for igrad "
            "train)" % (len(self.named), ", ".join(names),
                        ", ..." if len(self.named) > len(names) else ""))

    def build_profile(self, window=None, method="knee", alpha=0.7, out=None, csv=None):
        """The profile of the trace recorded so far (see igrad.build_profile).
        Raises InvalidArgumentError naming the cause when no trainable
        tensor maps to a component (nothing could be traced)."""
        if not self._tensors:
            raise self._no_mapped_tensor()
        from ..profile import build_profile
        return build_profile(self.trace, window=window, method=method, alpha=alpha, out=out,
                             csv=csv)
