"""igrad.torch.device — the PyTorch binding's GPU path: IgradState
(igrad.torch.state) comes here when the model's parameters are CUDA
tensors.

    device_view(addr, count, dtype, device)  a torch tensor over device memory
                                             the library owns (no copy)
    TorchCudaComm(group, device)             TorchComm whose bucket
                                             collectives (and alltoallv)
                                             take device buffers
    SelfCudaComm(device)                     one process, no torch.distributed
    params_device(params)                    the one CUDA device of a model
    create_engine(layout, profile, config, coll, device)
    set_step_stream(engine, device)          the engine on the current stream

The engine is igrad_engine_create_cuda's on the parameters' device: its
residuals, velocities and bucket buffers live in device memory (the
residual is the one O(parameters) buffer), and the host holds O(metadata).
Every step it is put on torch.cuda.current_stream(), the gradients go in
by data_ptr() (DDP bucket views, .grad: float32, contiguous, on that
device; anything else is staged on the device), and the step's bucket
collectives run through torch.distributed on device views of the engine's
buckets (NCCL: the process group's own communicator), issued and waited
on that same stream, so nothing is copied to the host.

Tests that need a GPU (tests/python/test_torch_cuda.py) skip visibly
without one. A library built without CUDA raises UnsupportedError ("this
build of igrad has no CUDA") at engine creation.

Not here: the host communicators (igrad.torch.comm), the DDP hook
(igrad.torch.hook), state dicts (igrad.torch.checkpoint).
"""
import contextlib

import torch
import torch.distributed as dist

from .. import _lib as L
from ..core import Comm, Engine
from .comm import TorchComm, _global_rank

__all__ = ["device_view", "TorchCudaComm", "SelfCudaComm", "params_device", "create_engine",
           "set_step_stream"]

_TYPESTR = {torch.uint8: "|u1", torch.float32: "<f4", torch.float64: "<f8",
            torch.int64: "<i8"}
_DT = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}


class _DeviceMemory:
    """`count` elements of `dtype` at device address `addr`, presented to
    torch through the CUDA array interface (version 3, no stream: the
    caller orders the work)."""

    def __init__(self, addr, count, dtype):
        self.__cuda_array_interface__ = {
            "shape": (int(count),), "typestr": _TYPESTR[dtype], "data": (int(addr), False),
            "strides": None, "version": 3, "stream": None}


def device_view(addr, count, dtype, device):
    """A CUDA tensor over `count` elements at device address `addr` (no
    copy). The memory belongs to the library; the tensor must not outlive
    the engine."""
    if count == 0:
        return torch.empty(0, dtype=dtype, device=device)
    return torch.as_tensor(_DeviceMemory(addr, count, dtype), device=device)


def params_device(params):
    """The CUDA device of the parameters (torch.device), or None when they
    are on the CPU. Parameters on several devices are refused: a CUDA
    engine has one."""
    devices = {p.device for p in params}
    if not any(d.type == "cuda" for d in devices):
        return None
    if len(devices) > 1:
        raise L.UnsupportedError(
            "the parameters are on %s: igrad's CUDA engine takes the parameters of one "
            "device (one engine per GPU, as DDP has one replica per GPU)"
            % ", ".join(sorted(str(d) for d in devices)))
    d = next(iter(devices))
    return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())


def _gather_into(out, inp, group):
    """all_gather into one flat output (torch >= 2.0 all_gather_into_tensor,
    1.13 _all_gather_base), else into its per-rank views."""
    fn = getattr(dist, "all_gather_into_tensor", None) or getattr(dist, "_all_gather_base",
                                                                  None)
    if fn is not None:
        return fn(out, inp, group=group, async_op=True)
    return dist.all_gather(list(out.split(inp.numel())), inp, group=group, async_op=True)


