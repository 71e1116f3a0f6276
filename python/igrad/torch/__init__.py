"""igrad.torch — PyTorch integration of libigrad (a package).

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
closes the step (see igrad.torch.hook). One step over the whole model is what the
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
IgradState._check_step in igrad.torch.state). Identity needs the module:
the model, a DDP wrapper or an unstarted named_parameters() generator of
it.

Not here: the C-level objects (igrad/core.py) and library loading
(igrad/_lib.py).

Modules, by concern (no module imports one that imports it back):
    layout.py         parameters that require grad, layout_from_module
    comm.py           TorchComm, the one-process _SelfComm
    device.py         the GPU path: device views, TorchCudaComm,
                      SelfCudaComm, CUDA engine creation
    state.py          IgradState: configuration, attach, engine, one step
    hook.py           the DDP comm hook, last-bucket and streamed (overlap)
    checkpoint.py     state_dict / load_state_dict, save / load, pickling,
                      state_residuals
    stats.py          stats(), the logger and TensorBoard scalars
    synchronizers.py  GradientSynchronizer, UpdateSynchronizer
    profiler.py       Profiler, broadcast_profile
"""
import sys

try:
    import torch  # noqa: F401
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    raise ModuleNotFoundError(
        "igrad.torch needs PyTorch, which this interpreter (%s) cannot import. The rest of "
        "igrad works without it. On Debian, PyTorch is the python3-torch package of "
        "/usr/bin/python3: run with /usr/bin/python3, or from a venv made with "
        "`/usr/bin/python3 -m venv --system-site-packages`" % sys.executable,
        name="torch") from None

from .checkpoint import state_residuals  # noqa: E402
from .comm import TorchComm  # noqa: E402
from .hook import hook  # noqa: E402
from .layout import layout_from_module, named_trainable_parameters  # noqa: E402
from .profiler import Profiler, broadcast_profile  # noqa: E402
from .state import IgradState  # noqa: E402
from .synchronizers import GradientSynchronizer, UpdateSynchronizer  # noqa: E402

__all__ = ["layout_from_module", "named_trainable_parameters", "TorchComm", "IgradState",
           "hook", "GradientSynchronizer", "UpdateSynchronizer", "Profiler", "broadcast_profile",
           "state_residuals"]
