"""test_model_vs_torch.py — the C trainer's forward and backward against
PyTorch.

For a few model shapes (grouped-query and multi-head attention, tied and
untied lm_head, text and uint16 token input), `igrad model init` writes a
checkpoint, `igrad model eval --dump` runs one forward/backward in C and
dumps logits, loss and every parameter gradient; llama_ref.py evaluates the
same weights in float64 with autograd. The checkpoint is also checked
against the Hugging Face conventions (config keys, tensor names/order,
safetensors layout).

Tolerances (C runs in float32, the reference in float64):
  loss:      |c - ref| <= 1e-5 * max(1, |ref|)
  logits:    max |c - ref| <= 2e-5 * max(1, max |ref|)
  gradients: per tensor, max |c - ref| <= 1e-4 * max |ref| + 1e-9
Run with Debian's /usr/bin/python3 (torch 1.13); the CLI is $IGRAD_CLI
(set by CTest) or build/igrad.
"""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import llama_ref  # noqa: E402

torch.set_num_threads(1)

CLI = os.environ.get("IGRAD_CLI") or os.path.join(
    os.environ.get("IGRAD_BUILD_DIR", "build"), "igrad")

TEXT = (b"It was the best of times, it was the worst of times, it was the age of "
        b"wisdom, it was the age of foolishness, it was the epoch of belief, it was "
        b"the epoch of incredulity, it was the season of Light, it was the season of "
        b"Darkness, it was the spring of hope, it was the winter of despair. ") * 4


def run(args):
    proc = subprocess.run([CLI] + args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise AssertionError("igrad %s failed (%d):\n%s%s" % (
            " ".join(args), proc.returncode, proc.stdout, proc.stderr))
    return proc.stdout


class ModelVsTorch(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def check(self, init_args, B, T, tokens=None):
        ckpt = os.path.join(self.dir, "ckpt")
        dump = os.path.join(self.dir, "dump.safetensors")
        run(["model", "init", "--out", ckpt] + init_args)
        if tokens is None:
            src = os.path.join(self.dir, "text.txt")
            with open(src, "wb") as f:
                f.write(TEXT)
            data = ["--text", src]
        else:
            src = os.path.join(self.dir, "tokens.bin")
            with open(src, "wb") as f:
                f.write(struct.pack("<%dH" % len(tokens), *tokens))
            data = ["--tokens", src]
        out = run(["model", "eval", "--init", ckpt, "--batch", str(B), "--seq-len", str(T),
                   "--dump", dump] + data)
        self.assertIn("loss", out)

        got, meta, _ = llama_ref.read_safetensors(dump)
        cfg, params = llama_ref.load_checkpoint(ckpt)
        inputs = got["inputs"].long()
        targets = got["targets"].long()
        self.assertEqual(tuple(inputs.shape), (B, T))
        stream = list(TEXT) if tokens is None else list(tokens)
        self.assertEqual(inputs.reshape(-1).tolist(), stream[:B * T])
        self.assertEqual(targets.reshape(-1).tolist(), stream[1:B * T + 1])

        logits, loss = llama_ref.forward(params, cfg, inputs, targets)
        loss.backward()

        c_loss = float(got["loss"])
        self.assertLessEqual(abs(c_loss - loss.item()), 1e-5 * max(1.0, abs(loss.item())),
                             "loss: C %.9g vs torch %.9g" % (c_loss, loss.item()))
        self.assertAlmostEqual(float(meta["loss"]), c_loss, places=6)
        ref = logits.detach()
        logits_err = (got["logits"].double() - ref).abs().max().item()
        scale = max(1.0, ref.abs().max().item())
        self.assertLessEqual(logits_err, 2e-5 * scale, "logits: max abs error %.3g (scale %.3g)"
                             % (logits_err, scale))

        names = llama_ref.param_names(cfg)
        grad_names = sorted(k[5:] for k in got if k.startswith("grad."))
        self.assertEqual(grad_names, sorted(names))
        worst = 0.0
        for name in names:
            g_ref = params[name].grad
            g_c = got["grad." + name].double()
            self.assertEqual(tuple(g_c.shape), tuple(g_ref.shape), name)
            err = (g_c - g_ref).abs().max().item()
            ref_max = g_ref.abs().max().item()
            self.assertGreater(ref_max, 0.0, "%s: reference gradient is all zero" % name)
            self.assertLessEqual(err, 1e-4 * ref_max + 1e-9,
                                 "%s: max abs error %.3g, max |grad| %.3g"
                                 % (name, err, ref_max))
            worst = max(worst, err / ref_max)
        print("  %-40s loss %.6f  logits err %.2e  worst grad rel err %.2e"
              % (" ".join(init_args), c_loss, logits_err, worst))
        return ckpt, cfg

    def test_tiny_gqa_untied_text(self):
        self.check(["--size", "tiny", "--seed", "7", "--init-std", "0.2"], B=4, T=32)

    def test_tiny_mha_tied_tokens(self):
        toks = [(i * 37 + 11) % 257 for i in range(3 * 64 + 1)]
        toks[50] = 256  # end-of-text inside the batch
        self.check(["--size", "tiny", "--kv-heads", "4", "--tie", "--seed", "3",
                    "--init-std", "0.15"], B=3, T=64, tokens=toks)

    def test_small_one_layer_default_init(self):
        # The `small` widths (C=256, H=8, KV=4, F=688) at HF's init std.
        self.check(["--size", "small", "--layers", "1", "--seed", "5"], B=2, T=128)

    def test_checkpoint_is_hf_shaped(self):
        ckpt, cfg = self.check(["--size", "tiny", "--layers", "3", "--seed", "9",
                                "--init-std", "0.1"], B=2, T=16)
        for key, want in [("model_type", "llama"), ("architectures", ["LlamaForCausalLM"]),
                          ("vocab_size", 257), ("hidden_size", 32), ("intermediate_size", 64),
                          ("num_hidden_layers", 3), ("num_attention_heads", 4),
                          ("num_key_value_heads", 2), ("max_position_embeddings", 64),
                          ("rms_norm_eps", 1e-5), ("rope_theta", 10000),
                          ("tie_word_embeddings", False), ("torch_dtype", "float32"),
                          ("bos_token_id", 256), ("eos_token_id", 256), ("hidden_act", "silu")]:
            self.assertEqual(cfg.get(key), want, key)
        path = os.path.join(ckpt, "model.safetensors")
        tensors, meta, order = llama_ref.read_safetensors(path)
        self.assertEqual(meta, {"format": "pt"})
        self.assertEqual(order, llama_ref.param_names(cfg))
        with open(path, "rb") as f:
            blob = f.read()
        (hlen,) = struct.unpack("<Q", blob[:8])
        self.assertEqual(hlen % 8, 0)
        header = json.loads(blob[8:8 + hlen])
        end = 0
        for name in order:
            b, e = header[name]["data_offsets"]
            self.assertEqual(b, end, name)
            self.assertEqual(header[name]["dtype"], "F32")
            end = e
        self.assertEqual(8 + hlen + end, len(blob))
        for name, t in tensors.items():
            if name.endswith("norm.weight"):
                self.assertTrue(torch.all(t == 1.0), name)


if __name__ == "__main__":
    unittest_main.main(verbosity=2)
