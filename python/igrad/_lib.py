"""_lib.py — loading libigrad through ctypes: where the shared library is
looked for, the version check, the C structs mirrored as ctypes.Structure,
every function's signature, and the translation of a non-OK status into a
Python exception carrying igrad_last_error().

Nothing here knows about PyTorch, and nothing here owns a handle: the
object wrappers (Layout, Profile, Trace, Engine, Comm) live in core.py.
The struct definitions must match include/igrad.h field for field;
tests/python/test_binding.py compiles a C program that prints the real
sizes and offsets and compares them with these.
"""
import ctypes
import ctypes.util
import os
import threading

# The version of the C API this package was written for. A library whose
# major.minor differ is refused at import (the structs could differ).
__version__ = "0.1.0"

# ---------------------------------------------------------------------------
# Exceptions
# ---------------------------------------------------------------------------

STATUS_NAMES = {
    0: "OK", 1: "E_INVALID", 2: "E_NOMEM", 3: "E_IO", 4: "E_FORMAT",
    5: "E_UNSUPPORTED", 6: "E_NONFINITE", 7: "E_MISMATCH", 8: "E_COMM",
    9: "E_STATE", 10: "E_TIMEOUT",
}


class IgradError(RuntimeError):
    """A libigrad call failed. `status` is the igrad_status_t number,
    `status_name` its name ("E_MISMATCH"), `message` igrad_last_error()."""

    status = None

    def __init__(self, message, status=None, function=None):
        if status is not None:
            self.status = status
        self.status_name = STATUS_NAMES.get(self.status, str(self.status))
        self.message = message
        self.function = function
        where = "%s: " % function if function else ""
        super().__init__("%s%s [%s]" % (where, message, self.status_name))


class InvalidArgumentError(IgradError):
    status = 1


class OutOfMemoryError(IgradError):
    status = 2


class FileError(IgradError):
    status = 3


class FormatError(IgradError):
    status = 4


class UnsupportedError(IgradError):
    status = 5


class NonFiniteError(IgradError):
    status = 6


class MismatchError(IgradError):
    status = 7


class CommError(IgradError):
    status = 8


class StateError(IgradError):
    status = 9


class CommTimeoutError(CommError):
    """A collective did not complete within config.timeout_s (IGRAD_E_TIMEOUT)."""
    status = 10


_ERRORS = {cls.status: cls for cls in (
    InvalidArgumentError, OutOfMemoryError, FileError, FormatError, UnsupportedError,
    NonFiniteError, MismatchError, CommError, StateError, CommTimeoutError)}


def error_for(status, message, function=None):
    """The exception object for a status (IgradError for unknown numbers)."""
    cls = _ERRORS.get(status)
    if cls is None:
        return IgradError(message, status=status, function=function)
    return cls(message, function=function)


# ---------------------------------------------------------------------------
# C types (igrad.h)
# ---------------------------------------------------------------------------

MAX_DIMS = 4
c_enum = ctypes.c_int  # every igrad enum is a plain C enum (int)