class TorchCudaComm(TorchComm):
    """TorchComm for a CUDA engine: the non-blocking collectives (the
    engine's buckets) take device addresses on `device` and run on device
    views of them, on the stream set by set_stream (the engine's) or the
    current one, and so does the blocking alltoallv (the sparse
    all-reduce's exchange); the other blocking ones (the engine's
    agreement) keep host addresses, staged as TorchComm stages them. Its
    igrad Comm is a custom one with memory "cuda"."""

    memory = "cuda"

    def __init__(self, group, device):
        super().__init__(group)
        self.data_device = device
        self._stream = None

    def comm(self):
        if self._comm is None:
            self._comm = Comm.custom(self, self.rank, self.size, memory="cuda")
        return self._comm

    def set_stream(self, stream):
        self._stream = int(stream) or None

    def _on_stream(self):
        if self._stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(torch.cuda.ExternalStream(self._stream,
                                                           device=self.data_device))

    def _issue_device_allgather(self, send, nbytes, recv):
        r = device_view(recv, nbytes * self.size, torch.uint8, self.data_device)
        s = device_view(send, nbytes, torch.uint8, self.data_device)
        if recv <= send < recv + nbytes * self.size:  # in place: no aliasing of the output
            s = s.clone()
        return (_gather_into(r, s, self.group), r, r)

    def _issue_device_allreduce(self, send, recv, count, dtype, op):
        dt = _DT[dtype]
        r = device_view(recv, count, dt, self.data_device)
        if send != recv:
            r.copy_(device_view(send, count, dt, self.data_device))
        work = dist.all_reduce(r, op=self._OPS[op], group=self.group, async_op=True)
        return (work, r, r)

    # igrad_comm_ops_t non-blocking callbacks: device buffers
    def iallgather(self, send, nbytes, recv):
        with self._on_stream():
            return self._issue_device_allgather(send, nbytes, recv)

    def iallreduce(self, send, recv, count, dtype, op):
        with self._on_stream():
            return self._issue_device_allreduce(send, recv, count, dtype, op)

    def wait(self, handle, timeout_s=0.0):
        with self._on_stream():  # the stream waits for NCCL; the host does not
            return super().wait(handle, timeout_s)

    # The two-level sync (topology "hier") on the device: the node comms are
    # TorchCudaComms too, and reduce / broadcast take device addresses.
    def split(self, color, key):
        sub = super().split(color, key)
        out = TorchCudaComm(sub.group, self.data_device)
        out._stream = self._stream
        return out

    def ireduce(self, send, recv, count, dtype, op, root):
        dt = _DT[dtype]
        with self._on_stream():
            if self.rank == root:  # the sum lands in recv; send is only read
                t = device_view(recv, count, dt, self.data_device)
                t.copy_(device_view(send, count, dt, self.data_device))
            else:  # a reduce may use its input as scratch: reduce a copy
                t = device_view(send, count, dt, self.data_device).clone()
            work = dist.reduce(t, dst=_global_rank(self.group, root), op=self._OPS[op],
                               group=self.group, async_op=True)
        return (work, t, t)

    def ibcast(self, buf, nbytes, root):
        with self._on_stream():
            t = device_view(buf, nbytes, torch.uint8, self.data_device)
            work = dist.broadcast(t, src=_global_rank(self.group, root), group=self.group,
                                  async_op=True)
        return (work, t, t)

    # The sparse all-reduce's exchange: blocking like TorchComm.alltoallv,
    # but on device views and on the stream set by set_stream.
    def alltoallv(self, send, send_nbytes, send_displs, recv, recv_nbytes, recv_displs):
        """Blocking variable all-to-all of device bytes: the block of
        send_nbytes[j] bytes at device address send + send_displs[j] goes
        to rank j, rank j's block for this rank lands at recv +
        recv_displs[j] (dist.all_to_all_single over packed device copies,
        or the buffers themselves when their blocks are back to back in
        rank order). Returns once the stream is done, so the bytes can be
        read from the host."""
        def side(addr, nbytes, displs):
            # the buffer over every block, the blocks, and the buffer itself
            # when the blocks already are the packed layout (else None)
            end = max((d + n for d, n in zip(displs, nbytes) if n), default=0)
            buf = device_view(addr, end, torch.uint8, self.data_device)
            parts = [buf[d:d + n] for d, n in zip(displs, nbytes)]
            offs = [sum(nbytes[:j]) for j in range(len(nbytes))]
            packed = all(d == o for d, n, o in zip(displs, nbytes, offs) if n)
            return parts, buf[:sum(nbytes)] if packed else None
        with self._on_stream():
            sparts, inp = side(send, send_nbytes, send_displs)
            rparts, out = side(recv, recv_nbytes, recv_displs)
            if inp is None:
                inp = torch.cat(sparts)
            scatter = out is None
            if scatter:
                out = torch.empty(sum(recv_nbytes), dtype=torch.uint8, device=self.data_device)
            dist.all_to_all_single(out, inp, output_split_sizes=list(recv_nbytes),
                                   input_split_sizes=list(send_nbytes), group=self.group)
            if scatter:
                off = 0
                for part, n in zip(rparts, recv_nbytes):
                    if n:
                        part.copy_(out[off:off + n])
                    off += n
            torch.cuda.current_stream(self.data_device).synchronize()  # blocking, as C expects

    def run_buckets(self, buckets):
        """A step's collectives on the current stream (the engine's): all
        issued in bucket order, then waited in order; device views only."""
        handles = []
        for b in buckets:
            if b.kind == "gather":
                handles.append(self._issue_device_allgather(b.send, b.send_nbytes, b.recv))
            elif b.kind == "reduce":
                handles.append(self._issue_device_allreduce(b.recv, b.recv, b.count, "F32",
                                                            "sum"))
            else:
                raise L.UnsupportedError("bucket %d: no collective for kind %r"
                                         % (b.index, b.kind))
        for h in handles:
            super().wait(h)


class SelfCudaComm:
    """One process without torch.distributed, for a CUDA engine: the
    library's self_cuda communicator; a gather bucket is a device copy."""

    rank, size = 0, 1
    memory = "cuda"

    def __init__(self, device):
        self.device = device
        self._comm = None

    def comm(self):
        if self._comm is None:
            self._comm = Comm.self_cuda(None)  # None: the engine's stream
        return self._comm

    def run_buckets(self, buckets):
        for b in buckets:
            if b.kind == "gather" and b.send != b.recv:
                device_view(b.recv, b.send_nbytes, torch.uint8, self.device).copy_(
                    device_view(b.send, b.send_nbytes, torch.uint8, self.device))


def group_comm(group, device, distributed):
    """The communicator of a CUDA engine: over the process group, or one
    process without torch.distributed."""
    return TorchCudaComm(group, device) if distributed else SelfCudaComm(device)


def create_engine(layout, profile, config, coll, device):
    """An Engine on `device` (torch.device("cuda", i)) and its current
    stream, over coll's device communicator. Collective over the group."""
    stream = torch.cuda.current_stream(device).cuda_stream
    return Engine(layout, profile, config, coll.comm(), device=device.index, stream=stream)


def set_step_stream(engine, device):
    """Puts the engine's next step on torch.cuda.current_stream(device) (the
    stream the backward pass and DDP's hook run on)."""
    engine.set_stream(torch.cuda.current_stream(device).cuda_stream)
