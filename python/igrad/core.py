"""core.py — Python objects over libigrad's handles: Layout, Trace,
Profile, Comm (self and custom backends), engine configuration and Engine.

Each object owns one C handle and frees it when it is garbage collected
(or on close()). Arguments are plain Python values and buffer addresses
(ints); nothing here imports torch, so the package is usable without it.
The PyTorch integration (DDP hook, GradientSynchronizer, Profiler, a
communicator over torch.distributed) lives in the igrad.torch package
(python/igrad/torch/).
"""
import ctypes
import dataclasses
import os
import itertools
import threading
import traceback

from . import _lib as L


def _b(text):
    return text.encode("utf-8") if isinstance(text, str) else text


def _s(raw):
    return raw.decode("utf-8", "replace") if raw is not None else None


def _dtype_value(dtype, what):
    """The igrad_dtype_t of a dtype name ("F32", "bf16", "F8_E4M3", ...) or
    number; InvalidArgumentError naming `what` and the known names."""
    if isinstance(dtype, int):
        return dtype
    v = L.DTYPE.get(str(dtype).upper())
    if v is None:
        raise L.InvalidArgumentError("%s: unknown dtype %r (libigrad knows %s)" % (
            what, dtype, ", ".join(L.DTYPE)))
    return v


def _sparsifier_value(sp):
    if isinstance(sp, int):
        return sp
    v = L.SPARSIFIERS.get(str(sp).lower())
    if v is None:
        raise L.InvalidArgumentError("unknown sparsifier %r (libigrad knows %s)" % (
            sp, ", ".join(L.SPARSIFIERS)))
    return v


def _enum_from_name(kind, value):
    """Enum value for a name (e.g. ("method", "ig")), or the int itself."""
    if isinstance(value, int):
        return value
    out = ctypes.c_int()
    L.lib().call("igrad_%s_from_name" % kind, _b(str(value)), ctypes.byref(out))
    return out.value


class _Handle:
    """Base of the handle owners: `_h` is the C pointer (int), `_free` the
    name of the function that releases it."""

    _free = None

    def __init__(self, handle):
        self._h = handle
        self._lib = L.lib()

    @property
    def handle(self):
        if not self._h:
            raise L.StateError("%s is closed" % type(self).__name__)
        return self._h

    def close(self):
        h, self._h = getattr(self, "_h", None), None
        if h and self._free:
            getattr(self._lib.dll, self._free)(h)

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the library may be gone
            pass


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------

# Layer of a name rule (igrad.h: IGRAD_NAME_LAYER_BLOCK / _NONE).
_NAME_LAYER_BLOCK, _NAME_LAYER_NONE = -2, -1


class NameMap(_Handle):
    """User name rules tried before the built-in ones (igrad_name_map_t):
    an ordered list of (pattern, kind, layer). pattern: a POSIX extended
    regex matched against the whole name (\\d accepted; a compiled
    re.Pattern gives its .pattern), or "glob:..." (fnmatch, '*' matches
    dots). kind: "Q", ..., "NORM", "OTHER". layer: "block" (the index after
    layers.N / h.N / blocks.N / block.N / layer.N), None (no layer: EMB,
    HEAD, OTHER, outer NORM) or a capture group g >= 1 holding the layer
    number."""

    _free = "igrad_name_map_free"

    @classmethod
    def create(cls, spec):
        """spec: a NameMap (returned as is), a path of a map file
        (docs/formats.md) or an iterable of (pattern, kind, layer)."""
        if isinstance(spec, NameMap):
            return spec
        lib = L.lib()
        h = ctypes.c_void_p()
        if isinstance(spec, (str, bytes, os.PathLike)):
            lib.call("igrad_name_map_load", _b(os.fsdecode(spec)), ctypes.byref(h))
            return cls(h.value)
        lib.call("igrad_name_map_create", ctypes.byref(h))
        self = cls(h.value)
        for i, rule in enumerate(spec):
            try:
                pattern, kind, layer = rule
            except (TypeError, ValueError):
                raise L.InvalidArgumentError(
                    "name_map rule %d is %r (expected (pattern, kind, layer))" % (i + 1, rule))
            pattern = getattr(pattern, "pattern", pattern)  # re.Pattern
            if layer is None or layer == "none":
                lv = _NAME_LAYER_NONE
            elif layer == "block":
                lv = _NAME_LAYER_BLOCK
            elif isinstance(layer, int) and not isinstance(layer, bool) and layer >= 1:
                lv = layer
            else:
                raise L.InvalidArgumentError(
                    "name_map rule %d (%r): layer is %r (expected 'block', None or a capture "
                    "group >= 1)" % (i + 1, pattern, layer))
            lib.call("igrad_name_map_add", self._h, _b(str(pattern)),
                     _enum_from_name("kind", kind), lv)
        return self

    def __len__(self):
        return int(self._lib.igrad_name_map_count(self.handle))


def _name_map_arg(name_map):
    """A NameMap for a name_map= argument, None for None."""
    return None if name_map is None else NameMap.create(name_map)


