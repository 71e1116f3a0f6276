#!/usr/bin/env python3
"""PowerSGD side by side with igrad, where users would compare (issue 27, part 5).

Loads the demo's base (an `igrad train` checkpoint: config.json +
model.safetensors, igrad's reference LLaMA with a byte vocabulary) into a
PyTorch model with the same parameter names, and post-trains it with DDP on
2 gloo ranks (torch.multiprocessing.spawn, one torch thread per rank) on
exactly the tokens `igrad train` reads with the demo's post-train settings:
the batches and the validation rows come from the trainer's own data code
(trainer/data.c, through dump_data.c, built here with cc), so the split and
the windows per step and rank are the C trainer's.

Methods (every one AdamW, the trainer's recipe: lr 1e-3 -> 1e-4 cosine after
10 warm-up steps, weight decay 0.1 on matrices only, beta2 0.95, eps 1e-8,
global-norm clip 1.0; beta1 as each method's users run it):
  dense        plain DDP (default buckets), beta1 0.9
  powersgd_rR  torch's PowerSGD hook, matrix_approximation_rank R (1, 2, 4),
               error feedback and warm start on (torch's defaults),
               start_powerSGD_iter --psgd-start (2: the earliest torch allows
               with error feedback; torch's default 1,000 would leave a
               120-step run all dense), one DDP bucket (torch 1.13 on gloo
               aborts PowerSGD with more than one), beta1 0.9
  adtopk_sync  igrad's DDP hook, ADTopk at density 1 %, beta1 0 (as
               `igrad train --beta1 auto` runs the sparse methods)
  ig           igrad's DDP hook, method ig, profile="auto" (30 steps as
               adtopk_sync, then the fitted set at target ratio 0.25: the
               defaults), density 1 %, beta1 0

Per run it records the val loss (token-weighted mean over the trainer's
validation rows, the same rows `igrad train --eval-batches 8` uses) and
next-token accuracy, bytes per step each rank hands to all-reduce (dense:
4 x parameters; PowerSGD: counted by wrapping the hook's dist.all_reduce and
checked against (rows + cols) x rank x 4 per compressed matrix + 4 x numel of
the tensors it leaves uncompressed; igrad: the hook's payload_nbytes), and
the step time (forward + backward with the hook + clip + AdamW; the median).

    PYTHONPATH=python IGRAD_LIBRARY=build/libigrad.so IGRAD_DATA_DIR=data \\
        /usr/bin/python3 experiments/powersgd/run.py --base runs/demo/base/checkpoint \\
        --workloads fortunes: --check
    ... run.py --workloads fortunes:,lodash: --report docs/results/powersgd

One run as experiments/time_to_quality runs it, a run directory in
`igrad train`'s format (metrics.csv, eval.csv, summary.json; methods dense
and powersgd_rR, each as one DDP bucket whose hook is timed):
    run.py --base B --workloads brown:news --methods powersgd_r4 --seeds 7 \
        --steps 120 --eval-every 10 --run-dir DIR      # both ranks, mp.spawn
    run.py ... --prepare-only                          # the batches, once
    mpirun -np 2 ... run.py ... --rank-from-env --master-addr ADDR --run-dir DIR
The last is one rank per process (OMPI_COMM_WORLD_RANK/SIZE), gloo on the
interface holding an address in ADDR's network (or GLOO_SOCKET_IFNAME).
Checked on 127.0.0.1 (powersgd_r4, brown:news, seed 1337, 3 steps,
--eval-every 2, OMP_NUM_THREADS=1 for both): the two launchers' metrics.csv
losses and bytes, eval.csv and final val loss are bit-identical. Give both
the same OMP_NUM_THREADS: set or unset at torch's import it moves the
forward's last bits (val loss 2.084016129 vs 2.084016144 at step 0).

--check compares the PyTorch model's loss on the first global batch with the
step-0 loss of a 1-step `igrad train` run (build/igrad, 2 ranks under mpirun)
from the same base on the same data. Finished runs are kept under --out and
reused (one JSON per run); --report writes <prefix>.json, <prefix>.png (val
loss against bytes per step) and the table into <prefix>.md between its
markers.
"""
import argparse
import datetime
import json
import math
import os
import socket
import statistics
import struct
import subprocess
import sys
import time

T_START = time.time()  # summary.json's wall_s counts from here (start-up included)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