# Enum tables, read from the loaded library's own name functions when the
# process-wide library is loaded (fill_tables), so that they cannot drift
# from the C tables: a dtype or method added to the library is known here
# without an edit. Filled in place: `from ._lib import KIND_NAMES` stays
# valid. Lists are indexed by the enum value; dicts map the C name to it.
DTYPE_NAMES = []         # igrad_dtype_name: "F32", ..., "F8_E4M3", ...
DTYPE = {}               # "F32" -> 0
KIND_NAMES = []          # igrad_kind_name: "Q", ..., "OTHER"
SPARSIFIERS = {}         # igrad_sparsifier_name: "none" -> 0
METHODS = {}             # igrad_method_name: "dense" -> 0
SCHEDULES = {}           # igrad_schedule_name
PACK_POLICIES = {}       # igrad_pack_policy_name
RESIDUAL_POLICIES = {}   # igrad_residual_policy_name
COLLECTIVES = {}         # igrad_collective_name
TOPOLOGIES = {}          # igrad_topology_name
INDEX_CODES = {}         # igrad_index_code_name
# (table, C function, what the function returns past the last value)
NAME_TABLES = {
    "dtype": (DTYPE, "igrad_dtype_name", "?"),
    "kind": (KIND_NAMES, "igrad_kind_name", "?"),
    "sparsifier": (SPARSIFIERS, "igrad_sparsifier_name", "unknown"),
    "method": (METHODS, "igrad_method_name", "unknown"),
    "schedule": (SCHEDULES, "igrad_schedule_name", "unknown"),
    "pack_policy": (PACK_POLICIES, "igrad_pack_policy_name", "unknown"),
    "residual_policy": (RESIDUAL_POLICIES, "igrad_residual_policy_name", "unknown"),
    "collective": (COLLECTIVES, "igrad_collective_name", "unknown"),
    "topology": (TOPOLOGIES, "igrad_topology_name", "unknown"),
    "index_code": (INDEX_CODES, "igrad_index_code_name", "unknown"),
}
# Enums without a name function in the library: tests/python/test_binding.py
# checks these (and STATUS_NAMES) against include/igrad.h.
ALLOCATIONS = {"partition": 0, "budget": 1}  # igrad_allocation_t (config.allocation)
REDUCE_SUM, REDUCE_MAX, REDUCE_MIN = 0, 1, 2
BUCKET_GATHER, BUCKET_REDUCE, BUCKET_SPARSE_REDUCE = 0, 1, 2
MEMORY_HOST, MEMORY_CUDA = 0, 1  # igrad_memory_t (igrad_comm_ops_t.memory)
# igrad_bucket_kind_t -> the name BucketDesc.kind carries (the library's
# bucket routes, src/route.c); a kind missing here is refused, never guessed.
# BUCKET_SPARSE_REDUCE is the engine's own (begin refuses its collective),
# so the torch hooks never get one; they refuse a kind they cannot run.
BUCKET_KINDS = {BUCKET_GATHER: "gather", BUCKET_REDUCE: "reduce",
                BUCKET_SPARSE_REDUCE: "sparse_reduce"}


class TensorInfo(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("dtype", c_enum), ("ndim", ctypes.c_int),
                ("shape", ctypes.c_int64 * MAX_DIMS), ("count", ctypes.c_int64),
                ("offset", ctypes.c_int64), ("layer", ctypes.c_int), ("kind", c_enum),
                ("is_bias", ctypes.c_int), ("component", ctypes.c_int)]


class ComponentInfo(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_int), ("kind", c_enum), ("count", ctypes.c_int64),
                ("tensors", ctypes.c_int)]


class SelectSpec(ctypes.Structure):
    _fields_ = [("row_wise", ctypes.c_int), ("rows", ctypes.c_int64), ("cols", ctypes.c_int64),
                ("per_row", ctypes.c_int64), ("count", ctypes.c_int64), ("n", ctypes.c_int64)]


class Selection(ctypes.Structure):
    _fields_ = [("index", ctypes.POINTER(ctypes.c_uint32)),
                ("value", ctypes.POINTER(ctypes.c_float)), ("count", ctypes.c_int64),
                ("row_wise", ctypes.c_int), ("sumsq", ctypes.c_double)]


class ProfileOptions(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("alpha", ctypes.c_double),
                ("method", ctypes.c_char_p), ("window_begin", ctypes.c_int64),
                ("window_end", ctypes.c_int64)]


class ProfileEntry(ctypes.Structure):
    _fields_ = [("layer", ctypes.c_int), ("kind", c_enum), ("count", ctypes.c_int64),
                ("mean_activity", ctypes.c_double), ("magnitude", ctypes.c_double),
                ("persistence", ctypes.c_double), ("score", ctypes.c_double),
                ("important", ctypes.c_int)]


class TargetFit(ctypes.Structure):
    _fields_ = [("tau", ctypes.c_double), ("release_keep", ctypes.c_double),
                ("n_important", ctypes.c_size_t), ("n_gated", ctypes.c_size_t),
                ("f_imp", ctypes.c_double), ("ratio", ctypes.c_double),
                ("model_ratio", ctypes.c_double), ("met", ctypes.c_int)]


# Callback types of igrad_comm_ops_t. Pointers arrive as c_void_p (int or
# None); every callback returns an igrad_status_t.
ALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_size_t, ctypes.c_void_p)
ALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                ctypes.c_void_p, ctypes.c_size_t, c_enum, c_enum)
BCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                            ctypes.c_size_t, ctypes.c_int)
BARRIER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
IALLGATHER_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_size_t, ctypes.c_void_p,
                                 ctypes.POINTER(ctypes.c_void_p))
IALLREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_size_t, c_enum, c_enum,
                                 ctypes.POINTER(ctypes.c_void_p))
WAIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
TEST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                           ctypes.POINTER(ctypes.c_int))
# const char *(*)(void *): a c_void_p return lets the callback hand back an
# address it keeps alive (a c_char_p return would dangle).
ERRMSG_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)
DESTROY_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
GROUP_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)
STREAM_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)
SPLIT_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                            ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                            ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))
IREDUCE_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                              ctypes.c_size_t, c_enum, c_enum, ctypes.c_int,
                              ctypes.POINTER(ctypes.c_void_p))
IBCAST_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                             ctypes.c_int, ctypes.POINTER(ctypes.c_void_p))
_SIZES = ctypes.POINTER(ctypes.c_size_t)
ALLTOALLV_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, _SIZES, _SIZES,
                                ctypes.c_void_p, _SIZES, _SIZES)


class CommOps(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("allgather", ALLGATHER_FN),
                ("allreduce", ALLREDUCE_FN), ("bcast", BCAST_FN), ("barrier", BARRIER_FN),
                ("iallgather", IALLGATHER_FN), ("iallreduce", IALLREDUCE_FN),
                ("wait", WAIT_FN), ("test", TEST_FN), ("error_message", ERRMSG_FN),
                ("destroy", DESTROY_FN), ("group_start", GROUP_FN),
                ("group_end", GROUP_FN), ("memory", c_enum), ("set_stream", STREAM_FN),
                ("split", SPLIT_FN), ("ireduce", IREDUCE_FN), ("ibcast", IBCAST_FN),
                ("alltoallv", ALLTOALLV_FN)]


class LinkPreset(ctypes.Structure):
    """igrad_link_preset_t."""
    _fields_ = [("name", ctypes.c_char_p), ("gbit_per_s", ctypes.c_double),
                ("latency_us", ctypes.c_double), ("assumes", ctypes.c_char_p)]


class Config(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("method", c_enum), ("sparsifier", c_enum),
                ("interleave", ctypes.c_int), ("density", ctypes.c_double),
                ("release_period", ctypes.c_int), ("release_keep", ctypes.c_double),
                ("schedule", c_enum), ("residual", c_enum), ("pack", c_enum),
                ("buckets", ctypes.c_int), ("block_entries", ctypes.c_int64),
                ("verify_every", ctypes.c_int64),
                ("value_dtype", c_enum), ("index_dtype", c_enum), ("collective", c_enum),
                ("threads", ctypes.c_int), ("timeout_s", ctypes.c_double),
                ("profile_steps", ctypes.c_int64), ("profile_alpha", ctypes.c_double),
                ("profile_partition", ctypes.c_char_p),
                ("momentum", ctypes.c_double), ("start_iter", ctypes.c_int64),
                ("target_ratio", ctypes.c_double),
                ("reprofile_every", ctypes.c_int64), ("reprofile_margin", ctypes.c_double),
                ("grad_dtype", c_enum),
                ("topology", c_enum), ("ranks_per_node", ctypes.c_int),
                ("dense_below", ctypes.c_int64),
                ("link_latency_ns", ctypes.c_int64), ("link_bandwidth_mbps", ctypes.c_int64),
                ("auto_sparse_reduce", ctypes.c_int), ("index_code", c_enum),
                ("allocation", c_enum)]


class Bucket(ctypes.Structure):
    _fields_ = [("kind", c_enum), ("index", ctypes.c_int), ("send", ctypes.c_void_p),
                ("send_nbytes", ctypes.c_size_t), ("recv", ctypes.c_void_p),
                ("recv_nbytes", ctypes.c_size_t), ("dtype", c_enum),
                ("count", ctypes.c_size_t)]