class Layout(_Handle):
    """An ordered table of trainable tensors (igrad_layout_t)."""

    _free = "igrad_layout_free"

    @classmethod
    def from_tensors(cls, tensors, name_map=None):
        """tensors: iterable of (name, shape) or (name, shape, dtype name).
        name_map: user name rules (NameMap.create's spec) tried before the
        built-in ones; the layout's hash then covers each tensor's (layer,
        kind) too."""
        lib = L.lib()
        nm = _name_map_arg(name_map)
        h = ctypes.c_void_p()
        lib.call("igrad_layout_create", ctypes.byref(h))
        self = cls(h.value)
        if nm is not None:
            lib.call("igrad_layout_set_name_map", self._h, nm.handle)
        for item in tensors:
            name, shape = item[0], tuple(int(d) for d in item[1])
            dtype = item[2] if len(item) > 2 else "F32"
            if len(shape) > L.MAX_DIMS:
                # Only the entry count and the leading dimension (rows of a
                # row-wise selection) matter to igrad: fold the rest.
                rest = 1
                for d in shape[1:]:
                    rest *= d
                shape = (shape[0], rest)
            arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
            lib.call("igrad_layout_add", self._h, _b(name), _dtype_value(dtype, name),
                     len(shape), arr)
        return self

    @classmethod
    def load(cls, path, name_map=None):
        """Reads a HF config.json, a safetensors header, a name list or a
        checkpoint directory (igrad_layout_load); with name_map, remapped
        by those rules (igrad_layout_remap)."""
        h = ctypes.c_void_p()
        L.lib().call("igrad_layout_load", _b(str(path)), ctypes.byref(h))
        self = cls(h.value)
        if name_map is None:
            return self
        nm = _name_map_arg(name_map)
        h2 = ctypes.c_void_p()
        L.lib().call("igrad_layout_remap", self.handle, nm.handle, ctypes.byref(h2))
        return cls(h2.value)

    def unmapped(self):
        """The tensors inside numbered blocks that no name rule maps (OTHER:
        sent every step, never profiled or deferred), as (name, count,
        share of the layout's entries)."""
        total = max(1, self.total_count)
        out = []
        for i in range(len(self)):
            if self._lib.igrad_layout_is_unmapped(self.handle, i):
                t = self.tensor(i)
                out.append((t["name"], t["count"], t["count"] / total))
        return out

    def unmapped_report(self, max_names=8):
        """The library's warning text about unmapped(), or None."""
        p = ctypes.c_void_p()
        self._lib.call("igrad_layout_unmapped_report", self.handle, max_names, ctypes.byref(p))
        if not p.value:
            return None
        try:
            return ctypes.string_at(p.value).decode()
        finally:
            self._lib.igrad_free(p.value)

    def __len__(self):
        return int(self._lib.igrad_layout_count(self.handle))

    def tensor(self, i):
        """Row i as a dict (name, shape, count, offset, layer, kind, ...)."""
        info = L.TensorInfo()
        self._lib.call("igrad_layout_tensor", self.handle, i, ctypes.byref(info))
        return {"name": _s(info.name), "shape": tuple(info.shape[:info.ndim]),
                "count": info.count, "offset": info.offset, "layer": info.layer,
                "kind": L.KIND_NAMES[info.kind], "dtype": L.DTYPE_NAMES[info.dtype],
                "is_bias": bool(info.is_bias),
                "component": info.component}

    @property
    def names(self):
        return [self.tensor(i)["name"] for i in range(len(self))]

    def find(self, name):
        """Index of the tensor called `name`, or -1."""
        return int(self._lib.igrad_layout_find(self.handle, _b(name)))

    @property
    def total_count(self):
        return int(self._lib.igrad_layout_total_count(self.handle))

    @property
    def hash(self):
        return int(self._lib.igrad_layout_hash(self.handle))

    @property
    def family(self):
        return _s(self._lib.igrad_layout_family(self.handle))

    def components(self):
        out = []
        info = L.ComponentInfo()
        for i in range(int(self._lib.igrad_layout_component_count(self.handle))):
            self._lib.call("igrad_layout_component", self.handle, i, ctypes.byref(info))
            out.append({"layer": info.layer, "kind": L.KIND_NAMES[info.kind],
                        "count": info.count, "tensors": info.tensors})
        return out

    def to_json(self):
        p = ctypes.c_void_p()
        self._lib.call("igrad_layout_to_json", self.handle, ctypes.byref(p))
        try:
            return ctypes.string_at(p.value).decode()
        finally:
            self._lib.igrad_free(p.value)


# ---------------------------------------------------------------------------
# Trace and profile
# ---------------------------------------------------------------------------

class Trace(_Handle):
    """Per-step, per-component activity of retained entries (igrad_trace_t)."""

    _free = "igrad_trace_free"

    @classmethod
    def create(cls, layout, sparsifier=None, density=None):
        h = ctypes.c_void_p()
        L.lib().call("igrad_trace_create", layout.handle, ctypes.byref(h))
        self = cls(h.value)
        if sparsifier is not None:
            self.set_sparsifier(sparsifier, density)
        return self

    @classmethod
    def load(cls, path):
        h = ctypes.c_void_p()
        L.lib().call("igrad_trace_load", _b(str(path)), ctypes.byref(h))
        return cls(h.value)

    def set_sparsifier(self, sparsifier, density):
        sp = _sparsifier_value(sparsifier)
        self._lib.call("igrad_trace_set_sparsifier", self.handle, sp, float(density))

    def record(self, step, tensor, sumsq, retained):
        self._lib.call("igrad_trace_record", self.handle, int(step), int(tensor),
                       float(sumsq), int(retained))

    def save(self, path):
        self._lib.call("igrad_trace_save", self.handle, _b(str(path)))

    def __len__(self):
        return int(self._lib.igrad_trace_step_count(self.handle))

    def steps(self):
        return [int(self._lib.igrad_trace_step(self.handle, i)) for i in range(len(self))]

    def components(self):
        out = []
        info = L.ComponentInfo()
        for i in range(int(self._lib.igrad_trace_component_count(self.handle))):
            self._lib.call("igrad_trace_component", self.handle, i, ctypes.byref(info))
            out.append({"layer": info.layer, "kind": L.KIND_NAMES[info.kind],
                        "count": info.count})
        return out

    def value(self, step_index, component):
        """(activity, retained) of a component at the step_index-th step."""
        a, r = ctypes.c_double(), ctypes.c_int64()
        self._lib.call("igrad_trace_value", self.handle, step_index, component,
                       ctypes.byref(a), ctypes.byref(r))
        return a.value, r.value

    @property
    def layout_hash(self):
        return int(self._lib.igrad_trace_layout_hash(self.handle))

    @property
    def sparsifier(self):
        return _s(self._lib.igrad_trace_sparsifier(self.handle))

    @property
    def density(self):
        return float(self._lib.igrad_trace_density(self.handle))


