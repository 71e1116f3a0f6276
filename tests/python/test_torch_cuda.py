"""test_torch_cuda.py — the GPU path of igrad.torch (igrad.torch.device) against
its CPU path on the same gradients: a model on a CUDA device makes
IgradState build an igrad_engine_create_cuda engine on that device, fed
the gradients by data_ptr() on the current stream, with the bucket
collectives on device views (one process without torch.distributed:
self_cuda; a one-rank NCCL process group: TorchCudaComm). Bit for bit
after every step: gradients and residuals of the CUDA state equal those of
a CPU state given the same gradients (GradientSynchronizer, and the DDP
hook with the pre-hook bucket contents recorded; the sparse all-reduce,
self_cuda and one-rank NCCL; BF16, F16 and FP8 wire values); a CUDA state_dict loads
into a CPU state and the reverse, and both continue alike; the memory
statistics say device >= 4 B per parameter (the residual) and host well
under 1 B per parameter.

Without a CUDA device every test skips (visible: CTest Skipped). Written
on a machine without a GPU: it has never run.
Run with /usr/bin/python3; IGRAD_LIBRARY points at the built libigrad.
"""
import datetime
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import igrad.torch.device  # noqa: E402
import igrad.torch as it  # noqa: E402

VOCAB = 64
KW = dict(method="adtopk_sync", density=0.05, momentum=0.5, buckets=3)


def model_on(device):
    return H.TinyLlama(vocab=VOCAB, dim=32, layers=2, heads=2, hidden=80, seed=3).to(device)


def local_grads(model, step):
    """The CPU model's gradients of step `step` (the same on every call)."""
    model.zero_grad()
    model(*H.batch(0, step, vocab=VOCAB)).backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def set_grads(model, grads):
    for p, g in zip(model.parameters(), grads):
        p.grad = g.to(p.device).clone()


def step_all(ref, step, synced):
    """Gives every (model, synchronizer) of `synced` the reference model's
    gradients of `step` and synchronizes it; waits for the GPU."""
    g = local_grads(ref, step)
    for model, sync in synced:
        set_grads(model, g)
        sync.synchronize(step)
    torch.cuda.synchronize()


def residuals(state):
    return {n: r.detach().cpu() for n, r in state.residuals().items()}


