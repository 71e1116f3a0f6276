#!/usr/bin/env python3
"""dense_below/run.py — what sending small tensors whole (config.dense_below,
issue 13) costs in bytes and gives in validation loss. Post-trains `make
demo`'s base on brown:news as the demo does (2 ranks, 120 steps of 16 x 64
tokens, density 0.01, ig profiling itself online with the default target),
adtopk_sync and ig, with dense_below 0 (off) and N (default 1024: the
model's norms, 256 entries, go whole), for several seeds; one table of
validation loss paired by seed and payload per step, OUT/summary.{md,json}.

  python3 experiments/dense_below/run.py [--seeds 1337,7,42] [--below 1024]
      [--steps 120] [--out runs/dense_below]

Needs runs/demo/base/checkpoint (`make demo`) and build/igrad.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IGRAD = os.path.join(REPO, "build", "igrad")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--below", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--base", default=os.path.join(REPO, "runs", "demo", "base", "checkpoint"))
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "dense_below"))
    ap.add_argument("--size", default=None,
                    help="train this model size from scratch instead of post-training the "
                    "demo's base (another model: e.g. tiny)")
    a = ap.parse_args()
    if a.size is None and not os.path.exists(os.path.join(a.base, "model.safetensors")):
        sys.exit("dense_below: no base checkpoint at %s (run `make demo` first)" % a.base)
    mpi = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(a.ranks)]
    if os.geteuid() == 0:
        mpi.insert(1, "--allow-run-as-root")
    start = ["--size", a.size, "--lr", "3e-3"] if a.size else ["--init", a.base, "--lr", "1e-3"]
    post = start + ["--data", "brown:news", "--val-fraction", "0.1",
            "--min-lr", "1e-4", "--warmup", "10", "--eval-batches", "8", "--density", "0.01",
            "--seq-len", "64", "--batch", "16", "--threads", "1", "--progress", "plain",
            "--steps", str(a.steps), "--eval-every", str(a.steps), "--log-every", "60"]
    seeds = [int(s) for s in a.seeds.split(",")]
    rows, t0 = [], time.time()
    for seed in seeds:
        res = {}
        for m in ("adtopk_sync", "ig"):
            for below in (0, a.below):
                name = "%s-%d" % (m, below)
                out = os.path.join(a.out, "seed%d" % seed, name)
                extra = ["--profile", "auto"] if m == "ig" else []
                extra += ["--dense-below", str(below)]  # 0 too: the default is 64
                if not os.path.exists(os.path.join(out, "summary.json")):
                    print("[%4.0fs] seed %d: %s" % (time.time() - t0, seed, name), flush=True)
                    os.makedirs(out, exist_ok=True)
                    with open(out + ".log", "w") as f:
                        r = subprocess.run(mpi + [IGRAD, "train"] + post +
                                           ["--method", m, "--seed", str(seed), "--out", out] +
                                           extra, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                           restore_signals=False)  # SIGPIPE ignored, as common.py
                    if r.returncode:
                        sys.exit("dense_below: %s seed %d failed, see %s.log" % (name, seed, out))
                    subprocess.run(["rm", "-rf", os.path.join(out, "checkpoint")])
                with open(os.path.join(out, "summary.json")) as f:
                    s = json.load(f)
                res[name] = {"val_loss": s["final"]["val_loss"],
                             "payload": s["payload_bytes_per_step"]}
        rows.append({"seed": seed, "runs": res})
    names = ["adtopk_sync-0", "adtopk_sync-%d" % a.below, "ig-0", "ig-%d" % a.below]
    lines = ["# Small tensors sent whole (`dense_below`): validation loss paired by seed", "",
             "`python3 experiments/dense_below/run.py --seeds %s --below %d --steps %d%s` "
             "(%s on brown:news on %d ranks; "
             "ig with `--profile auto` and the default target 0.25; payload = rank 0's mean "
             "per step)." % (a.seeds, a.below, a.steps, " --size " + a.size if a.size else "",
                             "the %s model from scratch, lr 3e-3" % a.size if a.size else
                             "post-training `make demo`'s base as the demo does", a.ranks), "",
             "| seed | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in rows:
        lines.append("| %d | " % r["seed"] + " | ".join("%.4f" % r["runs"][n]["val_loss"]
                                                     for n in names) + " |")
    lines += ["", "| method | below − off val loss per seed | mean | payload/step off → below |",
              "|---|---|---|---|"]
    diffs = {}
    for m in ("adtopk_sync", "ig"):
        d = [r["runs"]["%s-%d" % (m, a.below)]["val_loss"] - r["runs"][m + "-0"]["val_loss"]
             for r in rows]
        diffs[m] = d
        p0 = statistics.mean(r["runs"][m + "-0"]["payload"] for r in rows)
        p1 = statistics.mean(r["runs"]["%s-%d" % (m, a.below)]["payload"] for r in rows)
        lines.append("| %s | %s | %+.4f | %.0f → %.0f B (%.3fx) |" % (
            m, ", ".join("%+.4f" % x for x in d), statistics.mean(d), p0, p1, p1 / p0))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"seeds": seeds, "below": a.below, "rows": rows, "below_minus_off": diffs},
                  f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
