"""igrad.torch.comm — communicators over torch.distributed for the host
engine: TorchComm (a process group's collectives on buffers the library
owns, staged through the group's CUDA device for NCCL) and _SelfComm (one
process without torch.distributed). The CUDA engine's communicators
(TorchCudaComm, SelfCudaComm) are in igrad.torch.device.
"""
import ctypes
import datetime

import torch
import torch.distributed as dist

from .. import _lib as L
from ..core import Comm

_CTYPES = {torch.uint8: ctypes.c_uint8, torch.float32: ctypes.c_float,
           torch.float64: ctypes.c_double, torch.int64: ctypes.c_int64}
_DT = {"F32": torch.float32, "F64": torch.float64, "I64": torch.int64}


def _wrap(addr, count, dtype):
    """A CPU tensor over `count` elements at `addr` (no copy). The memory
    belongs to the library; the tensor must not outlive the call."""
    arr = (_CTYPES[dtype] * count).from_address(addr)
    return torch.frombuffer(arr, dtype=dtype)


def _global_rank(group, group_rank):
    if group is None or group is dist.group.WORLD:
        return group_rank
    if hasattr(dist, "get_global_rank"):  # 2.x
        return dist.get_global_rank(group, group_rank)
    from torch.distributed import distributed_c10d as c10d  # 1.13
    return c10d._get_global_rank(group, group_rank)