# The demo's post-train settings (experiments/frontier/importance.py's POST)
SEQ_LEN, GLOBAL_BATCH, RANKS = 64, 16, 2
VAL_FRACTION, EVAL_BATCHES = 0.1, 8
LR, MIN_LR, WARMUP, WEIGHT_DECAY, BETA2, EPS, CLIP = 1e-3, 1e-4, 10, 0.1, 0.95, 1e-8, 1.0
DENSITY = 0.01
TABLE_BEGIN, TABLE_END = "<!-- table: run.py --report -->", "<!-- end of table -->"
METHODS = ("dense", "powersgd_r1", "powersgd_r2", "powersgd_r4", "adtopk_sync", "ig")


# ---------------------------------------------------------------------------
# The model: igrad's reference LLaMA (trainer/model.c) with HF names
# ---------------------------------------------------------------------------

class RMSNorm(nn.Module):
    def __init__(self, dim, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Attention(nn.Module):
    """Causal attention with grouped key/value heads (query head h reads kv
    head h // (H/KV), as HF's repeat_kv) and HF's rotate-half RoPE."""

    def __init__(self, dim, heads, kv_heads, max_len, theta):
        super().__init__()
        self.H, self.KV, self.hd = heads, kv_heads, dim // heads
        self.q_proj = nn.Linear(dim, heads * self.hd, bias=False)
        self.k_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, kv_heads * self.hd, bias=False)
        self.o_proj = nn.Linear(heads * self.hd, dim, bias=False)
        half = self.hd // 2
        inv = torch.tensor([theta ** (-(2.0 * i) / self.hd) for i in range(half)],
                           dtype=torch.float64)
        ang = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
        self.register_buffer("cos", ang.cos().float(), persistent=False)  # (T, hd/2)
        self.register_buffer("sin", ang.sin().float(), persistent=False)

    def rope(self, x):  # (B, h, T, hd)
        T, half = x.shape[-2], self.hd // 2
        c, s = self.cos[:T], self.sin[:T]
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.H, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.KV, self.hd).transpose(1, 2)
        q, k = self.rope(q), self.rope(k)
        g = self.H // self.KV
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        att = (q @ k.transpose(-1, -2)) / math.sqrt(self.hd)
        causal = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
        att = att.masked_fill(causal, float("-inf")).softmax(-1)
        return self.o_proj((att @ v).transpose(1, 2).reshape(B, T, self.H * self.hd))


