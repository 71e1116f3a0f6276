#!/usr/bin/env python3
"""torch_ddp_finetune.py — post-train a small LLaMA-like model on a Brown
genre with PyTorch DDP on 2-4 CPU processes (gloo), synchronizing the
gradients with igrad's DDP communication hook.

What it does, on every rank:
  1. reads data/brown/<genre>.txt (documents separated by lines that are
     exactly "%"; run scripts/fetch-corpus first), byte-level tokens;
  2. profiles: --profile-steps of ordinary DDP training while
     igrad.torch.Profiler records the activity of the sparsifier's retained
     gradient; rank 0 writes trace.csv and builds profile.json
     (igrad.build_profile, the same as `igrad profile`);
  3. trains --steps more with the igrad hook (method ig by default) on a new
     DDP wrapper of the same model, printing loss and bytes per step;
  4. evaluates the held-out documents and compares the bytes with what
     the sparsifier's *_sync method would have sent.

The model is plain torch modules with Hugging Face LLaMA parameter names
(model.embed_tokens, model.layers.N.self_attn.q_proj, ..., mlp.down_proj,
model.norm, lm_head), so igrad maps every tensor to its component.

Run:
    PYTHONPATH=python IGRAD_LIBRARY=build/libigrad.so \\
        /usr/bin/python3 examples/torch_ddp_finetune.py --world 2
Processes are started with torch.multiprocessing.spawn, because Debian's
torchrun crashes on Python 3.11 (Std.from_str). Under torchrun, which this
script also supports, pass `--redirects 1 --tee 1` as the workaround:
    torchrun --redirects 1 --tee 1 --nproc_per_node 2 \\
        examples/torch_ddp_finetune.py
"""
import argparse
import datetime
import math
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))  # works without pip install too

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


# ---------------------------------------------------------------------------
# Model: LLaMA-shaped, Hugging Face names. B = batch, T = sequence length,
# C = width, H = heads, V = vocabulary (256 bytes).
# ---------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))  # (C,)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x, theta=10000.0):
    """Rotary position embedding over (B, H, T, D), halves rotated as in HF."""
    T, D = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = torch.outer(torch.arange(T, dtype=torch.float32), inv)  # (T, D/2)
    cos = torch.cat([ang.cos(), ang.cos()], -1)
    sin = torch.cat([ang.sin(), ang.sin()], -1)
    x1, x2 = x[..., :D // 2], x[..., D // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class LlamaAttention(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.q_proj = nn.Linear(dim, dim, bias=False)  # (C, C)
        self.k_proj = nn.Linear(dim, dim, bias=False)
        self.v_proj = nn.Linear(dim, dim, bias=False)
        self.o_proj = nn.Linear(dim, dim, bias=False)

    def forward(self, x):
        B, T, C = x.shape
        H = self.heads
        q, k, v = (p(x).view(B, T, H, C // H).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        q, k = rope(q), rope(k)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(C // H)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(causal, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, C))


class LlamaMLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)  # (4C, C) roughly
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, dim, heads, hidden):
        super().__init__()
        self.self_attn = LlamaAttention(dim, heads)
        self.mlp = LlamaMLP(dim, hidden)
        self.input_layernorm = RMSNorm(dim)
        self.post_attention_layernorm = RMSNorm(dim)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, vocab, dim, layers, heads, hidden):
        super().__init__()
        self.embed_tokens = nn.Embedding(vocab, dim)  # (V, C)
        self.layers = nn.ModuleList(LlamaDecoderLayer(dim, heads, hidden)
                                    for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, vocab=256, dim=64, layers=2, heads=4, hidden=176):
        super().__init__()
        self.model = LlamaModel(vocab, dim, layers, heads, hidden)
        self.lm_head = nn.Linear(dim, vocab, bias=False)  # (V, C)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        logits = self.lm_head(self.model(idx))  # (B, T, V)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


# ---------------------------------------------------------------------------
# Data: byte tokens of a Brown genre
# ---------------------------------------------------------------------------

