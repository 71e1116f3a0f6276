"""test_trace_reference.py — the reference method's trace files give the
profile igrad's own traces give (issue 13).

reference_trace_writer.py (standard library only, no igrad code) writes, from
known per-step sums of squares and retained counts of a small OPT-style
layout, the reference method's component_activity_trace.csv and igrad's v1
trace of the same run; igrad's own v2 trace is written from the same numbers
through the C API (igrad_trace_record / igrad_trace_save via the binding).
`igrad profile` on the three must give the same profile:

  - exact numbers (activities multiples of 1/64, components of 256 and 1024
    entries): the same profile JSON (components, tau, window, steps) and
    byte-identical profile CSVs, equal to tests/data/trace_reference/
    profile_v1_main.csv, which igrad profile made from trace_v1.csv before
    the trace format changed (main at 8ed24af);
  - arbitrary numbers (two tensors per component, 272 and 1088 entries): the
    reference file and v2 agree to 1e-12 (igrad keeps sqrt(sum / n), the
    reference sqrt(sum) / sqrt(n): an ulp apart), v1 to its %.9g rounding;
    the important sets are the same.

The fuzz corpus's v1 trace written by `igrad train` (6 steps) profiles
byte-identically to what main's igrad made of it (profile JSON and CSV).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

import igrad

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.dirname(os.path.dirname(HERE))
DATA = os.path.join(SRC, "tests", "data", "trace_reference")
CLI = os.environ.get("IGRAD_CLI", os.path.join(os.environ.get("IGRAD_BUILD_DIR", "build"), "igrad"))


def read(path, mode="r"):
    with open(path, mode) as f:
        return f.read()


class TraceReferenceTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="igrad_trace_ref_")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def write_all(self, exact):
        """The reference file, v1 and v2 of one run: their paths."""
        out = os.path.join(self.dir, "exact" if exact else "arbitrary")
        os.mkdir(out)
        subprocess.run([sys.executable, os.path.join(HERE, "reference_trace_writer.py"), out]
                       + (["--exact"] if exact else []), check=True)
        numbers = json.loads(read(os.path.join(out, "numbers.json")))
        layout = igrad.Layout.from_tensors([(n, s) for n, s in numbers["tensors"]])
        kinds = {(c["layer"], c["kind"]) for c in layout.components()}
        self.assertEqual(len(kinds), 12, kinds)  # every tensor in a (layer, kind) component
        trace = igrad.Trace.create(layout, "topk", 0.01)
        for step, tensor, sumsq, retained in numbers["records"]:
            trace.record(step, tensor, float(sumsq), retained)
        v2 = os.path.join(out, "trace_v2.csv")
        trace.save(v2)
        self.assertTrue(read(v2).startswith("# igrad-trace v2 "))
        return {"reference": os.path.join(out, "component_activity_trace.csv"),
                "v1": os.path.join(out, "trace_v1.csv"), "v2": v2}

    def profile(self, trace, *args):
        """igrad profile on a trace: (profile JSON as a dict, CSV bytes)."""
        base = os.path.splitext(trace)[0]
        subprocess.run([CLI, "profile", "--trace", trace, "--out", base + ".json",
                        "--csv", base + ".p.csv", "--quiet"] + list(args), check=True)
        return json.loads(read(base + ".json")), read(base + ".p.csv", "rb")

    @staticmethod
    def scored(p):
        """What a profile says about the trace's scores."""
        return {k: p[k] for k in ("alpha", "method", "tau", "window", "steps", "components")}

    def test_exact_numbers_same_profile(self):
        files = self.write_all(exact=True)
        want_csv = read(os.path.join(DATA, "profile_v1_main.csv"), "rb")
        self.assertEqual(read(files["v1"]), read(os.path.join(DATA, "trace_v1.csv")))
        for args in ([], ["--window", "5:25", "--method", "otsu"]):
            got = {name: self.profile(path, *args) for name, path in files.items()}
            ref_json, ref_csv = got["reference"]
            for name in ("v1", "v2"):
                self.assertEqual(self.scored(got[name][0]), self.scored(ref_json), (name, args))
                self.assertEqual(got[name][1], ref_csv, (name, args))
            if not args:
                self.assertEqual(ref_csv, want_csv)
            important = {(c["layer"], c["kind"]) for c in ref_json["components"] if c["important"]}
            self.assertTrue(important >= {(0, "V"), (0, "O"), (1, "V"), (1, "O")}, important)
            # what each file says about itself
            self.assertEqual(ref_json["layout_hash"], "0x0000000000000000")
            self.assertEqual(ref_json["sparsifier"], "unknown")
            self.assertEqual((got["v2"][0]["sparsifier"], got["v2"][0]["density"]), ("topk", 0.01))
            self.assertNotEqual(got["v2"][0]["layout_hash"], "0x0000000000000000")

    def test_arbitrary_numbers_same_profile(self):
        files = self.write_all(exact=False)
        got = {name: self.profile(path)[0] for name, path in files.items()}
        ref = got["reference"]
        for name, tol in (("v2", 1e-12), ("v1", 1e-7)):
            p = got[name]
            self.assertEqual((p["window"], p["steps"], p["method"]), (ref["window"], ref["steps"], "knee"))
            self.assertAlmostEqual(p["tau"], ref["tau"], delta=tol)
            self.assertEqual(len(p["components"]), len(ref["components"]))
            for a, b in zip(p["components"], ref["components"]):
                self.assertEqual((a["layer"], a["kind"], a["numel"], a["important"]),
                                 (b["layer"], b["kind"], b["numel"], b["important"]), name)
                for key in ("mean_activity", "magnitude", "persistence", "score"):
                    self.assertAlmostEqual(a[key], b[key], delta=tol * max(1.0, abs(b[key])),
                                           msg="%s %s %s" % (name, key, a))

    def test_v1_trace_from_igrad_train_unchanged(self):
        trace = os.path.join(self.dir, "train.csv")
        shutil.copy(os.path.join(SRC, "tests", "fuzz", "corpus", "trace",
                                 "trainer-adtopk-6-steps.csv"), trace)
        p, csv_bytes = self.profile(trace)
        self.assertEqual(read(os.path.splitext(trace)[0] + ".json"),
                         read(os.path.join(DATA, "trainer_profile_main.json")))
        self.assertEqual(csv_bytes, read(os.path.join(DATA, "trainer_profile_main.csv"), "rb"))

    def test_reference_file_refusals(self):
        files = self.write_all(exact=True)
        text = read(files["reference"])
        bad = os.path.join(self.dir, "bad.csv")
        cases = [
            (text.replace(",0,Q,", ",0,ATTN_Q,", 1), "unknown component 'ATTN_Q'"),
            (text.replace(",pubmed,", ",alpaca,", 2)
             .replace(",alpaca,", ",pubmed,", 1), "workload_name 'alpaca' differs"),
            # a raw column already divided by sqrt(numel), as igrad v1 wrote it
            (text.replace(",0,V,", ",0,V,0.5,0.5,256,2\r\n#", 1), "is not raw_activity / sqrt(numel)"),
        ]
        for body, message in cases:
            with open(bad, "w", newline="") as f:
                f.write(body)
            r = subprocess.run([CLI, "profile", "--trace", bad, "--quiet"], capture_output=True,
                               text=True)
            self.assertNotEqual(r.returncode, 0, message)
            self.assertIn("bad.csv:", r.stderr)
            self.assertIn(message, r.stderr)


if __name__ == "__main__":
    unittest_main.main()
