"""test_torch_update_sync.py — igrad.torch.UpdateSynchronizer (error
feedback on the optimizer's update) on 2 gloo processes
(torch.multiprocessing.spawn, as test_torch_ddp.py):

  - adtopk_sync with AdamW, 8 steps on different local batches: the
    parameters are identical on both ranks after every step and move, while
    AdamW's moments (local state) differ between the ranks;
  - method dense with SGD(lr, no momentum) equals plain DDP with the same
    SGD (an independent reference: torch's own gradient all-reduce) to
    float tolerance after 6 steps;
  - a state with a grad_scaler is refused.
Run with /usr/bin/python3 (torch 1.13); IGRAD_LIBRARY points at the built
libigrad (set by CTest).
"""
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402


def w_adamw_identical(rank, world):
    model = H.TinyLlama()
    start = H.flat_params(model).clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    state = it.IgradState(method="adtopk_sync", density=0.125)
    sync = it.UpdateSynchronizer(model, opt, state)
    for step in range(8):
        opt.zero_grad()
        model(*H.batch(rank, step)).backward()
        st = sync.step()
        assert st["skipped"] == 0 and st["step"] == step, st
        assert st["entries_sent"] < sum(p.numel() for p in model.parameters()), st
        got = H.gather_flat(H.flat_params(model))
        assert all(torch.equal(got[0], g) for g in got[1:]), \
            "step %d: parameters differ across ranks" % step
    moved = float((H.flat_params(model) - start).abs().max())
    assert moved > 1e-3, "parameters moved by only %g" % moved
    m = torch.cat([opt.state[p]["exp_avg"].reshape(-1) for p in model.parameters()])
    got = H.gather_flat(m)
    assert not torch.equal(got[0], got[1]), "AdamW's moments are equal on both ranks: " \
        "the optimizer did not run on local gradients"
    assert state.iter == 8


def w_dense_sgd_equals_ddp(rank, world):
    lr = 0.3
    model = H.TinyLlama()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    sync = it.UpdateSynchronizer(model, opt, it.IgradState(method="dense"))
    ref = H.TinyLlama()
    ddp = DDP(ref)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=lr)
    for step in range(6):
        opt.zero_grad()
        model(*H.batch(rank, step)).backward()
        sync.step()
        ref_opt.zero_grad()
        ddp(*H.batch(rank, step)).backward()
        ref_opt.step()
    d = float((H.flat_params(model).double() - H.flat_params(ref).double()).abs().max())
    moved = float((H.flat_params(ref) - H.flat_params(H.TinyLlama())).abs().max())
    assert moved > 1e-2, "SGD moved the parameters by only %g" % moved
    assert d <= 1e-6, "dense UpdateSynchronizer vs DDP + SGD: max |diff| %g" % d


class UpdateSynchronizerTest(unittest.TestCase):
    def test_adamw_parameters_identical_across_ranks(self):
        H.spawn(w_adamw_identical)

    def test_dense_sgd_equals_ddp(self):
        H.spawn(w_dense_sgd_equals_ddp)

    def test_grad_scaler_refused(self):
        model = H.TinyLlama()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        state = it.IgradState(method="dense", grad_scaler=lambda: 1024.0)
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "grad_scaler"):
            it.UpdateSynchronizer(model, opt, state)


if __name__ == "__main__":
    unittest_main.main()
