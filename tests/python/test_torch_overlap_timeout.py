"""test_torch_overlap_timeout.py — the overlapped DDP hook (overlap=True)
when a rank never reaches its hook: 3 gloo ranks, timeout_s=2; step 0 runs
on every rank, then rank 2 runs step 1's forward (DDP's own collectives)
but not its backward (as a rank that raised in between would). Ranks 0 and 1 wait in the igrad collectives they issued
during backward: each must raise within about the timeout (not the
process group's 60 s) an error naming the step and timeout_s, reachable
typed as igrad.CommTimeoutError through state.last_error, and the state
must refuse the next step by name. Rank 2 stays alive until both have
timed out (a rank that exits would close its connections and turn the
timeout into a connection error), and every rank leaves without waiting
for the abandoned collectives (os._exit).
"""
import os
import sys
import time
import traceback
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402,F401 (puts python/ on sys.path)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

TIMEOUT_S = 2.0
BOUND_S = 20.0  # "about the timeout" on a loaded machine; the group's own is 60 s
VICTIM = 2


def checks(rank, world):
    store = dist.distributed_c10d._get_default_store()
    model = H.TinyLlama(seed=0, dim=128, hidden=256)
    ddp = DDP(model, bucket_cap_mb=0.2)
    state = it.IgradState(ddp, method="topk_sync", density=0.1, buckets=4, overlap=True,
                          timeout_s=TIMEOUT_S)
    ddp.register_comm_hook(state, it.hook)
    ddp(*H.batch(rank, 0)).backward()  # step 0 on every rank
    assert state.iter == 1, state.iter
    if rank == VICTIM:  # never reaches its hook at step 1
        ddp(*H.batch(rank, 1))  # DDP's forward has collectives of its own
        store.wait(["timed_out_%d" % r for r in range(world) if r != VICTIM])
        store.set("victim_done", "1")
        return
    t0 = time.monotonic()
    msg = ""
    try:
        ddp(*H.batch(rank, 1)).backward()
    except RuntimeError as e:  # DDP re-raises the hook's error
        msg = str(e)
    waited = time.monotonic() - t0
    store.set("timed_out_%d" % rank, "1")
    assert "step 1: igrad bucket" in msg and "timeout_s = 2 s" in msg, (rank, msg)
    assert TIMEOUT_S <= waited < BOUND_S, (rank, waited)
    assert isinstance(state.last_error, igrad.CommTimeoutError), (rank, state.last_error)
    try:
        state._stream_open()  # what the next step's first bucket does
        raise AssertionError("rank %d: the state opened a step after the timeout" % rank)
    except igrad.StateError as e:
        assert "unusable: step 1" in str(e), (rank, str(e))
    if rank == 0:  # the store's server: stay until the victim is done with it
        store.wait(["victim_done"])
    print("rank %d: timed out after %.2f s: %s" % (rank, waited, msg.splitlines()[0][:160]))


def w_timeout(rank, world):
    # The abandoned gloo collectives would make destroy_process_group wait
    # for the group's timeout: leave at once, with the checks' verdict.
    code = 0
    try:
        checks(rank, world)
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class OverlapTimeoutTest(unittest.TestCase):
    def test_peer_never_reaches_its_hook(self):
        H.spawn(w_timeout, world=3, deadline_s=120)


if __name__ == "__main__":
    unittest_main.main()
