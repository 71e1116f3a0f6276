"""test_torch_names.py — parameter names of real torch models map to their
components, user name rules (name_map=) and the warning for unmapped
tensors.

  - nn.TransformerEncoder / nn.TransformerDecoder as torch names them:
    every attention and MLP tensor maps (in_proj -> QKV, out_proj -> O,
    linear1 -> FC1, linear2 -> FC2, norms -> NORM); nothing is unmapped.
  - PEFT's LoRA module structure rebuilt in torch (q_proj.base_layer,
    q_proj.lora_A.default, q_proj.lora_B.default): adapters map to their
    base projection.
  - A block with unknown module names: IgradState warns once, naming the
    tensors and their share; name_map (rules or a map file) maps them,
    changes the layout hash, survives pickling and an online-profiling
    engine (which copies the layout) is created with it.
  - A model none of whose trainable tensors maps (adapters of a kind the
    rules do not know): the Profiler traces nothing, and building its
    profile (from the Profiler, or from its saved trace through
    igrad.build_profile, or a C trace of those tensors) fails saying that
    no traced tensor mapped to a component and pointing to `igrad layout
    --unmapped` and name_map=; with rules it builds.
"""
import os
import pickle
import sys
import tempfile
import unittest
import warnings

import unittest_main  # noqa: E402 (tests/python, the script's folder)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402

torch.set_num_threads(1)


def kinds_by_name(layout):
    return {layout.tensor(i)["name"]: (layout.tensor(i)["layer"], layout.tensor(i)["kind"])
            for i in range(len(layout))}


class Odd(nn.Module):
    """A block whose modules no built-in rule knows."""

    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(8, 24)
        self.post = nn.Linear(24, 8)
        self.mlp = nn.Sequential()
        self.mlp.add_module("up_proj", nn.Linear(8, 16))


class OddModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([Odd(), Odd()])


class LoraLinear(nn.Module):
    """peft.tuners.lora.Linear's parameter structure."""

    def __init__(self, n_in, n_out, r=4):
        super().__init__()
        self.base_layer = nn.Linear(n_in, n_out, bias=False)
        self.base_layer.weight.requires_grad_(False)
        self.lora_A = nn.ModuleDict({"default": nn.Linear(n_in, r, bias=False)})
        self.lora_B = nn.ModuleDict({"default": nn.Linear(r, n_out, bias=False)})


class IA3Linear(nn.Module):
    """A frozen linear with a trainable adapter vector under a name no
    built-in rule knows (as PEFT's IA3 'ia3_l' before the rules knew it)."""

    def __init__(self, n):
        super().__init__()
        self.base_layer = nn.Linear(n, n, bias=False)
        self.base_layer.weight.requires_grad_(False)
        self.ia3_vec = nn.Parameter(torch.ones(n))