def read_documents(path):
    """Documents of a prepared corpus file: separated by lines that are "%"."""
    docs, cur = [], []
    with open(path, "rb") as f:
        for line in f:
            if line.rstrip(b"\r\n") == b"%":
                if cur:
                    docs.append(b"".join(cur))
                cur = []
            else:
                cur.append(line)
    if cur:
        docs.append(b"".join(cur))
    return [d for d in docs if d.strip()]


def load_corpus(args):
    path = args.text or os.path.join(args.data, "brown", args.genre + ".txt")
    if not os.path.exists(path):
        sys.exit("torch_ddp_finetune: %s not found; run scripts/fetch-corpus brown (or pass "
                 "--text FILE)" % path)
    docs = read_documents(path)
    nval = max(1, len(docs) // 10) if len(docs) > 1 else 0
    train = b"".join(docs[:len(docs) - nval] if nval else docs)
    val = b"".join(docs[len(docs) - nval:]) if nval else train[-len(train) // 10:]
    to_t = lambda b: torch.frombuffer(bytearray(b), dtype=torch.uint8).long()  # noqa: E731
    return to_t(train), to_t(val)


def get_batch(tokens, B, T, seed, rank, step):
    """Random windows; a pure function of (seed, rank, step), so a run is
    reproducible and every rank reads different text."""
    g = torch.Generator().manual_seed(seed * 1000003 + rank * 7919 + step)
    starts = torch.randint(0, tokens.numel() - T - 1, (B,), generator=g)
    x = torch.stack([tokens[s:s + T + 1] for s in starts.tolist()])
    return x[:, :-1], x[:, 1:]


@torch.no_grad()
def evaluate(model, tokens, B, T, batches=8):
    model.eval()
    losses = [float(model(*get_batch(tokens, B, T, 12345, 0, i))) for i in range(batches)]
    model.train()
    return sum(losses) / len(losses)


# ---------------------------------------------------------------------------
# One rank
# ---------------------------------------------------------------------------

def fmt_bytes(n):
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return "%.1f %s" % (n, unit) if unit != "B" else "%d B" % n
        n /= 1024.0


def run(rank, world, args):
    import igrad
    import igrad.torch as it

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    say = print if rank == 0 else (lambda *a, **k: None)
    train, val = load_corpus(args)
    model = LlamaForCausalLM(dim=args.dim, layers=args.layers, heads=args.heads,
                             hidden=args.hidden)
    nparams = sum(p.numel() for p in model.parameters())
    say("igrad %s (%s); %d ranks; model %d parameters; %s: %d train / %d val bytes"
        % (igrad.library_version(), igrad.library_path(), world, nparams, args.genre,
           train.numel(), val.numel()))
    # beta1 = 0 for igrad's sparse methods: Adam's first moment over sparse,
    # delayed updates hurts (docs/results/remedies.md)
    betas = (0.9, 0.95) if args.method == "dense" else (0.0, 0.95)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=betas, weight_decay=0.0)
    os.makedirs(args.out, exist_ok=True)
    trace_path = os.path.join(args.out, "trace.csv")
    profile_path = os.path.join(args.out, "profile.json")
    B, T = args.batch, args.seq_len

    # 1. profiling: dense DDP, the Profiler watches the averaged gradients
    ddp = DDP(model)
    prof = it.Profiler(model, sparsifier=args.sparsifier, density=args.density)
    for step in range(args.profile_steps):
        loss = ddp(*get_batch(train, B, T, args.seed, rank, step))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        prof.step(step)
        opt.step()
        if step % args.log_every == 0 or step == args.profile_steps - 1:
            say("profile step %4d  loss %.4f" % (step, float(loss)))
    if rank == 0:
        prof.save(trace_path)
        profile = igrad.build_profile(trace_path, window=(args.profile_steps // 4, None),
                                      method=args.partition, out=profile_path)
        imp = profile.important()
        say("profile: %d of %d components important (%s), tau %.3f -> %s"
            % (len(imp), len(profile.entries()), ", ".join("%d.%s" % c for c in imp[:8]) +
               (", ..." if len(imp) > 8 else ""), profile.threshold, profile_path))
    dist.barrier()

    # 2. training with the igrad hook (a DDP object takes one hook, before its
    #    first backward: wrap the same module again)
    ddp = DDP(model)
    config = igrad.Config(method=args.method, sparsifier=args.sparsifier,
                          density=args.density, release_period=args.release_period,
                          release_keep=args.release_keep, buckets=args.buckets)
    state = it.IgradState(ddp, profile=profile_path if args.method in ("ig", "iad") else None,
                          config=config)
    ddp.register_comm_hook(state, it.hook)
    t0 = time.time()
    payload = []
    for i in range(args.steps):
        step = args.profile_steps + i
        loss = ddp(*get_batch(train, B, T, args.seed, rank, step))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # the hook synchronizes here
        opt.step()
        st = state.last_stats
        payload.append(st.get("payload_nbytes", 0))
        if i % args.log_every == 0 or i == args.steps - 1:
            say("step %4d  loss %.4f  payload %9s  wire %9s  buckets %d  deferred %2d  "
                "released %2d%s" % (step, float(loss), fmt_bytes(st.get("payload_nbytes", 0)),
                                    fmt_bytes(st.get("wire_nbytes", 0)), st.get("buckets", 0),
                                    st.get("deferred_components", 0),
                                    st.get("released_components", 0),
                                    "  SKIPPED" if st.get("skipped") else ""))
    elapsed = time.time() - t0

    # 3. what the sparsifier's *_sync method would have sent (the plan's
    #    prediction, no training needed)
    ref = igrad.Engine(state.layout, None, igrad.make_config(
        method=args.sparsifier + "_sync", density=args.density), igrad.Comm.self_())
    steps = range(args.profile_steps, args.profile_steps + args.steps)
    ref_bytes = sum(ref.predict_payload(s) for s in steps) / max(1, args.steps)
    mean = sum(payload) / max(1, len(payload))
    vl = evaluate(model, val, B, T)
    say("done: %d steps in %.1f s; val loss %.4f; mean payload %s/step = %.3f x %s_sync "
        "(%s/step); %d skipped steps"
        % (args.steps, elapsed, vl, fmt_bytes(mean), mean / max(1.0, ref_bytes),
           args.sparsifier, fmt_bytes(ref_bytes), state.skipped_steps))
    state.save(os.path.join(args.out, "igrad_state.bin"))  # one file per rank
    dist.barrier()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned(rank, world, port, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    try:
        run(rank, world, args)
    finally:
        dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(
        description="Post-train a small LLaMA-like model on a Brown genre with DDP (gloo, "
                    "CPU) and the igrad communication hook: profile, then train with ig.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--world", type=int, default=2, help="processes (2-4 on a laptop)")
    ap.add_argument("--data", default=os.path.join(REPO, "data"),
                    help="data directory prepared by scripts/fetch-corpus")
    ap.add_argument("--genre", default="news", help="Brown genre (data/brown/<genre>.txt)")
    ap.add_argument("--text", help="train on this file instead ('%%' lines split documents)")
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "torch_ddp_finetune"),
                    help="directory for trace.csv, profile.json and per-rank igrad state")
    ap.add_argument("--profile-steps", type=int, default=40)
    ap.add_argument("--steps", type=int, default=120, help="training steps with the hook")
    ap.add_argument("--method", default="ig",
                    choices=["ig", "iad", "topk_sync", "adtopk_sync", "dense"])
    ap.add_argument("--sparsifier", default="adtopk", choices=["adtopk", "topk"])
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--release-period", type=int, default=4)
    ap.add_argument("--release-keep", type=float, default=0.25)
    ap.add_argument("--buckets", type=int, default=4)
    ap.add_argument("--partition", default="knee",
                    help="knee, otsu, kmeans2, gmm2, percentile:P, fixed:F")
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=176)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank and step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--log-every", type=int, default=10)
    args = ap.parse_args()
    if args.profile_steps < 4:
        ap.error("--profile-steps must be at least 4")

    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
        try:
            run(dist.get_rank(), dist.get_world_size(), args)
        finally:
            dist.destroy_process_group()
        return
    mp.spawn(spawned, args=(args.world, free_port(), args), nprocs=args.world, join=True)


if __name__ == "__main__":
    main()