class StepStats(ctypes.Structure):
    _fields_ = [("step", ctypes.c_int64), ("skipped", ctypes.c_int),
                ("tensors_sent", ctypes.c_int64), ("entries_sent", ctypes.c_int64),
                ("deferred_components", ctypes.c_int), ("released_components", ctypes.c_int),
                ("payload_nbytes", ctypes.c_int64), ("wire_nbytes", ctypes.c_double),
                ("select_ms", ctypes.c_double), ("pack_ms", ctypes.c_double),
                ("comm_ms", ctypes.c_double), ("unpack_ms", ctypes.c_double),
                ("total_ms", ctypes.c_double), ("buckets", ctypes.c_int),
                ("gather_buckets", ctypes.c_int), ("reduce_buckets", ctypes.c_int),
                ("bucket_count", ctypes.c_int),
                ("bucket_loads", ctypes.POINTER(ctypes.c_int64)),
                ("imbalance", ctypes.c_double), ("cv", ctypes.c_double),
                ("overflow", ctypes.c_int), ("residual_norm", ctypes.c_double),
                ("dropped_sumsq", ctypes.c_double),
                ("dataplane_nbytes", ctypes.c_int64),
                ("dataplane_nbytes_per_param", ctypes.c_double),
                ("intra_wire_nbytes", ctypes.c_double),
                ("inter_wire_nbytes", ctypes.c_double),
                ("sparse_reduce_buckets", ctypes.c_int),
                ("dense_small_tensors", ctypes.c_int64),
                ("comm_window_ms", ctypes.c_double * 6),
                ("sar_busiest_entries", ctypes.c_int64),
                ("sar_entries", ctypes.c_int64),
                ("sar_busiest_over_mean", ctypes.c_double)]


class TensorPlan(ctypes.Structure):
    _fields_ = [("every_step", ctypes.c_int), ("important", ctypes.c_int),
                ("component", ctypes.c_int), ("phase", ctypes.c_int),
                ("count", ctypes.c_int64), ("release_count", ctypes.c_int64),
                ("row_wise", ctypes.c_int), ("index_nbytes", ctypes.c_int),
                ("step_nbytes", ctypes.c_int64), ("release_nbytes", ctypes.c_int64)]


class OnlineInfo(ctypes.Structure):
    _fields_ = [("profiling", ctypes.c_int), ("profile_steps", ctypes.c_int64),
                ("steps_recorded", ctypes.c_int64), ("switch_step", ctypes.c_int64),
                ("replans", ctypes.c_int64), ("gather_ms", ctypes.c_double),
                ("build_ms", ctypes.c_double), ("reprofile_every", ctypes.c_int64),
                ("reprofiles", ctypes.c_int64), ("reprofile_replans", ctypes.c_int64),
                ("last_flips", ctypes.c_int64), ("reprofile_ms", ctypes.c_double)]


# ---------------------------------------------------------------------------
# Function signatures
# ---------------------------------------------------------------------------

P = ctypes.c_void_p  # opaque handles and raw buffers
PP = ctypes.POINTER(ctypes.c_void_p)
S = ctypes.c_int     # igrad_status_t
i64, u64, sz, dbl, cstr = (ctypes.c_int64, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_double,
                           ctypes.c_char_p)
I64P = ctypes.POINTER(ctypes.c_int64)

