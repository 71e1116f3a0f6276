"""test_experiments_smoke.py — the RQ1–RQ5 experiment scripts run end to end
in their smoke mode (tiny model, a few steps, generated text, 2 ranks) and
write every result file with the promised columns and every figure; each
script fails with a clear message and a non-zero exit on a missing corpus,
a missing base checkpoint and an MPI launch failure; run-shaped refuses
without CAP_NET_ADMIN and removes its namespace when interrupted; the
Spearman helper agrees with the textbook formula.

The smoke numbers themselves mean nothing (8 steps of a 35k-parameter
model); what is checked is that the scripts cannot silently rot. Runs in a
temporary output root; takes about a minute on 2 cores.
"""
import csv
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("IGRAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
EXP = os.path.join(SOURCE_DIR, "experiments")
IGRAD = os.environ.get("IGRAD_CLI") or os.path.join(SOURCE_DIR, "build", "igrad")
RUN_SHAPED = os.path.join(EXP, "netem", "run-shaped")

sys.path.insert(0, EXP)
import common  # noqa: E402

# The columns each output file must have, spelled out here (not imported
# from the scripts) so a change to a script's output shows up as a failure.
FILES = {
    "rq1_workload_stability": {
        "profiles.csv": "profile,group,data,seed,window,layer,kind,numel,mean_activity,magnitude,"
                        "persistence,score,important,tau",
        "profile_summary.csv": "profile,group,data,seed,window,tau,n_important,n_components,"
                               "imp_budget_share,important",
        "pairs.csv": "group,a,b,jaccard,topk_overlap,k,spearman,abs_dtau,n_imp_a,n_imp_b",
        "runs.csv": "label,method,run_dir",
        "png": ["heatmaps.png", "scores.png", "stability.png"],
    },
    "rq2_partition_ablation": {
        "results.csv": "config,partition,seed,n_important,n_components,tau,f_imp,val_loss,val_ppl,"
                       "val_acc,payload_bytes_per_step,ratio_to_adtopk_sync,ratio_to_topk_sync,"
                       "sync_ms,comm_ms,step_ms,tokens_per_s",
        "runs.csv": "label,method,run_dir",
        "png": ["quality_traffic.png"],
    },
    "rq3_release_frequency": {
        "results.csv": "config,release_period,residual,seed,f_imp,val_loss,val_ppl,val_acc,"
                       "payload_bytes_per_step,ratio_to_adtopk_sync,sync_ms,comm_ms,step_ms,"
                       "tokens_per_s",
        "runs.csv": "label,method,run_dir",
        "png": ["quality_traffic.png"],
    },
    "rq4_packing_ablation": {
        "results.csv": "config,pack,seed,buckets,f_imp,imbalance_median,imbalance_max,cv_median,"
                       "overflow_per_step,payload_bytes_per_step,select_ms,pack_ms,comm_ms,"
                       "unpack_ms,"
                       "sync_ms,step_ms,tokens_per_s,val_loss",
        "runs.csv": "label,method,run_dir",
        "png": ["packing.png"],
    },
    "rq5_adtopk_e2e": {
        "results.csv": "method,seed,f_imp,val_loss,val_ppl,val_acc,payload_bytes_per_step,"
                       "wire_bytes_per_step,ratio_to_topk_sync,ratio_to_own_sync,select_ms,"
                       "comm_ms,sync_ms,step_ms,overhead_share,tokens_per_s",
        "task.csv": "method,seed,f_imp,val_loss,task_accuracy,task_problems,"
                    "payload_bytes_per_step,ratio_to_own_sync,val_loss_ratio_to_own_sync,"
                    "task_accuracy_diff_to_own_sync",
        "net.csv": "link,method,steps,f_imp,payload_bytes_per_step,wire_bytes_per_step,comm_ms,"
                   "sync_ms,step_ms,tokens_per_s",
        "speedup.csv": "link,f_imp,ig_payload_ratio_to_topk_sync,ig_step_speedup_vs_topk_sync,"
                       "ig_step_speedup_vs_dense,ig_sync_speedup_vs_topk_sync,"
                       "ig_sync_speedup_vs_dense,ig_sync_ratio_to_topk_sync",
        "runs.csv": "label,method,run_dir",
        "png": ["curves.png", "network.png"],
    },
}
FILES["frontier"] = {
    "screen.csv": "workload,size,partition,release_keep,release_period,n_important,n_components,"
                  "f_imp,model_ratio,payload_ratio,trained",
    "results.csv": "workload,size,config,partition,release_keep,release_period,seed,f_imp,"
                   "val_loss,ref_val_loss,val_loss_ratio,task_accuracy,payload_bytes_per_step,"
                   "payload_ratio",
    "summary.csv": "workload,size,config,seeds,f_imp,release_keep,model_ratio,payload_ratio,"
                   "val_loss_mean,val_loss_std,val_loss_ratio_mean,val_loss_ratio_min,"
                   "val_loss_ratio_max,met",
    "runs.csv": "label,method,run_dir",
    "png": ["frontier.png"],
}
# Rows each results table must hold in smoke mode (one seed).
ROWS = {("rq2_partition_ablation", "results.csv"): 8,    # 2 references + 6 partitions
        ("rq3_release_frequency", "results.csv"): 14,    # adtopk_sync + 3 remedies + 5 R x 2
        ("rq4_packing_ablation", "results.csv"): 6,      # iad + 5 policies
        ("rq5_adtopk_e2e", "results.csv"): 5,            # 5 methods
        ("rq5_adtopk_e2e", "task.csv"): 5,               # 5 methods on the task
        ("frontier", "screen.csv"): 4,                   # 2 workloads x 2 grid points
        ("frontier", "results.csv"): 6}                  # 2 workloads x (2 points + 1 target)


def have_mpirun():
    return shutil.which("mpirun") is not None


def script(rq):
    return os.path.join(EXP, rq, "run.py")


class Smoke(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="igrad-exp-smoke.")
        cls.env = dict(os.environ, IGRAD=IGRAD, IGRAD_EXP_RUNS=os.path.join(cls.tmp, "runs"),
                       IGRAD_EXP_MODE="smoke")
        for k in ("IGRAD_EXP_BASE", "IGRAD_EXP_MPIRUN", "IGRAD_EXP_STEPS", "IGRAD_EXP_SEEDS",
                  "IGRAD_EXP_RANKS", "IGRAD_EXP_SIZE", "IGRAD_EXP_WORKLOADS"):
            cls.env.pop(k, None)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def run_script(self, rq, *args, env=None, timeout=600):
        p = subprocess.run([sys.executable, script(rq), *args], env=env or self.env,
                           capture_output=True, text=True, timeout=timeout, cwd=self.tmp)
        return p

    @unittest.skipUnless(have_mpirun(), "mpirun not found")
    def test_1_all_scripts_write_their_files(self):
        for rq, files in FILES.items():
            with self.subTest(rq=rq):
                p = self.run_script(rq)
                self.assertEqual(p.returncode, 0, f"{rq} failed:\n{p.stdout}\n{p.stderr}")
                out = os.path.join(self.tmp, "runs", rq + "-smoke")
                for name, header in files.items():
                    if name == "png":
                        continue
                    with open(os.path.join(out, name), newline="") as f:
                        rows = list(csv.reader(f))
                    self.assertEqual(",".join(rows[0]), header, f"{rq}/{name} header")
                    self.assertGreater(len(rows), 1, f"{rq}/{name} has no rows")
                    for r in rows[1:]:
                        self.assertEqual(len(r), len(rows[0]), f"{rq}/{name} row {r}")
                    want = ROWS.get((rq, name))
                    if want is not None:
                        self.assertEqual(len(rows) - 1, want, f"{rq}/{name} rows")
                for png in files["png"]:
                    path = os.path.join(out, png)
                    self.assertTrue(os.path.isfile(path), f"{rq}: {png} not written")
                    with open(path, "rb") as f:
                        self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n", f"{rq}/{png} not a PNG")
                    self.assertGreater(os.path.getsize(path), 2000, f"{rq}/{png} too small")
                with open(os.path.join(out, "summary.md")) as f:
                    md = f.read()
                self.assertIn("Mode `smoke`", md)
                self.assertIn("| ", md, f"{rq}/summary.md has no table")
                # every run the script names exists and finished
                for r in common.read_csv(os.path.join(out, "runs.csv")):
                    s = os.path.join(out, r["run_dir"], "summary.json")
                    self.assertTrue(os.path.isfile(s), f"{rq}: {s} missing")
        self.check_values()

    def check_values(self):
        root = os.path.join(self.tmp, "runs")
        rq5 = common.read_csv(os.path.join(root, "rq5_adtopk_e2e-smoke", "results.csv"))
        self.assertEqual([r["method"] for r in rq5], ["dense", "topk_sync", "adtopk_sync", "iad", "ig"])
        by = {r["method"]: r for r in rq5}
        # f_imp beside every traffic ratio of a profiled method, none for the others
        for m in ("iad", "ig"):
            f = float(by[m]["f_imp"])
            self.assertTrue(0 < f <= 1, f"{m} f_imp {f}")
        self.assertEqual(by["dense"]["f_imp"], "")
        self.assertEqual(float(by["topk_sync"]["ratio_to_topk_sync"]), 1.0)
        self.assertEqual(float(by["adtopk_sync"]["ratio_to_own_sync"]), 1.0)
        self.assertLess(float(by["ig"]["ratio_to_own_sync"]), 1.0, by["ig"])
        # the task leg: an exact-match accuracy per method, paired to its *_sync
        task = {r["method"]: r for r in common.read_csv(
            os.path.join(root, "rq5_adtopk_e2e-smoke", "task.csv"))}
        self.assertEqual(list(task), ["dense", "topk_sync", "adtopk_sync", "iad", "ig"])
        for m, r in task.items():
            self.assertTrue(0.0 <= float(r["task_accuracy"]) <= 1.0, r)
            self.assertEqual(int(r["task_problems"]), 20, r)
        self.assertEqual(float(task["adtopk_sync"]["task_accuracy_diff_to_own_sync"]), 0.0)
        self.assertEqual(task["dense"]["ratio_to_own_sync"], "")
        self.assertLess(float(task["ig"]["ratio_to_own_sync"]), 1.0, task["ig"])
        # the shared-memory rows are always in net.csv; shaped ones when allowed
        net = common.read_csv(os.path.join(root, "rq5_adtopk_e2e-smoke", "net.csv"))
        self.assertEqual([r["method"] for r in net if r["link"] == "shm"],
                         ["dense", "topk_sync", "adtopk_sync", "iad", "ig"])
        # RQ3: R = 4 with the residual kept is the same run as RQ2's knee row
        rq2 = {r["config"]: r for r in common.read_csv(
            os.path.join(root, "rq2_partition_ablation-smoke", "results.csv"))}
        rq3 = {r["config"]: r for r in common.read_csv(
            os.path.join(root, "rq3_release_frequency-smoke", "results.csv"))}
        self.assertEqual(rq2["ig knee"]["val_loss"], rq3["ig R=4 on"]["val_loss"])
        self.assertEqual(rq2["ig knee"]["payload_bytes_per_step"],
                         rq3["ig R=4 on"]["payload_bytes_per_step"])
        # RQ4: packing never changes what is sent
        rq4 = common.read_csv(os.path.join(root, "rq4_packing_ablation-smoke", "results.csv"))
        self.assertEqual(len({r["val_loss"] for r in rq4 if r["pack"]}), 1, rq4)
        # RQ1: pair metrics in range, and Jaccard 1 for a profile with itself is
        # not listed (pairs are distinct)
        for r in common.read_csv(os.path.join(root, "rq1_workload_stability-smoke", "pairs.csv")):
            self.assertNotEqual(r["a"], r["b"])
            self.assertTrue(0 <= float(r["jaccard"]) <= 1, r)
            self.assertTrue(0 <= float(r["topk_overlap"]) <= 1, r)

    # ---- clear failures ----
    def fresh_env(self, **kw):
        env = dict(self.env, IGRAD_EXP_RUNS=tempfile.mkdtemp(dir=self.tmp))
        env.update(kw)
        return env

    def assertFails(self, p, *needles):
        self.assertNotEqual(p.returncode, 0, p.stdout + p.stderr)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertNotIn("Traceback", p.stderr)
        for n in needles:
            self.assertIn(n, p.stderr)

    def test_2_missing_corpus(self):
        empty = tempfile.mkdtemp(dir=self.tmp)
        env = self.fresh_env(IGRAD_DATA_DIR=empty)
        p = self.run_script("rq1_workload_stability", "--workload", "brown:news",
                            "--workload", "kjv:", env=env)
        self.assertFails(p, "corpus for --data brown:news not found", "scripts/fetch-corpus brown")
        p = self.run_script("rq5_adtopk_e2e", "--data", "kjv:", env=env)
        self.assertFails(p, "corpus for --data kjv: not found", "scripts/fetch-corpus kjv")

    def test_3_missing_base(self):
        p = self.run_script("rq2_partition_ablation", "--base", "/nonexistent/checkpoint",
                            env=self.fresh_env())
        self.assertFails(p, "base checkpoint /nonexistent/checkpoint not found")
        p = self.run_script("rq4_packing_ablation", env=self.fresh_env(IGRAD_EXP_BASE=self.tmp))
        self.assertFails(p, "base checkpoint", "missing config.json, model.safetensors")

    def test_4_mpi_launch_failure(self):
        p = self.run_script("rq3_release_frequency", "--mpirun", "/nonexistent/mpirun",
                            env=self.fresh_env())
        self.assertFails(p, "cannot launch MPI", "'/nonexistent/mpirun' not found")
        fake = os.path.join(self.tmp, "fake-mpirun")
        with open(fake, "w") as f:
            f.write("#!/bin/sh\necho 'fake mpirun: no slots' >&2\nexit 1\n")
        os.chmod(fake, 0o755)
        p = self.run_script("rq4_packing_ablation", env=self.fresh_env(IGRAD_EXP_MPIRUN=fake))
        self.assertFails(p, "MPI launch failed", "fake mpirun: no slots")

    def test_5_bad_usage(self):
        p = self.run_script("rq3_release_frequency", "--periods", "0,4", env=self.fresh_env())
        self.assertFails(p, "--periods: every R must be at least 1")
        p = self.run_script("rq2_partition_ablation", env=self.fresh_env(IGRAD_EXP_MODE="huge"))
        self.assertFails(p, "IGRAD_EXP_MODE='huge'")

    # ---- run-shaped ----
    @unittest.skipUnless(shutil.which("capsh"), "capsh not found")
    def test_6_run_shaped_refuses_without_cap_net_admin(self):
        p = subprocess.run(["capsh", "--drop=cap_net_admin", "--", "-c", f"{RUN_SHAPED} --check"],
                           capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 3, p.stdout + p.stderr)
        self.assertIn("cannot shape the network here", p.stderr)
        self.assertIn("CAP_NET_ADMIN", p.stderr)

    @unittest.skipUnless(have_mpirun(), "mpirun not found")
    def test_7_run_shaped_cleans_up_on_interrupt(self):
        if subprocess.run([RUN_SHAPED, "--check"], capture_output=True).returncode != 0:
            self.skipTest("no privileges to shape the network here")
        p = subprocess.Popen([RUN_SHAPED, "--rate", "1gbit", "--", "-np", "1", "sleep", "60"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        ns = f"igrad-shaped-{p.pid}"
        listed = lambda: ns in subprocess.run(["ip", "netns", "list"], capture_output=True,  # noqa
                                              text=True).stdout.split()
        for _ in range(100):
            if listed():
                break
            time.sleep(0.1)
        self.assertTrue(listed(), f"namespace {ns} never appeared")
        time.sleep(1)  # let mpirun start the job inside it
        p.send_signal(signal.SIGTERM)
        try:
            out, err = p.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            self.fail("run-shaped did not stop within 20 s of SIGTERM")
        self.assertEqual(p.returncode, 143, err)
        self.assertFalse(listed(), f"namespace {ns} left behind")

    # ---- helpers ----
    def test_8_spearman_matches_the_formula(self):
        rng = random.Random(7)
        for n in (2, 5, 24, 40):
            xs = rng.sample(range(1000), n)   # distinct values: no ties
            ys = rng.sample(range(1000), n)
            rx = {v: i for i, v in enumerate(sorted(xs))}
            ry = {v: i for i, v in enumerate(sorted(ys))}
            d2 = sum((rx[x] - ry[y]) ** 2 for x, y in zip(xs, ys))
            want = 1 - 6 * d2 / (n * (n * n - 1))
            self.assertAlmostEqual(common.spearman(xs, ys), want, places=12, msg=f"n={n}")
        # ties take their average rank: ranks of [1, 2, 2, 3] are 1, 2.5, 2.5, 4
        self.assertEqual(common.ranks_avg([1, 2, 2, 3]), [1, 2.5, 2.5, 4])
        self.assertAlmostEqual(common.spearman([1, 2, 3, 4], [8, 6, 4, 2]), -1.0, places=12)


if __name__ == "__main__":
    unittest_main.main(verbosity=2)