class TorchCuda(unittest.TestCase):
    def setUp(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device (torch.cuda.is_available() is False): the GPU path "
                          "of igrad.torch was not run")
        self.dev = torch.device("cuda", 0)
        torch.cuda.set_device(self.dev)

    def tearDown(self):
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()

    def assert_same(self, a, b, what):
        for i, (x, y) in enumerate(zip(a, b)):
            x, y = x.detach().cpu(), y.detach().cpu()
            self.assertTrue(torch.equal(x, y), "%s: tensor %d differs (max |d| %g)"
                            % (what, i, (x - y).abs().max().item()))

    def assert_same_residuals(self, sa, sb, what):
        ra, rb = residuals(sa), residuals(sb)
        self.assertEqual(sorted(ra), sorted(rb), what)
        for n in ra:
            self.assertTrue(torch.equal(ra[n], rb[n]), "%s: residual of %s differs" % (what, n))

    def pair(self, group=None):
        """A CPU and a CUDA model and synchronizer over the same config."""
        cpu, gpu = model_on("cpu"), model_on(self.dev)
        sc = it.IgradState(cpu, process_group=group, **KW)
        sg = it.IgradState(gpu, **KW)
        return cpu, gpu, sc, sg

    def test_synchronizer_same_bits_as_cpu(self):
        """One process, no torch.distributed (self_cuda)."""
        ref = model_on("cpu")
        cpu, gpu, sc, sg = self.pair()
        yc = it.GradientSynchronizer(cpu.named_parameters(), sc)
        yg = it.GradientSynchronizer(gpu.named_parameters(), sg)
        for step in range(5):
            step_all(ref, step, [(cpu, yc), (gpu, yg)])
            self.assert_same([p.grad for p in cpu.parameters()],
                             [p.grad for p in gpu.parameters()], "step %d gradients" % step)
        self.assertEqual(sg.engine.device, 0)
        self.assert_same_residuals(sc, sg, "after 5 steps")
        st = sg.last_stats
        self.assertGreaterEqual(st["device_nbytes_per_param"], 8.0)  # residual + velocity
        self.assertEqual(sc.last_stats["device_nbytes"], 0)
        self.assertLess(st["host_nbytes"], sc.last_stats["host_nbytes"])
        self.assertEqual(st["entries_sent"], sc.last_stats["entries_sent"])

    def test_sparse_allreduce_same_bits_as_cpu(self):
        """collective="sparse_reduce" on the device (the engine's own
        exchanges through eng.sync): one process (self_cuda), then a
        one-rank NCCL group (TorchCudaComm.alltoallv on device views)."""
        kw = dict(KW, collective="sparse_reduce")
        for nccl in (False, True):
            gloo = None
            if nccl:
                dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % H.free_port(),
                                        rank=0, world_size=1,
                                        timeout=datetime.timedelta(seconds=60))
                gloo = dist.new_group(backend="gloo")
            ref, cpu, gpu = model_on("cpu"), model_on("cpu"), model_on(self.dev)
            sc = it.IgradState(cpu, process_group=gloo, **kw)
            sg = it.IgradState(gpu, **kw)
            yc = it.GradientSynchronizer(cpu.named_parameters(), sc)
            yg = it.GradientSynchronizer(gpu.named_parameters(), sg)
            what = "nccl" if nccl else "self_cuda"
            for step in range(4):
                step_all(ref, step, [(cpu, yc), (gpu, yg)])
                self.assert_same([p.grad for p in cpu.parameters()],
                                 [p.grad for p in gpu.parameters()],
                                 "%s step %d gradients" % (what, step))
            self.assert_same_residuals(sc, sg, "%s after 4 steps" % what)
            self.assertGreater(sg.last_stats["sparse_reduce_buckets"], 0)
            if nccl:
                self.assertIsInstance(sg._group_comm(), igrad.torch.device.TorchCudaComm)
                dist.destroy_process_group()

    def test_wire_values_same_bits_as_cpu(self):
        """BF16, F16 and FP8 E4M3 wire values (one process, self_cuda): the
        CUDA state rounds, packs and unpacks them as the CPU state does."""
        for vt in ("BF16", "F16", "F8_E4M3"):
            kw = dict(KW, value_dtype=vt)
            ref, cpu, gpu = model_on("cpu"), model_on("cpu"), model_on(self.dev)
            sc, sg = it.IgradState(cpu, **kw), it.IgradState(gpu, **kw)
            yc = it.GradientSynchronizer(cpu.named_parameters(), sc)
            yg = it.GradientSynchronizer(gpu.named_parameters(), sg)
            for step in range(4):
                step_all(ref, step, [(cpu, yc), (gpu, yg)])
                self.assert_same([p.grad for p in cpu.parameters()],
                                 [p.grad for p in gpu.parameters()],
                                 "%s step %d gradients" % (vt, step))
            self.assert_same_residuals(sc, sg, "%s after 4 steps" % vt)
            self.assertEqual(sg.last_stats["payload_nbytes"], sc.last_stats["payload_nbytes"])

    def test_host_memory_is_metadata(self):
        """Two 1M-entry tensors: host bytes are the plan's, well under one
        byte per parameter; device bytes hold the residual (4 B/param)."""
        m = torch.nn.Sequential(torch.nn.Linear(1024, 1024, bias=False),
                                torch.nn.Linear(1024, 1024, bias=False)).to(self.dev)
        st = it.IgradState(m, method="topk_sync", density=0.01)
        for p in m.parameters():
            p.grad = torch.randn_like(p)
        stats = it.GradientSynchronizer(m.named_parameters(), st).synchronize(0)
        self.assertGreaterEqual(stats["device_nbytes_per_param"], 4.0)
        self.assertLess(stats["host_nbytes_per_param"], 0.1, stats)

    def test_ddp_hook_nccl_one_rank(self):
        """DDP on a one-rank NCCL group with the hook: the result equals a
        CPU state given the buckets' contents before the hook."""
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % H.free_port(),
                                rank=0, world_size=1, timeout=datetime.timedelta(seconds=60))
        gloo = dist.new_group(backend="gloo")
        cpu, gpu, sc, sg = self.pair(group=gloo)
        ddp = DDP(gpu, device_ids=[0], bucket_cap_mb=0.01)
        seen = []

        def recording_hook(state, bucket):
            seen.append((bucket.buffer().detach().cpu().clone(), list(bucket.parameters())))
            return it.hook(state, bucket)

        ddp.register_comm_hook(sg, recording_hook)
        yc = it.GradientSynchronizer(cpu.named_parameters(), sc)
        names = {p: n for n, p in gpu.named_parameters()}
        cpu_params = dict(cpu.named_parameters())
        for step in range(4):
            seen.clear()
            ddp.zero_grad()
            x, y = H.batch(0, step, vocab=VOCAB)
            ddp(x.to(self.dev), y.to(self.dev)).backward()
            torch.cuda.synchronize()
            for buf, params in seen:  # the local gradients the hook was given
                off = 0
                for p in params:
                    cpu_params[names[p]].grad = buf[off:off + p.numel()].view(p.shape).clone()
                    off += p.numel()
            yc.synchronize(step)
            self.assert_same([p.grad for p in cpu.parameters()],
                             [p.grad for p in gpu.parameters()], "DDP step %d" % step)
        self.assertIsInstance(sg._group_comm(), igrad.torch.device.TorchCudaComm)
        self.assert_same_residuals(sc, sg, "DDP after 4 steps")

    def test_state_dict_cuda_to_cpu_and_back(self):
        """A CUDA state's state_dict (its engine state file saved from the
        device) loads into a CPU state, a CPU one into a CUDA state; all
        continue as the uninterrupted CPU state."""
        ref = model_on("cpu")
        cpu, gpu, sc, sg = self.pair()
        yc = it.GradientSynchronizer(cpu.named_parameters(), sc)
        yg = it.GradientSynchronizer(gpu.named_parameters(), sg)
        for step in range(3):
            step_all(ref, step, [(cpu, yc), (gpu, yg)])
        from_gpu, from_cpu = sg.state_dict(), sc.state_dict()
        self.assertEqual(from_gpu["engine_state"], from_cpu["engine_state"])
        cpu2, gpu2 = model_on("cpu"), model_on(self.dev)
        sc2, sg2 = it.IgradState(cpu2, **KW), it.IgradState(gpu2, **KW)
        sc2.load_state_dict(from_gpu)
        sg2.load_state_dict(from_cpu)
        yc2 = it.GradientSynchronizer(cpu2.named_parameters(), sc2)
        yg2 = it.GradientSynchronizer(gpu2.named_parameters(), sg2)
        for step in range(3, 5):
            step_all(ref, step, [(cpu, yc), (cpu2, yc2), (gpu2, yg2)])
            want = [p.grad for p in cpu.parameters()]
            self.assert_same(want, [p.grad for p in cpu2.parameters()], "cuda -> cpu")
            self.assert_same(want, [p.grad for p in gpu2.parameters()], "cpu -> cuda")
        self.assert_same_residuals(sc, sc2, "cuda -> cpu")
        self.assert_same_residuals(sc, sg2, "cpu -> cuda")


if __name__ == "__main__":
    unittest_main.main()
