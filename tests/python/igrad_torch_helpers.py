"""igrad_torch_helpers.py — shared pieces of the PyTorch integration tests
(not a test itself: CTest runs only test_*.py).

  TinyLlama       a LLaMA-shaped model with Hugging Face parameter names,
                  small enough that a step takes milliseconds
  batch(...)      deterministic per-(rank, step) token batches
  spawn(...)      runs a function on N gloo processes with a free port and
                  a deadline (a hang becomes a failure, never a stuck test)
  ref_select(...) top-k / row-wise top-k with error feedback in torch ops,
                  ties to the lower index (the independent reference)
  flat_params(m)  a model's parameters as one flat tensor
  gather_flat(t)  every rank's copy of t, flattened (all_gather)
  residuals(st)   copies of an IgradState's engine residuals (None: none)
"""
import datetime
import math
import os
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("IGRAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
if os.path.join(SOURCE_DIR, "python") not in sys.path:
    sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))


class RMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class Attention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=False)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        h = self.heads
        q, k, v = (p(x).view(B, T, h, C // h).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // h)
        mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.self_attn = Attention(dim, heads)
        self.mlp = MLP(dim, hidden)
        self.input_layernorm = RMSNorm(dim)
        self.post_attention_layernorm = RMSNorm(dim)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Inner(nn.Module):
    def __init__(self, vocab, dim, layers, heads, hidden):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads, hidden) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for b in self.layers:
            x = b(x)
        return self.norm(x)


class TinyLlama(nn.Module):
    """model.embed_tokens, model.layers.N.{self_attn.{q,k,v,o}_proj, mlp.
    {gate,up,down}_proj, input_layernorm, post_attention_layernorm},
    model.norm, lm_head — the Hugging Face LLaMA names."""

    def __init__(self, vocab=32, dim=16, layers=2, heads=2, hidden=40, seed=0):
        super().__init__()
        g = torch.random.fork_rng()
        with g:
            torch.manual_seed(seed)
            self.model = Inner(vocab, dim, layers, heads, hidden)
            self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx, targets):
        logits = self.lm_head(self.model(idx))
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def batch(rank, step, B=2, T=8, vocab=32):
    """Tokens and next-token targets, a pure function of (rank, step)."""
    g = torch.Generator().manual_seed(1000003 * (rank + 1) + step)
    x = torch.randint(0, vocab, (B, T + 1), generator=g)
    return x[:, :-1].contiguous(), x[:, 1:].contiguous()


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def gather_flat(t):
    """[rank 0's t, rank 1's t, ...], each flattened."""
    flat = t.detach().reshape(-1).clone()
    out = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(out, flat)
    return out


def residuals(state):
    """Copies of the engine's residuals, one per layout tensor (None for a
    tensor without one: method dense)."""
    import ctypes
    eng = state.engine
    out = []
    for t, (_, p) in enumerate(state._named):
        addr = eng.residual_address(t)
        if not addr:
            out.append(None)
            continue
        buf = (ctypes.c_float * p.numel()).from_address(addr)
        out.append(torch.frombuffer(buf, dtype=torch.float32).clone())
    return out


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_dist(rank, world, port, timeout_s=60):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout_s))


def _entry(rank, fn, world, port, args):
    init_dist(rank, world, port)
    try:
        fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    # Every check has run and the process group is gone. Leave without the
    # interpreter's teardown: after a comm hook has raised inside backward(),
    # torch 1.13 sometimes aborts while destroying the DDP objects at exit
    # ("terminate called without an active exception", about one run in
    # eight of test_errors_raise_on_every_rank), which is torch's teardown,
    # not a result of the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(fn, world=2, args=(), deadline_s=120):
    """Runs fn(rank, world, *args) on `world` processes (gloo). An exception
    in any process is raised here with its traceback; a process still
    running after deadline_s is killed and reported as a hang."""
    ctx = mp.spawn(_entry, args=(fn, world, free_port(), args), nprocs=world, join=False)
    end = time.monotonic() + deadline_s
    while not ctx.join(timeout=max(0.1, end - time.monotonic())):
        if time.monotonic() >= end:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            raise AssertionError("%s hung: killed after %d s" % (fn.__name__, deadline_s))


def stable_topk_mask(a, k):
    """Mask of the k entries of largest |a| (ties: the lower index), by a
    stable sort — independent of igrad's selection algorithm."""
    order = torch.sort(-a.abs(), stable=True).indices
    m = torch.zeros(a.numel(), dtype=torch.bool)
    m[order[:k]] = True
    return m


def ref_select(grad, residual, sparsifier, density, dense_below=64):
    """Error feedback + selection in torch: a = g + e; keep top-k of |a|
    (topk: flat, k = ceil(density n); adtopk on 2-D: per row
    max(1, ceil(density cols))); a tensor of fewer than dense_below entries
    (the library's default 64) is kept whole. Returns (selected values as a
    dense tensor, new residual)."""
    a = grad.reshape(-1).to(torch.float32) + residual.reshape(-1)
    n = a.numel()
    if n < dense_below:
        return a.view(grad.shape).clone(), torch.zeros_like(a).view(grad.shape)
    if sparsifier == "adtopk" and grad.dim() >= 2:
        rows = grad.shape[0]
        cols = n // rows
        per = min(cols, max(1, math.ceil(density * cols)))
        m = torch.cat([stable_topk_mask(a[r * cols:(r + 1) * cols], per) for r in range(rows)])
    else:
        k = min(n, max(1, math.ceil(density * n)))
        m = stable_topk_mask(a, k)
    sel = torch.where(m, a, torch.zeros_like(a))
    return sel.view(grad.shape), (a - sel).view(grad.shape)