def parse_window(window):
    """None, (a, b) (b None = to the end) or "A:B" / "A:" / ":B" -> (a, b)
    with b = -1 for "to the end"."""
    if window is None:
        return 0, -1
    if isinstance(window, str):
        if window.count(":") != 1:
            raise L.InvalidArgumentError("window %r is not A:B, A: or :B" % window)
        a, b = window.split(":")
        window = (int(a) if a else 0, int(b) if b else None)
    a, b = window
    return int(a or 0), (-1 if b is None else int(b))


class Profile(_Handle):
    """Component scores, threshold and important set (igrad_profile_t)."""

    _free = "igrad_profile_free"

    @classmethod
    def build(cls, trace, window=None, method="knee", alpha=0.7):
        opts = L.ProfileOptions()
        opts.size = ctypes.sizeof(L.ProfileOptions)
        opts.alpha = float(alpha)
        opts.method = _b(method)
        opts.window_begin, opts.window_end = parse_window(window)
        h = ctypes.c_void_p()
        L.lib().call("igrad_profile_build", trace.handle, ctypes.byref(opts), ctypes.byref(h))
        return cls(h.value)

    @classmethod
    def load(cls, path, layout=None):
        """Reads a profile JSON; with a layout, refuses a profile made for
        another model (MismatchError)."""
        h = ctypes.c_void_p()
        L.lib().call("igrad_profile_load", _b(str(path)), layout.handle if layout else None,
                     ctypes.byref(h))
        return cls(h.value)

    def save_json(self, path):
        self._lib.call("igrad_profile_save_json", self.handle, _b(str(path)))

    def save_csv(self, path):
        self._lib.call("igrad_profile_save_csv", self.handle, _b(str(path)))

    def entries(self):
        out = []
        e = L.ProfileEntry()
        for i in range(int(self._lib.igrad_profile_count(self.handle))):
            self._lib.call("igrad_profile_entry", self.handle, i, ctypes.byref(e))
            out.append({"layer": e.layer, "kind": L.KIND_NAMES[e.kind], "count": e.count,
                        "mean_activity": e.mean_activity, "magnitude": e.magnitude,
                        "persistence": e.persistence, "score": e.score,
                        "important": bool(e.important)})
        return out

    @property
    def threshold(self):
        return float(self._lib.igrad_profile_threshold(self.handle))

    @property
    def layout_hash(self):
        return int(self._lib.igrad_profile_layout_hash(self.handle))

    @property
    def method(self):
        return _s(self._lib.igrad_profile_method(self.handle))

    @property
    def sparsifier(self):
        return _s(self._lib.igrad_profile_sparsifier(self.handle))

    @property
    def density(self):
        return float(self._lib.igrad_profile_density(self.handle))

    @property
    def alpha(self):
        return float(self._lib.igrad_profile_alpha(self.handle))

    @property
    def window(self):
        b, e, n = ctypes.c_int64(), ctypes.c_int64(), ctypes.c_size_t()
        self._lib.igrad_profile_window(self.handle, ctypes.byref(b), ctypes.byref(e),
                                       ctypes.byref(n))
        return b.value, e.value

    def is_important(self, layer, kind):
        k = L.KIND_NAMES.index(kind) if isinstance(kind, str) else int(kind)
        return int(self._lib.igrad_profile_is_important(self.handle, int(layer), k))

    def important(self):
        """[(layer, kind)] of the important components."""
        return [(e["layer"], e["kind"]) for e in self.entries() if e["important"]]

    def set_threshold(self, tau):
        """Re-marks the important set in place: important = score >= tau."""
        self._lib.call("igrad_profile_set_threshold", self.handle, float(tau))


TARGET_MIN_KEEP = 0.05  # IGRAD_TARGET_MIN_KEEP


def ig_default_target_ratio():
    """The target_ratio method "ig" uses when none is given (0.25): the
    library's igrad_ig_default_target_ratio(), which `igrad train`'s
    --target-ratio default reads too. IgradState(method="ig",
    profile="auto") takes it when target_ratio is not given."""
    fn = L.lib().dll.igrad_ig_default_target_ratio
    fn.restype, fn.argtypes = ctypes.c_double, []
    return float(fn())


def target_fit(layout, profile, target_ratio, min_keep=TARGET_MIN_KEEP, **config):
    """igrad_target_fit: the important set (as a threshold tau) and kappa
    that make method ig send at most target_ratio x the sparsifier's
    *_sync payload, priced with the engine's own budgets. `config` takes
    make_config's fields (method must be ig, the default). Returns a dict:
    tau, release_keep, n_important, n_gated, f_imp, ratio, model_ratio, met.
    Apply it with profile.set_threshold(tau) and release_keep."""
    cfg = make_config(**config)
    out = L.TargetFit()
    L.lib().call("igrad_target_fit", layout.handle, profile.handle, ctypes.byref(cfg),
                 float(target_ratio), float(min_keep), ctypes.byref(out))
    return {"tau": out.tau, "release_keep": out.release_keep,
            "n_important": out.n_important, "n_gated": out.n_gated, "f_imp": out.f_imp,
            "ratio": out.ratio, "model_ratio": out.model_ratio, "met": bool(out.met)}


def partition(scores, method="knee"):
    """Threshold over scores by a partition method (igrad_partition)."""
    arr = (ctypes.c_double * max(1, len(scores)))(*scores)
    tau = ctypes.c_double()
    L.lib().call("igrad_partition", arr, len(scores), _b(method), ctypes.byref(tau))
    return tau.value


# ---------------------------------------------------------------------------
# Selection (used by the Profiler and by tests)
# ---------------------------------------------------------------------------

def select_spec(sparsifier, density, shape, step=0, interleave=False, scale=1.0):
    """The selection spec of a tensor of `shape` at `step` (a SelectSpec)."""
    sp = _sparsifier_value(sparsifier)
    shape = tuple(int(d) for d in shape)
    if len(shape) > L.MAX_DIMS:
        rest = 1
        for d in shape[1:]:
            rest *= d
        shape = (shape[0], rest)
    arr = (ctypes.c_int64 * max(1, len(shape)))(*shape)
    spec = L.SelectSpec()
    L.lib().call("igrad_select_spec", sp, float(density), float(scale), int(bool(interleave)),
                 int(step), len(shape), arr, ctypes.byref(spec))
    return spec


