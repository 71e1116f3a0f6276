"""llama_ref.py — an independent PyTorch reference for the C trainer's model.

Reads a checkpoint written by the trainer (config.json + model.safetensors,
parsed here with json + torch.frombuffer: Debian has no `safetensors`
package) and evaluates the same LLaMA with plain torch ops, following
Hugging Face's LlamaForCausalLM: RMSNorm x * rsqrt(mean(x^2) + eps) * w,
rotate_half RoPE with theta = rope_theta, repeat_kv for grouped-query
attention, SwiGLU MLP down(silu(gate(x)) * up(x)), optional tied lm_head,
mean cross-entropy with ignore_index -1. Nothing here is copied from
transformers; it is written from the architecture description.

Not here: tests (test_model_vs_torch.py and others import this module).
"""
import json
import math
import struct

import torch

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16,
    "BF16": torch.bfloat16, "I64": torch.int64, "I32": torch.int32,
    "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8, "BOOL": torch.bool,
}


def read_safetensors(path):
    """Returns ({name: tensor}, metadata dict, [names in header order])."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    meta = header.pop("__metadata__", {})
    data = blob[8 + hlen:]
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = _DTYPES[info["dtype"]]
        shape = info["shape"]
        if end == begin:
            t = torch.zeros(shape, dtype=dtype)
        else:
            t = torch.frombuffer(bytearray(data[begin:end]), dtype=dtype).reshape(shape)
        tensors[name] = t
    return tensors, meta, list(header.keys())


def read_config(path):
    with open(path) as f:
        return json.load(f)


def param_names(cfg):
    """Hugging Face LlamaForCausalLM.named_parameters() order."""
    names = ["model.embed_tokens.weight"]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        names += [p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                  p + "self_attn.v_proj.weight", p + "self_attn.o_proj.weight",
                  p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight",
                  p + "mlp.down_proj.weight", p + "input_layernorm.weight",
                  p + "post_attention_layernorm.weight"]
    names.append("model.norm.weight")
    if not cfg.get("tie_word_embeddings", False):
        names.append("lm_head.weight")
    return names


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_tables(T, hd, theta, dtype):
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def forward(params, cfg, inputs, targets=None):
    """params: {name: tensor} (leaves may require grad); inputs, targets:
    (B, T) int64. Returns (logits (B, T, V), loss or None)."""
    C = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = C // H
    eps = cfg["rms_norm_eps"]
    B, T = inputs.shape
    emb = params["model.embed_tokens.weight"]
    dtype = emb.dtype
    cos, sin = rope_tables(T, hd, float(cfg.get("rope_theta", 10000.0)), dtype)
    x = emb[inputs]
    causal = torch.ones(T, T, dtype=torch.bool).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        h = rms_norm(x, params[p + "input_layernorm.weight"], eps)
        q = (h @ params[p + "self_attn.q_proj.weight"].T).view(B, T, H, hd).transpose(1, 2)
        k = (h @ params[p + "self_attn.k_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        v = (h @ params[p + "self_attn.v_proj.weight"].T).view(B, T, KV, hd).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = k.repeat_interleave(H // KV, dim=1)
        v = v.repeat_interleave(H // KV, dim=1)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        s = s.masked_fill(causal, float("-inf"))
        y = torch.softmax(s, dim=-1) @ v
        y = y.transpose(1, 2).reshape(B, T, H * hd)
        x = x + y @ params[p + "self_attn.o_proj.weight"].T
        h = rms_norm(x, params[p + "post_attention_layernorm.weight"], eps)
        gate = h @ params[p + "mlp.gate_proj.weight"].T
        up = h @ params[p + "mlp.up_proj.weight"].T
        x = x + (torch.nn.functional.silu(gate) * up) @ params[p + "mlp.down_proj.weight"].T
    x = rms_norm(x, params["model.norm.weight"], eps)
    head = emb if cfg.get("tie_word_embeddings", False) else params["lm_head.weight"]
    logits = x @ head.T
    loss = None
    if targets is not None:
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(B * T, -1), targets.reshape(-1), ignore_index=-1)
    return logits, loss


def load_checkpoint(directory, dtype=torch.float64):
    """Returns (config dict, {name: leaf tensor of `dtype` requiring grad})."""
    cfg = read_config(directory + "/config.json")
    tensors, _, _ = read_safetensors(directory + "/model.safetensors")
    params = {n: tensors[n].to(dtype).clone().requires_grad_(True) for n in param_names(cfg)}
    return cfg, params
