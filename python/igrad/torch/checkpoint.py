"""igrad.torch.checkpoint — IgradState's state across processes:
state_dict / load_state_dict (the engine's exact state file, residuals
once), save / load per rank, pickling (PowerSGD's convention: never the
process group), and state_residuals, which reads the residuals out of a
state_dict without an engine. CheckpointMixin is a base of IgradState.
"""
import array
import ctypes
import math
import os
import struct
import sys
import tempfile

import torch

from .. import _lib as L
from ..core import Profile, config_to_dict, make_config
from .comm import _wrap
from .device import device_view
from .profiler import _profile_bytes, _profile_from_bytes
from .stats import _Observed

_STATE_FORMAT = "igrad.torch.IgradState/1"



class CheckpointMixin:
    """IgradState's state_dict, save/load and pickling."""

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
                out[n] = device_view(addr, count, torch.float32,
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
            if k == "release_keep" and getattr(self, "target_ratio", None) is not None:
                continue  # chosen by the target_ratio fit (kept in the engine's state)
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
        start_iter = d.pop("start_iter", 0)  # before the config held it
        self.__dict__.update(d)
        self.config.setdefault("start_iter", int(start_iter))
        self.process_group = None  # the default group, resolved at first use
        self.grad_scaler = None
        self.tensorboard = None  # a writer is not pickled: set it again
        self.log_every = int(d.get("log_every", 0))
        self._obs = _Observed()  # stats() counts from here
        self._reset_runtime()
        if pj is not None:
            self.profile = _profile_from_bytes(pj)
        self._pending_load = saved



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