# name: (restype, argtypes). Functions returning S are wrapped by Lib.call,
# which raises on a non-OK status.
SIGNATURES = {
    "igrad_version": (ctypes.c_uint, []),
    "igrad_version_string": (cstr, []),
    "igrad_status_str": (cstr, [S]),
    "igrad_last_error": (cstr, []),
    "igrad_free": (None, [P]),
    "igrad_kind_name": (cstr, [c_enum]),
    "igrad_component_of": (c_enum, [cstr, ctypes.POINTER(ctypes.c_int)]),
    "igrad_dtype_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_kind_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_convert": (S, [P, c_enum, P, c_enum, sz]),
    # layout
    "igrad_layout_create": (S, [PP]),
    "igrad_layout_add": (S, [P, cstr, c_enum, ctypes.c_int, I64P]),
    "igrad_layout_load": (S, [cstr, PP]),
    "igrad_layout_free": (None, [P]),
    "igrad_layout_count": (sz, [P]),
    "igrad_layout_total_count": (i64, [P]),
    "igrad_layout_family": (cstr, [P]),
    "igrad_layout_tensor": (S, [P, sz, ctypes.POINTER(TensorInfo)]),
    "igrad_layout_find": (ctypes.c_int, [P, cstr]),
    "igrad_layout_component_count": (sz, [P]),
    "igrad_layout_component": (S, [P, sz, ctypes.POINTER(ComponentInfo)]),
    "igrad_layout_hash": (u64, [P]),
    "igrad_layout_to_json": (S, [P, ctypes.POINTER(ctypes.c_void_p)]),
    # name rules
    "igrad_name_map_create": (S, [PP]),
    "igrad_name_map_add": (S, [P, cstr, c_enum, ctypes.c_int]),
    "igrad_name_map_load": (S, [cstr, PP]),
    "igrad_name_map_free": (None, [P]),
    "igrad_name_map_count": (sz, [P]),
    "igrad_layout_set_name_map": (S, [P, P]),
    "igrad_layout_remap": (S, [P, P, PP]),
    "igrad_layout_is_unmapped": (ctypes.c_int, [P, sz]),
    "igrad_layout_unmapped_report": (S, [P, sz, ctypes.POINTER(ctypes.c_void_p)]),
    # selection
    "igrad_budget": (i64, [i64, dbl]),
    "igrad_select_spec": (S, [c_enum, dbl, dbl, ctypes.c_int, i64, ctypes.c_int, I64P,
                              ctypes.POINTER(SelectSpec)]),
    "igrad_select_ws_create": (S, [PP]),
    "igrad_select_ws_free": (None, [P]),
    "igrad_select_ef": (S, [P, P, ctypes.POINTER(SelectSpec), cstr, P,
                            ctypes.POINTER(Selection)]),
    "igrad_residual_accumulate": (S, [P, P, i64, cstr]),
    # trace
    "igrad_trace_create": (S, [P, PP]),
    "igrad_trace_record": (S, [P, i64, sz, dbl, i64]),
    "igrad_trace_save": (S, [P, cstr]),
    "igrad_trace_load": (S, [cstr, PP]),
    "igrad_trace_free": (None, [P]),
    "igrad_trace_step_count": (sz, [P]),
    "igrad_trace_set_sparsifier": (S, [P, c_enum, dbl]),
    "igrad_trace_layout_hash": (u64, [P]),
    "igrad_trace_sparsifier": (cstr, [P]),
    "igrad_trace_density": (dbl, [P]),
    "igrad_trace_component_count": (sz, [P]),
    "igrad_trace_component": (S, [P, sz, ctypes.POINTER(ComponentInfo)]),
    "igrad_trace_step": (i64, [P, sz]),
    "igrad_trace_value": (S, [P, sz, sz, ctypes.POINTER(dbl), I64P]),
    # profile
    "igrad_profile_build": (S, [P, ctypes.POINTER(ProfileOptions), PP]),
    "igrad_partition": (S, [ctypes.POINTER(dbl), sz, cstr, ctypes.POINTER(dbl)]),
    "igrad_profile_save_json": (S, [P, cstr]),
    "igrad_profile_save_csv": (S, [P, cstr]),
    "igrad_profile_load": (S, [cstr, P, PP]),
    "igrad_profile_free": (None, [P]),
    "igrad_profile_count": (sz, [P]),
    "igrad_profile_entry": (S, [P, sz, ctypes.POINTER(ProfileEntry)]),
    "igrad_profile_threshold": (dbl, [P]),
    "igrad_profile_set_threshold": (S, [P, dbl]),
    "igrad_target_fit": (S, [P, P, ctypes.POINTER(Config), dbl, dbl,
                             ctypes.POINTER(TargetFit)]),
    "igrad_profile_layout_hash": (u64, [P]),
    "igrad_profile_method": (cstr, [P]),
    "igrad_profile_is_important": (ctypes.c_int, [P, ctypes.c_int, c_enum]),
    "igrad_profile_sparsifier": (cstr, [P]),
    "igrad_profile_density": (dbl, [P]),
    "igrad_profile_alpha": (dbl, [P]),
    "igrad_profile_window": (None, [P, I64P, I64P, ctypes.POINTER(sz)]),
    # communicators
    "igrad_comm_create_self": (S, [PP]),
    "igrad_comm_create_custom": (S, [ctypes.POINTER(CommOps), P, ctypes.c_int, ctypes.c_int,
                                     PP]),
    "igrad_comm_free": (None, [P]),
    "igrad_comm_rank": (ctypes.c_int, [P]),
    "igrad_comm_size": (ctypes.c_int, [P]),
    "igrad_comm_backend": (cstr, [P]),
    "igrad_comm_allgather": (S, [P, P, sz, P]),
    "igrad_comm_allreduce": (S, [P, P, P, sz, c_enum, c_enum]),
    "igrad_comm_bcast": (S, [P, P, sz, ctypes.c_int]),
    "igrad_comm_barrier": (S, [P]),
    # names of enums
    "igrad_method_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_method_name": (cstr, [c_enum]),
    "igrad_schedule_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_schedule_name": (cstr, [c_enum]),
    "igrad_pack_policy_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_pack_policy_name": (cstr, [c_enum]),
    "igrad_residual_policy_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_residual_policy_name": (cstr, [c_enum]),
    "igrad_collective_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_collective_name": (cstr, [c_enum]),
    "igrad_link_preset_count": (sz, []),
    "igrad_link_preset": (ctypes.POINTER(LinkPreset), [sz]),
    "igrad_link_parse": (S, [cstr, ctypes.POINTER(dbl), ctypes.POINTER(dbl)]),
    "igrad_link_to_config": (None, [dbl, dbl, ctypes.POINTER(i64), ctypes.POINTER(i64)]),
    "igrad_topology_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_topology_name": (cstr, [c_enum]),
    "igrad_index_code_from_name": (S, [cstr, ctypes.POINTER(c_enum)]),
    "igrad_index_code_name": (cstr, [c_enum]),
    "igrad_sparsifier_name": (cstr, [c_enum]),
    "igrad_dtype_name": (cstr, [c_enum]),
    # engine
    "igrad_config_validate": (S, [ctypes.POINTER(Config)]),
    "igrad_config_default": (S, [ctypes.POINTER(Config), sz]),
    "igrad_engine_create": (S, [P, P, ctypes.POINTER(Config), P, PP]),
    # igrad_cuda.h (every build: without CUDA they return IGRAD_E_UNSUPPORTED)
    "igrad_engine_create_cuda": (S, [P, P, ctypes.POINTER(Config), P, ctypes.c_int, P, PP]),
    "igrad_engine_set_stream_cuda": (S, [P, P]),
    "igrad_comm_create_self_cuda": (S, [P, PP]),
    "igrad_engine_free": (None, [P]),
    "igrad_engine_begin": (S, [P, i64, PP, ctypes.POINTER(ctypes.POINTER(Bucket)),
                               ctypes.POINTER(sz)]),
    "igrad_engine_end": (S, [P, i64, PP]),
    "igrad_engine_sync": (S, [P, i64, PP]),
    "igrad_engine_open": (S, [P, i64]),
    "igrad_engine_ready": (S, [P, i64, ctypes.POINTER(sz), sz, PP,
                               ctypes.POINTER(ctypes.POINTER(Bucket)), ctypes.POINTER(sz)]),
    "igrad_engine_close": (S, [P, i64]),
    "igrad_engine_last_stats": (S, [P, ctypes.POINTER(StepStats)]),
    "igrad_engine_tensor_plan": (S, [P, sz, ctypes.POINTER(TensorPlan)]),
    "igrad_engine_predict_payload": (i64, [P, i64]),
    "igrad_engine_residual": (ctypes.POINTER(ctypes.c_float), [P, sz]),
    "igrad_engine_velocity": (ctypes.POINTER(ctypes.c_float), [P, sz]),
    "igrad_engine_set_trace": (S, [P, P]),
    "igrad_engine_set_profile": (S, [P, P]),
    "igrad_engine_profile": (P, [P]),
    "igrad_engine_online_info": (S, [P, ctypes.POINTER(OnlineInfo)]),
    "igrad_engine_config": (S, [P, ctypes.POINTER(Config)]),
    "igrad_engine_step": (i64, [P]),
    "igrad_engine_workspace_nbytes": (sz, [P]),
    "igrad_engine_save_state": (S, [P, cstr]),
    "igrad_engine_load_state": (S, [P, cstr]),
}


