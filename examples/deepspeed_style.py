#!/usr/bin/env python3
"""deepspeed_style.py — igrad in a DeepSpeed-style training loop, on 2-4 CPU
processes (gloo).

DeepSpeed is not installable here (no PyPI), so this loop drives a small
stand-in object, `StandInEngine`, that has the attributes and methods a
DeepSpeed engine has and igrad's recipe uses (the 1-bit Adam precedent):

    engine.module                        the model
    engine.data_parallel_group           the process group of the replicas
    engine.enable_backward_allreduce     False: the engine does not average
    engine.backward(loss)                loss / gradient_accumulation_steps
    engine.is_gradient_accumulation_boundary()
    engine.step()                        the optimizer at the boundary only
    engine.save_checkpoint(dir)          rank 0 writes the model and optimizer

and the loop is the recipe, unchanged for DeepSpeed itself:

    state = IgradState(process_group=engine.data_parallel_group, method=...)
    sync = GradientSynchronizer(engine.module.named_parameters(), state)
    engine.enable_backward_allreduce = False
    for micro_step, batch in ...:
        engine.backward(loss(engine.module, batch))
        if engine.is_gradient_accumulation_boundary():
            sync.synchronize()           # igrad averages the gradients
        engine.step()
    state.save(dir + "/igrad.bin")       # every rank: residuals differ

It was NOT run against DeepSpeed itself. With --check-dense the same run
with method dense is compared, bit for bit, with the stand-in's own
all-reduce (enable_backward_allreduce = True); with --resume-at N the run
is stopped after N optimizer steps, saved and resumed in new processes,
and its final parameters are compared with an uninterrupted run's.

    PYTHONPATH=python /usr/bin/python3 examples/deepspeed_style.py --world 2
"""
import argparse
import datetime
import hashlib
import os
import socket
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))  # without pip install too

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

import igrad.torch as it  # noqa: E402


class Block(nn.Module):
    """Hugging Face LLaMA names (self_attn.q/k/v/o_proj, mlp.up/down_proj),
    so that igrad maps every tensor to its component; a gated mixer stands
    in for attention (the loop, not the model, is the point here)."""

    def __init__(self, dim, hidden):
        super().__init__()
        self.self_attn = nn.Module()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self.self_attn, n, nn.Linear(dim, dim, bias=False))
        self.mlp = nn.Module()
        self.mlp.up_proj = nn.Linear(dim, hidden, bias=False)
        self.mlp.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        a = self.self_attn
        g = torch.sigmoid(a.q_proj(x) * a.k_proj(x))
        x = x + a.o_proj(g * a.v_proj(x))
        return x + self.mlp.down_proj(torch.relu(self.mlp.up_proj(x)))


class Model(nn.Module):
    def __init__(self, dim, hidden, layers):
        super().__init__()
        self.model = nn.Module()
        self.model.layers = nn.ModuleList([Block(dim, hidden) for _ in range(layers)])
        self.lm_head = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        for b in self.model.layers:
            x = b(x)
        return self.lm_head(x)


class StandInEngine:
    """The DeepSpeed engine attributes igrad's recipe uses (ZeRO stage 0)."""

    def __init__(self, model, lr, accumulation, group=None):
        self.module = model
        self.data_parallel_group = group
        self.enable_backward_allreduce = True  # DeepSpeed's default
        self.gradient_accumulation_steps = accumulation
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.0, 0.95))
        self.micro_steps = 0
        self.global_steps = 0

    def is_gradient_accumulation_boundary(self):
        return (self.micro_steps + 1) % self.gradient_accumulation_steps == 0

    def backward(self, loss):
        (loss / self.gradient_accumulation_steps).backward()
        if self.enable_backward_allreduce and self.is_gradient_accumulation_boundary():
            world = dist.get_world_size(self.data_parallel_group)
            for p in self.module.parameters():
                dist.all_reduce(p.grad, group=self.data_parallel_group)
                p.grad.mul_(1.0 / world)

    def step(self):
        if self.is_gradient_accumulation_boundary():
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=False)
            self.global_steps += 1
        self.micro_steps += 1

    def save_checkpoint(self, path):
        """As DeepSpeed: rank 0 writes model, optimizer and counters."""
        if dist.get_rank(self.data_parallel_group) == 0:
            os.makedirs(path, exist_ok=True)
            torch.save({"model": self.module.state_dict(),
                        "optimizer": self.optimizer.state_dict(),
                        "micro_steps": self.micro_steps, "global_steps": self.global_steps},
                       os.path.join(path, "engine.pt"))
        dist.barrier(group=self.data_parallel_group)

    def load_checkpoint(self, path):
        ck = torch.load(os.path.join(path, "engine.pt"))
        self.module.load_state_dict(ck["model"])
        self.optimizer.load_state_dict(ck["optimizer"])
        self.micro_steps, self.global_steps = ck["micro_steps"], ck["global_steps"]


