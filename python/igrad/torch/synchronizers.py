"""igrad.torch.synchronizers — igrad in loops without DDP:
GradientSynchronizer (the gradients, after backward) and
UpdateSynchronizer (error feedback on the optimizer's update).
"""
import torch

from .. import _lib as L


class GradientSynchronizer:
    """igrad synchronization for loops that do not use DDP:

        state = IgradState(profile="profile.json", method="ig")
        sync = GradientSynchronizer(model.named_parameters(), state)
        for step, batch in enumerate(loader):
            loss(model, batch).backward()       # local gradients
            sync.synchronize(step)              # .grad = average of selections
            optimizer.step(); optimizer.zero_grad()

    A parameter whose .grad is None at a step (frozen mid-run with
    `p.requires_grad_(False); p.grad = None`, or unused by this step's
    forward) stays untouched: its .grad stays None, so the optimizer
    skips it, and its error-feedback residual is kept unchanged for when it
    thaws (this rank sends zeros for it and releases nothing; see
    IgradState._step_frozen). Freeze a parameter on every rank: one frozen
    on some ranks only gets the others' average there and diverges. DeepSpeed (ZeRO stage 0): set
    `engine.enable_backward_allreduce = False`, build the synchronizer over
    `engine.module.named_parameters()` with `engine.data_parallel_group` as
    the state's process_group, and after `engine.backward(loss)` call
    synchronize() when `engine.is_gradient_accumulation_boundary()`, then
    `engine.step()`; save igrad's state per rank (state.save), since
    DeepSpeed writes checkpoints from rank 0 only."""

    def __init__(self, named_parameters, state, optimizer=None):
        # named_parameters: model.named_parameters() (unstarted), the model
        # itself, or (name, parameter) pairs (then no check for replaced
        # parameters: the module they live in is unknown). optimizer: only
        # looked at (state.check_optimizer: a warning for Adam's beta1 > 0
        # with a sparse method).
        self.state = state
        state.attach(named_parameters)
        state.check_optimizer(optimizer)

    def synchronize(self, step=None):
        """Averages the gradients over the ranks with igrad; returns the
        step's stats (state.last_stats). `step` defaults to state.iter; the
        same step must be used on every rank."""
        st = self.state
        step = st.iter if step is None else int(step)
        grads, frozen = [], []
        for t, (n, p) in enumerate(st._named):
            if p.grad is None:  # frozen or unused: synced as zeros, result dropped
                frozen.append(t)
                grads.append(torch.zeros_like(p))
            else:
                grads.append(p.grad)
        stats = st._step_frozen(step, grads, frozen)
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
    updates: a state with grad_scaler is refused. A parameter whose .grad
    is None at step() (frozen mid-run, or unused) is not moved: the
    optimizer skips it, its zero update is synchronized with its residual
    held out (kept for when it thaws) and the synced delta is not applied
    to it."""

    def __init__(self, model, optimizer, state):
        if state.grad_scaler is not None:
            raise L.InvalidArgumentError("UpdateSynchronizer syncs the optimizer's update, "
                                         "which a loss scale does not scale: build the "
                                         "IgradState without grad_scaler")
        self.optimizer = optimizer
        self.state = GradientSynchronizer(model, state, optimizer).state

    def step(self, step=None):
        """One local optimizer step whose update is synchronized and applied;
        returns the step's stats (state.last_stats). `step` defaults to
        state.iter; the same step must be used on every rank."""
        st = self.state
        step = st.iter if step is None else int(step)
        params = [p for _, p in st._named]
        frozen = [t for t, p in enumerate(params) if p.grad is None]
        with torch.no_grad():
            old = [p.detach().clone() for p in params]
            self.optimizer.step()
            deltas = [p.detach() - o for p, o in zip(params, old)]
            for p, o in zip(params, old):
                p.copy_(o)
            for t in frozen:  # the optimizer skipped it: nothing to send
                deltas[t].zero_()
        stats = st._step_frozen(step, deltas, frozen)
        if not stats.get("skipped"):
            skip = set(frozen)
            with torch.no_grad():
                for t, (p, o, d) in enumerate(zip(params, old, deltas)):
                    if t not in skip:
                        p.copy_(o.add_(d))
        st.iter = step + 1
        return stats

