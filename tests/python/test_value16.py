"""test_value16.py — the 16-bit wire values against PyTorch, the
independent reference: igrad_convert() F32 -> BF16 / F16 against torch's
.to(torch.bfloat16) / .half() bit for bit (NaN: both NaN) on random bit
patterns, exact ties, F16 subnormals, the F16 overflow edge, Inf and NaN,
and the decoding back; and one engine step (topk_sync, density 1, the
self communicator) whose result is torch's rounding of the gradient,
except that where torch's rounding gives +-Inf (F16 past 65519, BF16
near FLT_MAX) the engine sends the largest finite value, with the rest in
the residual."""
import ctypes
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import igrad  # noqa: E402
from igrad import _lib as L  # noqa: E402

DT = {"BF16": (torch.bfloat16, 2), "F16": (torch.float16, 1)}


def convert(x, src, dst, out_dtype):
    """igrad_convert of a contiguous CPU tensor into a new one."""
    out = torch.empty(x.numel(), dtype=out_dtype)
    codes = {n: i for i, n in enumerate(L.DTYPE_NAMES)}
    L.lib().call("igrad_convert", ctypes.c_void_p(x.data_ptr()), codes[src],
                 ctypes.c_void_p(out.data_ptr()), codes[dst], x.numel())
    return out


def test_values(n=400000, seed=7):
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(-2**31, 2**31 - 1, (n,), generator=g, dtype=torch.int64)
    anyf = bits.to(torch.int32).view(torch.float32)           # every class incl. NaN/Inf
    f16r = (torch.rand(n, generator=g) - 0.5) * 2 * 70000.0   # F16 range and overflow
    tiny = (torch.rand(n, generator=g) - 0.5) * 2 * 2.0**-13  # F16 subnormals
    # exact midpoints between neighbouring bf16 / f16 values (ties)
    lo16 = torch.randint(0, 0x7bff, (n,), generator=g, dtype=torch.int32).to(torch.int16)
    a = lo16.view(torch.float16).float()
    b = (lo16 + 1).view(torch.float16).float()
    ties16 = (a.double() + b.double()).mul(0.5).float()
    lob = torch.randint(0, 0x7f7f, (n,), generator=g, dtype=torch.int32).to(torch.int16)
    a = lob.view(torch.bfloat16).float()
    b = (lob + 1).view(torch.bfloat16).float()
    tiesb = (a.double() + b.double()).mul(0.5).float()
    edge = torch.tensor([0.0, -0.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e30,
                         float("inf"), float("-inf"), float("nan"), 2.0**-24, 2.0**-25,
                         3 * 2.0**-26, 1.17e-38, 1e-45, 3.4e38], dtype=torch.float32)
    return torch.cat([anyf, f16r, tiny, ties16, tiesb, edge]).contiguous()


class ConvertTest(unittest.TestCase):
    def check(self, name):
        tdt, _ = DT[name]
        x = test_values()
        mine = convert(x, "F32", name, torch.int16)
        ref = x.to(tdt).view(torch.int16)
        nan = torch.isnan(x)
        mine_nan = torch.isnan(mine.view(tdt).float())
        self.assertTrue(torch.equal(mine_nan, nan), "%s: NaN where torch has none" % name)
        diff = (mine != ref) & ~nan
        if diff.any():
            i = int(diff.nonzero()[0])
            self.fail("%s: %d of %d values differ from torch, first %r: igrad 0x%04x, "
                      "torch 0x%04x" % (name, int(diff.sum()), x.numel(), float(x[i]),
                                        int(mine[i]) & 0xffff, int(ref[i]) & 0xffff))
        back = convert(mine, name, "F32", torch.float32)
        want = mine.view(tdt).float()
        ok = (back == want) | (torch.isnan(back) & torch.isnan(want))
        self.assertTrue(bool(ok.all()), "%s: decoding differs from torch" % name)

    def test_bf16(self):
        self.check("BF16")

    def test_f16(self):
        self.check("F16")

    def test_refused_pair(self):
        with self.assertRaises(igrad.IgradError) as cm:
            convert(torch.zeros(4), "F32", "I16", torch.int16)
        self.assertIn("F32 to I16 is not supported", str(cm.exception))


class EngineTest(unittest.TestCase):
    """Density 1: every entry is sent, so the result is the rounding of g."""

    def run_step(self, name, g):
        layout = igrad.Layout.from_tensors([("w", tuple(g.shape))])
        e = igrad.Engine(layout, None, {"method": "topk_sync", "density": 1.0,
                                        "value_dtype": name}, igrad.Comm.self_())
        out = g.clone()
        e.sync(0, [out.data_ptr()])
        addr = e.residual_address(0)
        r = torch.frombuffer((ctypes.c_float * g.numel()).from_address(addr),
                             dtype=torch.float32).clone().view(g.shape)
        return out, r, e.stats()

    def test_engine_rounds_like_torch(self):
        g = test_values(20000, seed=3)
        g = g[torch.isfinite(g)].reshape(-1)
        for name in ("BF16", "F16"):
            tdt, _ = DT[name]
            out, r, st = self.run_step(name, g)
            ref = g.to(tdt).float()
            clamp = torch.isinf(ref)
            if name == "F16":
                self.assertTrue(bool(clamp.any()), "no F16 overflow in the test values")
            big = 65504.0 if name == "F16" else float(torch.finfo(torch.bfloat16).max)
            ref = torch.where(clamp, torch.sign(g) * big, ref)
            self.assertTrue(torch.equal(out, ref), name)
            # exact, except after an F16 clamp of |g| >= 2^29 (the remainder
            # g - 65504 is then the nearest float)
            exact = (g.abs() < 2.0**29) | (name == "BF16")
            self.assertTrue(torch.equal((out + r)[exact], g[exact]),
                            "%s: sent + residual != g" % name)
            err = (out.double() + r.double() - g.double()).abs()
            self.assertTrue(bool((err <= g.double().abs() * 2.0**-24).all()), name)
            self.assertEqual(st["entries_sent"], g.numel())

    def test_payload_2_bytes(self):
        g = torch.randn(1000)
        _, _, s32 = self.run_step("F32", g)
        _, _, s16 = self.run_step("BF16", g)
        self.assertEqual(s32["payload_nbytes"] - s16["payload_nbytes"], 2 * 1000)


if __name__ == "__main__":
    unittest_main.main()
