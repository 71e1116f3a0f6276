"""test_value8.py — FP8 wire values (value_dtype "F8_E4M3", alias "FP8")
through the binding against a reference written here from the OCP E4M3
definition in Python floats (torch 1.13 has no float8): one engine step of
topk_sync at density 1 on the self communicator sends every entry, so the
result is each value rounded to nearest even at its block's power-of-two
scale (the smallest 2^k, k >= -126, with max |g| <= 448 * 2^k) and
result + residual == g exactly; the payload is F32's minus 3 bytes per entry
plus a 4-byte scale per block."""
import bisect
import ctypes
import math
import os
import sys
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import igrad  # noqa: E402

# the 127 finite non-negative E4M3 values by code (codes 0..0x7e increase)
CODES = [math.ldexp(c & 7, -9) if c < 8 else math.ldexp(8 + (c & 7), (c >> 3) - 10)
         for c in range(0x7f)]


def ref_round(x):
    """x (|x| <= 448) to the nearest E4M3 value, ties to the even code."""
    a = abs(x)
    i = bisect.bisect_right(CODES, a) - 1  # CODES[i] <= a
    if i + 1 < len(CODES):
        lo, hi = a - CODES[i], CODES[i + 1] - a
        if hi < lo or (hi == lo and i % 2 == 1):
            i += 1
    return math.copysign(CODES[i], x)


def ref_block(values):
    amax = max(abs(v) for v in values)
    k = -126
    while amax > math.ldexp(448.0, k):
        k += 1
    return [ref_round(math.ldexp(v, -k)) * 2.0 ** k for v in values]


class Fp8Test(unittest.TestCase):
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

    def test_engine_rounds_like_the_reference(self):
        gen = torch.Generator().manual_seed(11)
        n = 6000
        g = torch.randn(n, generator=gen) * torch.exp2(torch.randint(-20, 6, (n,), generator=gen)
                                                       .float())
        g[0] = 0.0
        g[1] = -g[1]
        for name in ("F8_E4M3", "FP8", "fp8"):
            out, r, st = self.run_step(name, g)
            ref = torch.tensor(ref_block(g.tolist()), dtype=torch.float32)
            self.assertTrue(torch.equal(out, ref), name)
            self.assertTrue(torch.equal(out + r, g), "%s: sent + residual != g" % name)
            self.assertEqual(st["entries_sent"], n)
        self.assertEqual(igrad.config_to_dict(igrad.make_config(value_dtype="fp8"))
                         ["value_dtype"], "F8_E4M3")

    def test_payload(self):
        g = torch.randn(1000)
        _, _, s32 = self.run_step("F32", g)
        _, _, s8 = self.run_step("FP8", g)
        self.assertEqual(s32["payload_nbytes"] - s8["payload_nbytes"], 3 * 1000 - 4)


if __name__ == "__main__":
    unittest_main.main()
