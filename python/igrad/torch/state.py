"""igrad.torch.state — IgradState: the configuration, the model it is
attached to, the engine (made at the first step, on the parameters'
device) and one synchronized step over a list of gradients
(_step_tensors), which the DDP hook (igrad.torch.hook) and the
synchronizers call. Checkpoints, statistics and DDP buckets are its
bases' (igrad.torch.checkpoint, .stats, .hook).
"""
import ctypes
import dataclasses
import operator
import os
import re
import time
import warnings

import torch
import torch.distributed as dist

from .. import _lib as L
from ..core import (OPTIONS, Config, Engine, Layout, Profile, _link_fields,
                    ig_default_target_ratio, make_config, target_fit)
from . import device as _device
from .checkpoint import CheckpointMixin
from .comm import TorchComm, _SelfComm
from .hook import DdpHookMixin
from .layout import _TORCH_DTYPES, _ParamSlots, _name_map_spec, _trainable
from .stats import StatsMixin, _Observed, _tensorboard_writer

_DTYPE_OF = operator.attrgetter("dtype")

# The window of IgradState(profile="auto") when config.profile_steps is 0
# (off in the library): the 30 steps of `igrad train --profile-steps`.
AUTO_PROFILE_STEPS = 30


def _group_text(group):
    """A process group for a message: the default one, or its size and ranks."""
    if group is dist.group.WORLD:
        return "the default group"
    try:
        size = dist.get_world_size(group)
        return "a group of %d rank(s), this one rank %d" % (size, dist.get_rank(group))
    except RuntimeError:
        return "a group this rank is not in"


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


