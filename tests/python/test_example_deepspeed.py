"""test_example_deepspeed.py — examples/deepspeed_style.py (igrad in a
DeepSpeed-style loop over a stand-in engine with DeepSpeed's attributes:
enable_backward_allreduce = False, the accumulation boundary,
data_parallel_group, rank-0 checkpoints) on 2 processes: method dense
through igrad equals the stand-in's own all-reduce bit for bit (so igrad
synchronizes exactly once per optimizer step, at the boundary); a run
stopped after 3 steps, saved (igrad's state on every rank) and resumed in
new processes ends with the uninterrupted run's parameters, bit for bit;
adtopk_sync sends fewer bytes than dense. Not DeepSpeed itself (not
installable here).
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
EXAMPLE = os.path.join(SOURCE_DIR, "examples", "deepspeed_style.py")


class Example(unittest.TestCase):
    def test_recipe(self):
        with tempfile.TemporaryDirectory() as d:
            proc = subprocess.run(
                [sys.executable, EXAMPLE, "--world", "2", "--steps", "6", "--accumulation", "2",
                 "--check-dense", "--resume-at", "3", "--log-every", "1", "--out", d],
                capture_output=True, text=True, timeout=240)
            self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
            finals = re.findall(r"^final (\S+) ([0-9a-f]+)$", proc.stdout, re.M)
            self.assertEqual([m for m, _ in finals],
                             ["adtopk_sync", "dense", "own-allreduce", "adtopk_sync"], proc.stdout)
            self.assertEqual(finals[1][1], finals[2][1], "dense via igrad != own all-reduce")
            self.assertEqual(finals[0][1], finals[3][1], "resumed run != uninterrupted run")
            self.assertNotEqual(finals[0][1], finals[1][1], "sparse run equals dense run")
            pay = [int(b) for b in re.findall(r"^step +\d+ loss \S+ payload (\d+) B", proc.stdout,
                                              re.M)]
            self.assertEqual(len(pay), 6 + 6 + 3 + 3, proc.stdout)  # sparse, dense, stopped 0..2, resumed 3..5
            self.assertLess(pay[0], pay[6], "adtopk_sync payload not below dense")
            for r in (0, 1):
                self.assertTrue(os.path.exists(os.path.join(d, "checkpoint",
                                                            "igrad.rank%d.bin" % r)))


if __name__ == "__main__":
    unittest_main.main()