def batch(rank, micro_step, args):
    """This rank's micro-batch: a fixed random linear map to learn."""
    g = torch.Generator().manual_seed(10007 * rank + micro_step)
    x = torch.randn(args.batch, args.dim, generator=g)
    w = torch.Generator().manual_seed(1)
    target = x @ torch.randn(args.dim, args.dim, generator=w) * 0.1
    return x, target


def params_digest(model):
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def train(rank, args, method, stop_at=None, resume=False):
    torch.manual_seed(0)
    model = Model(args.dim, args.hidden, args.layers)
    engine = StandInEngine(model, args.lr, args.accumulation)
    state = sync = None
    if method != "own-allreduce":
        engine.enable_backward_allreduce = False
        state = it.IgradState(process_group=engine.data_parallel_group, method=method,
                              density=args.density, threads=1)
        sync = it.GradientSynchronizer(engine.module.named_parameters(), state)
    ckpt = os.path.join(args.out, "checkpoint")
    if resume:
        engine.load_checkpoint(ckpt)
        state.load(os.path.join(ckpt, "igrad.bin"))  # this rank's file
    total = args.steps * args.accumulation
    while engine.micro_steps < total:
        x, y = batch(rank, engine.micro_steps, args)
        loss = ((engine.module(x) - y) ** 2).mean()
        engine.backward(loss)
        if sync is not None and engine.is_gradient_accumulation_boundary():
            st = sync.synchronize(engine.global_steps)
            if rank == 0 and engine.global_steps % args.log_every == 0:
                print("step %3d loss %.5f payload %d B" % (engine.global_steps, loss.item(),
                                                          st["payload_nbytes"]), flush=True)
        engine.step()
        if stop_at is not None and engine.global_steps == stop_at and \
                engine.micro_steps % args.accumulation == 0:
            engine.save_checkpoint(ckpt)
            state.save(os.path.join(ckpt, "igrad.bin"))  # every rank
            return None
    digest = params_digest(engine.module)
    if rank == 0:
        print("final %s %s" % (method, digest), flush=True)
    return digest


def worker(rank, world, port, args, plan):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=120))
    try:
        for method, stop_at, resume in plan:
            train(rank, args, method, stop_at, resume)
    finally:
        dist.destroy_process_group()


def launch(args, plan):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(args.world, port, args, plan), nprocs=args.world, join=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--method", default="adtopk_sync", help="topk_sync, adtopk_sync or dense "
                    "(ig and iad need a profile: see torch_ddp_finetune.py)")
    ap.add_argument("--steps", type=int, default=20, help="optimizer steps")
    ap.add_argument("--accumulation", type=int, default=2, help="micro-batches per step")
    ap.add_argument("--density", type=float, default=0.05)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--out", default="runs/deepspeed_style")
    ap.add_argument("--check-dense", action="store_true",
                    help="also: method dense vs the stand-in's own all-reduce, bit for bit")
    ap.add_argument("--resume-at", type=int, default=0,
                    help="also: stop after N steps, save, resume, compare with uninterrupted")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    plan = [(args.method, None, False)]
    if args.check_dense:
        plan += [("dense", None, False), ("own-allreduce", None, False)]
    launch(args, plan)
    if args.resume_at:
        launch(args, [(args.method, args.resume_at, False)])
        launch(args, [(args.method, None, True)])


if __name__ == "__main__":
    main()