class SelectWorkspace(_Handle):
    """Scratch space of igrad_select_ef (one per thread)."""

    _free = "igrad_select_ws_free"

    def __init__(self):
        h = ctypes.c_void_p()
        L.lib().call("igrad_select_ws_create", ctypes.byref(h))
        super().__init__(h.value)
        self._idx = None
        self._val = None

    def select_ef(self, grad_addr, residual_addr, spec, name=None, index_addr=None,
                  value_addr=None):
        """Fused error feedback + selection on raw float32 buffers.
        Returns the Selection; index/value land in the given buffers or in
        scratch arrays of this workspace (valid until the next call)."""
        n = max(1, spec.count)
        if index_addr is None or value_addr is None:
            if self._idx is None or len(self._idx) < n:
                self._idx = (ctypes.c_uint32 * n)()
                self._val = (ctypes.c_float * n)()
            index_addr = ctypes.addressof(self._idx)
            value_addr = ctypes.addressof(self._val)
        sel = L.Selection()
        sel.index = ctypes.cast(index_addr, ctypes.POINTER(ctypes.c_uint32))
        sel.value = ctypes.cast(value_addr, ctypes.POINTER(ctypes.c_float))
        self._lib.call("igrad_select_ef", grad_addr, residual_addr, ctypes.byref(spec),
                       _b(name) if name else None, self.handle, ctypes.byref(sel))
        return sel


# ---------------------------------------------------------------------------
# Communicators
# ---------------------------------------------------------------------------

class Comm(_Handle):
    """A communicator (igrad_comm_t): `Comm.self_()` for one rank, or
    `Comm.custom(backend, rank, size)` whose collectives call the methods of
    a Python object:
        allgather(send, nbytes, recv)               addresses (ints)
        allreduce(send, recv, count, dtype, op)     dtype "F32"/"F64"/"I64",
                                                    op "sum"/"max"/"min"
        bcast(buf, nbytes, root)
        barrier()
    and optionally alltoallv(send, send_nbytes, send_displs, recv, recv_nbytes,
    recv_displs) (addresses and lists of `backend.size` byte counts and
    offsets, blocking; what collective "sparse_reduce" needs), and
    optionally iallgather/iallreduce (same arguments, return a handle
    object or None when already complete) with wait(handle) and
    test(handle) -> bool. An exception in a callback becomes IGRAD_E_COMM,
    its text the library's error message. With memory="cuda" the
    non-blocking collectives and alltoallv get CUDA device addresses (the
    buckets of an Engine(..., device=N)), and the backend's optional
    set_stream(stream) (an int cudaStream_t, 0 = default) is called before
    each (alltoallv stays blocking: it returns once the bytes are there);
    the other blocking ones keep host addresses. `Comm.self_cuda(stream)`: one rank for device
    buffers (igrad_comm_create_self_cuda)."""

    _free = "igrad_comm_free"

    @classmethod
    def self_(cls):
        h = ctypes.c_void_p()
        L.lib().call("igrad_comm_create_self", ctypes.byref(h))
        return cls(h.value)

    @classmethod
    def self_cuda(cls, stream=None):
        h = ctypes.c_void_p()
        L.lib().call("igrad_comm_create_self_cuda", stream or None, ctypes.byref(h))
        return cls(h.value)

    @classmethod
    def custom(cls, backend, rank, size, memory="host"):
        bridge = _CustomBridge(backend, memory)
        h = ctypes.c_void_p()
        L.lib().call("igrad_comm_create_custom", ctypes.byref(bridge.ops), None, int(rank),
                     int(size), ctypes.byref(h))
        self = cls(h.value)
        self._bridge = bridge  # the callbacks must outlive the C comm
        return self

    def close(self):
        super().close()
        self._bridge = None

    @property
    def rank(self):
        return int(self._lib.igrad_comm_rank(self.handle))

    @property
    def size(self):
        return int(self._lib.igrad_comm_size(self.handle))

    @property
    def backend(self):
        return _s(self._lib.igrad_comm_backend(self.handle))


_OP_NAMES = {L.REDUCE_SUM: "sum", L.REDUCE_MAX: "max", L.REDUCE_MIN: "min"}