def version_number(text):
    """"MAJOR.MINOR.PATCH" -> MAJOR*10000 + MINOR*100 + PATCH."""
    parts = [int(x) for x in text.split(".")]
    while len(parts) < 3:
        parts.append(0)
    return parts[0] * 10000 + parts[1] * 100 + parts[2]


def version_text(number):
    return "%d.%d.%d" % (number // 10000, number // 100 % 100, number % 100)


class Lib:
    """A loaded libigrad: the ctypes handle with signatures set, plus
    `call(name, *args)`, which raises the matching IgradError when the
    function returns a non-OK status. Functions that a library lacks (an
    older build) are left out; calling one raises AttributeError."""

    def __init__(self, path, expected=__version__):
        self.path = path
        self.dll = ctypes.CDLL(path)
        for name, (restype, argtypes) in SIGNATURES.items():
            try:
                fn = getattr(self.dll, name)
            except AttributeError:
                continue
            fn.restype = restype
            fn.argtypes = argtypes
        self.check_version(expected)

    def check_version(self, expected):
        """Refuses a library whose major.minor differ from `expected`
        (a "MAJOR.MINOR.PATCH" string)."""
        try:
            have = int(self.dll.igrad_version())
        except AttributeError:
            raise ImportError("igrad: %s is not libigrad (no igrad_version())" % self.path)
        want = version_number(expected)
        self.version = have
        if have // 100 != want // 100:
            raise ImportError(
                "igrad: the library %s is version %s, but this Python package (igrad %s) "
                "needs %d.%d.x; rebuild the library or point IGRAD_LIBRARY at a matching one"
                % (self.path, version_text(have), expected, want // 10000, want // 100 % 100))

    def __getattr__(self, name):
        return getattr(self.dll, name)

    def last_error(self):
        msg = self.dll.igrad_last_error()
        return msg.decode("utf-8", "replace") if msg else ""

    def check(self, status, function=None):
        """Raises the exception for a non-OK status (message from the library)."""
        if status != 0:
            msg = self.last_error() or self.dll.igrad_status_str(status).decode()
            raise error_for(status, msg, function)

    def call(self, name, *args):
        status = getattr(self.dll, name)(*args)
        self.check(status, name)
        return status


def c_names(dll, function, end, limit=256):
    """[name of value 0, 1, ...] from one of the library's name functions,
    up to the first value it does not know (it returns `end` there)."""
    fn = getattr(dll, function)
    out = []
    for v in range(limit):
        raw = fn(v)
        name = raw.decode("utf-8", "replace") if raw is not None else end
        if name == end:
            break
        out.append(name)
    return out


def c_status_count(dll, limit=256):
    """How many consecutive statuses from 0 the library describes
    (igrad_status_str returns "unknown status" past the last one)."""
    n = 0
    while n < limit and dll.igrad_status_str(n) != b"unknown status":
        n += 1
    return n


def fill_tables(lib):
    """Fills the enum tables (DTYPE, KIND_NAMES, METHODS, ...) in place from
    `lib`'s name functions."""
    for table, function, end in NAME_TABLES.values():
        names = c_names(lib.dll, function, end)
        if isinstance(table, list):
            table[:] = names
        else:
            table.clear()
            table.update((n, v) for v, n in enumerate(names))
    DTYPE_NAMES[:] = c_names(lib.dll, "igrad_dtype_name", "?")
    unnamed = [v for v in range(c_status_count(lib.dll)) if v not in STATUS_NAMES]
    if unnamed:  # still usable: such an error is a plain IgradError
        for v in unnamed:
            STATUS_NAMES[v] = "E_%d" % v


def _candidates():
    """Where the shared library is looked for, in order."""
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    env = os.environ.get("IGRAD_LIBRARY")
    if env:
        return [env]  # an explicit choice is never silently replaced
    for name in ("libigrad.so", "libigrad.so.0", "libigrad.dylib"):
        out.append(os.path.join(here, name))
    repo = os.path.dirname(os.path.dirname(here))
    for build in ("build", "build-release"):
        out.append(os.path.join(repo, build, "libigrad.so"))
    found = ctypes.util.find_library("igrad")
    if found:
        out.append(found)
    return out


_lock = threading.Lock()
_lib = None


def load_library(path=None, expected=__version__):
    """Loads (once) and returns the Lib. `path` overrides the search;
    `expected` is the version the caller needs (tests pass another one to
    check the refusal). Raises ImportError naming every place tried."""
    global _lib
    with _lock:
        if path is None and _lib is not None and expected == __version__:
            return _lib
        tried = []
        for cand in ([path] if path else _candidates()):
            if not (os.path.exists(cand) or os.sep not in cand):
                relative = "" if os.path.isabs(cand) else (
                    "; relative to the working directory %s: give an absolute path" % os.getcwd())
                tried.append("%s (not found%s)" % (cand, relative))
                continue
            try:
                lib = Lib(cand, expected)
            except OSError as e:
                tried.append("%s (%s)" % (cand, e))
                continue
            if path is None and expected == __version__:
                fill_tables(lib)
                _lib = lib
            return lib
        raise ImportError(
            "igrad: cannot load libigrad; tried: %s. Build it (make) or set IGRAD_LIBRARY "
            "to the path of libigrad.so" % "; ".join(tried))


def lib():
    """The process-wide library (loaded on first use)."""
    return _lib if _lib is not None else load_library()
