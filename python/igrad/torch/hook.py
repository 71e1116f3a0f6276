"""igrad.torch.hook — the DDP communication hook: hook(state, bucket) and
IgradState's bucket handling, at the last bucket (one engine step over the
whole model) or streamed with backward (overlap=True). See the igrad.torch
docstring for how a step runs. DdpHookMixin is a base of IgradState.
"""
import time

import torch

from .. import _lib as L


def hook(state, bucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: `ddp.register_comm_hook(state, hook)` with an
    IgradState built for the same model. Returns a future per bucket; all of
    a step's futures complete when its last bucket has been synchronized
    (see the module docstring). Without DDP (a list of gradients, a manual
    loop) use igrad.torch.GradientSynchronizer."""
    if not (callable(getattr(bucket, "is_last", None))
            and callable(getattr(bucket, "buffer", None))
            and callable(getattr(bucket, "parameters", None))):
        raise TypeError(
            "igrad.torch.hook(state, bucket) is DDP's communication hook: bucket must be the "
            "torch.distributed.GradBucket that DDP passes (ddp.register_comm_hook(state, "
            "igrad.torch.hook)), not %s; to synchronize gradients without DDP use "
            "igrad.torch.GradientSynchronizer(model, state).synchronize()"
            % type(bucket).__name__)
    return state._on_bucket(bucket)



class DdpHookMixin:
    """IgradState's DDP bucket handling (needs the state's step:
    _step_tensors, _check_step, _loss_scale, _skip_step, _raise_step_error,
    _observe)."""

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
        try:
            fut = (self._stream_bucket(bucket) if getattr(self, "overlap", False)
                   else self._last_bucket(bucket))
        except L.IgradError as e:
            self._last_error = e  # DDP re-raises it as a plain RuntimeError
            raise
        if bucket.is_last():
            self._last_error = None
        return fut

    def _last_bucket(self, bucket):
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
    # match the other ranks' and close fails the step on every rank. A rank
    # that never reaches its hook (it raised, or stopped, before backward
    # got there) leaves the others waiting in the collectives they issued:
    # each of those waits is bounded by config timeout_s (0: none), and a
    # wait that runs out raises CommTimeoutError naming the step and the
    # timeout on every waiting rank. The step stays open in the engine and
    # its collectives pending, so the state refuses every later step.

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
        if getattr(self, "_stream_lost", None):
            raise L.StateError("IgradState is unusable: %s (its collectives are still "
                               "pending; make a new state and process group)"
                               % self._stream_lost)
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
        timeout = float(self.config.get("timeout_s") or 0.0)
        for k, h in enumerate(s["handles"]):
            if not coll.wait(h, timeout):
                self._stream_lost = (
                    "step %d: igrad bucket %d of %d did not complete within timeout_s = %g s"
                    % (step, k + 1, len(s["handles"]), timeout))
                raise L.CommTimeoutError(
                    "%s (the overlapped DDP hook's wait): a rank has not taken part in this "
                    "step's collectives (it raised or stopped before its backward reached "
                    "that bucket)" % self._stream_lost)
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
        if step < self.start_iter:  # the engine's dense warm-up (config start_iter)
            st["warmup"] = 1
        self.total_payload_nbytes += st["payload_nbytes"]
        self.total_wire_nbytes += st["wire_nbytes"]
        self.last_stats = st
        self._observe(st)
        self.iter += 1