class _CustomBridge:
    """The ctypes callback table of a custom comm. Exceptions never cross
    into C: they are caught, kept for error_message(), and reported as
    IGRAD_E_COMM. Non-blocking handles are small integers (never 0) that
    map to the backend's handle objects."""

    def __init__(self, backend, memory="host"):
        if memory not in ("host", "cuda"):
            raise L.InvalidArgumentError("memory is %r (must be 'host' or 'cuda')" % (memory,))
        self.backend = backend
        self.memory = memory
        self.error = b""
        self._err_buf = ctypes.create_string_buffer(1)
        self.handles = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        ops = L.CommOps()
        ops.size = ctypes.sizeof(L.CommOps)
        self._fns = [
            L.ALLGATHER_FN(self._allgather), L.ALLREDUCE_FN(self._allreduce),
            L.BCAST_FN(self._bcast), L.BARRIER_FN(self._barrier)]
        ops.allgather, ops.allreduce, ops.bcast, ops.barrier = self._fns
        if hasattr(backend, "iallgather") and hasattr(backend, "wait"):
            more = [L.IALLGATHER_FN(self._iallgather), L.IALLREDUCE_FN(self._iallreduce),
                    L.WAIT_FN(self._wait), L.TEST_FN(self._test)]
            self._fns += more
            ops.iallgather, ops.iallreduce, ops.wait, ops.test = more
        self.children = []  # bridges of the comms split from this one
        if all(hasattr(backend, f) for f in ("split", "ireduce", "ibcast", "wait")):
            more = [L.SPLIT_FN(self._split), L.IREDUCE_FN(self._ireduce),
                    L.IBCAST_FN(self._ibcast)]
            self._fns += more
            ops.split, ops.ireduce, ops.ibcast = more
        if hasattr(backend, "alltoallv"):  # the sparse all-reduce (collective sparse_reduce)
            fn = L.ALLTOALLV_FN(self._alltoallv)
            self._fns.append(fn)
            ops.alltoallv = fn
        msg = L.ERRMSG_FN(self._error_message)
        self._fns.append(msg)
        ops.error_message = msg
        if memory == "cuda":
            ops.memory = L.MEMORY_CUDA
            if hasattr(backend, "set_stream"):
                fn = L.STREAM_FN(lambda user, stream: self._guard(backend.set_stream,
                                                                  stream or 0))
                self._fns.append(fn)
                ops.set_stream = fn
        self.ops = ops

    def _guard(self, fn, *args):
        try:
            fn(*args)
            return 0
        except Exception as e:  # noqa: BLE001 - reported to C as IGRAD_E_COMM
            self.error = ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace")
            self.trace = traceback.format_exc()
            return 8

    def _allgather(self, user, send, nbytes, recv):
        if not nbytes:
            return 0
        return self._guard(self.backend.allgather, send, nbytes, recv)

    def _allreduce(self, user, send, recv, count, dtype, op):
        if not count:
            return 0
        return self._guard(self.backend.allreduce, send, recv, count, L.DTYPE_NAMES[dtype],
                           _OP_NAMES[op])

    def _bcast(self, user, buf, nbytes, root):
        if not nbytes:
            return 0
        return self._guard(self.backend.bcast, buf, nbytes, root)

    def _barrier(self, user):
        return self._guard(self.backend.barrier)

    def _keep(self, out, handle):
        if handle is None:
            out[0] = None
            return
        with self._lock:
            key = next(self._ids)
            self.handles[key] = handle
        out[0] = key

    def _iallgather(self, user, send, nbytes, recv, out):
        out[0] = None
        if not nbytes:
            return 0
        return self._guard(lambda: self._keep(out, self.backend.iallgather(send, nbytes,
                                                                            recv)))

    def _iallreduce(self, user, send, recv, count, dtype, op, out):
        out[0] = None
        if not count:
            return 0
        return self._guard(lambda: self._keep(out, self.backend.iallreduce(
            send, recv, count, L.DTYPE_NAMES[dtype], _OP_NAMES[op])))

    def _split(self, user, color, key, ops_out, user_out, rank_out, size_out):
        def run():
            child = _CustomBridge(self.backend.split(color, key), self.memory)
            self.children.append(child)  # its callbacks live as long as this bridge
            ops_out[0] = ctypes.addressof(child.ops)
            user_out[0] = None
            rank_out[0] = int(child.backend.rank)
            size_out[0] = int(child.backend.size)
        return self._guard(run)

    def _ireduce(self, user, send, recv, count, dtype, op, root, out):
        out[0] = None
        if not count:
            return 0
        return self._guard(lambda: self._keep(out, self.backend.ireduce(
            send, recv, count, L.DTYPE_NAMES[dtype], _OP_NAMES[op], root)))

    def _ibcast(self, user, buf, nbytes, root, out):
        out[0] = None
        if not nbytes:
            return 0
        return self._guard(lambda: self._keep(out, self.backend.ibcast(buf, nbytes, root)))

    def _alltoallv(self, user, send, send_nbytes, send_displs, recv, recv_nbytes,
                   recv_displs):
        def run():
            n = int(self.backend.size)
            self.backend.alltoallv(send or 0, send_nbytes[:n], send_displs[:n], recv or 0,
                                   recv_nbytes[:n], recv_displs[:n])
        return self._guard(run)

    def _wait(self, user, key):
        with self._lock:
            handle = self.handles.pop(key, None)
        if handle is None:  # completed by test() already
            return 0
        return self._guard(self.backend.wait, handle)

    def _test(self, user, key, done):
        def run():
            test = getattr(self.backend, "test", None)
            if test is None:  # no test: complete it now (the contract allows it)
                self.backend.wait(self.handles[key])
                self.handles[key] = None
                done[0] = 1
            else:
                done[0] = 1 if (self.handles[key] is None or test(self.handles[key])) else 0
        return self._guard(run)

    def _error_message(self, user):
        self._err_buf = ctypes.create_string_buffer(self.error)
        return ctypes.addressof(self._err_buf)


# ---------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------

# The engine options the binding offers: igrad_config_t's fields by name,
# in the struct's order, and how a name converts (enum fields through the
# library's name functions). Every default is the library's own
# (igrad_config_default: IGRAD_CONFIG_INIT), read when the package loads.
# grad_dtype is not an option: IgradState sets it from the parameters.
OPTIONS = ("method", "sparsifier", "interleave", "density", "release_period",
           "release_keep", "schedule", "residual", "pack", "buckets", "block_entries",
           "verify_every", "value_dtype", "index_dtype", "collective", "threads", "timeout_s",
           "profile_steps", "profile_alpha", "profile_partition", "momentum", "start_iter",
           "target_ratio", "reprofile_every", "reprofile_margin", "topology",
           "ranks_per_node", "dense_below", "link_latency_ns", "link_bandwidth_mbps",
           "auto_sparse_reduce", "index_code")
_ENUM_KINDS = {"index_code": "index_code", "method": "method", "sparsifier": "sparsifier", "schedule": "schedule",
               "residual": "residual_policy", "pack": "pack_policy", "value_dtype": "dtype",
               "index_dtype": "dtype", "collective": "collective", "topology": "topology",
               "grad_dtype": "dtype"}
_BOOLS = ("interleave", "auto_sparse_reduce")
# dtype names the trainer's --value-dtype takes besides the library's
_DTYPE_ALIASES = {"FP8": "F8_E4M3", "FP16": "F16"}
_FIELD_TYPES = dict(L.Config._fields_)


