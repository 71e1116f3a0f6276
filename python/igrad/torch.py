"""igrad.torch — PyTorch integration of libigrad.

    layout_from_module(model)          Layout of the trainable parameters
    TorchComm(group)                   igrad communicator over torch.distributed
    IgradState(model, profile=..., method="ig", ...)
    hook(state, bucket)                DDP communication hook
                                       (ddp.register_comm_hook(state, hook))
    GradientSynchronizer(named_parameters, state).synchronize(step)
                                       loops without DDP, DeepSpeed-style engines
    UpdateSynchronizer(model, optimizer, state).step()
                                       error feedback on the optimizer's update:
                                       a local optimizer step, the update synced
    Profiler(model, sparsifier="adtopk", density=0.01)
                                       records the activity trace of a run
    broadcast_profile(profile, src=0)  rank src's profile on every rank, sent
                                       over the process group
    state_residuals(state_dict)        the residuals held by a state_dict's
                                       engine state, by parameter name

How the DDP hook runs one step. DDP calls the hook once per gradient
bucket, in bucket order, and waits for the returned futures only when
backward has finished (Reducer::finalize_backward). The hook therefore
collects the buckets, returning a pending future for each, and when the
last bucket arrives (bucket.is_last()) runs one engine step over the whole
model: engine.begin (agreement, error feedback, selection, packing),
the step's collectives through torch.distributed on the process group,
engine.end (the average of every rank's selections, written in place into
the gradients, which are views of the bucket buffers), then completes every
future with its bucket's buffer. With IgradState(overlap=True) the same
step is streamed instead: the first bucket opens it, every bucket's
parameters are handed to engine.ready as the bucket arrives, the igrad
buckets it returns are issued at once, and the last bucket waits them and
closes the step (see IgradState._stream_bucket). One step over the whole model is what the
C trainer runs, so selection, release schedule, bucket packing and byte
statistics are exactly the C engine's for the same layout, profile and
config, whatever DDP's bucketing. Parameters are identified by name (a
{parameter: name} map built once from named_parameters()), never by bucket
index, because DDP rebuilds its buckets after the first iteration.

Values are averaged by the engine: DDP does not divide the hook's result
by the world size.

Non-finite gradients (AMP overflow): the engine agrees over the ranks that
the step is skipped and leaves every residual unchanged; the hook then
returns the buckets as DDP's default all-reduce would (nonfinite=
"allreduce", the default), so every rank sees the overflow and GradScaler
skips the step on all ranks alike; with nonfinite="keep" each rank's
local, unmodified gradients are returned. Either way the skip is in
state.last_stats["skipped"] and state.skipped_steps.

AMP loss scales: with IgradState(grad_scaler=scaler) the engine is given
every gradient divided by the current scale (scaler.get_scale(), or the
callable's value), so residuals hold unscaled values whatever the scale
does between steps, and the result is multiplied by the scale again:
.grad stays scaled, as torch.cuda.amp.GradScaler expects (scaler.step
unscales it and skips steps with Inf/NaN). Without grad_scaler, scaled
gradients go in as they are, and a residual kept from a step with another
scale would be added at the wrong scale.

Parameters are fixed when the state is attached: every step checks each
parameter's size, dtype and identity (and its gradient's size) against
that, and a change on any rank raises MismatchError on every rank (see
IgradState._check_step). Identity needs the module: the model, a DDP
wrapper or an unstarted named_parameters() generator of it.

Not here: the C-level objects (igrad/core.py) and library loading
(igrad/_lib.py).
"""
import array
import ctypes
import logging
import math
import operator
import os
import re
import struct
import sys
import tempfile
import time
import warnings

try:
    import torch
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "igrad.torch needs PyTorch, which this interpreter (%s) cannot import. The rest of "
        "igrad works without it. On Debian, PyTorch is the python3-torch package of "
        "/usr/bin/python3: run with /usr/bin/python3, or from a venv made with "
        "`/usr/bin/python3 -m venv --system-site-packages`" % sys.executable,
        name="torch") from None
import torch.distributed as dist

from . import _lib as L
from .core import (CONFIG_DEFAULTS, Comm, Engine, Layout, NameMap, Profile, SelectWorkspace,
                   Trace, config_to_dict, make_config, select_spec, target_fit)

_DTYPE_OF = operator.attrgetter("dtype")

__all__ = ["layout_from_module", "named_trainable_parameters", "TorchComm", "IgradState",
           "hook", "GradientSynchronizer", "Profiler", "broadcast_profile", "state_residuals"]

_TORCH_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                 torch.float64: "F64"}
for _t, _n in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):  # torch >= 2.1
    if hasattr(torch, _t):
        _TORCH_DTYPES[getattr(torch, _t)] = _n


# ---------------------------------------------------------------------------
# Parameters and layout
# ---------------------------------------------------------------------------

def _strip_prefix(name):
    # DistributedDataParallel (and DataParallel) wrap the model as `.module`.
    return name[len("module."):] if name.startswith("module.") else name


def _trainable(model):
    """(root, [(name, path, parameter)]): the parameters that require grad
    in named_parameters() order (tied weights once), `name` without a DDP
    "module." prefix, `path` the name relative to `root`, the Module they
    were read from. root is None when it is unknown (an iterable of pairs
    that is not the generator of a Module's named_parameters())."""
    root, prefix = None, ""
    if hasattr(model, "named_parameters"):
        root, items = model, model.named_parameters()
    else:
        items = model
        # A named_parameters() generator that has not started yet holds its
        # module and prefix as the frame's arguments (CPython and PyPy
        # expose them): with them a replaced parameter can be noticed even
        # when the caller passed model.named_parameters().
        frame = getattr(model, "gi_frame", None)
        f_locals = frame.f_locals if frame is not None else {}
        if isinstance(f_locals.get("self"), torch.nn.Module):
            root, prefix = f_locals["self"], f_locals.get("prefix") or ""
            prefix = prefix + "." if prefix else ""
    out, seen = [], set()
    for name, p in items:
        if not p.requires_grad or id(p) in seen:  # tied weights count once
            continue
        seen.add(id(p))
        path = name[len(prefix):] if root is not None and name.startswith(prefix) else None
        if path is None:
            root = None
        out.append((_strip_prefix(name), path, p))
    return root, out


def named_trainable_parameters(model):
    """[(name, parameter)] of the parameters that require grad, in
    named_parameters() order, with a DDP "module." prefix removed. `model`
    is a Module (DDP or not) or an iterable of (name, parameter)."""
    return [(n, p) for n, _, p in _trainable(model)[1]]


class _ParamSlots:
    """Where each attached parameter sits in its module tree, to notice
    cheaply when one is replaced after attaching (model.set_input_embeddings
    (new), resize_token_embeddings, module.weight = nn.Parameter(...)): the
    state would otherwise go on synchronizing the old tensor. Every link
    from the root to a parameter is kept as (dict, key, object), the dict
    being a module's _modules or _parameters, so one pass of identity tests
    checks all of them. Only dicts and child objects are held, never the
    root itself (DDP holds the state through its comm hook: no cycle)."""

    def __init__(self, root, paths):
        links = {}
        self.paths = []
        for path, p in paths:
            parts = path.split(".")
            owner = root
            for part in parts[:-1]:
                child = owner._modules[part]
                links.setdefault((id(owner._modules), part), (owner._modules, part, child))
                owner = child
            if owner._parameters.get(parts[-1]) is not p:
                raise KeyError(path)
            links.setdefault((id(owner._parameters), parts[-1]),
                             (owner._parameters, parts[-1], p))
            self.paths.append(parts)
        self.root_modules, self.root_params = root._modules, root._parameters
        self.dicts = [d for d, _, _ in links.values()]
        self.keys = [k for _, k, _ in links.values()]
        self.objs = [o for _, _, o in links.values()]

    def intact(self):
        return all(map(operator.is_, map(dict.get, self.dicts, self.keys), self.objs))

    def current(self, t):
        """The tensor the model now has at parameter t's place (None if
        the place is gone)."""
        parts = self.paths[t]
        modules, params = self.root_modules, self.root_params
        for part in parts[:-1]:
            m = modules.get(part)
            if m is None:
                return None
            modules, params = m._modules, m._parameters
        return params.get(parts[-1])


def layout_from_module(model, name_map=None):
    """The igrad Layout of a model's trainable parameters (names and shapes
    from named_parameters(), only those that require grad; a DDP "module."
    prefix is stripped). Tensors of more than 4 dimensions keep their first
    dimension and fold the rest (rows of a row-wise selection). name_map:
    user name rules tried before the built-in ones (igrad.NameMap: a list
    of (pattern, kind, layer) or a map file's path)."""
    return Layout.from_tensors([(n, tuple(p.shape) if p.dim() else (), _TORCH_DTYPES.get(
        p.dtype, "F32")) for n, p in named_trainable_parameters(model)], name_map=name_map)


def _name_map_spec(name_map):
    """name_map= as kept by IgradState (picklable): None, a path string or a
    list of (pattern string, kind, layer)."""
    if name_map is None or isinstance(name_map, str):
        return name_map
    if isinstance(name_map, os.PathLike):
        return os.fspath(name_map)
    if isinstance(name_map, NameMap):
        raise L.InvalidArgumentError("name_map: give IgradState the rules (a list of "
                                     "(pattern, kind, layer)) or a map file's path, not a "
                                     "NameMap (the state must pickle)")
    rules = [tuple(r) if isinstance(r, (list, tuple)) else r for r in name_map]
    rules = [(getattr(r[0], "pattern", r[0]),) + r[1:] if isinstance(r, tuple) and r else r
             for r in rules]
    NameMap.create(rules)  # validates now, not at the first backward
    return rules


