#!/usr/bin/env python3
"""paired/run.py — rows x seeds of `igrad train` post-training `make demo`'s
base, one Markdown table of final validation loss paired by seed (ratio to a
reference row at the same seed), payload per step and, for task workloads,
exact-match accuracy. The presets are the studies in docs/results/:

  remedies         remedies.md "Results" (seq 128, 120 steps, 2 ranks):
                   dense, adtopk_sync with AdamW beta1 0.9 / 0, DGC momentum
  remedies-update  remedies.md "Error feedback on the update" (seq 64)
  deferral         deferral.md (seq 64, the demo's post-training shape)
  task             task.md "Commands" (task:mix:size=1, response only)
  task-probe       task.md "Which kind is learnable" (dense, lr 3e-3, 240 steps)

  python3 experiments/paired/run.py PRESET [--seeds 1337,7,42] [--out runs/paired]
      [--ranks 2] [--base runs/demo/base/checkpoint] [--list]

Needs runs/demo/base/checkpoint (`make demo`), build/igrad and mpirun.
Finished runs (OUT/PRESET/ROW/seedS/summary.json) are reused; the table goes
to stdout and OUT/PRESET/summary.md.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IGRAD = os.path.join(REPO, "build", "igrad")

POST = ("--data brown:news --val-fraction 0.1 --lr 1e-3 --min-lr 1e-4 --warmup 10 "
        "--eval-batches 8 --density 0.01 --batch 16 --threads 1 --progress quiet --steps 120")
TASK = ("--data task:mix:size=1:test=200 --response-only --seq-len 128 --batch 16 --lr 1e-3 "
        "--min-lr 1e-4 --warmup 10 --steps 120 --eval-every 40 --threads 1 --progress quiet")
PROBE = ("--response-only --batch 16 --seq-len 128 --lr 3e-3 --min-lr 1e-4 --warmup 10 "
         "--steps 240 --eval-every 60 --method dense --threads 1 --progress quiet")

# preset: (common arguments, default seeds, reference row, [(row, arguments)])
PRESETS = {
    "remedies": (POST + " --seq-len 128 --eval-every 0", "1337,7,42", "dense", [
        ("dense", "--method dense"),
        ("adtopk beta1 0.9", "--method adtopk_sync --beta1 0.9"),
        ("adtopk beta1 0", "--method adtopk_sync --beta1 0"),
        ("adtopk DGC 0.9, beta1 0", "--method adtopk_sync --beta1 0 --momentum 0.9"),
    ]),
    "remedies-update": (POST + " --seq-len 64 --eval-every 30", "1337,7,42", "dense", [
        ("dense", "--method dense"),
        ("adtopk_sync", "--method adtopk_sync"),
        ("EF on update, beta1 0.9", "--method adtopk_sync --ef-on update --beta1 0.9"),
        ("EF on update, beta1 0", "--method adtopk_sync --ef-on update --beta1 0"),
        ("dense, local AdamW updates averaged", "--method dense --ef-on update"),
    ]),
    "deferral": (POST + " --seq-len 64 --eval-every 30", "1337,7,42", "adtopk_sync", [
        ("dense", "--method dense"),
        ("adtopk_sync", "--method adtopk_sync"),
        ("adtopk_sync, no clip", "--method adtopk_sync --clip 0"),
        ("topk_sync", "--method topk_sync"),
        ("topk_sync at ig's bytes", "--method topk_sync --density 0.0019"),
        ("ig (R 4, target 0.25)", "--method ig --profile auto"),
        ("ig, R 2", "--method ig --profile auto --release-period 2"),
        ("ig, R 8", "--method ig --profile auto --release-period 8"),
        ("ig, target 0.5", "--method ig --profile auto --target-ratio 0.5"),
    ]),
    "task": (TASK, "1337,7", "dense", [
        ("dense", "--method dense"),
        ("adtopk_sync beta1 0", "--method adtopk_sync --density 0.01 --beta1 0"),
    ]),
    "task-probe": (PROBE, "1337", "recall", [
        ("recall", "--data task:recall:size=1:test=200"),
        ("copy", "--data task:copy:size=1:test=200"),
    ]),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset", nargs="?", choices=sorted(PRESETS))
    ap.add_argument("--seeds", default=None, help="comma-separated (default: the preset's)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--base", default=os.path.join(REPO, "runs", "demo", "base", "checkpoint"))
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "paired"))
    ap.add_argument("--list", action="store_true", help="print every preset's commands and exit")
    a = ap.parse_args()
    if a.list or a.preset is None:
        for name in sorted(PRESETS):
            common, seeds, ref, rows = PRESETS[name]
            print("%s (seeds %s, ratios to %s):" % (name, seeds, ref))
            for row, args in rows:
                print("  %-40s igrad train --init BASE %s %s --seed S" % (row, common, args))
        return 0
    common, seeds, ref, rows = PRESETS[a.preset]
    seeds = [int(s) for s in (a.seeds or seeds).split(",")]
    if not os.path.exists(os.path.join(a.base, "model.safetensors")):
        sys.exit("paired: no base checkpoint at %s (run `make demo` first)" % a.base)
    if not os.access(IGRAD, os.X_OK):
        sys.exit("paired: %s is missing (run `make`)" % IGRAD)
    mpi = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(a.ranks)]
    if os.geteuid() == 0:
        mpi.insert(1, "--allow-run-as-root")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    blas = subprocess.run([os.path.join(REPO, "scripts", "blas-env")], capture_output=True, text=True)
    if blas.returncode == 0 and blas.stdout.strip():
        env["OPENBLAS_CORETYPE"] = blas.stdout.strip()
    root, t0, res = os.path.join(a.out, a.preset), time.time(), {}
    for row, args in rows:
        for seed in seeds:
            out = os.path.join(root, row.replace(" ", "_").replace(",", "").replace("'", ""),
                               "seed%d" % seed)
            summary = os.path.join(out, "summary.json")
            if not os.path.exists(summary):
                print("[%5.0fs] %s seed %d" % (time.time() - t0, row, seed), flush=True)
                os.makedirs(out, exist_ok=True)
                cmd = (mpi + [IGRAD, "train", "--init", a.base] + shlex.split(common) +
                       shlex.split(args) + ["--seed", str(seed), "--out", out])
                with open(out + ".log", "w") as f:
                    r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env=env)
                if r.returncode:
                    sys.exit("paired: %s seed %d failed, see %s.log" % (row, seed, out))
                subprocess.run(["rm", "-rf", os.path.join(out, "checkpoint")])
            with open(summary) as f:
                s = json.load(f)
            res[row, seed] = (s["final"]["val_loss"], s.get("payload_bytes_per_step"),
                              s.get("task_accuracy"))
    head = ["row", "arguments", "val loss per seed", "/ %s per seed" % ref, "mean ratio",
            "payload / %s" % ref]
    if a.preset.startswith("task"):
        head.append("task accuracy per seed")
    lines = ["# `%s`: final validation loss paired by seed" % a.preset, "",
             "`python3 experiments/paired/run.py %s --seeds %s` (%d ranks, base %s)." %
             (a.preset, ",".join(map(str, seeds)), a.ranks, os.path.relpath(a.base, REPO)), "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row, args in rows:
        vl = [res[row, s][0] for s in seeds]
        ratio = [res[row, s][0] / res[ref, s][0] for s in seeds]
        pay = res[row, seeds[0]][1] / res[ref, seeds[0]][1] if res[ref, seeds[0]][1] else float("nan")
        cells = [row, "`%s`" % args, " / ".join("%.4f" % v for v in vl),
                 " / ".join("%.4f" % r for r in ratio), "%.4f" % (sum(ratio) / len(ratio)),
                 "%.3f" % pay]
        if a.preset.startswith("task"):
            cells.append(" / ".join("%.3f" % (res[row, s][2] or 0) for s in seeds))
        lines.append("| " + " | ".join(cells) + " |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(root, "summary.md"), "w") as f:
        f.write(text)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