def _c_default():
    """A fresh igrad_config_t holding IGRAD_CONFIG_INIT, written by the
    library (igrad_config_default)."""
    c = L.Config()
    L.lib().call("igrad_config_default", ctypes.byref(c), ctypes.sizeof(L.Config))
    return c


def _set_field(c, name, value):
    kind = _ENUM_KINDS.get(name)
    if kind == "sparsifier":
        v = _sparsifier_value(value)
    elif kind == "dtype":
        v = value if isinstance(value, int) else str(value).upper()
        v = _enum_from_name("dtype", _DTYPE_ALIASES.get(v, v))
    elif kind is not None:
        v = _enum_from_name(kind, value)
    elif name in _BOOLS:
        v = int(bool(value))
    elif _FIELD_TYPES[name] is ctypes.c_double:
        v = float(value)
    elif _FIELD_TYPES[name] is ctypes.c_char_p:
        v = str(value).encode()  # kept alive by c
    else:
        v = int(value)
    setattr(c, name, v)


def _get_field(c, name):
    kind = _ENUM_KINDS.get(name)
    v = getattr(c, name)
    if kind is not None:
        return _s(getattr(L.lib(), "igrad_%s_name" % kind)(v))
    if name in _BOOLS:
        return bool(v)
    if _FIELD_TYPES[name] is ctypes.c_char_p:
        return _s(v)
    return v


_DEFAULTS = {n: _get_field(_c_default(), n) for n in OPTIONS}


@dataclasses.dataclass
class Config:
    """The engine's options (igrad_config_t; include/igrad.h documents each
    field). Every default is the C library's IGRAD_CONFIG_INIT, read through
    igrad_config_default, so this class defines none of its own. Values are
    checked by the library when the Config is made (InvalidArgumentError
    naming the field). Pass it as IgradState(config=...); keyword overrides
    there replace single fields. to_struct() gives the igrad_config_t.

    method          "ig", "iad", "topk_sync", "adtopk_sync" or "dense"
    sparsifier      "adtopk" or "topk" (iad, ig); density: rho in (0, 1]
    interleave      adtopk: odd steps select flat
    release_period, release_keep   R and kappa of deferred components
    schedule, pack, buckets, block_entries   release phases, bucket packing
    residual        "on" ("drop": the ablation without error feedback)
    verify_every    the ranks' agreement check every N steps
    value_dtype     "F32", "BF16", "F16" or "F8_E4M3" ("FP8": E4M3 codes and
                    a power-of-two scale per block) values on the wire
    index_dtype     "U16" (16-bit indices where they fit) or "U32"
    collective      "auto", "gather", "reduce" or "sparse_reduce"
    threads, timeout_s   selection threads (0 = OpenMP's); collective timeout
    profile_steps, profile_alpha, profile_partition   online profiling
                    (IgradState(profile="auto") sets profile_steps)
    momentum        DGC momentum correction in [0, 1) (for SGD without
                    momentum; with AdamW use betas=(0.0, 0.95) instead)
    start_iter      the first N steps are plain dense averages (warm-up)
    target_ratio    ig: payload X x the sparsifier's *_sync (0 = off)
    reprofile_every, reprofile_margin   periodic re-profiling (online)
    topology, ranks_per_node   "flat" or "hier" (two-level sync)
    dense_below     tensors of fewer entries are sent whole
    link_latency_ns, link_bandwidth_mbps   the link collective "auto" prices
    auto_sparse_reduce   "auto" may choose the sparse all-reduce
    index_code      "compact" (Elias-Fano, bitmap or fixed per row, the
                    smallest) or "fixed" (index_dtype's widths) indices"""

    method: str = _DEFAULTS["method"]
    sparsifier: str = _DEFAULTS["sparsifier"]
    interleave: bool = _DEFAULTS["interleave"]
    density: float = _DEFAULTS["density"]
    release_period: int = _DEFAULTS["release_period"]
    release_keep: float = _DEFAULTS["release_keep"]
    schedule: str = _DEFAULTS["schedule"]
    residual: str = _DEFAULTS["residual"]
    pack: str = _DEFAULTS["pack"]
    buckets: int = _DEFAULTS["buckets"]
    block_entries: int = _DEFAULTS["block_entries"]
    verify_every: int = _DEFAULTS["verify_every"]
    value_dtype: str = _DEFAULTS["value_dtype"]
    index_dtype: str = _DEFAULTS["index_dtype"]
    collective: str = _DEFAULTS["collective"]
    threads: int = _DEFAULTS["threads"]
    timeout_s: float = _DEFAULTS["timeout_s"]
    profile_steps: int = _DEFAULTS["profile_steps"]
    profile_alpha: float = _DEFAULTS["profile_alpha"]
    profile_partition: str = _DEFAULTS["profile_partition"]  # None: "knee"
    momentum: float = _DEFAULTS["momentum"]
    start_iter: int = _DEFAULTS["start_iter"]
    target_ratio: float = _DEFAULTS["target_ratio"]
    reprofile_every: int = _DEFAULTS["reprofile_every"]
    reprofile_margin: float = _DEFAULTS["reprofile_margin"]
    topology: str = _DEFAULTS["topology"]
    ranks_per_node: int = _DEFAULTS["ranks_per_node"]
    dense_below: int = _DEFAULTS["dense_below"]
    link_latency_ns: int = _DEFAULTS["link_latency_ns"]
    link_bandwidth_mbps: int = _DEFAULTS["link_bandwidth_mbps"]
    auto_sparse_reduce: bool = _DEFAULTS["auto_sparse_reduce"]
    index_code: str = _DEFAULTS["index_code"]

    def __post_init__(self):
        self.to_struct()  # the library checks every value now

    def to_struct(self, **extra):
        """The igrad_config_t of these options (and `extra` fields, e.g.
        grad_dtype), validated by the library."""
        return make_config(**dict(dataclasses.asdict(self), **extra))

    def replace(self, **overrides):
        """A copy with some options replaced (link= as make_config takes it)."""
        return dataclasses.replace(self, **_link_fields(overrides))

    @classmethod
    def from_struct(cls, c):
        """The Config of an igrad_config_t (e.g. Engine.config())."""
        return cls(**{n: _get_field(c, n) for n in OPTIONS})