# ---------------------------------------------------------------------------
# Raw buffers as tensors
# ---------------------------------------------------------------------------

_CTYPES = {torch.uint8: ctypes.c_uint8, torch.float32: ctypes.c_float,
           torch.float64: ctypes.c_double, torch.int64: ctypes.c_int64}
_DT = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}


def _wrap(addr, count, dtype):
    """A CPU tensor over `count` elements at `addr` (no copy). The memory
    belongs to the library; the tensor must not outlive the call."""
    arr = (_CTYPES[dtype] * count).from_address(addr)
    return torch.frombuffer(arr, dtype=dtype)


# ---------------------------------------------------------------------------
# Communicator over torch.distributed
# ---------------------------------------------------------------------------

def _engine_syncs(config):
    """Whether a step runs whole through eng.sync (the engine's own
    collectives) rather than begin / the group's collectives / end: the
    two-level sync (topology "hier") and the sparse all-reduce (collective
    "sparse_reduce", or "auto" with auto_sparse_reduce, where the engine
    may choose it per step)."""
    if str(config.get("topology", "flat")).lower() == "hier":
        return True
    coll = str(config.get("collective", "auto")).lower()
    return coll == "sparse_reduce" or (coll == "auto"
                                       and bool(config.get("auto_sparse_reduce")))


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    if hasattr(dist, "get_global_rank"):  # 2.x
        return dist.get_global_rank(group, group_rank)
    from torch.distributed import distributed_c10d as c10d  # 1.13
    return c10d._get_global_rank(group, group_rank)


_LOG = logging.getLogger("igrad")

# The per-step statistics stats() averages, and those it reports of the last step.
_OBS_MEANS = ("payload_nbytes", "wire_nbytes", "intra_wire_nbytes", "inter_wire_nbytes",
              "select_ms", "pack_ms", "comm_ms", "unpack_ms", "total_ms")
_OBS_LAST = ("deferred_components", "released_components", "residual_norm")


class _Observed:
    """Sums of the completed steps' statistics (IgradState.stats)."""

    def __init__(self):
        self.steps = 0
        self.sums = {k: 0.0 for k in _OBS_MEANS}
        self.last = {}

    def add(self, st):
        self.steps += 1
        for k in _OBS_MEANS:
            self.sums[k] += float(st.get(k, 0.0))
        self.last = {k: st.get(k) for k in _OBS_LAST}


def _tensorboard_writer(tb):
    """None, a writer (anything with add_scalar(tag, value, step), e.g. a
    torch.utils.tensorboard SummaryWriter), or a log directory for a new
    SummaryWriter (which needs the tensorboard package)."""
    if tb is None or hasattr(tb, "add_scalar"):
        return tb
    if isinstance(tb, (str, os.PathLike)):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:
            raise L.UnsupportedError("tensorboard=%r needs torch.utils.tensorboard, which "
                                     "cannot be imported here (%s): install the tensorboard "
                                     "package, or pass any object with add_scalar(tag, value, "
                                     "step)" % (os.fspath(tb), e)) from None
        return SummaryWriter(os.fspath(tb))
    raise L.InvalidArgumentError("tensorboard is %r (a log directory or an object with "
                                 "add_scalar)" % (tb,))


