"""test_torch_stats.py — IgradState's observability, on one process:

  - stats(): the means over the completed steps equal the per-step
    last_stats the test collected itself; ratio_to_dense = payload /
    (4 bytes x parameters); sparsifier_sync_nbytes = the adtopk_sync
    engine's payload on the same model (a second state, measured);
    ratio_to_sparsifier, f_imp in (0, 1) for ig; stats_reset() starts
    again;
  - log_every=N: one "igrad step" INFO line on the "igrad" logger every
    N steps, with the payload and the ratios;
  - tensorboard=: a writer object gets add_scalar("igrad/...", value,
    step) every N steps; a log directory without the tensorboard package
    is refused by name; where the package imports, a real SummaryWriter
    writes event files instead (not the case on this project's machines).
"""
import os
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402,F401 (puts python/ on sys.path)

import torch  # noqa: E402

import igrad.torch as it  # noqa: E402
from igrad import _lib as L  # noqa: E402


def model():
    torch.manual_seed(0)
    m = torch.nn.Module()
    m.model = torch.nn.Module()
    m.model.layers = torch.nn.ModuleList()
    for _ in range(2):
        b = torch.nn.Module()
        b.self_attn = torch.nn.Module()
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(b.self_attn, n, torch.nn.Linear(32, 32, bias=False))
        b.mlp = torch.nn.Module()
        b.mlp.up_proj = torch.nn.Linear(32, 64, bias=False)
        b.mlp.down_proj = torch.nn.Linear(64, 32, bias=False)
        m.model.layers.append(b)
    return m


def run(state, m, steps):
    sync = it.GradientSynchronizer(m.named_parameters(), state)
    seen = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        for p in m.parameters():
            p.grad = torch.randn(p.shape, generator=g)
        seen.append(dict(sync.synchronize(step)))
    return seen


class Recorder:
    def __init__(self):
        self.calls = []

    def add_scalar(self, tag, value, step):
        self.calls.append((tag, value, step))


class StatsTest(unittest.TestCase):
    def test_stats_summary(self):
        m = model()
        n = sum(p.numel() for p in m.parameters())
        sync_state = it.IgradState(method="adtopk_sync", density=0.05, threads=1)
        ref = run(sync_state, m, 4)
        trace_profile = it.Profiler(m, sparsifier="adtopk", density=0.05)
        for step in range(4):
            g = torch.Generator().manual_seed(step)
            for p in m.parameters():
                p.grad = torch.randn(p.shape, generator=g)
            trace_profile.step(step)
        prof = trace_profile.build_profile(method="fixed:0.5")
        st = it.IgradState(method="ig", profile=prof, density=0.05, threads=1)
        seen = run(st, m, 8)
        s = st.stats()
        self.assertEqual(s["steps"], 8)
        for k in ("payload_nbytes", "wire_nbytes", "select_ms", "total_ms"):
            self.assertAlmostEqual(s[k], sum(x[k] for x in seen) / 8, places=9, msg=k)
        self.assertEqual(s["dense_nbytes"], 4.0 * n)
        self.assertAlmostEqual(s["ratio_to_dense"], s["payload_nbytes"] / (4.0 * n), places=12)
        # what adtopk_sync sends at an even step, measured by another state
        self.assertEqual(s["sparsifier_sync_nbytes"], ref[0]["payload_nbytes"])
        self.assertTrue(0.0 < s["ratio_to_sparsifier"] < 1.0, s)
        self.assertTrue(0.0 < s["f_imp"] < 1.0, s)
        self.assertEqual(s["deferred_components"], seen[-1]["deferred_components"])
        st.stats_reset()
        self.assertEqual(st.stats()["steps"], 0)

    def test_logger_and_writer(self):
        m = model()
        rec = Recorder()
        st = it.IgradState(method="adtopk_sync", density=0.05, threads=1, log_every=3,
                           tensorboard=rec)
        with self.assertLogs("igrad", "INFO") as logs:
            run(st, m, 7)
        lines = [r for r in logs.output if "igrad step" in r]
        self.assertEqual(len(lines), 2, logs.output)  # after steps 3 and 6 (indices 2, 5)
        self.assertIn("x dense", lines[0])
        self.assertIn("x its *_sync", lines[0])
        tags = sorted(set(t for t, _, _ in rec.calls))
        self.assertIn("igrad/payload_nbytes", tags)
        self.assertIn("igrad/ratio_to_dense", tags)
        self.assertEqual(sorted(set(s for _, _, s in rec.calls)), [2, 5])
        with self.assertRaises(L.InvalidArgumentError):
            it.IgradState(method="adtopk_sync", log_every=-1)

    def test_tensorboard_directory(self):
        try:
            import torch.utils.tensorboard  # noqa: F401
        except ImportError:
            with tempfile.TemporaryDirectory() as d:
                with self.assertRaises(L.UnsupportedError) as cm:
                    it.IgradState(method="adtopk_sync", tensorboard=d)
                self.assertIn("tensorboard", str(cm.exception))
            print("test_tensorboard_directory: torch.utils.tensorboard is not importable "
                  "here: the refusal was checked, a real SummaryWriter was not")
            return
        with tempfile.TemporaryDirectory() as d:
            st = it.IgradState(method="adtopk_sync", density=0.05, threads=1, log_every=1,
                               tensorboard=d)
            run(st, model(), 2)
            st.tensorboard.flush()
            self.assertTrue(any(f.startswith("events.") for f in os.listdir(d)))


if __name__ == "__main__":
    unittest_main.main()