def link_presets():
    """igrad plan's named links: [(name, gbit_per_s, latency_us, assumes)]."""
    out = []
    lib = L.lib()
    for i in range(lib.igrad_link_preset_count()):
        p = lib.igrad_link_preset(i).contents
        out.append((p.name.decode(), p.gbit_per_s, p.latency_us, p.assumes.decode()))
    return out


def link_config(spec):
    """(link_latency_ns, link_bandwidth_mbps) of a preset name or
    "GBITS,LAT_US", as the CLI's --link rounds them (igrad_link_to_config)."""
    bw, lat = ctypes.c_double(), ctypes.c_double()
    L.lib().call("igrad_link_parse", _b(str(spec)), ctypes.byref(bw), ctypes.byref(lat))
    ns, mbps = ctypes.c_int64(), ctypes.c_int64()
    L.lib().igrad_link_to_config(bw, lat, ctypes.byref(ns), ctypes.byref(mbps))
    return ns.value, mbps.value


def _link_fields(kw):
    """kw with link= (a preset name, "GBITS,LAT_US" or (latency_ns,
    bandwidth_mbps)) replaced by link_latency_ns and link_bandwidth_mbps."""
    if "link" not in kw:
        return kw
    kw = dict(kw)
    link = kw.pop("link")
    if isinstance(link, str):
        kw["link_latency_ns"], kw["link_bandwidth_mbps"] = link_config(link)
    elif link is not None:
        try:
            lat, mbps = link
            kw["link_latency_ns"], kw["link_bandwidth_mbps"] = int(lat), int(mbps)
        except (TypeError, ValueError):
            raise L.InvalidArgumentError("link is %r (give a preset name such as '100g', "
                                         "'GBITS,LAT_US', or (latency_ns, bandwidth_mbps) "
                                         "integers, e.g. (8000, 100000))" % (link,))
    return kw


def make_config(**kw):
    """An igrad_config_t from keyword arguments: the library's defaults
    (IGRAD_CONFIG_INIT) with the given fields replaced (names as in
    Config, plus grad_dtype; enum fields take names: method="ig",
    pack="greedy", ...; None keeps the default). Unknown keys are an
    InvalidArgumentError; the library validates the values. link is
    link_latency_ns and link_bandwidth_mbps together: igrad plan's preset
    name ("100g", "nvlink", ...), "GBITS,LAT_US" (e.g. "100,8"), or
    (latency_ns, bandwidth_mbps) integers."""
    kw = _link_fields(kw)
    known = OPTIONS + ("grad_dtype",)
    unknown = set(kw) - set(known)
    if unknown:
        raise L.InvalidArgumentError("unknown config field(s): %s (known: %s)" % (
            ", ".join(sorted(unknown)), ", ".join(known)))
    c = _c_default()
    for name in known:  # in the struct's order
        if kw.get(name) is not None:
            _set_field(c, name, kw[name])
    L.lib().call("igrad_config_validate", ctypes.byref(c))
    return c


def config_to_dict(c):
    """The config struct as a dict of names (the inverse of make_config);
    profile_partition None (the C NULL) reads "knee"."""
    out = {n: _get_field(c, n) for n in OPTIONS + ("grad_dtype",)}
    if out["profile_partition"] is None:
        out["profile_partition"] = "knee"
    return out


class BucketDesc:
    """One collective of a step (a copy of igrad_bucket_t)."""

    __slots__ = ("kind", "index", "send", "send_nbytes", "recv", "recv_nbytes", "dtype",
                 "count")

    def __init__(self, b):
        if b.kind not in L.BUCKET_KINDS:
            raise L.UnsupportedError(
                "bucket %d has kind %d, which this binding does not know (it knows %s); "
                "the library is newer than the binding" % (
                    b.index, b.kind, ", ".join("%d (%s)" % kv for kv in
                                              sorted(L.BUCKET_KINDS.items()))))
        self.kind = L.BUCKET_KINDS[b.kind]
        self.index = b.index
        self.send, self.send_nbytes = b.send, b.send_nbytes
        self.recv, self.recv_nbytes = b.recv, b.recv_nbytes
        self.dtype = b.dtype
        self.count = b.count

    def __repr__(self):
        return "BucketDesc(%s, index=%d, send_nbytes=%d, recv_nbytes=%d)" % (
            self.kind, self.index, self.send_nbytes, self.recv_nbytes)


STATS_FIELDS = [f for f, _ in L.StepStats._fields_ if f != "bucket_loads"]


def _addr_array(addrs):
    return (ctypes.c_void_p * max(1, len(addrs)))(*addrs)


