"""test_example_ddp.py — examples/torch_ddp_finetune.py runs end to end on
2 processes with tiny settings: it profiles, writes trace.csv, profile.json
and one igrad state file per rank, trains with ig and prints loss and
bytes for every step, with fewer bytes than adtopk_sync. The text is
generated here, so the test does not need the Brown corpus.
"""
import os
import re
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("IGRAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "torch_ddp_finetune.py")


class Example(unittest.TestCase):
    def test_runs_end_to_end(self):
        with tempfile.TemporaryDirectory() as d:
            text = os.path.join(d, "text.txt")
            with open(text, "w") as f:
                for i in range(40):
                    f.write("Document %d says the quick brown fox jumps over %d lazy dogs.\n"
                            "%%\n" % (i, i * 7 % 13))
            out = os.path.join(d, "run")
            proc = subprocess.run(
                [sys.executable, EXAMPLE, "--world", "2", "--text", text, "--out", out,
                 "--profile-steps", "6", "--steps", "8", "--log-every", "1", "--dim", "32",
                 "--hidden", "64", "--seq-len", "16", "--batch", "2", "--density", "0.05"],
                capture_output=True, text=True, timeout=240)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            lines = re.findall(r"^step +(\d+) +loss ([0-9.]+) +payload +([0-9.]+ [KMG]?B)",
                               proc.stdout, re.M)
            self.assertEqual([int(s) for s, _, _ in lines], list(range(6, 14)), proc.stdout)
            m = re.search(r"= ([0-9.]+) x adtopk_sync", proc.stdout)
            self.assertIsNotNone(m, proc.stdout)
            self.assertLess(float(m.group(1)), 1.0, proc.stdout)
            for name in ("trace.csv", "profile.json", "igrad_state.rank0.bin",
                         "igrad_state.rank1.bin"):
                self.assertTrue(os.path.exists(os.path.join(out, name)), name)
            help_ = subprocess.run([sys.executable, EXAMPLE, "--help"], capture_output=True,
                                   text=True, timeout=60)
            self.assertEqual(help_.returncode, 0)
            self.assertIn("--profile-steps", help_.stdout)


if __name__ == "__main__":
    unittest_main.main()