class TorchComm:
    """Collectives of a torch.distributed process group (gloo, NCCL or any
    other backend), in the form that igrad's custom communicator and the
    engine's two-phase step need: buffers are raw addresses of CPU memory
    owned by the library. With NCCL the bytes are staged through the
    current CUDA device. `comm()` returns the igrad Comm over this object
    (made once)."""

    _OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = dist.get_backend(group)
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if str(backend) == "nccl" else torch.device("cpu"))
        self._comm = None

    def comm(self):
        if self._comm is None:
            self._comm = Comm.custom(self, self.rank, self.size)
        return self._comm

    # Staging for devices other than the CPU: (device tensor, host tensor) pairs
    # whose device result is copied back at wait().
    def _dev(self, t):
        return t if self.device.type == "cpu" else t.to(self.device)

    def _issue_allgather(self, send, nbytes, recv):
        r = _wrap(recv, nbytes * self.size, torch.uint8)
        s = _wrap(send, nbytes, torch.uint8)
        lo, hi = recv, recv + nbytes * self.size
        if lo <= send < hi:  # in place: the input must not alias an output
            s = s.clone()
        rd = self._dev(r)
        work = dist.all_gather(list(rd.split(nbytes)), self._dev(s), group=self.group,
                               async_op=True)
        return (work, rd, r)

    def _issue_allreduce(self, send, recv, count, dtype, op):
        dt = _DT[dtype]
        r = _wrap(recv, count, dt)
        if send != recv:
            r.copy_(_wrap(send, count, dt))
        rd = self._dev(r)
        work = dist.all_reduce(rd, op=self._OPS[op], group=self.group, async_op=True)
        return (work, rd, r)

    def wait(self, handle):
        work, dev, host = handle
        work.wait()
        if dev is not host:
            host.copy_(dev)

    def test(self, handle):
        return handle[0].is_completed()

    # igrad_comm_ops_t callbacks (see core.Comm.custom)
    def allgather(self, send, nbytes, recv):
        self.wait(self._issue_allgather(send, nbytes, recv))

    def allreduce(self, send, recv, count, dtype, op):
        self.wait(self._issue_allreduce(send, recv, count, dtype, op))

    def iallgather(self, send, nbytes, recv):
        return self._issue_allgather(send, nbytes, recv)

    def iallreduce(self, send, recv, count, dtype, op):
        return self._issue_allreduce(send, recv, count, dtype, op)

    def bcast(self, buf, nbytes, root):
        t = _wrap(buf, nbytes, torch.uint8)
        d = self._dev(t)
        dist.broadcast(d, src=_global_rank(self.group, root), group=self.group)
        if d is not t:
            t.copy_(d)

    def barrier(self):
        dist.barrier(group=self.group)

    # The two-level sync (IgradState(topology="hier")): split into nodes,
    # reduce onto a root, broadcast from it.
    def split(self, color, key):
        """The TorchComm of the ranks with the same color (-1: the ranks on
        this host), ordered by key then rank. Collective: every rank of
        this group makes every new group, in the same order."""
        import socket
        mine = (str(color) if color >= 0 else "host:" + socket.gethostname(), int(key),
                self.rank)
        every = [None] * self.size
        dist.all_gather_object(every, mine, group=self.group)
        out = None
        for c in sorted(set(e[0] for e in every)):
            members = sorted((k, r) for cc, k, r in every if cc == c)
            g = dist.new_group([_global_rank(self.group, r) for _, r in members])
            if c == mine[0]:
                out = TorchComm(g)
        return out

    def ireduce(self, send, recv, count, dtype, op, root):
        dt = _DT[dtype]
        if self.rank == root:  # the sum lands in recv; send is only read
            t = _wrap(recv, count, dt)
            t.copy_(_wrap(send, count, dt))
        else:  # a reduce may use its input as scratch: reduce a copy
            t = _wrap(send, count, dt).clone()
        d = self._dev(t)
        work = dist.reduce(d, dst=_global_rank(self.group, root), op=self._OPS[op],
                           group=self.group, async_op=True)
        return (work, d, t if self.rank == root else d)

    def ibcast(self, buf, nbytes, root):
        t = _wrap(buf, nbytes, torch.uint8)
        d = self._dev(t)
        work = dist.broadcast(d, src=_global_rank(self.group, root), group=self.group,
                              async_op=True)
        return (work, d, t)

    # The sparse all-reduce (IgradState(collective="sparse_reduce")).
    def alltoallv(self, send, send_nbytes, send_displs, recv, recv_nbytes, recv_displs):
        """Blocking variable all-to-all of bytes: the block of send_nbytes[j]
        bytes at send + send_displs[j] goes to rank j, rank j's block for
        this rank lands at recv + recv_displs[j] (dist.all_to_all_single
        over packed copies, on the group's device)."""
        def blocks(addr, nbytes, displs):
            end = max((d + n for d, n in zip(displs, nbytes) if n), default=0)
            buf = _wrap(addr, end, torch.uint8) if end else torch.empty(0, dtype=torch.uint8)
            return buf, [buf[d:d + n] for d, n in zip(displs, nbytes)]
        _, sparts = blocks(send, send_nbytes, send_displs)
        _, rparts = blocks(recv, recv_nbytes, recv_displs)
        inp = self._dev(torch.cat(sparts) if sparts else torch.empty(0, dtype=torch.uint8))
        out = torch.empty(sum(recv_nbytes), dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(out, inp, output_split_sizes=list(recv_nbytes),
                               input_split_sizes=list(send_nbytes), group=self.group)
        out = out.cpu()
        off = 0
        for part, n in zip(rparts, recv_nbytes):
            if n:
                part.copy_(out[off:off + n])
            off += n

    def issue(self, b):
        """Starts one engine bucket's collective (igrad.core.BucketDesc);
        returns the handle to wait()."""
        if b.kind == "gather":
            return self._issue_allgather(b.send, b.send_nbytes, b.recv)
        if b.kind == "reduce":
            return self._issue_allreduce(b.recv, b.recv, b.count, "F32", "sum")
        raise L.UnsupportedError("bucket %d: no collective for kind %r" % (b.index, b.kind))

    def run_buckets(self, buckets):
        """Runs an engine step's collectives (igrad.core.BucketDesc list):
        all issued in bucket order, then waited in the same order."""
        handles = [self.issue(b) for b in buckets]
        for h in handles:
            self.wait(h)


class _SelfComm:
    """One process without torch.distributed: the collectives are copies."""

    rank, size = 0, 1

    def __init__(self):
        self._comm = None

    def comm(self):
        if self._comm is None:
            self._comm = Comm.self_()
        return self._comm

    @staticmethod
    def run_buckets(buckets):
        for b in buckets:
            if b.kind == "gather" and b.send != b.recv:
                ctypes.memmove(b.recv, b.send, b.send_nbytes)

    def issue(self, b):
        self.run_buckets([b])

    @staticmethod
    def wait(handle):
        pass


# ---------------------------------------------------------------------------
# State of a synchronized run (DDP hook and GradientSynchronizer)
# ---------------------------------------------------------------------------

_STATE_FORMAT = "igrad.torch.IgradState/1"


class IgradState:
    """State of igrad synchronization for one data-parallel model, shared by
    the DDP hook and GradientSynchronizer (the PowerSGD hook's conventions:
    constructor knobs, `iter`, `start_iter`, picklable without its process
    group).

    model:          the model (DDP-wrapped or not), or an iterable of
                    (name, parameter); may be None and attached later with
                    attach() (GradientSynchronizer does it).
    process_group:  None = the default group (when torch.distributed is not
                    initialized: a single process).
    profile:        path of a profile JSON or a Profile (required for
                    methods "iad" and "ig"); checked against the model's
                    layout (MismatchError for a profile of another model).
                    "auto": no separate profiling run; the engine sends
                    everything for the first `profile_steps` synchronized
                    steps (as the sparsifier's *_sync), builds the profile
                    from what every rank selected and switches to the
                    method (`online_info`, `built_profile()`).
    profile_steps:  the window of profile="auto" (30);
    profile_partition: its partition method (None = "knee").
    reprofile_every, reprofile_margin: with profile="auto", re-profile every
                    N synchronized steps after the switch and move a
                    component to the other class only when its score is
                    beyond the threshold by the margin in two windows in a
                    row (igrad_config_t.reprofile_every; 0 = off, margin
                    0.05); counters in `online_info`.
    method:         "ig" (default), "iad", "topk_sync", "adtopk_sync", "dense".
    sparsifier, density, release_period, release_keep, schedule, pack,
    buckets, verify_every, collective, interleave, residual, block_entries,
    risk_lambda, index_dtype, threads, timeout_s:  the engine's configuration
                    (igrad_config_t; same defaults as IGRAD_CONFIG_INIT).
                    timeout_s bounds igrad's own MPI collectives; over a
                    torch.distributed process group the group's timeout
                    (init_process_group(timeout=...)) bounds each collective
                    instead; one that times out there raises CommError.
    target_ratio:   None (default) or X in (0, 1]: method "ig" chooses the
                    important set and kappa from the profile's scores so
                    that it sends at most X x the sparsifier's *_sync
                    payload (igrad.target_fit; overrides release_keep and
                    re-marks the profile). The choice is in `target_fit`;
                    with profile="auto" the engine makes it when it
                    switches (igrad_config_t.target_ratio).
    gate_other:     True (default): embeddings, lm_head and norms (EMB, HEAD,
                    NORM components) are gated like projections; False: they
                    are sent every step (the behaviour before; an ablation).
    name_map:       user name rules tried before the built-in ones: a map
                    file's path (docs/formats.md) or a list of (pattern,
                    kind, layer) (igrad.NameMap): pattern a POSIX extended
                    regex on the whole name (or "glob:..."), kind "Q", ...,
                    "NORM" or "OTHER", layer "block", None or a capture
                    group >= 1. Tensors inside numbered blocks that no rule
                    maps (OTHER: sent every step, never profiled or
                    deferred) are named once per state in a UserWarning.
    start_iter:     the first `start_iter` steps are plain averaged
                    all-reduces without igrad (warm-up, as in PowerSGD).
    momentum, momentum_masking, residual_decay:  the engine's error-feedback
                    remedies (igrad_config_t; off by default): DGC momentum
                    correction (velocity u = momentum*u + g before error
                    feedback, one more float per parameter; use it with an
                    optimizer without momentum: SGD momentum=0, Adam
                    betas=(0, ...)), momentum factor masking, and residual
                    = residual_decay * (what was not sent). With igrad's
                    sparse methods use Adam/AdamW with betas=(0.0, 0.95) (or
                    0.999): see docs/results/remedies.md.
    value_dtype:    "F32" (default), "BF16" or "F16": the values of gather
                    buckets on the wire (2 bytes instead of 4), each rounded
                    to nearest even with the rounding error kept in the
                    residual (igrad_config_t.value_dtype; not for "dense").
    grad_scaler:    AMP: a torch GradScaler (its get_scale()) or a callable
                    returning the current loss scale S. The gradients DDP
                    or the synchronizer hand over are scaled by S; the
                    engine is given g / S, so residuals are always unscaled
                    and never mix the scales of different steps, and the
                    result is multiplied by S again, so .grad stays scaled
                    as GradScaler's contract wants (scaler.step unscales,
                    finds Inf/NaN and skips). Exact (bit for bit the run
                    with scale 1) for powers of two, which is what
                    GradScaler's default growth and backoff keep. A step
                    with Inf/NaN is skipped by the engine (residuals
                    unchanged) and returned as `nonfinite` says. None: the
                    gradients are taken as they are (1).
    nonfinite:      "allreduce" (default) or "keep": what a skipped
                    (non-finite) step returns, see the module docstring.
    overlap:        True: the DDP hook streams the step (igrad_engine_open/
                    ready/close): each DDP bucket's parameters go to the
                    engine as backward delivers them and each igrad bucket's
                    collective is issued as soon as its tensors are in; the
                    result is bit for bit the default (False) last-bucket
                    step's. last_stats adds "early_buckets" and "close_ms".
    topology:       "flat" (default) or "hier": the two-level sync
                    (igrad_config_t.topology): each tensor is summed onto its
                    owner among the ranks of a node, the owners exchange
                    between nodes, the result is broadcast inside the node.
                    The engine runs these collectives itself over the process
                    group (new_group, reduce, broadcast, all_gather), so the
                    whole step runs at the last bucket (no overlap); iad and
                    ig need a profile given (not "auto").
    ranks_per_node: L: ranks [kL, (k+1)L) of the group form node k; 0
                    (default): the ranks on one host.
    dense_below:    N > 0: parameters of fewer than N entries (biases, norms)
                    are sent whole whenever they are sent, as PowerSGD leaves
                    small tensors uncompressed (config dense_below; default
                    64, chosen by measurement, docs/results/dense_below.md;
                    0 = every tensor through the sparsifier).
    link:           the link collective="auto" prices each bucket with:
                    igrad plan's preset name ("100g", "25g", "nvlink", ...;
                    igrad.link_presets()), "GBITS,LAT_US", or
                    (latency_ns, bandwidth_mbps) (config link_latency_ns,
                    link_bandwidth_mbps; None: latency 0, by bytes alone).
    auto_sparse_reduce: config auto_sparse_reduce: collective "auto" may
                    choose the sparse all-reduce per bucket. It and
                    collective="sparse_reduce" run under the engine's own
                    sync: TorchComm's alltoallv (dist.all_to_all_single)
                    carries it, the whole step runs at the last bucket, as
                    with topology "hier" (no overlap).
    grads_in_place: True (default): when every trainable parameter is
                    bfloat16 (or every one float16), on the CPU, without
                    grad_scaler or overlap, the engine reads and writes the
                    16-bit gradients in place (config grad_dtype; residuals
                    stay float32; the result is the float32 sum rounded once
                    to nearest even), saving the 4 bytes per parameter of a
                    float32 staging copy. Otherwise (a mix of dtypes too),
                    or with False, they go through a float32 copy as before.

    After each step `last_stats` holds the engine's statistics of the step
    (igrad_step_stats_t fields plus "collective_ms", the time of the
    torch.distributed collectives); `total_payload_nbytes` and
    `total_wire_nbytes` accumulate them; `skipped_steps` counts skips."""

    def __init__(self, model=None, process_group=None, profile=None, method="ig",
                 sparsifier="adtopk", density=0.01, release_period=4, release_keep=0.25,
                 schedule="staggered", pack="contiguous", buckets=4, verify_every=100,
                 start_iter=0, collective="auto", interleave=False, residual="on",
                 block_entries=None, risk_lambda=1.0, index_dtype="U16", threads=0,
                 nonfinite="allreduce", timeout_s=300.0, profile_steps=30,
                 profile_partition=None, gate_other=True, target_ratio=None, momentum=0.0,
                 momentum_masking=True, residual_decay=1.0, value_dtype="F32",
                 grad_scaler=None, reprofile_every=0, reprofile_margin=0.05, overlap=False,
                 grads_in_place=True, topology="flat", ranks_per_node=0, log_every=0,
                 tensorboard=None, dense_below=CONFIG_DEFAULTS["dense_below"], name_map=None,
                 link=None,
                 auto_sparse_reduce=False):
        if nonfinite not in ("allreduce", "keep"):
            raise L.InvalidArgumentError("nonfinite is %r (must be 'allreduce' or 'keep')"
                                         % (nonfinite,))
        self.process_group = process_group
        self.config = {
            "method": method, "sparsifier": sparsifier, "density": density,
            "release_period": release_period, "release_keep": release_keep,
            "schedule": schedule, "pack": pack, "buckets": buckets,
            "verify_every": verify_every, "collective": collective,
            "interleave": bool(interleave), "residual": residual,
            "block_entries": block_entries, "risk_lambda": risk_lambda,
            "index_dtype": index_dtype, "threads": threads, "timeout_s": timeout_s,
            "gate_other": bool(gate_other),
            "momentum": momentum, "momentum_masking": bool(momentum_masking),
            "residual_decay": residual_decay, "value_dtype": value_dtype,
            "topology": topology, "ranks_per_node": int(ranks_per_node),
            "dense_below": int(dense_below),
            "auto_sparse_reduce": bool(auto_sparse_reduce),
        }
        if link is not None:
            self.config["link"] = link
        if str(topology).lower() == "hier" and overlap:
            raise L.InvalidArgumentError("topology='hier' runs whole steps with its own "
                                         "collectives: it cannot stream (overlap=False)")
        if _engine_syncs(self.config) and overlap:
            raise L.InvalidArgumentError(
                "collective=%r%s runs whole steps with the engine's own collectives (the "
                "sparse all-reduce's all-to-alls): it cannot stream (overlap=False)"
                % (collective, " with auto_sparse_reduce" if auto_sparse_reduce else ""))
        if isinstance(profile, str) and profile == "auto":
            if str(method).lower() not in ("ig", "iad"):
                raise L.InvalidArgumentError("profile='auto' profiles online for iad and ig; "
                                             "method %r uses no profile" % (method,))
            self.config["profile_steps"] = int(profile_steps)
            self.config["profile_partition"] = profile_partition
            if target_ratio is not None:  # the engine fits it when it switches
                self.config["target_ratio"] = float(target_ratio)
            self.config["reprofile_every"] = int(reprofile_every)
            self.config["reprofile_margin"] = float(reprofile_margin)
        elif reprofile_every:
            raise L.InvalidArgumentError("reprofile_every is %r, but re-profiling follows "
                                         "online profiling (profile='auto')" % (reprofile_every,))
        make_config(**self.config)  # validates now, not at the first backward
        if target_ratio is not None and not (0.0 < float(target_ratio) <= 1.0):
            raise L.InvalidArgumentError("target_ratio is %r (must be in (0, 1])"
                                         % (target_ratio,))
        if grad_scaler is not None and not (callable(grad_scaler)
                                            or callable(getattr(grad_scaler, "get_scale", None))):
            raise L.InvalidArgumentError("grad_scaler is %r (a torch GradScaler, or a callable "
                                         "returning the current loss scale)" % (grad_scaler,))
        self.grad_scaler = grad_scaler
        self.name_map = _name_map_spec(name_map)
        self.target_ratio = None if target_ratio is None else float(target_ratio)
        self.target_fit = None
        self.profile = profile
        self.start_iter = int(start_iter)
        self.nonfinite = nonfinite
        self.overlap = bool(overlap)
        self.grads_in_place = bool(grads_in_place)
        self.log_every = int(log_every)
        if self.log_every < 0:
            raise L.InvalidArgumentError("log_every is %d (must be >= 0; 0 = off)"
                                         % self.log_every)
        self.tensorboard = _tensorboard_writer(tensorboard)
        self._obs = _Observed()
        self.iter = 0
        self.skipped_steps = 0
        self.last_stats = {}
        self.total_payload_nbytes = 0
        self.total_wire_nbytes = 0.0
        self._reset_runtime()
        if model is not None:
            self.attach(model)

    def _reset_runtime(self):
        self._named = None           # [(name, param)] in layout order
        self._meta = None            # [(name, shape, numel, dtype)] when attached
        self._params = None          # [param] in layout order
        self._counts = None          # [numel] when attached
        self._dtypes = None          # [dtype] when attached
        self._slots = None           # _ParamSlots, or None when the module is unknown
        self._param_names = None     # {param: name}
        self._index = None           # {name: layout index}
        self._layout = None
        self._profile_obj = None
        self._coll = None            # TorchComm or _SelfComm
        self._engine = None
        self._pending = []           # DDP buckets waiting for the last one
        self._stream = None          # overlap: the streamed step in progress (a dict)
        self._pending_load = None    # state_dict to apply once the engine exists
        self._trace = None
        self._data_dev = None        # where the engine's gradients live (_data_device)
        self._grad_dt = torch.float32  # the dtype the engine reads (_engine_grad_dtype)

    # -- setup ---------------------------------------------------------------

    def attach(self, model):
        """Binds the state to a model's parameters (names from
        named_parameters(), "module." stripped). Needed again after
        unpickling, as the model is not part of the pickle."""
        root, items = _trainable(model)
        if not items:
            raise L.InvalidArgumentError("the model has no parameter that requires grad")
        meta = [(n, tuple(p.shape), p.numel(), p.dtype) for n, _, p in items]
        if self._meta is not None:
            if [m[:2] for m in self._meta] != [m[:2] for m in meta]:
                raise L.MismatchError("attach(): the model's parameters differ from the ones "
                                      "this state was built for")
        named = [(n, p) for n, _, p in items]
        self._named = named
        self._meta = meta
        self._params = [p for _, p in named]
        self._data_dev = None
        self._counts = [m[2] for m in meta]
        self._dtypes = [m[3] for m in meta]
        self._slots = None
        if root is not None:
            try:
                self._slots = _ParamSlots(root, [(path, p) for _, path, p in items])
            except (KeyError, AttributeError):  # not a plain module tree: no identity check
                self._slots = None
        self._param_names = {p: n for n, p in named}
        self._index = {n: i for i, (n, _) in enumerate(named)}

    def _group_comm(self):
        if self._coll is None:
            distributed = dist.is_available() and dist.is_initialized()
            dev = self._data_device()
            if dev.type == "cuda":  # the GPU path: igrad/cuda.py
                from . import cuda as _cuda
                self._coll = _cuda.group_comm(self.process_group, dev, distributed)
            elif distributed:
                self._coll = TorchComm(self.process_group)
            else:
                self._coll = _SelfComm()
        return self._coll

    def _data_device(self):
        """The device of the engine's gradients: the parameters' CUDA device
        (a CUDA engine, igrad/cuda.py), else the CPU. Known once attached."""
        if self._data_dev is None:
            if self._params is None:
                return torch.device("cpu")
            dev = None
            if any(p.is_cuda for p in self._params):
                from . import cuda as _cuda
                dev = _cuda.params_device(self._params)
            self._data_dev = dev if dev is not None else torch.device("cpu")
        return self._data_dev

    @property
    def rank(self):
        return self._group_comm().rank

    @property
    def world_size(self):
        return self._group_comm().size

    @property
    def layout(self):
        if self._layout is None:
            if self._named is None:
                raise L.StateError("IgradState has no model: pass one to the constructor "
                                   "or call state.attach(model) (also after unpickling)")
            # The shapes and dtypes of attach() time, which every step is
            # checked against (_check_step).
            self._layout = Layout.from_tensors([
                (n, shape, _TORCH_DTYPES.get(dtype, "F32")) for n, shape, _, dtype in self._meta],
                name_map=getattr(self, "name_map", None))
            if not getattr(self, "_unmapped_warned", False):
                self._unmapped_warned = True  # once per state
                report = self._layout.unmapped_report()
                if report:
                    warnings.warn("igrad: " + report, stacklevel=2)
        return self._layout

    def _needs_profile(self):
        return str(self.config["method"]).lower() in ("ig", "iad")

    def _resolve_profile(self):
        if not self._needs_profile() or self.profile == "auto":
            return None
        prof = self.profile
        if prof is None:
            raise L.InvalidArgumentError("method %r needs a profile (profile=path or Profile)"
                                         % self.config["method"])
        if isinstance(prof, (str, bytes, os.PathLike)):
            prof = Profile.load(os.fspath(prof), self.layout)
        elif prof.layout_hash not in (0, self.layout.hash):
            raise L.MismatchError(
                "the profile was made for another model (layout hash 0x%016x, this model's "
                "is 0x%016x)" % (prof.layout_hash, self.layout.hash))
        self._warn_profile_settings(prof)
        return prof

    def _warn_profile_settings(self, prof):
        # Usable, but its importance was measured on another selection (as
        # `igrad train` warns too).
        sp, rho = str(self.config["sparsifier"]).lower(), float(self.config["density"])
        psp, prho = prof.sparsifier, prof.density
        if psp != sp or abs(prho - rho) > 1e-12 * max(abs(rho), 1.0):
            warnings.warn("the profile was made with sparsifier %s at density %g; this state "
                          "uses %s at density %g" % (psp, prho, sp, rho), stacklevel=4)

    @property
    def engine(self):
        """The igrad Engine (created on first use; collective over the group)."""
        if self._engine is None:
            if self._coll is not None and getattr(self._coll, "memory", "host") != (
                    "cuda" if self._data_device().type == "cuda" else "host"):
                self._coll = None  # made before the model was attached
            coll = self._group_comm()
            layout = self.layout
            # Every rank must reach engine_create (a collective) even when its
            # own profile fails to load, or the others would wait forever: a
            # local failure becomes a failure on every rank. The same exchange
            # checks that either every rank or none has a state to load
            # (loading is collective too).
            err = None
            try:
                self._profile_obj = self._resolve_profile()
                if self._pending_load is not None:
                    self._check_names(self._pending_load)
            except L.IgradError as e:
                err = e
            pending = self._pending_load is not None
            if coll.size > 1:
                self._agree_setup(coll, err, pending)
            elif err is not None:
                raise err
            if self.target_ratio is not None and self._profile_obj is not None:
                # a pure function of agreed inputs: the same on every rank
                fit = target_fit(layout, self._profile_obj, self.target_ratio, **self.config)
                self._profile_obj.set_threshold(fit["tau"])
                self.config["release_keep"] = fit["release_keep"]
                self.target_fit = fit
            self._grad_dt = self._engine_grad_dtype()
            cfg = make_config(**dict(self.config, grad_dtype=_TORCH_DTYPES[self._grad_dt]))
            dev = self._data_device()
            if dev.type == "cuda":
                from . import cuda as _cuda
                self._engine = _cuda.create_engine(layout, self._profile_obj, cfg, coll, dev)
            else:
                self._engine = Engine(layout, self._profile_obj, cfg, coll.comm())
            if self._trace is not None:
                self._engine.set_trace(self._trace)
            if pending:
                sd, self._pending_load = self._pending_load, None
                self._apply_state(sd)
        return self._engine

    def _engine_grad_dtype(self):
        """The gradients' dtype the engine reads in place (config grad_dtype):
        the trainable parameters' one dtype when it is bfloat16 or float16,
        on the CPU, without grad_scaler or overlap, with grads_in_place;
        else float32 (16-bit gradients, or a mix of dtypes, are then staged
        through a float32 copy)."""
        dts = set(self._dtypes or ())
        dt = next(iter(dts)) if len(dts) == 1 else torch.float32
        if (getattr(self, "grads_in_place", True) and dt in (torch.bfloat16, torch.float16)
                and self.grad_scaler is None and not getattr(self, "overlap", False)
                and self._data_device().type == "cpu"):
            return dt
        return torch.float32

    @staticmethod
    def _agree_setup(coll, err, pending):
        # One MAX all-reduce of (failed, pending, -pending): did any rank fail
        # before the engine's own checks, and do all ranks agree on loading?
        flags = torch.tensor([int(err is not None), int(pending), -int(pending)],
                             dtype=torch.int64)
        if coll.device.type != "cpu":
            flags = flags.to(coll.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=coll.group)
        failed, any_pending, not_all = (int(x) for x in flags.cpu())
        if err is not None:
            raise err
        if failed:
            raise L.MismatchError("another rank failed to set up igrad (its profile, "
                                  "configuration or state_dict); see that rank's error")
        if any_pending and not_all == 0:
            raise L.StateError("load_state_dict() was called on some ranks but not on "
                               "others (every rank loads its own state)")

    @property
    def online_info(self):
        """profile="auto": the window's status (profiling, steps_recorded,
        switch_step, replans, gather_ms, build_ms; with reprofile_every:
        reprofiles, reprofile_replans, last_flips, reprofile_ms)."""
        return self.engine.online_info()

    def built_profile(self):
        """profile="auto": a copy of the profile the engine built (a Profile;
        save it with save_json to reuse it), or None while profiling."""
        return self.engine.profile(self.layout)

    def set_trace(self, trace):
        """Records the engine's selections into an igrad Trace (the run
        profiles itself, as the C trainer's --trace does)."""
        self._trace = trace
        if self._engine is not None:
            self._engine.set_trace(trace)

    def plan_hash(self):
        """Hex digest of the engine's plan (per tensor: every step or phase,
        budgets, wire bytes); equal on every rank of a consistent run."""
        import hashlib
        eng = self.engine
        h = hashlib.sha256()
        for t in range(len(self.layout)):
            p = eng.tensor_plan(t)
            h.update(repr(sorted(p.items())).encode())
        return h.hexdigest()[:16]

    # -- one step ------------------------------------------------------------

    def _dense_average(self, tensors):
        coll = self._group_comm()
        if coll.size == 1:
            return
        for g in tensors:
            gd = g if coll.device.type == "cpu" or g.device == coll.device else g.to(
                coll.device)
            dist.all_reduce(gd, group=coll.group)
            gd.div_(coll.size)
            if gd is not g:
                g.copy_(gd)

    # Every step checks that the tensors handed to the engine are still the
    # ones the layout was made from: the engine reads and writes
    # layout-count floats at each address, so a parameter resized after
    # attach() (p.data = smaller) would be a heap overflow, and a parameter
    # replaced in the model (resize_token_embeddings) would be synchronized
    # in its stale version. The check is local, but its failure must reach
    # every rank, or the others would wait in the step's collectives: the
    # refusing rank hands the engine NULL for that tensor, the engine's
    # per-step agreement fails the step on every rank, and every rank
    # raises MismatchError (the refusing one with the reason).

    def _check_step(self, step, grads):
        """None, or (t, MismatchError) for the first layout tensor t whose
        parameter or gradient no longer matches the state as attached.
        (Gradient dtypes need no check: any float is staged to float32, and
        torch keeps a gradient's dtype equal to its parameter's.)"""
        counts, params = self._counts, self._params
        if (list(map(torch.Tensor.numel, params)) == counts
                and list(map(_DTYPE_OF, params)) == self._dtypes
                and list(map(torch.Tensor.numel, grads)) == counts
                and (self._slots is None or self._slots.intact())):
            return None
        return self._first_mismatch(step, grads)

    def _first_mismatch(self, step, grads):
        for t, ((name, shape, count, dtype), p, g) in enumerate(zip(self._meta, self._params,
                                                                     grads)):
            why = None
            if self._slots is not None and self._slots.current(t) is not p:
                why = ("parameter %s was replaced after the state was attached (the model "
                       "now has another tensor under that name, e.g. after "
                       "resize_token_embeddings or set_input_embeddings); igrad would "
                       "synchronize the old one" % name)
            elif p.numel() != count:
                why = ("parameter %s has %d entries, the layout %d (shape %s, now %s): it was "
                       "resized after the state was attached" % (
                           name, p.numel(), count, list(shape), list(p.shape)))
            elif p.dtype != dtype:
                why = ("parameter %s is %s, it was %s when the state was attached"
                       % (name, str(p.dtype).replace("torch.", ""),
                          str(dtype).replace("torch.", "")))
            elif g.numel() != count:
                why = "the gradient of %s has %d entries, the layout %d" % (name, g.numel(),
                                                                           count)
            if why is not None:
                return t, L.MismatchError(
                    "step %d: %s; build a new IgradState (and GradientSynchronizer) for the "
                    "model as it is now" % (step, why))
        return None

    def _agree_warmup(self, step, bad):
        # Warm-up steps do not run the engine: one MIN all-reduce of
        # (rank, tensor) of a refusal tells every rank.
        coll = self._group_comm()
        n = len(self._meta)
        if coll.size > 1:
            key = torch.tensor([coll.rank * n + bad[0] if bad else coll.size * n],
                               dtype=torch.int64)
            if coll.device.type != "cpu":
                key = key.to(coll.device)
            dist.all_reduce(key, op=dist.ReduceOp.MIN, group=coll.group)
            key = int(key.cpu()[0])
            if bad is None and key < coll.size * n:
                raise L.MismatchError(
                    "step %d: rank %d refused the step at tensor %s: its parameter or gradient "
                    "no longer matches the layout this state was attached with (that rank's "
                    "error says how); every rank fails this step"
                    % (step, key // n, self._meta[key % n][0]))
        if bad is not None:
            raise bad[1]

    def _peer_refusal(self, step, e):
        """The MismatchError for a step that another rank refused through
        the engine's agreement (its NULL gradient), or None when `e` is
        something else."""
        m = re.search(r"failed on rank (\d+)[^;]*?(?: at tensor (\S+))?; every rank", e.message)
        if not isinstance(e, L.InvalidArgumentError) or m is None:
            return None
        at = " at tensor %s" % m.group(2) if m.group(2) else ""
        return L.MismatchError(
            "step %d: rank %s refused the step%s: its parameter or gradient no longer matches "
            "the layout this state was attached with (resized, replaced or another dtype; that "
            "rank's error says which); every rank fails this step" % (step, m.group(1), at))

    def _skip_step(self, step, e, bad, grads):
        """The engine skipped the step on every rank (non-finite; residuals
        unchanged): this rank's own refusal `bad` wins; with
        nonfinite="allreduce" `grads` are averaged as DDP would."""
        if bad is not None:
            raise bad[1] from None
        if self.nonfinite == "allreduce":
            self._dense_average(grads)
        self.skipped_steps += 1
        self.last_stats = {"step": step, "skipped": 1, "reason": str(e)}

    def _raise_step_error(self, step, e, bad):
        """The engine failed the step on every rank: raises this rank's own
        refusal `bad`, else a peer's refusal named in `e`, else `e`."""
        if bad is not None:
            raise bad[1] from None
        peer = self._peer_refusal(step, e)
        if peer is not None:
            raise peer from e
        raise e

    def _step_tensors(self, step, grads, refused=None):
        """Synchronizes one step: grads[t] is tensor t's gradient (layout
        order, any float dtype and device), overwritten in place with the
        average of every rank's selection. Returns the stats dict.
        `refused`: (t, exception) when the caller already found this rank
        unable to take part (grads may then be None); the step then fails
        on every rank. Raises MismatchError on every rank when a parameter
        on any rank no longer matches the layout (see _check_step)."""
        bad = refused if refused is not None else self._check_step(step, grads)
        if step < self.start_iter:
            self._agree_warmup(step, bad)
            self._dense_average(grads)
            self.last_stats = {"step": step, "skipped": 0, "warmup": 1}
            return self.last_stats
        eng = self.engine
        coll = self._group_comm()
        # The engine reads and writes contiguous float32 memory on its device
        # (the CPU, or the parameters' GPU: igrad/cuda.py), or the model's
        # bfloat16/float16 in place (_engine_grad_dtype, self._grad_dt);
        # anything else goes through a staging copy there in that dtype,
        # written back after end().
        # A refused step stages only the tensors before the refused one
        # (the engine names that one to every rank) and passes NULL from it on.
        # With a loss scale S != 1 every gradient is staged as g / S (the
        # user's tensors stay untouched until the result is written back).
        scale = 1.0
        try:
            scale = self._loss_scale()
        except L.IgradError as e:  # refused like a bad parameter: on every rank
            if bad is None:
                bad = (0, e)
        gdt = self._grad_dt
        if scale != 1.0 and gdt != torch.float32 and bad is None:
            bad = (0, L.InvalidArgumentError(
                "step %d: grad_scaler was set after the engine was made to read %s gradients "
                "in place (a loss scale needs the float32 staging): set it before the first "
                "step" % (step, str(gdt).replace("torch.", ""))))
        ok = len(self._meta) if bad is None else bad[0]
        bufs, back = [], []
        data_dev = self._data_device()
        for g in (grads[:ok] if ok else ()):
            if (scale == 1.0 and g.dtype == gdt and g.device == data_dev
                    and g.is_contiguous()):
                bufs.append(g)
            else:
                s = g.detach().to(device=data_dev, dtype=gdt).contiguous()
                if scale != 1.0:  # in place only in a copy of our own
                    s = s.div_(scale) if s.data_ptr() != g.data_ptr() else s.div(scale)
                bufs.append(s)
                back.append((g, s))
        addrs = [b.data_ptr() for b in bufs] + [None] * (len(self._meta) - len(bufs))
        if eng.device is not None:  # the stream the gradients were made on
            from . import cuda as _cuda
            _cuda.set_step_stream(eng, data_dev)
        whole = _engine_syncs(self.config)
        t0 = time.perf_counter()
        try:
            if whole:  # the engine runs its own collectives (two-level sync, sparse all-reduce)
                eng.sync(step, addrs)
            else:
                buckets = eng.begin(step, addrs)
        except L.NonFiniteError as e:
            self._skip_step(step, e, bad, grads)
            return self.last_stats
        except L.IgradError as e:
            self._raise_step_error(step, e, bad)
        if bad is not None:  # cannot happen: the engine refuses a NULL gradient
            raise bad[1]
        if not whole:
            t0 = time.perf_counter()
            coll.run_buckets(buckets)
        t1 = time.perf_counter()
        if not whole:
            eng.end(step, addrs)
        for g, s in back:
            g.copy_(s.mul_(scale) if scale != 1.0 else s)
        st = eng.stats()
        st.update(eng.memory_stats())
        st["collective_ms"] = (t1 - t0) * 1e3
        self.total_payload_nbytes += st["payload_nbytes"]
        self.total_wire_nbytes += st["wire_nbytes"]
        self.last_stats = st
        self._observe(st)
        return st

    def _loss_scale(self):
        """The current AMP loss scale (grad_scaler), 1.0 without one."""
        sc = self.grad_scaler
        if sc is None:
            return 1.0
        v = float(sc.get_scale() if callable(getattr(sc, "get_scale", None)) else sc())
        if not (v > 0.0 and v != float("inf")):
            raise L.InvalidArgumentError("grad_scaler: the loss scale is %r (must be a finite "
                                         "number > 0)" % (v,))
        return v

    def _layout_grads(self, by_name):
        missing = [n for n, _ in self._named if n not in by_name]
        if missing:
            raise L.MismatchError(
                "no gradient for %d parameter(s) of the layout this step (first: %s); with "
                "DDP every trainable parameter must be in a bucket" % (len(missing),
                                                                         missing[0]))
        return [by_name[n] for n, _ in self._named]

    # -- DDP bucket handling ---------------------------------------------------

    def _bucket_names(self, bucket):
        if self._param_names is None:
            raise L.StateError("IgradState has no model: pass it to the constructor or call "
                               "state.attach(model) (also after unpickling)")
        names = []
        for p in bucket.parameters():
            n = self._param_names.get(p)
            if n is None:
                raise L.MismatchError(
                    "a DDP bucket holds a parameter of shape %s that is not in this state's "
                    "model (was the state attached to the model DDP wraps?)"
                    % (tuple(p.shape),))
            names.append(n)
        return names

    def _on_bucket(self, bucket):
        if self.iter < self.start_iter:
            buf = bucket.buffer()
            self._dense_average([buf])
            if bucket.is_last():
                self.last_stats = {"step": self.iter, "skipped": 0, "warmup": 1}
                self.iter += 1
            fut = torch.futures.Future()
            fut.set_result(buf)
            return fut
        if getattr(self, "overlap", False):
            return self._stream_bucket(bucket)
        fut = torch.futures.Future()
        self._pending.append((bucket, fut))
        if not bucket.is_last():
            return fut
        pending, self._pending = self._pending, []
        try:
            # A failure here is this rank's alone: it is handed to
            # _step_tensors, which fails the step on every rank (the others
            # would otherwise wait in the step's collectives).
            grads, refused = None, None
            try:
                by_name = {}
                for b, _ in pending:
                    # A dense bucket's buffer is its parameters' gradients
                    # back to back; slicing it (rather than trusting
                    # gradients() to return views) guarantees the engine's
                    # result lands in the buffer that the future hands back.
                    buf, off = b.buffer(), 0
                    for n, p in zip(self._bucket_names(b), b.parameters()):
                        by_name[n] = buf[off:off + p.numel()]
                        off += p.numel()
                    if off != buf.numel():
                        raise L.UnsupportedError(
                            "a DDP bucket of %d entries holds parameters of %d entries (a "
                            "parameter resized after DDP was built, or sparse gradients, which "
                            "are not supported)" % (buf.numel(), off))
                grads = self._layout_grads(by_name)
            except L.IgradError as e:
                refused = (0, e)
            step = self.iter
            self._step_tensors(step, grads, refused)
            self.iter += 1
        except BaseException as e:
            for _, f in pending:
                f.set_exception(e)
            raise
        for b, f in pending:
            f.set_result(b.buffer())
        return fut

    # -- DDP buckets, overlapped with backward (overlap=True) --------------------
    #
    # The same step as the last-bucket path, streamed: the first bucket of a
    # step opens it (engine.open), each bucket's parameters are given to
    # engine.ready as DDP hands the bucket over, and every igrad bucket
    # ready returns is issued at once (async torch.distributed); the last
    # DDP bucket waits them in order and closes the step (the agreement,
    # residuals, results into the bucket buffers). Results are bit for bit
    # the last-bucket path's. A rank that cannot take part (a changed
    # parameter, a bad loss scale, a bucket it cannot map) gives the rest of
    # its tensors as NULL at the last bucket, so its collectives still
    # match the other ranks' and close fails the step on every rank.

    def _stream_bucket(self, bucket):
        fut = torch.futures.Future()
        self._pending.append((bucket, fut))
        try:
            if self._stream is None:
                self._stream = self._stream_open()
            self._stream_give(self._stream, bucket)
            if bucket.is_last():
                s, self._stream = self._stream, None
                self._stream_close(s)
        except BaseException as e:
            # the step is lost on this rank: a later bucket or step gets the
            # engine's "step N is still open" rather than joining this one
            pending, self._pending, self._stream = self._pending, [], None
            for _, f in pending:
                f.set_exception(e)
            raise
        if bucket.is_last():
            pending, self._pending = self._pending, []
            for b, f in pending:
                f.set_result(b.buffer())
        return fut

    def _stream_open(self):
        if self._param_names is None:
            raise L.StateError("IgradState has no model: pass it to the constructor or call "
                               "state.attach(model) (also after unpickling)")
        step = self.iter
        s = {"step": step, "given": set(), "views": {}, "handles": [], "back": [],
             "keep": [], "scale": 1.0, "early": 0}
        bad = self._check_step(step, self._params)  # gradients are checked per bucket
        try:
            s["scale"] = self._loss_scale()
        except L.IgradError as e:
            if bad is None:
                bad = (0, e)
        s["refused"] = bad
        self.engine.open(step)
        return s

    def _stream_give(self, s, bucket):
        if s["refused"] is not None:
            return
        scale, idx, addrs = s["scale"], [], []
        try:
            buf, off = bucket.buffer(), 0
            for n, p in zip(self._bucket_names(bucket), bucket.parameters()):
                g = buf[off:off + p.numel()]
                off += p.numel()
                t = self._index[n]
                if t in s["given"] or t in idx:
                    raise L.MismatchError("step %d: parameter %s is in two DDP buckets"
                                          % (s["step"], n))
                s["views"][t] = g
                if (scale != 1.0 or g.dtype != torch.float32 or g.device.type != "cpu"
                        or not g.is_contiguous()):
                    st = g.detach().to(device="cpu", dtype=torch.float32).contiguous()
                    if scale != 1.0:
                        st = st.div_(scale) if st.data_ptr() != g.data_ptr() else st.div(scale)
                    s["back"].append((g, st))
                    g = st
                s["keep"].append(g)
                idx.append(t)
                addrs.append(g.data_ptr())
            if off != buf.numel():
                raise L.UnsupportedError(
                    "a DDP bucket of %d entries holds parameters of %d entries (a parameter "
                    "resized after DDP was built, or sparse gradients, which are not "
                    "supported)" % (buf.numel(), off))
        except L.IgradError as e:
            s["refused"] = (0, e)
            return
        self._stream_ready(s, idx, addrs)

    def _stream_ready(self, s, idx, addrs):
        coll = self._group_comm()
        for b in self.engine.ready(s["step"], idx, addrs):
            s["handles"].append(coll.issue(b))
        s["given"].update(idx)
        if len(s["given"]) < len(self._meta):
            s["early"] = len(s["handles"])  # issued before the step's last tensor

    def _stream_close(self, s):
        step, eng, coll = s["step"], self.engine, self._group_comm()
        missing = [t for t in range(len(self._meta)) if t not in s["given"]]
        if missing and s["refused"] is None:
            s["refused"] = (missing[0], L.MismatchError(
                "no gradient for %d parameter(s) of the layout this step (first: %s); with "
                "DDP every trainable parameter must be in a bucket"
                % (len(missing), self._meta[missing[0]][0])))
        if missing:  # NULL: the agreement at close fails the step on every rank
            self._stream_ready(s, missing, [None] * len(missing))
        t0 = time.perf_counter()
        for h in s["handles"]:
            coll.wait(h)
        t1 = time.perf_counter()
        bad = s["refused"]
        try:
            eng.close(step)
            t2 = time.perf_counter()
        except L.NonFiniteError as e:
            self._skip_step(step, e, bad, [s["views"][t] for t in range(len(self._meta))])
            self.iter += 1
            return
        except L.IgradError as e:
            self._raise_step_error(step, e, bad)
        if bad is not None:  # cannot happen: the engine refuses a NULL gradient
            raise bad[1]
        scale = s["scale"]
        for g, st in s["back"]:
            g.copy_(st.mul_(scale) if scale != 1.0 else st)
        st = eng.stats()
        st["collective_ms"] = (t1 - t0) * 1e3  # the wait at the last bucket
        st["early_buckets"] = s["early"]
        st["close_ms"] = (t2 - t1) * 1e3  # agreement, residuals, unpacking
        self.total_payload_nbytes += st["payload_nbytes"]
        self.total_wire_nbytes += st["wire_nbytes"]
        self.last_stats = st
        self._observe(st)
        self.iter += 1

    # -- observability (PowerSGD's compression_stats(), a logger, TensorBoard) ---

    def stats(self):
        """A summary of the steps this rank synchronized through the engine
        since the state was made (or since stats_reset()): "steps",
        "skipped_steps"; per step (means): "payload_nbytes", "wire_nbytes",
        "intra_wire_nbytes", "inter_wire_nbytes", "select_ms", "pack_ms",
        "comm_ms", "unpack_ms", "total_ms"; "dense_nbytes" (4 bytes per
        parameter: a dense float32 all-reduce's payload), "ratio_to_dense"
        (payload / dense_nbytes, PowerSGD's compress rate inverted),
        "sparsifier_sync_nbytes" (what the sparsifier's *_sync method sends
        at an even step: every tensor at its normal budget) and
        "ratio_to_sparsifier"; "f_imp" (the share of that budget sent every
        step); of the last step "deferred_components",
        "released_components" and "residual_norm". Before the engine exists
        (no step yet) only the counts."""
        o = self._obs
        out = {"steps": o.steps, "skipped_steps": self.skipped_steps}
        if o.steps:
            for k, v in o.sums.items():
                out[k] = v / o.steps
            out.update(o.last)
        if self._engine is not None:
            eng = self._engine
            dense = 4.0 * float(sum(self._counts or []))
            sync = imp = 0
            for t in range(len(self._meta)):
                tp = eng.tensor_plan(t)
                sync += tp["step_nbytes"]
                imp += tp["step_nbytes"] if tp["every_step"] else 0
            out["dense_nbytes"] = dense
            out["sparsifier_sync_nbytes"] = sync if sync else None
            out["f_imp"] = imp / sync if sync else None
            if o.steps:
                out["ratio_to_dense"] = out["payload_nbytes"] / dense if dense else None
                out["ratio_to_sparsifier"] = out["payload_nbytes"] / sync if sync else None
        return out

    def stats_reset(self):
        """Starts stats()' sums again (the counts of skips stay)."""
        self._obs = _Observed()

    def _observe(self, st):
        self._obs.add(st)
        every = self.log_every
        if not every or self._obs.steps % every:
            return
        s = self.stats()
        step = int(st.get("step", self.iter))
        if self.tensorboard is not None:
            for k in ("payload_nbytes", "wire_nbytes", "inter_wire_nbytes", "ratio_to_dense",
                      "ratio_to_sparsifier", "f_imp", "residual_norm", "select_ms", "comm_ms",
                      "total_ms"):
                v = s.get(k)
                if v is not None:
                    self.tensorboard.add_scalar("igrad/" + k, float(v), step)
        if getattr(self, "rank", 0) == 0:
            rs = s.get("ratio_to_sparsifier")
            _LOG.info("igrad step %d: payload %.0f B/step (%.4f x dense%s), wire %.0f B "
                      "(inter %.0f), f_imp %s, deferred %d, residual norm %.4g, select/pack/"
                      "comm/unpack %.2f/%.2f/%.2f/%.2f ms, %d skipped", step,
                      s["payload_nbytes"], s.get("ratio_to_dense") or 0.0,
                      "" if rs is None else ", %.4f x its *_sync" % rs, s["wire_nbytes"],
                      s["inter_wire_nbytes"],
                      "-" if s.get("f_imp") is None else "%.3f" % s["f_imp"],
                      s["deferred_components"], s["residual_norm"], s["select_ms"],
                      s["pack_ms"], s["comm_ms"], s["unpack_ms"], s["skipped_steps"])

    # -- checkpointing -----------------------------------------------------------

    def state_dict(self):
        """This rank's state: step counter, config, names and shapes, hashes
        and the engine's exact state file (bytes, "engine_state"), which
        holds the residuals once and resumes a run bit for bit. Save one per
        rank (residuals differ between ranks). The state file is a uint8
        tensor (older dicts hold bytes; both load). The residuals by name:
        state_residuals(sd) (or, live, self.residuals())."""
        sd = {"format": _STATE_FORMAT, "iter": self.iter, "start_iter": self.start_iter,
              "config": dict(self.config), "skipped_steps": self.skipped_steps}
        if self._named is not None:
            sd["names"] = [n for n, _ in self._named]
            sd["shapes"] = [list(m[1]) for m in self._meta]
            sd["layout_hash"] = self.layout.hash
        if self._engine is None:
            if self._pending_load is not None:  # loaded but not yet applied
                keep = dict(self._pending_load)
                keep.update({k: sd[k] for k in ("iter", "config") if k in sd})
                return keep
            return sd
        eng = self._engine
        sd["config"] = config_to_dict(eng.config())
        sd["rank"], sd["world_size"] = self.rank, self.world_size
        sd["plan_hash"] = self.plan_hash()
        sd["engine_step"] = eng.step
        with tempfile.TemporaryDirectory(prefix="igrad-state-") as d:
            path = os.path.join(d, "state.bin")
            eng.save_state(path)
            with open(path, "rb") as f:
                # a uint8 tensor, not bytes: torch.save (pickle protocol 2)
                # writes bytes as latin-1 text, about 1.5 x their size
                sd["engine_state"] = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
        return sd

    def residuals(self):
        """Copies of the engine's residuals now, {parameter name: tensor of
        the parameter's attached shape} (on the engine's device; empty for
        method "dense")."""
        eng = self.engine
        out = {}
        for t, (n, shape, count, _) in enumerate(self._meta):  # as attached (the engine's)
            addr = eng.residual_address(t)
            if addr is not None and eng.device is not None:  # device memory
                from . import cuda as _cuda
                out[n] = _cuda.device_view(addr, count, torch.float32,
                                           self._data_device()).clone().view(shape)
            elif addr is not None:
                out[n] = _wrap(addr, count, torch.float32).clone().view(shape)
        return out

    def load_state_dict(self, sd):
        """Restores a state_dict() of the same rank. Collective when the
        engine exists (every rank loads its own); otherwise applied when the
        engine is created at the next step. Raises MismatchError for another
        configuration, model or rank, InvalidArgumentError for an unknown
        parameter name."""
        if sd.get("format") != _STATE_FORMAT:
            raise L.FormatError("not an IgradState state_dict (format %r)"
                                % (sd.get("format"),))
        cfg = sd.get("config", {})
        mine = config_to_dict(make_config(**self.config))
        for k, v in cfg.items():
            if k in ("threads", "verify_every", "timeout_s"):  # results do not depend on them
                continue
            if k in mine and str(mine[k]).lower() != str(v).lower():
                raise L.MismatchError("state_dict config.%s is %r, this state has %r"
                                      % (k, v, mine[k]))
        if self._named is not None:
            self._check_names(sd)
        if self._engine is None:
            self._pending_load = dict(sd)
            self.iter = int(sd["iter"])
            self.skipped_steps = int(sd.get("skipped_steps", 0))
            return
        self._apply_state(sd)

    def _check_names(self, sd):
        unknown = [n for n in list(sd.get("residuals", {})) + list(sd.get("names", []))
                   if n not in self._index]
        if unknown:
            raise L.InvalidArgumentError(
                "state_dict names parameter %r, which this model does not have (or does "
                "not train)" % unknown[0])

    def _apply_state(self, sd):
        if "engine_state" not in sd:
            raise L.FormatError("state_dict has no engine state (it was saved before the "
                                "first synchronized step); nothing to restore but iter")
        with tempfile.TemporaryDirectory(prefix="igrad-state-") as d:
            path = os.path.join(d, "state.bin")
            with open(path, "wb") as f:
                f.write(_state_file_bytes(sd["engine_state"]))
            self._engine.load_state(path)
        self.iter = int(sd["iter"])
        self.skipped_steps = int(sd.get("skipped_steps", 0))

    def save(self, path):
        """Writes this rank's engine state (residuals, step, hashes) with
        igrad_engine_save_state. `path` may contain "{rank}" (e.g.
        "ckpt/igrad.rank{rank}.bin"); without it ".rank<R>" is inserted
        before the extension when the group has more than one rank.
        Returns the path written. Local: each rank writes its own file (so
        it also suits DeepSpeed, which saves checkpoints from rank 0 only).
        """
        path = self._rank_path(path)
        self.engine.save_state(path)
        with open(path + ".iter", "w") as f:
            f.write("%d\n" % self.iter)
        return path

    def load(self, path):
        """Reads the files written by save() (collective: every rank loads
        its own; if one fails, all fail and nothing changes)."""
        path = self._rank_path(path)
        self.engine.load_state(path)
        try:
            with open(path + ".iter") as f:
                self.iter = int(f.read().strip())
        except FileNotFoundError:
            self.iter = self._engine.step + 1
        return path

    def _rank_path(self, path):
        path = os.fspath(path)
        if "{rank}" in path:
            return path.format(rank=self.rank)
        if self.world_size > 1:
            root, ext = os.path.splitext(path)
            return "%s.rank%d%s" % (root, self.rank, ext)
        return path

    # -- pickling (PowerSGD convention) --------------------------------------------

    def __getstate__(self):
        """Pickles the configuration and this rank's state_dict, never the
        process group, the grad scaler or the TensorBoard writer (set
        state.grad_scaler / state.tensorboard again after unpickling), the
        model or native handles; stats() counts again from the unpickling."""
        d = {k: v for k, v in self.__dict__.items()
             if not k.startswith("_") and k not in ("process_group", "grad_scaler",
                                                     "tensorboard")}
        if isinstance(d.get("profile"), Profile):
            d["profile_json"] = _profile_bytes(d.pop("profile"))
        d["_saved_state"] = self.state_dict() if self._engine is not None else \
            self._pending_load
        return d

    def __setstate__(self, d):
        saved = d.pop("_saved_state", None)
        pj = d.pop("profile_json", None)
        self.__dict__.update(d)
        self.process_group = None  # the default group, resolved at first use
        self.grad_scaler = None
        self.tensorboard = None  # a writer is not pickled: set it again
        self.log_every = int(d.get("log_every", 0))
        self._obs = _Observed()  # stats() counts from here
        self._reset_runtime()
        if pj is not None:
            self.profile = _profile_from_bytes(pj)
        self._pending_load = saved


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


def _state_file_bytes(data):
    """A state_dict's "engine_state" as bytes (a uint8 tensor, or bytes as
    dicts saved before held it)."""
    if isinstance(data, torch.Tensor):
        if data.dtype != torch.uint8 or data.dim() != 1:
            raise L.FormatError("state_dict engine_state is a %s tensor of %d dimensions, "
                                "not the uint8 bytes of a state file" % (data.dtype, data.dim()))
        data = data.contiguous().cpu()
        return ctypes.string_at(data.data_ptr(), data.numel())
    return bytes(data)


def state_residuals(sd):
    """The residuals held by an IgradState.state_dict(), {parameter name:
    CPU float32 tensor of the parameter's shape}, read from its engine state
    file (docs/formats.md §7: after the u32 item count at byte 20, the items,
    step and call count, a u64 tensor count, a u64 residual count N and N
    little-endian f32, layout order); empty for
    method "dense". A dict saved before the residuals lived only in the
    state file (a "residuals" entry) returns that entry."""
    if "residuals" in sd:
        return dict(sd["residuals"])
    data, names, shapes = sd.get("engine_state"), sd.get("names"), sd.get("shapes")
    if data is None or names is None or shapes is None:
        raise L.FormatError("state_dict has no engine state with names and shapes (it was "
                            "saved before the first synchronized step)")
    data = _state_file_bytes(data)
    if len(data) < 24 or data[:8] != b"IGRADST\0":
        raise L.FormatError("state_dict engine_state is not an igrad engine state file")
    at = 24 + 8 * struct.unpack_from("<I", data, 20)[0] + 16  # past the items, step, calls
    if len(data) < at + 16:
        raise L.FormatError("state_dict engine_state is cut short")
    tensors, count = struct.unpack_from("<QQ", data, at)
    at += 16
    counts = [math.prod(s) for s in shapes]
    if tensors != len(names) or len(shapes) != len(names):
        raise L.FormatError("state_dict engine_state has %d tensors, its names %d"
                            % (tensors, len(names)))
    if count == 0:
        return {}
    if count != sum(counts) or len(data) < at + 4 * count:
        raise L.FormatError("state_dict engine_state holds %d residual entries, its shapes %d"
                            % (count, sum(counts)))
    values = array.array("f", data[at:at + 4 * count])
    if sys.byteorder != "little":
        values.byteswap()
    flat = torch.frombuffer(values, dtype=torch.float32)  # shares `values`, kept alive by it
    out, k = {}, 0
    for n, shape, c in zip(names, shapes, counts):
        out[n] = flat[k:k + c].view(shape)
        k += c
    return out


def hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: `ddp.register_comm_hook(state, hook)` with an
    IgradState built for the same model. Returns a future per bucket; all of
    a step's futures complete when its last bucket has been synchronized
    (see the module docstring)."""
    return state._on_bucket(bucket)


# ---------------------------------------------------------------------------
# Manual loops
# ---------------------------------------------------------------------------

class GradientSynchronizer:
    """igrad synchronization for loops that do not use DDP:

        state = IgradState(profile="profile.json", method="ig")
        sync = GradientSynchronizer(model.named_parameters(), state)
        for step, batch in enumerate(loader):
            loss(model, batch).backward()       # local gradients
            sync.synchronize(step)              # .grad = average of selections
            optimizer.step(); optimizer.zero_grad()

    A parameter whose .grad is None is synchronized as zeros (its .grad is
    then set). DeepSpeed (ZeRO stage 0): set
    `engine.enable_backward_allreduce = False`, build the synchronizer over
    `engine.module.named_parameters()` with `engine.data_parallel_group` as
    the state's process_group, and after `engine.backward(loss)` call
    synchronize() when `engine.is_gradient_accumulation_boundary()`, then
    `engine.step()`; save igrad's state per rank (state.save), since
    DeepSpeed writes checkpoints from rank 0 only."""

    def __init__(self, named_parameters, state):
        # named_parameters: model.named_parameters() (unstarted), the model
        # itself, or (name, parameter) pairs (then no check for replaced
        # parameters: the module they live in is unknown).
        self.state = state
        state.attach(named_parameters)

    def synchronize(self, step=None):
        """Averages the gradients over the ranks with igrad; returns the
        step's stats (state.last_stats). `step` defaults to state.iter; the
        same step must be used on every rank."""
        st = self.state
        step = st.iter if step is None else int(step)
        grads = []
        for n, p in st._named:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        stats = st._step_tensors(step, grads)
        st.iter = step + 1
        return stats


class UpdateSynchronizer:
    """Error feedback on the optimizer's update (`igrad train --ef-on
    update`) for a user's optimizer, in loops without DDP:

        state = IgradState(method="adtopk_sync", density=0.01)
        sync = UpdateSynchronizer(model, optimizer, state)
        for step, batch in enumerate(loader):
            loss(model, batch).backward()       # local gradients, not averaged
            sync.step()                         # instead of optimizer.step()
            optimizer.zero_grad()

    step() snapshots the trainable parameters, runs optimizer.step() on this
    rank's local gradients (the optimizer's state, e.g. Adam's moments,
    stays local and differs between ranks), takes the update
    delta = p_new - p_old, puts p_old back, synchronizes delta through the
    engine exactly as GradientSynchronizer does a gradient (error feedback,
    selection, the average over ranks) and sets p = p_old + the synced
    delta, the same on every rank. Clip the local gradients yourself before
    step() if you clip. A step the engine skips (a non-finite update on any
    rank) leaves every parameter at p_old on every rank (the optimizer's
    local state has still advanced). AMP loss scaling does not apply to
    updates: a state with grad_scaler is refused."""

    def __init__(self, model, optimizer, state):
        if state.grad_scaler is not None:
            raise L.InvalidArgumentError("UpdateSynchronizer syncs the optimizer's update, "
                                         "which a loss scale does not scale: build the "
                                         "IgradState without grad_scaler")
        self.optimizer = optimizer
        self.state = GradientSynchronizer(model, state).state

    def step(self, step=None):
        """One local optimizer step whose update is synchronized and applied;
        returns the step's stats (state.last_stats). `step` defaults to
        state.iter; the same step must be used on every rank."""
        st = self.state
        step = st.iter if step is None else int(step)
        params = [p for _, p in st._named]
        with torch.no_grad():
            old = [p.detach().clone() for p in params]
            self.optimizer.step()
            deltas = [p.detach() - o for p, o in zip(params, old)]
            for p, o in zip(params, old):
                p.copy_(o)
        stats = st._step_tensors(step, deltas)
        if not stats.get("skipped"):
            with torch.no_grad():
                for p, o, d in zip(params, old, deltas):
                    p.copy_(o.add_(d))
        st.iter = step + 1
        return stats


# ---------------------------------------------------------------------------
# Profiling
# ---------------------------------------------------------------------------

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
                 name_map=None, dense_below=CONFIG_DEFAULTS["dense_below"]):
        self.named = named_trainable_parameters(model)
        self.layout = layout_from_module(self.named, name_map=name_map)
        report = self.layout.unmapped_report()
        if report:
            warnings.warn("igrad: " + report, stacklevel=2)
        self.sparsifier, self.density, self.interleave = sparsifier, density, interleave
        self.dense_below = int(dense_below)
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
        from .profile import build_profile
        return build_profile(self.trace, window=window, method=method, alpha=alpha, out=out,
                             csv=csv)