class Engine(_Handle):
    """One rank's synchronization engine (igrad_engine_t). `grads` arguments
    are lists of addresses of contiguous float32 buffers, one per layout
    tensor in layout order. `config` is an igrad.Config, a dict of its
    fields, an igrad_config_t (make_config) or None (the defaults). With
    device=N the engine is igrad_engine_create_cuda's on CUDA device N and
    `stream` (an int cudaStream_t; None = the default stream): gradients,
    residuals and buckets are device addresses, and `comm` must take device
    buffers (Comm.self_cuda, Comm.custom(..., memory="cuda")). A library
    built without CUDA raises UnsupportedError saying so."""

    _free = "igrad_engine_free"

    def __init__(self, layout, profile, config, comm, device=None, stream=None):
        if isinstance(config, Config):
            config = config.to_struct()
        elif not isinstance(config, L.Config):
            config = make_config(**(config or {}))
        h = ctypes.c_void_p()
        prof = profile.handle if profile is not None else None
        if device is None:
            L.lib().call("igrad_engine_create", layout.handle, prof, ctypes.byref(config),
                         comm.handle, ctypes.byref(h))
        else:
            L.lib().call("igrad_engine_create_cuda", layout.handle, prof,
                         ctypes.byref(config), comm.handle, int(device), stream or None,
                         ctypes.byref(h))
        super().__init__(h.value)
        self.device = device
        self.nparams = layout.total_count
        self.comm = comm  # borrowed by the engine: keep it alive
        self.ntensors = len(layout)
        self._trace = None

    def _grads(self, grads):
        if len(grads) != self.ntensors:
            raise L.InvalidArgumentError("%d gradient buffers for a layout of %d tensors"
                                         % (len(grads), self.ntensors))
        return _addr_array(grads)

    def begin(self, step, grads):
        arr = self._grads(grads)
        bp = ctypes.POINTER(L.Bucket)()
        nb = ctypes.c_size_t()
        self._lib.call("igrad_engine_begin", self.handle, int(step), arr, ctypes.byref(bp),
                       ctypes.byref(nb))
        return [BucketDesc(bp[i]) for i in range(nb.value)]

    def end(self, step, grads):
        self._lib.call("igrad_engine_end", self.handle, int(step), self._grads(grads))

    def sync(self, step, grads):
        self._lib.call("igrad_engine_sync", self.handle, int(step), self._grads(grads))

    def set_stream(self, stream):
        """A CUDA engine's later steps run on `stream` (int cudaStream_t, 0 =
        the default stream)."""
        self._lib.call("igrad_engine_set_stream_cuda", self.handle, stream or None)

    def memory_stats(self):
        """This rank's bytes: device (the data plane's memory of a CUDA
        engine: residuals, velocities, staged selection, buckets) and host
        (everything else the engine holds: plans, per-tensor results,
        scratch), each also per parameter of the layout."""
        nparams = self.nparams
        device = int(self.stats()["dataplane_nbytes"]) if self.device is not None else 0
        host = int(self.workspace_nbytes) - device
        return {"device_nbytes": device, "host_nbytes": host,
                "device_nbytes_per_param": device / nparams if nparams else 0.0,
                "host_nbytes_per_param": host / nparams if nparams else 0.0}
    # The streamed step (igrad_engine_open / ready / close): tensors given as
    # their gradients become final, buckets handed out for their collectives
    # as soon as all their tensors are given (in bucket order).

    def open(self, step):
        self._lib.call("igrad_engine_open", self.handle, int(step))

    def ready(self, step, tensors, grads):
        """tensors: layout indices; grads: their buffers' addresses (None
        for a refused one). Returns the buckets to issue now, in order."""
        if len(tensors) != len(grads):
            raise L.InvalidArgumentError("%d tensor indices but %d gradient buffers"
                                         % (len(tensors), len(grads)))
        idx = (ctypes.c_size_t * max(1, len(tensors)))(*tensors)
        bp = ctypes.POINTER(L.Bucket)()
        nb = ctypes.c_size_t()
        self._lib.call("igrad_engine_ready", self.handle, int(step), idx, len(tensors),
                       _addr_array(grads), ctypes.byref(bp), ctypes.byref(nb))
        return [BucketDesc(bp[i]) for i in range(nb.value)]

    def close(self, step):
        self._lib.call("igrad_engine_close", self.handle, int(step))

    def stats(self):
        s = L.StepStats()
        self._lib.call("igrad_engine_last_stats", self.handle, ctypes.byref(s))
        out = {f: getattr(s, f) for f in STATS_FIELDS}
        out["comm_window_ms"] = list(s.comm_window_ms)
        out["bucket_loads"] = [s.bucket_loads[i] for i in range(s.bucket_count)] \
            if s.bucket_loads else []
        return out

    def tensor_plan(self, t):
        p = L.TensorPlan()
        self._lib.call("igrad_engine_tensor_plan", self.handle, int(t), ctypes.byref(p))
        return {f: getattr(p, f) for f, _ in L.TensorPlan._fields_}

    def predict_payload(self, step):
        return int(self._lib.igrad_engine_predict_payload(self.handle, int(step)))

    def residual_address(self, t):
        """Address of tensor t's residual (read-only), or None (dense)."""
        p = self._lib.igrad_engine_residual(self.handle, int(t))
        return ctypes.cast(p, ctypes.c_void_p).value if p else None

    def velocity_address(self, t):
        """Address of tensor t's momentum-correction velocity (read-only), or
        None (config momentum 0, or dense)."""
        p = self._lib.igrad_engine_velocity(self.handle, int(t))
        return ctypes.cast(p, ctypes.c_void_p).value if p else None

    def set_trace(self, trace):
        self._lib.call("igrad_engine_set_trace", self.handle,
                       trace.handle if trace is not None else None)
        self._trace = trace  # borrowed by the engine

    def config(self):
        c = L.Config()
        self._lib.call("igrad_engine_config", self.handle, ctypes.byref(c))
        return c

    def set_profile(self, profile):
        """Re-plans for `profile` keeping every residual (collective:
        igrad_engine_set_profile)."""
        self._lib.call("igrad_engine_set_profile", self.handle, profile.handle)

    def online_info(self):
        """Online profiling status (igrad_online_info_t as a dict)."""
        o = L.OnlineInfo()
        self._lib.call("igrad_engine_online_info", self.handle, ctypes.byref(o))
        return {f: getattr(o, f) for f, _ in L.OnlineInfo._fields_}

    def profile(self, layout=None):
        """A copy of the profile the engine built online (or was given by
        set_profile), or None while the window records."""
        h = self._lib.igrad_engine_profile(self.handle)
        if not h:
            return None
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "profile.json")
            self._lib.call("igrad_profile_save_json", h, _b(path))
            return Profile.load(path, layout)

    @property
    def step(self):
        return int(self._lib.igrad_engine_step(self.handle))

    @property
    def workspace_nbytes(self):
        return int(self._lib.igrad_engine_workspace_nbytes(self.handle))

    def save_state(self, path):
        self._lib.call("igrad_engine_save_state", self.handle, _b(str(path)))

    def load_state(self, path):
        self._lib.call("igrad_engine_load_state", self.handle, _b(str(path)))
