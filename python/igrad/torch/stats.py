"""igrad.torch.stats — what IgradState reports of its steps: stats() (means
of the engine's per-step statistics, PowerSGD's compression_stats()), the
log_every logger and TensorBoard scalars. StatsMixin is a base of
IgradState.
"""
import logging
import os

from .. import _lib as L

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



class StatsMixin:
    """IgradState's observability (needs self._obs, self._engine,
    self._meta, self._counts, self.skipped_steps, self.log_every,
    self.tensorboard, self.iter)."""

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