class NamesTest(unittest.TestCase):
    def test_transformer_encoder_decoder(self):
        enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64), 3)
        layout = it.layout_from_module(enc)
        got = kinds_by_name(layout)
        self.assertEqual(len(got), 3 * 12)
        want = {"self_attn.in_proj_weight": "QKV", "self_attn.in_proj_bias": "QKV",
                "self_attn.out_proj.weight": "O", "self_attn.out_proj.bias": "O",
                "linear1.weight": "FC1", "linear1.bias": "FC1", "linear2.weight": "FC2",
                "linear2.bias": "FC2", "norm1.weight": "NORM", "norm1.bias": "NORM",
                "norm2.weight": "NORM", "norm2.bias": "NORM"}
        for layer in range(3):
            for suffix, kind in want.items():
                self.assertEqual(got["layers.%d.%s" % (layer, suffix)], (layer, kind))
        self.assertEqual(layout.unmapped(), [])
        self.assertIsNone(layout.unmapped_report())
        self.assertEqual(len(layout.components()), 3 * 5)

        dec = nn.TransformerDecoder(nn.TransformerDecoderLayer(32, 4, 64), 2)
        got = kinds_by_name(it.layout_from_module(dec))
        self.assertEqual(got["layers.1.multihead_attn.in_proj_weight"], (1, "QKV"))
        self.assertEqual(got["layers.1.multihead_attn.out_proj.weight"], (1, "O"))
        self.assertEqual(got["layers.1.norm3.weight"], (1, "NORM"))
        self.assertNotIn("OTHER", {k for _, k in got.values()})

    def test_lora_adapters(self):
        model = nn.Module()
        inner = nn.Module()
        blocks = nn.ModuleList()
        for _ in range(2):
            block = nn.Module()
            attn = nn.Module()
            attn.q_proj = LoraLinear(16, 16)
            attn.v_proj = LoraLinear(16, 16)
            block.self_attn = attn
            blocks.append(block)
        inner.layers = blocks
        model.model = inner
        wrapper = nn.Module()
        wrapper.model = model
        peft = nn.Module()
        peft.base_model = wrapper  # PeftModel.base_model.model.model.layers...
        layout = it.layout_from_module(peft)
        got = kinds_by_name(layout)
        self.assertEqual(len(got), 8)  # base_layer weights are frozen
        self.assertEqual(
            got["base_model.model.model.layers.1.self_attn.q_proj.lora_A.default.weight"],
            (1, "Q"))
        self.assertEqual(
            got["base_model.model.model.layers.0.self_attn.v_proj.lora_B.default.weight"],
            (0, "V"))
        self.assertEqual(layout.unmapped(), [])
        # The Profiler now traces the adapters (it recorded nothing before)
        prof = it.Profiler(peft, density=0.25)
        for p in peft.parameters():
            if p.requires_grad:
                p.grad = torch.randn_like(p)
        prof.step()
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.csv")
            prof.save(path)
            with open(path) as f:
                rows = [line for line in f if not line.startswith(("#", "step"))]
        self.assertEqual(sorted({tuple(r.split(",")[1:3]) for r in rows}),
                         [("0", "Q"), ("0", "V"), ("1", "Q"), ("1", "V")])

    def test_unmapped_warning_and_rules(self):
        model = OddModel()
        state = it.IgradState(model, method="adtopk_sync")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            layout = state.layout
            state.layout  # built once: one warning
        msgs = [str(w.message) for w in seen if "match no name rule" in str(w.message)]
        self.assertEqual(len(msgs), 1, [str(w.message) for w in seen])
        total = layout.total_count
        self.assertIn("8 of 12 tensors inside numbered blocks", msgs[0])
        self.assertIn("layers.0.mix.weight (%.2f %%)" % (100.0 * 192 / total), msgs[0])
        self.assertIn("name_map", msgs[0])
        names = [n for n, _, _ in layout.unmapped()]
        self.assertEqual(names, ["layers.%d.%s" % (l, s) for l in (0, 1)
                                 for s in ("mix.weight", "mix.bias", "post.weight",
                                           "post.bias")])

        rules = [(r"layers\.(\d+)\.mix\.(weight|bias)", "QKV", 1),
                 ("glob:*.post.*", "O", "block")]
        mapped_state = it.IgradState(model, method="adtopk_sync", name_map=rules)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            mapped = mapped_state.layout
        self.assertFalse([w for w in seen if "match no name rule" in str(w.message)])
        got = kinds_by_name(mapped)
        self.assertEqual(got["layers.1.mix.bias"], (1, "QKV"))
        self.assertEqual(got["layers.0.post.weight"], (0, "O"))
        self.assertEqual(got["layers.0.mlp.up_proj.weight"], (0, "FC1"))  # built-in
        self.assertNotEqual(mapped.hash, layout.hash)

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "names.map")
            with open(path, "w") as f:
                f.write("# the same rules as a map file\n"
                        "layers\\.(\\d+)\\.mix\\.(weight|bias) QKV 1\n"
                        "glob:*.post.* O block\n")
            from_file = it.IgradState(model, method="ig", profile="auto", name_map=path)
            self.assertEqual(from_file.layout.hash, mapped.hash)
            from_file.engine  # online profiling copies the layout: it keeps the rules

        # The Profiler: the same warning without rules; with the run's rules
        # its trace (and so the profile) is made for the mapped layout.
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            it.Profiler(model)
        self.assertEqual(len([w for w in seen if "match no name rule" in str(w.message)]), 1)
        prof = it.Profiler(model, name_map=rules)
        self.assertEqual(prof.layout.hash, mapped.hash)
        self.assertEqual(prof.trace.layout_hash, mapped.hash)

        # igrad.Layout.load with rules (remap of a loaded name list)
        with tempfile.TemporaryDirectory() as d:
            names = os.path.join(d, "names.txt")
            with open(names, "w") as f:
                for i in range(len(layout)):
                    t = layout.tensor(i)
                    f.write("%s %s\n" % (t["name"], " ".join(map(str, t["shape"]))))
            self.assertEqual(igrad.Layout.load(names).hash, layout.hash)
            self.assertEqual(igrad.Layout.load(names, name_map=rules).hash, mapped.hash)

        again = pickle.loads(pickle.dumps(mapped_state))
        again.attach(model)
        self.assertEqual(again.layout.hash, mapped.hash)

        with self.assertRaisesRegex(igrad.InvalidArgumentError, "kind Q needs a layer"):
            it.IgradState(model, method="adtopk_sync", name_map=[("x", "Q", None)])
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "not a POSIX extended regex"):
            it.IgradState(model, method="adtopk_sync", name_map=[("a(", "Q", 1)])
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "layer is 'row'"):
            it.IgradState(model, method="adtopk_sync", name_map=[("x", "Q", "row")])
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "unknown component kind"):
            it.IgradState(model, method="adtopk_sync", name_map=[("x", "QQ", "block")])

    def test_profile_of_unmapped_names_says_why(self):
        model = nn.Module()
        model.layers = nn.ModuleList()
        for _ in range(2):
            block = nn.Module()
            block.mixer_x = IA3Linear(8)
            model.layers.append(block)
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            prof = it.Profiler(model, density=0.5)
        self.assertEqual(prof.layout.unmapped()[0][0], "layers.0.mixer_x.ia3_vec")
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.randn_like(p)
        prof.step()
        prof.step()
        cause = "no traced tensor mapped to a component"
        with self.assertRaises(igrad.InvalidArgumentError) as ctx:
            prof.build_profile()
        msg = str(ctx.exception)
        for want in (cause, "2 trainable tensors", "layers.0.mixer_x.ia3_vec",
                     "igrad layout --unmapped", "name_map="):
            self.assertIn(want, msg)

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "trace.csv")
            prof.save(path)  # a header, no rows
            with self.assertRaises(igrad.FormatError) as ctx:
                igrad.build_profile(path)
            msg = str(ctx.exception)
            for want in ("no data rows after the header", cause, "igrad layout --unmapped",
                         "--map FILE", "name_map="):
                self.assertIn(want, msg)

        # the C trace of that layout itself (igrad_profile_build's message)
        with self.assertRaises(igrad.InvalidArgumentError) as ctx:
            igrad.Profile.build(prof.trace)
        msg = str(ctx.exception)
        for want in ("none of its layout's 2 tensors maps to one", cause, "name_map="):
            self.assertIn(want, msg)

        # with a rule the adapters are their block's FC1 and the profile builds
        mapped = it.Profiler(model, density=0.5, name_map=[("glob:*.ia3_vec", "FC1", "block")])
        mapped.step()
        mapped.step()
        profile = mapped.build_profile()
        self.assertEqual(sorted((e["layer"], e["kind"]) for e in profile.entries()),
                         [(0, "FC1"), (1, "FC1")])


if __name__ == "__main__":
    unittest_main.main()