class MLP(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        dim = c["hidden_size"]
        self.self_attn = Attention(dim, c["num_attention_heads"], c["num_key_value_heads"],
                                   c["max_position_embeddings"], float(c["rope_theta"]))
        self.mlp = MLP(dim, c["intermediate_size"])
        self.input_layernorm = RMSNorm(dim, c["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(dim, c["rms_norm_eps"])

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList(Layer(c) for _ in range(c["num_hidden_layers"]))
        self.norm = RMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        if c.get("tie_word_embeddings"):
            raise SystemExit("run.py: tied embeddings are not supported")
        self.model = Body(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)

    def logits(self, idx):
        return self.lm_head(self.model(idx))

    def forward(self, idx, targets):
        lg = self.logits(idx)
        return F.cross_entropy(lg.reshape(-1, lg.shape[-1]), targets.reshape(-1),
                               ignore_index=-1)


def read_safetensors(path):
    """{name: float32 tensor} of a safetensors file (F32 only, as igrad writes)."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    head = json.loads(blob[8:8 + n])
    out = {}
    for name, e in head.items():
        if name == "__metadata__":
            continue
        if e["dtype"] != "F32":
            raise SystemExit("run.py: %s is %s (F32 expected)" % (name, e["dtype"]))
        a, b = e["data_offsets"]
        t = torch.frombuffer(bytearray(blob[8 + n + a:8 + n + b]), dtype=torch.float32)
        out[name] = t.reshape(e["shape"])
    return out


def load_base(base):
    with open(os.path.join(base, "config.json")) as f:
        c = json.load(f)
    model = LlamaForCausalLM(c)
    sd = read_safetensors(os.path.join(base, "model.safetensors"))
    missing = set(model.state_dict()) ^ set(sd)
    if missing:
        raise SystemExit("run.py: names differ between the model and the checkpoint: %s"
                         % sorted(missing)[:6])
    model.load_state_dict(sd, strict=True)
    return model


# ---------------------------------------------------------------------------
# Data: the C trainer's batches, dumped by dump_data.c
# ---------------------------------------------------------------------------

def dump_tool(out):
    exe = os.path.join(out, "dump_data")
    src = [os.path.join(HERE, "dump_data.c"), os.path.join(REPO, "trainer", "data.c"),
           os.path.join(REPO, "trainer", "task.c"), os.path.join(REPO, "src", "core", "json_strict.c")]
    if not os.path.exists(exe) or any(os.path.getmtime(s) > os.path.getmtime(exe) for s in src):
        os.makedirs(out, exist_ok=True)
        subprocess.run(["cc", "-O2", "-std=c11", "-I" + os.path.join(REPO, "trainer"),
                        "-I" + os.path.join(REPO, "src"), "-I/usr/include/cjson", *src,
                        "-lcjson", "-lm", "-o", exe], check=True)
    return exe


def label(w):
    return w.replace(":", "").replace("+", "_") or "data"


def data_file(out, workload, seed, steps):
    path = os.path.join(out, "data", "%s-s%d-n%d.bin" % (label(workload), seed, steps))
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([dump_tool(out), workload, str(seed), str(SEQ_LEN), str(GLOBAL_BATCH),
                        str(RANKS), str(steps), str(VAL_FRACTION), str(EVAL_BATCHES),
                        path + ".tmp"], check=True)
        os.replace(path + ".tmp", path)
    return path


def read_data(path):
    """(train (steps, 2, G, T), val (2, NVAL, T)) as int64 tensors."""
    raw = torch.from_numpy(__import__("numpy").fromfile(path, dtype="<i4").astype("int64"))
    steps, G, T, nval = (int(v) for v in raw[:4])
    n = steps * 2 * G * T
    train = raw[4:4 + n].reshape(steps, 2, G, T)
    val = raw[4 + n:4 + n + 2 * nval * T].reshape(2, nval, T)
    return train, val


# ---------------------------------------------------------------------------
# Bytes PowerSGD sends
# ---------------------------------------------------------------------------

class CountingDist:
    """torch.distributed as the PowerSGD hook module sees it, with all_reduce
    counting the bytes it is handed (numel x element size)."""

    def __init__(self):
        self.nbytes = 0

    def __getattr__(self, name):
        return getattr(dist, name)

    def all_reduce(self, tensor, *a, **k):
        self.nbytes += tensor.numel() * tensor.element_size()
        return dist.all_reduce(tensor, *a, **k)


def powersgd_bytes(model, rank, min_compression_rate=2):
    """Bytes one rank all-reduces per compressed step, from the shapes, as
    torch's hook decides: a tensor of 2+ dims viewed as (shape[0], rest) is
    sent as P (rows x rank) and Q (cols x rank) when that is more than
    min_compression_rate x smaller; everything else goes uncompressed."""
    total = 0
    for p in model.parameters():
        if p.dim() > 1:
            n, m = p.shape[0], p.numel() // p.shape[0]
            r = min(n, m, rank)
            if (n + m) * r * min_compression_rate < n * m:
                total += (n + m) * r * 4
                continue
        total += p.numel() * 4
    return total


# ---------------------------------------------------------------------------
# One rank of one run
# ---------------------------------------------------------------------------

def lr_at(step, total):
    """optim.c's optim_lr: linear warm-up, then cosine to MIN_LR."""
    if step < WARMUP:
        return LR * (step + 1) / WARMUP
    if total <= WARMUP:
        return LR
    if step >= total:
        return MIN_LR
    prog = (step - WARMUP) / (total - WARMUP)
    return MIN_LR + (LR - MIN_LR) * 0.5 * (1.0 + math.cos(math.pi * prog))


@torch.no_grad()
def evaluate(model, val):
    """Token-weighted val loss and next-token accuracy over every validation
    row (what igrad train's evaluate() computes)."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for i in range(0, val.shape[1], GLOBAL_BATCH):
        x, y = val[0, i:i + GLOBAL_BATCH], val[1, i:i + GLOBAL_BATCH]
        lg = model.logits(x)
        mask = y >= 0
        loss_sum += float(F.cross_entropy(lg.reshape(-1, lg.shape[-1]), y.reshape(-1),
                                          ignore_index=-1, reduction="sum"))
        correct += int((lg.argmax(-1) == y)[mask].sum())
        count += int(mask.sum())
    model.train()
    return loss_sum / count, correct / count


def worker(rank, world, port, a, workload, method, seed, path, result, addr="127.0.0.1"):
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=600))
    try:
        run_rank(rank, world, a, workload, method, seed, path, result)
    finally:
        dist.destroy_process_group()


def run_rank(rank, world, a, workload, method, seed, path, result):
    torch.manual_seed(seed)
    train, val = read_data(path)
    steps = a.steps
    B = GLOBAL_BATCH // world
    model = load_base(a.base)
    nparams = sum(p.numel() for p in model.parameters())
    sparse = method in ("adtopk_sync", "ig")
    beta1 = 0.0 if sparse else 0.9
    decay = [p for p in model.parameters() if p.dim() > 1]
    no_decay = [p for p in model.parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=(beta1, BETA2), eps=EPS)
    counter, state, predicted, rank_r = None, None, None, None
    timed = a.run_dir is not None  # a run directory as `igrad train` writes it
    hook_start = [None]  # when this step's (one) DDP bucket reached its hook

    def time_hook(hook):
        """`hook`, noting when DDP first calls it in a step: with one bucket,
        the moment the last gradient of backward is ready."""
        def timed_hook(hook_state, bucket):
            if hook_start[0] is None:
                hook_start[0] = time.perf_counter()
            return hook(hook_state, bucket)
        return timed_hook

    if method == "dense" and not timed:
        ddp = DDP(model)
    elif method == "dense":
        # plain all-reduce (torch's allreduce_hook: divide by the world size,
        # all_reduce) of one bucket after backward, so that sync_ms is its
        # whole time, as PowerSGD's below (one bucket too) and the C trainer's
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as D
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = DDP(model, bucket_cap_mb=1024)
        counter = CountingDist()
        D.dist = counter
        ddp.register_comm_hook(None, time_hook(D.allreduce_hook))
    elif method.startswith("powersgd_r"):
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as P
        rank_r = int(method[len("powersgd_r"):])
        # torch 1.13 + gloo: PowerSGD aborts with more than one DDP bucket
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = DDP(model, bucket_cap_mb=1024)
        counter = CountingDist()
        P.dist = counter  # the hook module's all_reduce, counted
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as D
        D.dist = counter  # the dense steps before start_powerSGD_iter
        state = P.PowerSGDState(process_group=None, matrix_approximation_rank=rank_r,
                                start_powerSGD_iter=a.psgd_start)
        ddp.register_comm_hook(state, time_hook(P.powerSGD_hook) if timed else P.powerSGD_hook)
        predicted = powersgd_bytes(model, rank_r)
    elif timed:
        raise SystemExit("run.py: --run-dir runs dense and powersgd_rR only (got %s)" % method)
    else:
        import igrad
        import igrad.torch as it
        ddp = DDP(model)
        cfg = igrad.Config(method=method, density=DENSITY)
        state = it.IgradState(ddp, profile="auto" if method == "ig" else None, config=cfg)
        ddp.register_comm_hook(state, it.hook)
    losses, nbytes, times, syncs, evals = [], [], [], [], []

    def evaluate_at(done):
        """`igrad train`'s evaluation points: step 0 and every --eval-every
        steps (when > 0) and the last; rank 0 evaluates, outside step time."""
        if not timed or not (done == steps or (a.eval_every > 0 and done % a.eval_every == 0)):
            return
        if rank == 0:
            vl, va = evaluate(model, val)
            evals.append((done, vl, math.exp(vl), va))
            print("  %s %s s%d eval at step %3d: val loss %.6f" % (workload, method, seed, done,
                                                                  vl), flush=True)
        dist.barrier()

    evaluate_at(0)
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps)
        x = train[step, 0, rank * B:(rank + 1) * B]
        y = train[step, 1, rank * B:(rank + 1) * B]
        if counter is not None:
            counter.nbytes = 0
        hook_start[0] = None
        t0 = time.perf_counter()
        loss = ddp(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        t_sync_end = time.perf_counter()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        opt.step()
        times.append(time.perf_counter() - t0)
        syncs.append(t_sync_end - hook_start[0] if hook_start[0] is not None else 0.0)
        if counter is not None:
            nbytes.append(counter.nbytes)
        elif state is not None:
            nbytes.append(int(state.last_stats.get("payload_nbytes", 0)))
        else:
            nbytes.append(4 * nparams)
        lt = loss.detach().clone()
        dist.all_reduce(lt)  # the global mean loss, as igrad train logs it
        losses.append(float(lt) / world)
        if rank == 0 and (step % 20 == 0 or step == steps - 1):
            print("  %s %s s%d step %3d loss %.4f bytes %d  %.0f ms" % (
                workload, method, seed, step, losses[-1], nbytes[-1], 1e3 * times[-1]),
                flush=True)
        evaluate_at(step + 1)
    # every rank holds the same parameters; rank 0 evaluates
    if rank == 0:
        if timed:
            vl, va = evals[-1][1], evals[-1][3]  # the evaluation at the last step
        else:
            vl, va = evaluate(model, val)
        out = {"workload": workload, "method": method, "seed": seed, "steps": steps,
               "val_loss": vl, "val_acc": va, "train_loss": losses, "bytes": nbytes,
               "step_s": times, "beta1": beta1, "num_params": nparams,
               "dense_bytes": 4 * nparams}
        if rank_r is not None:
            out.update({"rank": rank_r, "start_powerSGD_iter": a.psgd_start,
                        "predicted_bytes": predicted})
        if method == "ig":
            out["target_fit"] = state.target_fit
            out["online_info"] = getattr(state, "online_info", None)
        with open(result + ".tmp", "w") as f:
            json.dump(out, f, default=str)
        os.replace(result + ".tmp", result)
        if timed:
            write_run_dir(a.run_dir, out, syncs, evals, world)
    dist.barrier()


def write_run_dir(d, r, syncs, evals, world):
    """metrics.csv, eval.csv and summary.json in `igrad train`'s format (the
    columns experiments/time_to_quality reads). step_ms: forward, backward
    with the hook, clip and AdamW (evaluation excluded); sync_ms: from the
    hook's call with the one bucket (every gradient ready) to backward's
    return: the all-reduces, PowerSGD's compression and decompression and
    the copy back into the gradients, none of it overlapped with compute;
    wire_bytes = payload_bytes: the bytes this rank handed to all_reduce."""
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "metrics.csv"), "w") as f:
        f.write("step,method,loss,payload_bytes,wire_bytes,sync_ms,step_ms\n")
        for i, (loss, b, sy, st) in enumerate(zip(r["train_loss"], r["bytes"], syncs,
                                                   r["step_s"])):
            f.write("%d,%s,%.8f,%d,%d,%.4f,%.3f\n" % (i, r["method"], loss, b, b, 1e3 * sy,
                                                      1e3 * st))
    with open(os.path.join(d, "eval.csv"), "w") as f:
        f.write("step,val_loss,val_ppl,val_acc\n")
        for s, vl, ppl, va in evals:
            f.write("%d,%.9g,%.9g,%.9g\n" % (s, vl, ppl, va))
    summ = {"implementation": "torch (experiments/powersgd/run.py)", "method": r["method"],
            "ranks": world, "steps": r["steps"], "complete": True, "workload": r["workload"],
            "seed": r["seed"], "beta1": r["beta1"], "num_params": r["num_params"],
            "eval": [list(e) for e in evals], "final": {"val_loss": r["val_loss"],
                                                        "val_acc": r["val_acc"]},
            "payload_bytes_per_step": statistics.mean(r["bytes"]),
            "sync_ms_per_step": 1e3 * statistics.mean(syncs),
            "sync_ms": "from the hook's call with the one DDP bucket (all gradients ready) "
                       "to backward's return",
            "wall_s": time.time() - T_START}
    for k in ("rank", "start_powerSGD_iter", "predicted_bytes"):
        if k in r:
            summ[k] = r[k]
    with open(os.path.join(d, "summary.json.tmp"), "w") as f:
        json.dump(summ, f, indent=1)
    os.replace(os.path.join(d, "summary.json.tmp"), os.path.join(d, "summary.json"))


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------
# The forward check against the C trainer
# ---------------------------------------------------------------------------

def check(a, workload, seed):
    """The PyTorch model's loss on global batch 0 against `igrad train`'s
    step-0 loss (the same base, data and seed): the same weights and tokens,
    an independent implementation (trainer/model.c)."""
    path = data_file(a.out, workload, seed, a.steps)
    train, _ = read_data(path)
    model = load_base(a.base)
    torch.set_num_threads(1)
    with torch.no_grad():
        mine = float(model(train[0, 0], train[0, 1]))
    d = os.path.join(a.out, "check", "%s-s%d" % (label(workload), seed))
    metrics = os.path.join(d, "metrics.csv")
    if not os.path.exists(metrics):
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        subprocess.run(["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(RANKS),
                        a.igrad, "train", "--init", a.base, "--data", workload,
                        "--val-fraction", str(VAL_FRACTION), "--lr", str(LR), "--min-lr",
                        str(MIN_LR), "--warmup", str(WARMUP), "--eval-batches",
                        str(EVAL_BATCHES), "--seq-len", str(SEQ_LEN), "--batch",
                        str(GLOBAL_BATCH), "--threads", "1", "--progress", "quiet",
                        "--method", "dense", "--steps", "1", "--eval-every", "0",
                        "--seed", str(seed), "--out", d], check=True, env=env,
                       stdout=subprocess.DEVNULL)
    with open(metrics) as f:
        rows = [line.strip().split(",") for line in f if line.strip()]
    col = rows[0].index("loss")
    ref = float(rows[1][col])
    diff = abs(mine - ref)
    print("check %s seed %d: torch loss on global batch 0 %.6f, igrad train step 0 %.6f, "
          "|diff| %.2e (%s)" % (workload, seed, mine, ref, diff,
                                "ok" if diff <= 1e-4 else "FAILED"), flush=True)
    return {"workload": workload, "seed": seed, "torch_loss": mine, "igrad_train_loss": ref,
            "abs_diff": diff, "ok": diff <= 1e-4}


# ---------------------------------------------------------------------------
# Report
# ---------------------------------------------------------------------------

def load_runs(out):
    runs = {}
    d = os.path.join(out, "results")
    for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
        if name.endswith(".json"):
            with open(os.path.join(d, name)) as f:
                r = json.load(f)
            runs[(r["workload"], r["method"], r["seed"])] = r
    return runs


def summarize(r, start):
    """Bytes per step after compression starts (and over the whole run), the
    median step time."""
    b = r["bytes"]
    s = {"val_loss": r["val_loss"], "val_acc": r["val_acc"],
         "bytes_run": sum(b) / len(b),
         "step_ms": 1e3 * statistics.median(r["step_s"][2:])}
    if r["method"].startswith("powersgd"):
        tail = b[r["start_powerSGD_iter"]:]
        s["predicted_bytes"] = r["predicted_bytes"]
        s["counted_matches_predicted"] = all(x == r["predicted_bytes"] for x in tail)
    elif r["method"] == "ig" and len(b) > start:
        tail = b[start:]  # after the switch from the profiling steps
    else:
        tail = b
    s["bytes"] = sum(tail) / len(tail)
    return s


def report(a, checks):
    runs = load_runs(a.out)
    seeds = [int(s) for s in a.seeds.split(",")]
    data = {"settings": {"seq_len": SEQ_LEN, "global_batch": GLOBAL_BATCH, "ranks": RANKS,
                         "steps": a.steps, "val_fraction": VAL_FRACTION,
                         "eval_batches": EVAL_BATCHES, "lr": LR, "min_lr": MIN_LR,
                         "warmup": WARMUP, "weight_decay": WEIGHT_DECAY, "beta2": BETA2,
                         "clip": CLIP, "density": DENSITY,
                         "start_powerSGD_iter": a.psgd_start, "seeds": seeds},
            "checks": checks, "workloads": {}}
    rows = ["| workload | method | β1 | seeds | val loss per seed | mean | ÷ dense (paired) "
            "| per seed ÷ dense | B/step | ÷ dense B | ÷ adtopk_sync B | whole run B/step "
            "| val acc mean | step ms (median, per seed) |",
            "|---|---|---:|---|---|---:|---:|---|---:|---:|---:|---:|---:|---|"]
    points = {}
    for w in a.workloads.split(","):
        dw = data["workloads"][w] = {}
        for m in METHODS:
            have = [s for s in seeds if (w, m, s) in runs]
            if not have:
                continue
            sm = {s: summarize(runs[(w, m, s)], 30) for s in have}
            paired = [s for s in have if (w, "dense", s) in runs]
            ratios = {s: sm[s]["val_loss"] / runs[(w, "dense", s)]["val_loss"] for s in paired}
            ad = [s for s in have if (w, "adtopk_sync", s) in runs]
            byts = statistics.mean(sm[s]["bytes"] for s in have)
            dense_b = runs[(w, m, have[0])]["dense_bytes"]
            ad_b = (statistics.mean(summarize(runs[(w, "adtopk_sync", s)], 30)["bytes"]
                                    for s in ad) if ad else None)
            e = dw[m] = {
                "seeds": have, "beta1": runs[(w, m, have[0])]["beta1"],
                "val_loss": {str(s): sm[s]["val_loss"] for s in have},
                "val_acc": {str(s): sm[s]["val_acc"] for s in have},
                "val_loss_mean": statistics.mean(sm[s]["val_loss"] for s in have),
                "ratio_to_dense": {str(s): v for s, v in ratios.items()},
                "ratio_to_dense_mean": statistics.mean(ratios.values()) if ratios else None,
                "bytes_per_step": byts,
                "bytes_per_step_whole_run": statistics.mean(sm[s]["bytes_run"] for s in have),
                "bytes_to_dense": byts / dense_b,
                "bytes_to_adtopk_sync": byts / ad_b if ad_b else None,
                "step_ms_median": {str(s): sm[s]["step_ms"] for s in have},
            }
            if m.startswith("powersgd"):
                e["predicted_bytes"] = sm[have[0]]["predicted_bytes"]
                e["counted_matches_predicted"] = all(sm[s]["counted_matches_predicted"]
                                                     for s in have)
            if m == "ig":
                e["target_fit"] = runs[(w, m, have[0])].get("target_fit")
            rows.append("| %s | %s | %g | %s | %s | %.4f | %s | %s | %.0f | %.4f | %s | %.0f "
                        "| %.4f | %s |" % (
                w, m, e["beta1"], ", ".join(map(str, have)),
                ", ".join("%.4f" % sm[s]["val_loss"] for s in have), e["val_loss_mean"],
                "%.4f" % e["ratio_to_dense_mean"] if ratios else "–",
                ", ".join("%.4f" % ratios[s] for s in paired) or "–", byts,
                e["bytes_to_dense"], "%.4f" % e["bytes_to_adtopk_sync"] if ad_b else "–",
                e["bytes_per_step_whole_run"], statistics.mean(sm[s]["val_acc"] for s in have),
                ", ".join("%.0f" % sm[s]["step_ms"] for s in have)))
            if ratios:
                points.setdefault(w, []).append((m, byts, e["ratio_to_dense_mean"]))
    prefix = a.report
    with open(prefix + ".json", "w") as f:
        json.dump(data, f, indent=1)
    table = "\n".join(rows) + "\n"
    print(table)
    md = prefix + ".md"  # the table goes between the markers of PREFIX.md
    if os.path.exists(md):
        with open(md) as f:
            text = f.read()
        a0, a1 = text.find(TABLE_BEGIN), text.find(TABLE_END)
        if a0 >= 0 and a1 > a0:
            text = text[:a0 + len(TABLE_BEGIN)] + "\n" + table + text[a1:]
            with open(md, "w") as f:
                f.write(text)
    plot(points, prefix + ".png", a.steps)


def plot(points, path, steps):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    ws = sorted(points)
    fig, axes = plt.subplots(1, len(ws), figsize=(5.5 * len(ws), 4.2), squeeze=False)
    for ax, w in zip(axes[0], ws):
        for m, b, r in points[w]:
            fam = "tab:blue" if m.startswith("powersgd") else (
                "black" if m == "dense" else "tab:red")
            ax.scatter([b], [r], color=fam, marker="o" if m != "dense" else "s")
            ax.annotate(m, (b, r), textcoords="offset points", fontsize=8,
                        xytext=(6, -10) if m.startswith("powersgd") else (4, 4))
        ps = sorted((b, r) for m, b, r in points[w] if m.startswith("powersgd"))
        if ps:
            ax.plot(*zip(*ps), color="tab:blue", lw=1, label="PowerSGD rank 1, 2, 4")
        ig = sorted((b, r) for m, b, r in points[w] if m in ("ig", "adtopk_sync"))
        if ig:
            ax.plot(*zip(*ig), color="tab:red", lw=1, ls="--", label="igrad ig, adtopk_sync")
        ax.set_xscale("log")
        ax.set_xlabel("bytes per step and rank (the payload handed to the collectives)")
        ax.set_ylabel("val loss ÷ dense (mean of per-seed ratios)")
        ax.set_title("%s, %d steps from the demo's base" % (w, steps))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


# ---------------------------------------------------------------------------
# One run into a run directory (experiments/time_to_quality)
# ---------------------------------------------------------------------------

def iface_for(addr):
    """The interface holding an IPv4 address in the same network as `addr`
    (in a testbed namespace: the node's veth; for 127.0.0.1: lo)."""
    import ipaddress
    target = ipaddress.ip_address(addr)
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        f = line.split()
        if len(f) >= 4 and f[2] == "inet" and target in ipaddress.ip_network(f[3], strict=False):
            return f[1]
    raise SystemExit("run.py: no interface here is in %s's network" % addr)


def one_run(a):
    if not a.run_dir and not a.prepare_only:
        raise SystemExit("run.py: --rank-from-env needs --run-dir")
    ws, ms, seeds = a.workloads.split(","), a.methods.split(","), a.seeds.split(",")
    if len(ws) != 1 or len(ms) != 1 or len(seeds) != 1:
        raise SystemExit("run.py: --run-dir/--prepare-only take one workload, method and seed")
    w, m, seed = ws[0], ms[0], int(seeds[0])
    if a.prepare_only:
        print(data_file(a.out, w, seed, a.steps))
        return
    path = os.path.join(a.out, "data", "%s-s%d-n%d.bin" % (label(w), seed, a.steps))
    a.run_dir = os.path.abspath(a.run_dir)
    os.makedirs(a.run_dir, exist_ok=True)
    result = os.path.join(a.run_dir, "result.json")
    if not a.rank_from_env:
        path = data_file(a.out, w, seed, a.steps)
        mp.spawn(worker, args=(RANKS, free_port(), a, w, m, seed, path, result),
                 nprocs=RANKS, join=True)
        return
    if not os.path.exists(path):  # two ranks would race to write it
        raise SystemExit("run.py: %s is missing (run with --prepare-only first)" % path)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    world = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    if world != RANKS:
        raise SystemExit("run.py: the data is cut for %d ranks (mpirun gave %d)" % (RANKS, world))
    os.environ.setdefault("GLOO_SOCKET_IFNAME", iface_for(a.master_addr))
    worker(rank, world, a.master_port, a, w, m, seed, path, result, a.master_addr)


# ---------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="igrad train checkpoint directory")
    ap.add_argument("--workloads", default="fortunes:")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--psgd-start", type=int, default=2,
                    help="start_powerSGD_iter (torch's default is 1000)")
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "powersgd"))
    ap.add_argument("--igrad", default=os.path.join(REPO, "build", "igrad"))
    ap.add_argument("--check", action="store_true",
                    help="compare the forward with igrad train's step-0 loss first")
    ap.add_argument("--run", choices=["all", "none"], default="all")
    ap.add_argument("--report", help="write PREFIX.json and PREFIX.png, and the table into "
                    "PREFIX.md between its table markers")
    ap.add_argument("--run-dir", help="one run (one workload, method and seed) written as "
                    "`igrad train` writes its --out: metrics.csv, eval.csv, summary.json")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="with --run-dir: evaluate at step 0, every N steps and the last")
    ap.add_argument("--rank-from-env", action="store_true",
                    help="with --run-dir: be one rank, rank and world from mpirun's "
                    "OMPI_COMM_WORLD_RANK/SIZE, instead of spawning both")
    ap.add_argument("--master-addr", default="127.0.0.1",
                    help="with --rank-from-env: rank 0's address (gloo's interface is the "
                    "one holding an address in its subnet unless GLOO_SOCKET_IFNAME is set)")
    ap.add_argument("--master-port", type=int, default=29500)
    ap.add_argument("--prepare-only", action="store_true",
                    help="only write the data file a --rank-from-env run reads, then exit")
    a = ap.parse_args()
    a.out = os.path.abspath(a.out)
    if a.run_dir or a.rank_from_env or a.prepare_only:
        one_run(a)
        return
    checks = []
    seeds = [int(s) for s in a.seeds.split(",")]
    workloads = a.workloads.split(",")
    if a.check:
        checks = [check(a, w, seeds[0]) for w in workloads]
        with open(os.path.join(a.out, "checks.json"), "w") as f:
            json.dump(checks, f, indent=1)
        if not all(c["ok"] for c in checks):
            sys.exit("run.py: the forward does not match igrad train's")
    elif os.path.exists(os.path.join(a.out, "checks.json")):
        with open(os.path.join(a.out, "checks.json")) as f:
            checks = json.load(f)
    os.makedirs(os.path.join(a.out, "results"), exist_ok=True)
    if a.run == "all":
        for w in workloads:
            for seed in seeds:  # seed outermost within a workload: a partial set is paired
                for m in a.methods.split(","):
                    result = os.path.join(a.out, "results", "%s-%s-s%d.json" % (label(w), m, seed))
                    if os.path.exists(result):
                        continue
                    path = data_file(a.out, w, seed, a.steps)
                    print("+ %s %s seed %d" % (w, m, seed), flush=True)
                    t0 = time.time()
                    mp.spawn(worker, args=(RANKS, free_port(), a, w, m, seed, path, result),
                             nprocs=RANKS, join=True)
                    print("  done in %.0f s" % (time.time() - t0), flush=True)
    if a.report:
        report(a, checks)


if __name__ == "__main__":
    main()