class TorchComm:
    """Collectives of a torch.distributed process group (gloo, NCCL or any
    other backend), in the form that igrad's custom communicator and the
    engine's two-phase step need: buffers are raw addresses of CPU memory
    owned by the library. With NCCL the bytes are staged through the
    current CUDA device. `comm()` returns the igrad Comm over this object
    (made once)."""

    _OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}

    def __init__(self, group=None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.size = dist.get_world_size(group)
        backend = dist.get_backend(group)
        self.device = (torch.device("cuda", torch.cuda.current_device())
                       if str(backend) == "nccl" else torch.device("cpu"))
        self._comm = None

    def comm(self):
        if self._comm is None:
            self._comm = Comm.custom(self, self.rank, self.size)
        return self._comm

    # Staging for devices other than the CPU: (device tensor, host tensor) pairs
    # whose device result is copied back at wait().
    def _dev(self, t):
        return t if self.device.type == "cpu" else t.to(self.device)

    def _issue_allgather(self, send, nbytes, recv):
        r = _wrap(recv, nbytes * self.size, torch.uint8)
        s = _wrap(send, nbytes, torch.uint8)
        lo, hi = recv, recv + nbytes * self.size
        if lo <= send < hi:  # in place: the input must not alias an output
            s = s.clone()
        rd = self._dev(r)
        work = dist.all_gather(list(rd.split(nbytes)), self._dev(s), group=self.group,
                               async_op=True)
        return (work, rd, r)

    def _issue_allreduce(self, send, recv, count, dtype, op):
        dt = _DT[dtype]
        r = _wrap(recv, count, dt)
        if send != recv:
            r.copy_(_wrap(send, count, dt))
        rd = self._dev(r)
        work = dist.all_reduce(rd, op=self._OPS[op], group=self.group, async_op=True)
        return (work, rd, r)

    def wait(self, handle, timeout_s=0.0):
        """Completes a handle of issue() (the result copied back to the
        host). timeout_s > 0: returns False, the collective left pending,
        when it has not completed within timeout_s seconds (a failed one
        raises as without a timeout); True otherwise."""
        work, dev, host = handle
        if timeout_s > 0:
            try:
                work.wait(timeout=datetime.timedelta(seconds=timeout_s))
            except RuntimeError:
                if not work.is_completed():  # timed out, still pending
                    return False
                raise
        else:
            work.wait()
        if dev is not host:
            host.copy_(dev)
        return True

    def test(self, handle):
        return handle[0].is_completed()

    # igrad_comm_ops_t callbacks (see core.Comm.custom)
    def allgather(self, send, nbytes, recv):
        self.wait(self._issue_allgather(send, nbytes, recv))

    def allreduce(self, send, recv, count, dtype, op):
        self.wait(self._issue_allreduce(send, recv, count, dtype, op))

    def iallgather(self, send, nbytes, recv):
        return self._issue_allgather(send, nbytes, recv)

    def iallreduce(self, send, recv, count, dtype, op):
        return self._issue_allreduce(send, recv, count, dtype, op)

    def bcast(self, buf, nbytes, root):
        t = _wrap(buf, nbytes, torch.uint8)
        d = self._dev(t)
        dist.broadcast(d, src=_global_rank(self.group, root), group=self.group)
        if d is not t:
            t.copy_(d)

    def barrier(self):
        dist.barrier(group=self.group)

    # The two-level sync (IgradState(topology="hier")): split into nodes,
    # reduce onto a root, broadcast from it.
    def split(self, color, key):
        """The TorchComm of the ranks with the same color (-1: the ranks on
        this host), ordered by key then rank. Collective: every rank of
        this group makes every new group, in the same order."""
        import socket
        mine = (str(color) if color >= 0 else "host:" + socket.gethostname(), int(key),
                self.rank)
        every = [None] * self.size
        dist.all_gather_object(every, mine, group=self.group)
        out = None
        for c in sorted(set(e[0] for e in every)):
            members = sorted((k, r) for cc, k, r in every if cc == c)
            g = dist.new_group([_global_rank(self.group, r) for _, r in members])
            if c == mine[0]:
                out = TorchComm(g)
        return out

    def ireduce(self, send, recv, count, dtype, op, root):
        dt = _DT[dtype]
        if self.rank == root:  # the sum lands in recv; send is only read
            t = _wrap(recv, count, dt)
            t.copy_(_wrap(send, count, dt))
        else:  # a reduce may use its input as scratch: reduce a copy
            t = _wrap(send, count, dt).clone()
        d = self._dev(t)
        work = dist.reduce(d, dst=_global_rank(self.group, root), op=self._OPS[op],
                           group=self.group, async_op=True)
        return (work, d, t if self.rank == root else d)

    def ibcast(self, buf, nbytes, root):
        t = _wrap(buf, nbytes, torch.uint8)
        d = self._dev(t)
        work = dist.broadcast(d, src=_global_rank(self.group, root), group=self.group,
                              async_op=True)
        return (work, d, t)

    # The sparse all-reduce (IgradState(collective="sparse_reduce")).
    def alltoallv(self, send, send_nbytes, send_displs, recv, recv_nbytes, recv_displs):
        """Blocking variable all-to-all of bytes: the block of send_nbytes[j]
        bytes at send + send_displs[j] goes to rank j, rank j's block for
        this rank lands at recv + recv_displs[j] (dist.all_to_all_single
        over packed copies, on the group's device)."""
        def blocks(addr, nbytes, displs):
            end = max((d + n for d, n in zip(displs, nbytes) if n), default=0)
            buf = _wrap(addr, end, torch.uint8) if end else torch.empty(0, dtype=torch.uint8)
            return buf, [buf[d:d + n] for d, n in zip(displs, nbytes)]
        _, sparts = blocks(send, send_nbytes, send_displs)
        _, rparts = blocks(recv, recv_nbytes, recv_displs)
        inp = self._dev(torch.cat(sparts) if sparts else torch.empty(0, dtype=torch.uint8))
        out = torch.empty(sum(recv_nbytes), dtype=torch.uint8, device=self.device)
        dist.all_to_all_single(out, inp, output_split_sizes=list(recv_nbytes),
                               input_split_sizes=list(send_nbytes), group=self.group)
        out = out.cpu()
        off = 0
        for part, n in zip(rparts, recv_nbytes):
            if n:
                part.copy_(out[off:off + n])
            off += n

    def issue(self, b):
        """Starts one engine bucket's collective (igrad.core.BucketDesc);
        returns the handle to wait()."""
        if b.kind == "gather":
            return self._issue_allgather(b.send, b.send_nbytes, b.recv)
        if b.kind == "reduce":
            return self._issue_allreduce(b.recv, b.recv, b.count, "F32", "sum")
        raise L.UnsupportedError("bucket %d: no collective for kind %r" % (b.index, b.kind))

    def run_buckets(self, buckets):
        """Runs an engine step's collectives (igrad.core.BucketDesc list):
        all issued in bucket order, then waited in the same order."""
        handles = [self.issue(b) for b in buckets]
        for h in handles:
            self.wait(h)


class _SelfComm:
    """One process without torch.distributed: the collectives are copies."""

    rank, size = 0, 1

    def __init__(self):
        self._comm = None

    def comm(self):
        if self._comm is None:
            self._comm = Comm.self_()
        return self._comm

    @staticmethod
    def run_buckets(buckets):
        for b in buckets:
            if b.kind == "gather" and b.send != b.recv:
                ctypes.memmove(b.recv, b.send, b.send_nbytes)

    def issue(self, b):
        self.run_buckets([b])

    @staticmethod
    def wait(handle, timeout_s=0.0):
        return True

