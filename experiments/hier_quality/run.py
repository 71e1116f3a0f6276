#!/usr/bin/env python3
"""hier_quality/run.py — does the two-level sync (config.topology hier)
train as well as the flat one? Post-trains `make demo`'s base on brown:news
with adtopk_sync and ig, flat and hier, on P ranks in nodes of L (default
4 ranks, 2 per node: 2 "nodes" on one machine), for several seeds, and
writes one table of validation loss paired by seed, the payload and sync
time per step (rank 0's), to OUT/summary.{md,json}.

ig gets a profile made from the flat adtopk_sync run's trace of the same
seed (`igrad profile`) and the trainer's default payload target (0.25):
the two-level engine needs its profile at create (no online profiling).

  python3 experiments/hier_quality/run.py [--seeds 1337,7,42] [--steps 120]
      [--ranks 4] [--ranks-per-node 2] [--out runs/hier_quality]

Needs runs/demo/base/checkpoint (`make demo` makes it) and build/igrad.
Every number comes from the runs' own summary.json.
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


def mpirun(np_):
    cmd = ["mpirun", "--oversubscribe", "--bind-to", "none", "-np", str(np_)]
    if os.geteuid() == 0:
        cmd.insert(1, "--allow-run-as-root")
    return cmd


def run(cmd, log):
    with open(log, "w") as f:
        r = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                           restore_signals=False)  # mpirun: SIGPIPE ignored, as common.py
    if r.returncode != 0:
        sys.exit("hier_quality: failed (exit %d): %s\n  see %s" % (r.returncode, " ".join(cmd),
                                                                  log))


def summary(path):
    with open(os.path.join(path, "summary.json")) as f:
        s = json.load(f)
    return {"val_loss": s["final"]["val_loss"], "payload": s["payload_bytes_per_step"],
            "sync_ms": s["sync_ms_per_step"], "wall_s": s["wall_s"]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--ranks-per-node", type=int, default=2)
    ap.add_argument("--base", default=os.path.join(REPO, "runs", "demo", "base", "checkpoint"))
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "hier_quality"))
    ap.add_argument("--reuse", action="store_true",
                    help="keep runs whose summary.json exists (same arguments assumed)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.base, "model.safetensors")):
        sys.exit("hier_quality: no base checkpoint at %s (run `make demo` first)" % a.base)
    if not os.access(IGRAD, os.X_OK):
        sys.exit("hier_quality: %s is not built (run `make`)" % IGRAD)
    seeds = [int(s) for s in a.seeds.split(",")]
    os.makedirs(a.out, exist_ok=True)
    post = ["--init", a.base, "--data", "brown:news", "--val-fraction", "0.1", "--lr", "1e-3",
            "--min-lr", "1e-4", "--warmup", "10", "--eval-batches", "8", "--density", "0.01",
            "--seq-len", "64", "--batch", "16", "--threads", "1", "--progress", "plain",
            "--steps", str(a.steps), "--eval-every", str(a.steps), "--log-every", "40"]
    hier = ["--topology", "hier", "--ranks-per-node", str(a.ranks_per_node)]
    rows, t0 = [], time.time()
    for seed in seeds:
        d = os.path.join(a.out, "seed%d" % seed)
        os.makedirs(d, exist_ok=True)
        trace, prof = os.path.join(d, "trace.csv"), os.path.join(d, "profile.json")
        res = {}
        for method in ("adtopk_sync", "ig"):
            for topo in ("flat", "hier", "hierL"):
                # hierL: density x L, so that a node sends what each flat rank does
                name = "%s-%s" % (method, topo)
                out = os.path.join(d, name)
                extra = hier if topo != "flat" else []
                if topo == "hierL":
                    extra = extra + ["--density", "%g" % (0.01 * a.ranks_per_node)]
                if method == "adtopk_sync" and topo == "flat":
                    extra = ["--trace", trace]
                if method == "ig":
                    extra = extra + ["--profile", prof]
                if a.reuse and os.path.exists(os.path.join(out, "summary.json")):
                    res[name] = summary(out)
                    continue
                print("[%4.0fs] seed %d: %s" % (time.time() - t0, seed, name), flush=True)
                run(mpirun(a.ranks) + [IGRAD, "train"] + post +
                    ["--method", method, "--seed", str(seed), "--out", out] + extra,
                    out + ".log")
                subprocess.run(["rm", "-rf", os.path.join(out, "checkpoint")])
                res[name] = summary(out)
                if name == "adtopk_sync-flat":
                    run([IGRAD, "profile", "--trace", trace, "--out", prof, "--quiet"],
                        os.path.join(d, "profile.log"))
        rows.append({"seed": seed, "runs": res})

    names = ["adtopk_sync-flat", "adtopk_sync-hier", "adtopk_sync-hierL", "ig-flat", "ig-hier",
             "ig-hierL"]
    lines = ["# Two-level sync vs flat: validation loss paired by seed", "",
             "`python3 experiments/hier_quality/run.py --seeds %s --steps %d --ranks %d "
             "--ranks-per-node %d` (post-training `make demo`'s base on brown:news, "
             "16 x 64 tokens per step, density 0.01; ig with a profile from the flat "
             "adtopk_sync run's trace and the default target 0.25; hierL: hier at density "
             "0.01 x L, so that each node sends what each flat rank sends; payload and sync time "
             "are rank 0's medians per step; one 2-core machine, so sync times are not "
             "a network measurement)." % (a.seeds, a.steps, a.ranks, a.ranks_per_node), "",
             "| seed | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for r in rows:
        lines.append("| %d | " % r["seed"] + " | ".join(
            "%.4f" % r["runs"][n]["val_loss"] for n in names) + " |")
    diffs = {}
    lines += ["", "| method | variant − flat val loss per seed | mean | payload/step flat → "
              "variant (rank 0) | sync ms flat → variant |", "|---|---|---|---|---|"]
    for m in ("adtopk_sync", "ig"):
        for v in ("hier", "hierL"):
            dd = [r["runs"][m + "-" + v]["val_loss"] - r["runs"][m + "-flat"]["val_loss"]
                  for r in rows]
            diffs[m + "-" + v] = dd
            pf = statistics.mean(r["runs"][m + "-flat"]["payload"] for r in rows)
            ph = statistics.mean(r["runs"][m + "-" + v]["payload"] for r in rows)
            sf = statistics.mean(r["runs"][m + "-flat"]["sync_ms"] for r in rows)
            sh = statistics.mean(r["runs"][m + "-" + v]["sync_ms"] for r in rows)
            lines.append("| %s %s | %s | %+.4f | %.0f → %.0f B | %.1f → %.1f |" % (
                m, v, ", ".join("%+.4f" % x for x in dd), statistics.mean(dd), pf, ph, sf, sh))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(a.out, "summary.md"), "w") as f:
        f.write(text)
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump({"seeds": seeds, "steps": a.steps, "ranks": a.ranks,
                   "ranks_per_node": a.ranks_per_node, "rows": rows,
                   "hier_minus_flat": diffs}, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