class IgradState(CheckpointMixin, DdpHookMixin, StatsMixin):
    """State of igrad synchronization for one data-parallel model, shared by
    the DDP hook and GradientSynchronizer (the PowerSGD hook's conventions:
    constructor knobs, `iter`, `start_iter`, picklable without its process
    group).

        state = IgradState(ddp, profile="profile.json",
                           config=igrad.Config(density=0.01), buckets=8)

    model:          the model (DDP-wrapped or not), or an iterable of
                    (name, parameter); may be None and attached later with
                    attach() (GradientSynchronizer does it).
    process_group:  None = the default group (when torch.distributed is not
                    initialized: a single process).
    profile:        path of a profile JSON or a Profile (required for
                    methods "iad" and "ig"); checked against the model's
                    layout (MismatchError for a profile of another model).
                    "auto": no separate profiling run; the engine sends
                    everything for the first config.profile_steps
                    synchronized steps (AUTO_PROFILE_STEPS, 30, when 0) as
                    the sparsifier's *_sync, builds the profile from what
                    every rank selected and switches to the method
                    (`online_info`, `built_profile()`); with reprofile_every
                    it re-profiles periodically. profile_steps,
                    profile_partition, reprofile_every and reprofile_margin
                    apply only to "auto".
    config:         the engine's options, an igrad.Config (every default is
                    the C library's IGRAD_CONFIG_INIT); None = Config().
    **overrides:    single Config fields replacing config's (method="ig",
                    density=0.01, buckets=4, start_iter=10, ...), and link=:
                    the link collective="auto" prices each bucket with, igrad
                    plan's preset name ("100g", "nvlink", ...;
                    igrad.link_presets()), "GBITS,LAT_US" or (latency_ns,
                    bandwidth_mbps). Of the options: start_iter: the first
                    start_iter steps are plain dense averages (warm-up, as
                    in PowerSGD; the engine runs them); target_ratio X in
                    (0, 1] (0 = off; method "ig" with profile="auto" and
                    neither target_ratio nor release_keep given:
                    igrad.ig_default_target_ratio(), 0.25, igrad train's
                    --target-ratio default): method "ig" chooses the important set
                    and kappa from the profile's scores so that it sends at
                    most X x the sparsifier's *_sync payload (igrad.
                    target_fit, chosen when the engine is made, in
                    `target_fit`; with profile="auto" the engine makes it
                    when it switches); momentum: DGC momentum correction,
                    for SGD without momentum (with igrad's sparse methods
                    use Adam/AdamW with betas=(0.0, 0.95): see
                    docs/results/remedies.md); topology="hier", collective=
                    "sparse_reduce" and auto_sparse_reduce run whole steps
                    with the engine's own collectives over the group (no
                    overlap). timeout_s bounds igrad's own MPI collectives;
                    over a process group the group's timeout bounds each
                    collective instead (CommError), and with overlap=True
                    timeout_s bounds each wait of the hook too
                    (CommTimeoutError naming the step; the state is then
                    unusable).

    The binding's own options:
    grad_scaler:    AMP: a torch GradScaler (its get_scale()) or a callable
                    returning the current loss scale S. The engine is given
                    g / S, so residuals are always unscaled, and the result
                    is multiplied by S again, so .grad stays scaled as
                    GradScaler wants (scaler.step unscales, finds Inf/NaN
                    and skips). Exact for powers of two (GradScaler's
                    default growth and backoff). A step with Inf/NaN is
                    skipped by the engine (residuals unchanged) and returned
                    as `nonfinite` says. None: the gradients as they are.
    nonfinite:      "allreduce" (default) or "keep": what a skipped
                    (non-finite) step returns, see igrad.torch's docstring.
    overlap:        True: the DDP hook streams the step (igrad_engine_open/
                    ready/close): each igrad bucket's collective is issued
                    as soon as backward has delivered its tensors; bit for
                    bit the default (False) last-bucket step. last_stats
                    adds "early_buckets" and "close_ms". A gradient changed
                    by the caller after its DDP bucket was handed over is
                    not seen by the step (IGRAD_DEBUG_STREAM=1 fails such a
                    step by name).
    grads_in_place: True (default): when every trainable parameter is
                    bfloat16 (or every one float16), on the CPU, without
                    grad_scaler or overlap, the engine reads and writes the
                    16-bit gradients in place (config grad_dtype; residuals
                    stay float32), saving a float32 staging copy; else, or
                    with False, a float32 copy.
    name_map:       user name rules tried before the built-in ones: a map
                    file's path (docs/formats.md) or a list of (pattern,
                    kind, layer) (igrad.NameMap). Tensors inside numbered
                    blocks that no rule maps (OTHER: sent every step) are
                    named once per state in a UserWarning.
    log_every, tensorboard: every N engine steps, log stats() on rank 0
                    (logger "igrad") and write its scalars to a TensorBoard
                    writer or log directory.

    After each step `last_stats` holds the engine's statistics of the step
    (igrad_step_stats_t fields plus "collective_ms", the time of the
    torch.distributed collectives; "warmup": 1 on a start_iter step);
    `total_payload_nbytes` and `total_wire_nbytes` accumulate them;
    `skipped_steps` counts skips.

    Errors: DDP hands an exception raised in its comm hook on as a plain
    RuntimeError ("MismatchError: ..."); the igrad exception itself is
    `last_error` (None once a step succeeds), raise_last_error() raises it
    as its type. A DDP model is refused (MismatchError) when its
    process_group is not the state's. Methods ig and iad need a profile
    (InvalidArgumentError at construction), and ig a model whose names map
    to layers (name_map=; see _check_layers). check_optimizer(opt) warns
    once when a sparse method meets Adam's beta1 > 0."""

    def __init__(self, model=None, process_group=None, profile=None, config=None, *,
                 grad_scaler=None, nonfinite="allreduce", overlap=False, grads_in_place=True,
                 name_map=None, log_every=0, tensorboard=None, **overrides):
        if nonfinite not in ("allreduce", "keep"):
            raise L.InvalidArgumentError("nonfinite is %r (must be 'allreduce' or 'keep')"
                                         % (nonfinite,))
        if config is None:
            config = Config()
        elif isinstance(config, dict):
            config = Config(**_link_fields(config))
        elif not isinstance(config, Config):
            raise L.InvalidArgumentError("config is %r (an igrad.Config, a dict of its fields "
                                         "or None)" % (config,))
        unknown = sorted(set(overrides) - set(OPTIONS) - {"link"})
        if unknown:
            raise TypeError("IgradState() got unexpected keyword argument(s) %s (the engine's "
                            "options are igrad.Config's fields: %s; and link)"
                            % (", ".join(map(repr, unknown)), ", ".join(OPTIONS)))
        cfg = config.replace(**overrides)
        self.process_group = process_group
        self.config = dataclasses.asdict(cfg)
        auto = isinstance(profile, str) and profile == "auto"
        target_ratio = cfg.target_ratio or None
        if (auto and str(cfg.method).lower() == "ig" and target_ratio is None
                and "target_ratio" not in overrides and "release_keep" not in overrides):
            # igrad train's --target-ratio default, from the library (0 given: off)
            target_ratio = ig_default_target_ratio()
            self.config["target_ratio"] = target_ratio
        if target_ratio is not None and not (0.0 < float(target_ratio) <= 1.0):
            raise L.InvalidArgumentError("target_ratio is %r (must be in (0, 1])"
                                         % (target_ratio,))
        if str(cfg.method).lower() in ("ig", "iad") and profile is None:
            raise L.InvalidArgumentError(
                "method %r needs a profile: profile='auto' (profiled online during the first "
                "profile_steps steps, no separate run), or a profile JSON's path or an "
                "igrad.Profile (igrad profile, igrad.torch.Profiler)" % (cfg.method,))
        if auto:
            if str(cfg.method).lower() not in ("ig", "iad"):
                raise L.InvalidArgumentError("profile='auto' profiles online for iad and ig; "
                                             "method %r uses no profile" % (cfg.method,))
            self.config["profile_steps"] = cfg.profile_steps or AUTO_PROFILE_STEPS
        else:
            if cfg.reprofile_every:
                raise L.InvalidArgumentError(
                    "reprofile_every is %r, but re-profiling follows online profiling "
                    "(profile='auto')" % (cfg.reprofile_every,))
            # Online profiling only; a given profile is fitted to target_ratio
            # here, when the engine is made.
            self.config["profile_steps"] = 0
            self.config["target_ratio"] = 0.0
        if overlap and _engine_syncs(self.config):
            raise L.InvalidArgumentError(
                "topology=%r, collective=%r%s runs whole steps with the engine's own "
                "collectives (the two-level sync, the sparse all-reduce): it cannot stream "
                "(overlap=False)" % (cfg.topology, cfg.collective,
                                     " with auto_sparse_reduce" if cfg.auto_sparse_reduce
                                     else ""))
        make_config(**self.config)  # validates now, not at the first backward
        if grad_scaler is not None and not (callable(grad_scaler)
                                            or callable(getattr(grad_scaler, "get_scale", None))):
            raise L.InvalidArgumentError("grad_scaler is %r (a torch GradScaler, or a callable "
                                         "returning the current loss scale)" % (grad_scaler,))
        self.grad_scaler = grad_scaler
        self.name_map = _name_map_spec(name_map)
        self.target_ratio = None if target_ratio is None else float(target_ratio)
        self.target_fit = None
        self.profile = profile
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

    def check_optimizer(self, optimizer):
        """Warns (once per state) when a sparse method is paired with an
        Adam-style optimizer whose beta1 > 0: its first moment re-applies
        the error-fed, released gradient entries step after step, which
        igrad's sparse methods are not tuned for; `igrad train` uses
        betas=(0.0, 0.95) for them (docs/results/remedies.md). Called by
        UpdateSynchronizer and GradientSynchronizer(optimizer=...); with
        DDP call it yourself."""
        if optimizer is None or getattr(self, "_beta1_warned", False):
            return
        method = str(self.config["method"]).lower()
        if method == "dense":
            return
        b1 = sorted({float(g["betas"][0]) for g in getattr(optimizer, "param_groups", ())
                     if isinstance(g.get("betas"), (tuple, list)) and float(g["betas"][0]) > 0})
        if b1:
            self._beta1_warned = True
            warnings.warn("igrad: method %r is sparse, and the optimizer %s has beta1 = %s: "
                          "igrad's sparse methods want AdamW with betas=(0.0, 0.95) (the "
                          "default of igrad train; docs/results/remedies.md)"
                          % (method, type(optimizer).__name__, ", ".join("%g" % b for b in b1)),
                          stacklevel=3)

    @property
    def last_error(self):
        """The igrad exception (an IgradError: MismatchError, CommError, ...)
        of the last step that failed inside DDP's comm hook, None when the
        last step succeeded. DDP hands a hook's exception on as a plain
        RuntimeError whose message starts with the igrad type's name, so
        `except igrad.MismatchError` around backward() misses it; catch
        RuntimeError and look here (or call raise_last_error())."""
        return self._last_error

    def raise_last_error(self):
        """Raises last_error as its igrad type when the last step failed;
        does nothing otherwise:

            try:
                loss.backward()
            except RuntimeError:
                state.raise_last_error()   # igrad's typed error, if it was igrad's
                raise"""
        if self._last_error is not None:
            raise self._last_error

    @property
    def start_iter(self):
        """The steps below it are the engine's dense warm-up (config
        start_iter)."""
        return int(self.config.get("start_iter", 0))

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
        self._last_error = None      # last_error: the IgradError of the last failed step
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
        self._check_ddp_group(model)
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
        try:
            self._check_layers()
        except L.IgradError:  # refused: the state stays unattached
            self._named = self._meta = self._params = self._counts = self._dtypes = None
            self._slots = self._param_names = self._index = self._layout = None
            raise

    def _check_layers(self):
        """ig and iad plan per (layer, kind) component: a parameter that the
        name rules map to no layer (OTHER, embeddings, the head) is sent
        every step and never profiled. A model whose blocks the rules do not
        recognise (stage0, stage1, ...) is all OTHER: warned about when most
        parameters map to no layer, refused for ig when none maps (ig would
        send everything every step, and profile='auto' would fail only after
        profile_steps steps)."""
        if not self._needs_profile():
            return
        layout = self.layout
        rows = [layout.tensor(i) for i in range(len(layout))]
        none = [r["name"] for r in rows if r["layer"] < 0]
        if len(none) * 2 <= len(rows):
            return
        what = ("%d of %d parameters map to no layer (first: %s): the name rules do not "
                "recognise the model's blocks, so they are OTHER, sent every step and never "
                "profiled; give IgradState name_map= rules (pattern, kind, layer) for them "
                "(docs/formats.md)" % (len(none), len(rows), ", ".join(none[:4])))
        if len(none) == len(rows) and str(self.config["method"]).lower() == "ig":
            raise L.InvalidArgumentError("method 'ig': no parameter maps to a layer; " + what)
        warnings.warn("igrad: " + what, stacklevel=3)

    def _check_ddp_group(self, model):
        """A DDP model must synchronize over this state's process group:
        the hook runs igrad's collectives over the state's group while DDP
        hands it the buckets of its own, and ranks of different groups would
        wait for each other until one dies."""
        ddp_group = getattr(model, "process_group", None)
        if (ddp_group is None or not isinstance(model, torch.nn.parallel.DistributedDataParallel)
                or not (dist.is_available() and dist.is_initialized())):
            return
        mine = self.process_group if self.process_group is not None else dist.group.WORLD
        if mine is not ddp_group:
            raise L.MismatchError(
                "IgradState's process_group (%s) is not the group this DDP model synchronizes "
                "over (ddp.process_group, %s): igrad's collectives would run over another group "
                "than DDP's buckets and the ranks would block; build the state with "
                "process_group=ddp.process_group (None for the default group)"
                % (_group_text(mine), _group_text(ddp_group)))

    def _group_comm(self):
        if self._coll is None:
            distributed = dist.is_available() and dist.is_initialized()
            dev = self._data_device()
            if dev.type == "cuda":  # the GPU path: igrad.torch.device
                self._coll = _device.group_comm(self.process_group, dev, distributed)
            elif distributed:
                self._coll = TorchComm(self.process_group)
            else:
                self._coll = _SelfComm()
        return self._coll

    def _data_device(self):
        """The device of the engine's gradients: the parameters' CUDA device
        (a CUDA engine, igrad.torch.device), else the CPU. Known once attached."""
        if self._data_dev is None:
            if self._params is None:
                return torch.device("cpu")
            dev = None
            if any(p.is_cuda for p in self._params):
                dev = _device.params_device(self._params)
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
                fit = target_fit(layout, self._profile_obj, self.target_ratio,
                                 **{k: v for k, v in self.config.items()
                                    if k != "target_ratio"})
                self._profile_obj.set_threshold(fit["tau"])
                self.config["release_keep"] = fit["release_keep"]
                self.target_fit = fit
            self._grad_dt = self._engine_grad_dtype()
            cfg = make_config(**dict(self.config, grad_dtype=_TORCH_DTYPES[self._grad_dt]))
            dev = self._data_device()
            if dev.type == "cuda":
                self._engine = _device.create_engine(layout, self._profile_obj, cfg, coll, dev)
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
        """Averages `tensors` over the group in place, as DDP would (the
        fallback of a skipped step). 16-bit floats on a CPU backend are
        summed as a float32 copy and rounded back once: gloo cannot
        all-reduce bfloat16 (torch 1.13: "Invalid scalar type"), and one
        rounding of the float32 average is the more accurate result anyway."""
        coll = self._group_comm()
        if coll.size == 1:
            return
        for g in tensors:
            gd = g if coll.device.type == "cpu" or g.device == coll.device else g.to(
                coll.device)
            if gd.device.type == "cpu" and gd.dtype in (torch.bfloat16, torch.float16):
                gd = gd.to(torch.float32)
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

    def _engine_floats(self, addr, count):
        """A float32 tensor over `count` floats of the engine's memory at
        `addr` (host, or the CUDA engine's device; no copy)."""
        eng = self.engine
        if eng.device is not None:
            return _device.device_view(addr, count, torch.float32, self._data_device())
        return torch.frombuffer((ctypes.c_float * count).from_address(addr),
                                dtype=torch.float32)

    def _step_frozen(self, step, grads, frozen):
        """_step_tensors for a step where the layout tensors `frozen` have
        no gradient on this rank (a parameter frozen mid-run:
        requires_grad_(False), .grad = None). Each is given as zeros with
        its error-feedback residual (and momentum velocity) held out: the
        engine sees a = 0, so this rank contributes nothing for it and
        releases nothing, and the residual is put back unchanged after the
        step, for when the parameter thaws. The caller discards the frozen
        tensors' results, so the parameter stays untouched."""
        if not frozen:
            return self._step_tensors(step, grads)
        eng = self.engine
        held = []
        with torch.no_grad():
            for t in frozen:
                for addr in (eng.residual_address(t), eng.velocity_address(t)):
                    if addr:
                        buf = self._engine_floats(addr, self._counts[t])
                        held.append((buf, buf.clone()))
                        buf.zero_()
        try:
            return self._step_tensors(step, grads)
        finally:
            with torch.no_grad():
                for buf, saved in held:
                    buf.copy_(saved)

    def _step_tensors(self, step, grads, refused=None):
        """Synchronizes one step: grads[t] is tensor t's gradient (layout
        order, any float dtype and device), overwritten in place with the
        average of every rank's selection. Returns the stats dict.
        `refused`: (t, exception) when the caller already found this rank
        unable to take part (grads may then be None); the step then fails
        on every rank. Raises MismatchError on every rank when a parameter
        on any rank no longer matches the layout (see _check_step)."""
        bad = refused if refused is not None else self._check_step(step, grads)
        eng = self.engine
        coll = self._group_comm()
        # The engine reads and writes contiguous float32 memory on its device
        # (the CPU, or the parameters' GPU: igrad.torch.device), or the model's
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
            _device.set_step_stream(eng, data_dev)
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
        if step < self.start_iter:  # the engine's dense warm-up (config start_iter)
            st["warmup"] = 1
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
