"""test_torch_profiler.py — igrad.torch.Profiler and igrad.build_profile.

  - On the same gradients, the Profiler's trace equals the trace the C
    engine records of itself (method adtopk_sync / topk_sync on one rank,
    igrad_engine_set_trace), value for value, and both equal an activity
    computed independently in torch (error feedback + stable-sort top-k).
  - build_profile() over the Profiler's trace CSV writes the same profile
    as the CLI `igrad profile` (JSON byte for byte), and its scores match
    a Python reference of magnitude / persistence / score.
"""
import math
import os
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402

torch.set_num_threads(1)
STEPS = 12
DENSITY = 0.125
CLI = os.environ.get("IGRAD_CLI") or os.path.join(
    os.environ.get("IGRAD_BUILD_DIR", os.path.join(H.SOURCE_DIR, "build")), "igrad")


class ProfilerTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def record(self, sparsifier):
        """Runs STEPS of training on one process; returns (profiler, engine
        trace, torch reference activities {(step, layer, kind): a})."""
        model = H.TinyLlama()
        prof = it.Profiler(model, sparsifier=sparsifier, density=DENSITY)
        layout = it.layout_from_module(model)
        eng_trace = igrad.Trace.create(layout, sparsifier, DENSITY)
        engine = igrad.Engine(layout, None, igrad.make_config(
            method=sparsifier + "_sync", density=DENSITY), igrad.Comm.self_())
        engine.set_trace(eng_trace)
        res = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
        want = {}
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        for step in range(STEPS):
            opt.zero_grad()
            model(*H.batch(0, step)).backward()
            prof.step()
            grads = [p.grad.reshape(-1).clone() for p in model.parameters()]
            engine.sync(step, [g.data_ptr() for g in grads])
            sumsq, numel = {}, {}  # per component: FC1 holds gate_proj and up_proj
            for n, p in model.named_parameters():
                layer, kind = igrad.component_of(n)
                s, res[n] = H.ref_select(p.grad, res[n], sparsifier, DENSITY)
                if kind != "OTHER":
                    key = (step, layer, kind)
                    sumsq[key] = sumsq.get(key, 0.0) + float((s.double() ** 2).sum())
                    numel[key] = numel.get(key, 0) + p.numel()
            for key in sumsq:
                want[key] = math.sqrt(sumsq[key]) / math.sqrt(numel[key])
            opt.step()
        return prof, eng_trace, want

    def check_traces(self, sparsifier):
        prof, eng_trace, want = self.record(sparsifier)
        self.assertEqual(prof.trace.steps(), list(range(STEPS)))
        self.assertEqual(eng_trace.steps(), list(range(STEPS)))
        comps = prof.trace.components()
        self.assertEqual(comps, eng_trace.components())
        for s in range(STEPS):
            for c, comp in enumerate(comps):
                a_py, r_py = prof.trace.value(s, c)
                a_c, r_c = eng_trace.value(s, c)
                self.assertEqual((a_py, r_py), (a_c, r_c),
                                 "%s step %d %s: Profiler vs engine" % (sparsifier, s, comp))
                ref = want[(s, comp["layer"], comp["kind"])]
                self.assertLessEqual(abs(a_py - ref), 1e-6 * max(ref, 1e-12),
                                     "%s step %d %s: activity %r, torch reference %r"
                                     % (sparsifier, s, comp, a_py, ref))
        return prof

    def test_profiler_trace_equals_engine_and_torch(self):
        self.check_traces("topk")
        self.check_traces("adtopk")

    def test_build_profile_equals_cli(self):
        prof = self.check_traces("adtopk")
        trace_path = os.path.join(self.dir, "trace.csv")
        prof.save(trace_path)
        with open(trace_path) as f:
            self.assertTrue(f.readline().startswith("# igrad-trace v2"))

        py_json = os.path.join(self.dir, "py.json")
        profile = igrad.build_profile(trace_path, window=(2, None), method="knee", alpha=0.6,
                                      out=py_json)
        self.assertEqual(profile.window, (2, STEPS))
        self.assertEqual(profile.sparsifier, "adtopk")
        self.assertEqual(profile.density, DENSITY)
        # Built from the in-memory trace too: the same split, the same scores up
        # to the CSV's 9 significant digits.
        mem = prof.build_profile(window="2:", alpha=0.6).entries()
        self.assertEqual([e["important"] for e in mem], [e["important"] for e in profile.entries()])
        for a, b in zip(mem, profile.entries()):
            self.assertAlmostEqual(a["score"], b["score"], delta=1e-7)

        if not os.path.exists(CLI):
            self.skipTest("no igrad CLI at %s" % CLI)
        cli_json = os.path.join(self.dir, "cli.json")
        proc = subprocess.run([CLI, "profile", "--trace", trace_path, "--window", "2:",
                               "--method", "knee", "--alpha", "0.6", "--out", cli_json,
                               "--quiet"], capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(py_json, "rb") as a, open(cli_json, "rb") as b:
            self.assertEqual(a.read(), b.read(), "profile JSON from Python and from the CLI")

        # Scores against a Python reference of the definitions (DESIGN.md 3).
        tr = igrad.Trace.load(trace_path)
        comps = tr.components()
        steps = [i for i, s in enumerate(tr.steps()) if s >= 2]
        acts = [[tr.value(i, c)[0] for c in range(len(comps))] for i in steps]
        means = [sum(a[c] for a in acts) / len(acts) for c in range(len(comps))]
        lo, hi = min(means), max(means)
        mag = [(m - lo) / (hi - lo) if hi > lo else 1.0 for m in means]

        def median(v):
            v = sorted(v)
            n = len(v)
            return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

        pers = [sum(1 for a in acts if a[c] > median(a)) / len(acts) for c in range(len(comps))]
        entries = profile.entries()
        for c, e in enumerate(entries):
            self.assertAlmostEqual(e["magnitude"], mag[c], places=12)
            self.assertAlmostEqual(e["persistence"], pers[c], places=12)
            self.assertAlmostEqual(e["score"], 0.6 * mag[c] + 0.4 * pers[c], places=12)
            self.assertEqual(e["important"], e["score"] >= profile.threshold)
        self.assertTrue(any(e["important"] for e in entries))

        # the profile drives an engine for the same model: important components
        # are sent every step, the others at their release phase
        model = H.TinyLlama()
        state = it.IgradState(model, profile=py_json, method="ig", density=DENSITY)
        for t in range(len(state.layout)):
            info = state.layout.tensor(t)
            plan = state.engine.tensor_plan(t)
            want = 1 if info["kind"] == "OTHER" else profile.is_important(info["layer"],
                                                                         info["kind"])
            self.assertEqual(plan["every_step"], want, info["name"])

        # a profile made at another density (or sparsifier) works, with a
        # warning naming both settings
        import warnings
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            other = it.IgradState(H.TinyLlama(), profile=py_json, method="ig",
                                  density=DENSITY * 5, sparsifier="topk")
            other.engine
        msgs = [str(w.message) for w in seen]
        self.assertTrue(any("sparsifier adtopk at density %g" % DENSITY in m and
                            "uses topk at density %g" % (DENSITY * 5) in m for m in msgs), msgs)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            it.IgradState(H.TinyLlama(), profile=py_json, method="ig", density=DENSITY).engine
        self.assertFalse([w for w in seen if "profile was made" in str(w.message)])


if __name__ == "__main__":
    unittest_main.main()
