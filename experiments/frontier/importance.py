#!/usr/bin/python3
"""importance.py — does the online profile follow the data?

For each workload and seed, from the demo's base: one `igrad train
--method ig --profile auto` run that stops one step after the switch (the
demo's post-train settings, 2 ranks), with rank 0's trace. From each run's
profile.json (the scores the engine used: every rank's selections summed)
and summary.json (the payload target's fit: tau, f_imp, planned ratio) it
tabulates per component the mean activity a_c (= sqrt(sum of retained
v^2 / numel), the trace's normalized activity), the unnormalized
sqrt(sum of retained v^2) (a_c * sqrt(numel)), magnitude, persistence,
score, rank and the chosen set; across workloads the rank correlations
(Spearman, Kendall) of the score, of a_c and of the unnormalized activity,
and how much of log a_c's variance lies between components (structure)
and how much between workloads for the same component (data).

Outputs: OUT/importance.json and OUT/importance.md (tables), the runs
under OUT/runs/<workload>/seed<S>.
Usage: /usr/bin/python3 experiments/frontier/importance.py
       [--base runs/demo/base/checkpoint] [--workloads W,W] [--seeds S,S]
       [--out runs/importance] [--igrad build/igrad] [--ranks 2]
       [--profile-steps 30] [--extra "flags for igrad train"]
"""
import argparse
import itertools
import json
import math
import os
import shlex
import subprocess
import sys

from scipy import stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKLOADS = "brown:news,fortunes:,lodash:,task:recall:size=1:test=200"
# scripts/demo's post-train settings (text and task legs)
POST = ["--val-fraction", "0.1", "--lr", "1e-3", "--min-lr", "1e-4", "--warmup", "10",
        "--eval-batches", "8", "--density", "0.01", "--seq-len", "64", "--batch", "16",
        "--threads", "1", "--progress", "none"]
TASK = ["--response-only", "--lr", "3e-3", "--min-lr", "1e-4", "--warmup", "10",
        "--eval-batches", "8", "--density", "0.01", "--seq-len", "128", "--batch", "8",
        "--threads", "1", "--progress", "none"]


def label(w):
    return w.split(":")[0] + ("-" + w.split(":")[1] if w.split(":")[1] else "")


def comp_name(c):
    return c["kind"] if c["layer"] < 0 else f"{c['layer']}.{c['kind']}"


def run_one(a, w, seed):
    d = os.path.join(a.out, "runs", label(w), f"seed{seed}")
    if os.path.exists(os.path.join(d, "summary.json")) and \
            os.path.exists(os.path.join(d, "profile.json")):
        return d
    os.makedirs(d, exist_ok=True)
    steps = a.profile_steps + 1
    cmd = ["nice", "-n", "10", "mpirun", "--oversubscribe", "--bind-to", "none", "-np",
           str(a.ranks), a.igrad, "train", "--init", a.base, "--data", w,
           *(TASK if w.startswith("task:") else POST), "--method", "ig", "--profile", "auto",
           "--profile-steps", str(a.profile_steps), "--steps", str(steps), "--eval-every", "0",
           "--seed", str(seed), "--trace", os.path.join(d, "trace.csv"), "--out", d,
           *shlex.split(a.extra)]
    print("+", " ".join(shlex.quote(x) for x in cmd), file=sys.stderr, flush=True)
    with open(os.path.join(d, "cmd.txt"), "w") as f:
        f.write(" ".join(shlex.quote(x) for x in cmd) + "\n")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
    return d


def read_run(d):
    with open(os.path.join(d, "profile.json")) as f:
        prof = json.load(f)
    with open(os.path.join(d, "summary.json")) as f:
        summ = json.load(f)
    tgt = summ.get("sync", {}).get("target") or summ.get("target") or {}
    tau = tgt.get("tau", prof["tau"])
    comps = []
    for c in prof["components"]:
        comps.append({
            "name": comp_name(c), "numel": c["numel"], "a": c["mean_activity"],
            "raw": c["mean_activity"] * math.sqrt(c["numel"]), "magnitude": c["magnitude"],
            "persistence": c["persistence"], "score": c["score"],
            "chosen": c["score"] >= tau,
        })
    order = sorted(range(len(comps)), key=lambda i: -comps[i]["score"])
    for r, i in enumerate(order):
        comps[i]["rank"] = r + 1
    return {"components": comps, "tau": tau, "f_imp": tgt.get("f_imp"),
            "planned_ratio": tgt.get("planned_ratio"), "n_important": tgt.get("n_important"),
            "alpha": prof["alpha"]}


def corr(x, y):
    s = stats.spearmanr(x, y).correlation
    k = stats.kendalltau(x, y).correlation
    return round(float(s), 4), round(float(k), 4)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default=os.path.join(REPO, "runs/demo/base/checkpoint"))
    ap.add_argument("--workloads", default=WORKLOADS)
    ap.add_argument("--seeds", default="1337")
    ap.add_argument("--out", default=os.path.join(REPO, "runs/importance"))
    ap.add_argument("--igrad", default=os.path.join(REPO, "build/igrad"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--profile-steps", type=int, default=30)
    ap.add_argument("--extra", default="", help="more flags for igrad train")
    a = ap.parse_args()
    workloads = [w for w in a.workloads.split(",") if w]
    seeds = [int(s) for s in a.seeds.split(",") if s]
    if not os.path.exists(os.path.join(a.base, "train_state.json")):
        sys.exit(f"importance: no base at {a.base} (scripts/demo's first stage makes it)")

    res = {"workloads": workloads, "seeds": seeds, "runs": {}}
    for w, s in itertools.product(workloads, seeds):
        res["runs"][f"{w}|{s}"] = read_run(run_one(a, w, s))
    names = [c["name"] for c in res["runs"][f"{workloads[0]}|{seeds[0]}"]["components"]]

    # per workload: means over seeds
    per = {}
    for w in workloads:
        rs = [res["runs"][f"{w}|{s}"] for s in seeds]
        per[w] = {k: [sum(r["components"][i][k] for r in rs) / len(rs) for i in range(len(names))]
                  for k in ("a", "raw", "score", "persistence", "magnitude")}
        per[w]["sets"] = [sorted(c["name"] for c in r["components"] if c["chosen"]) for r in rs]
        per[w]["f_imp"] = [r["f_imp"] for r in rs]
        per[w]["planned_ratio"] = [r["planned_ratio"] for r in rs]
    res["per_workload"] = per
    pairs = {}
    for w1, w2 in itertools.combinations(workloads, 2):
        pairs[f"{w1} vs {w2}"] = {k: corr(per[w1][k], per[w2][k]) for k in ("score", "a", "raw")}
    res["pairs"] = pairs
    # seed-to-seed within a workload, for scale
    within = {}
    for w in workloads:
        for s1, s2 in itertools.combinations(seeds, 2):
            c1 = res["runs"][f"{w}|{s1}"]["components"]
            c2 = res["runs"][f"{w}|{s2}"]["components"]
            within[f"{w} {s1} vs {s2}"] = {
                k: corr([c[k] for c in c1], [c[k] for c in c2]) for k in ("score", "a")}
    res["within"] = within
    # variance of log a: between components vs between workloads
    la = {w: [math.log(x) for x in per[w]["a"]] for w in workloads}
    n, m = len(names), len(workloads)
    grand = sum(sum(v) for v in la.values()) / (n * m)
    comp_mean = [sum(la[w][i] for w in workloads) / m for i in range(n)]
    between = sum((cm - grand) ** 2 for cm in comp_mean) / n
    inside = sum((la[w][i] - comp_mean[i]) ** 2 for w in workloads for i in range(n)) / (n * m)
    res["log_a_variance"] = {"between_components": between, "across_workloads": inside}
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "importance.json"), "w") as f:
        json.dump(res, f, indent=1)

    md = ["| component | numel | " + " | ".join(
        f"{label(w)}: a_c, score (rank)" for w in workloads) + " |",
          "|---|---|" + "---|" * len(workloads)]
    r0 = res["runs"][f"{workloads[0]}|{seeds[0]}"]["components"]
    for i, nm in enumerate(names):
        cells = []
        for w in workloads:
            c = res["runs"][f"{w}|{seeds[0]}"]["components"][i]
            cells.append(f"{c['a']:.3g}, {c['score']:.3f} ({c['rank']})" +
                         (" **in**" if c["chosen"] else ""))
        md.append(f"| {nm} | {r0[i]['numel']} | " + " | ".join(cells) + " |")
    md.append("")
    md.append("| workload | seed | set (n) | f_imp | planned ratio |")
    md.append("|---|---|---|---|---|")
    for w, s in itertools.product(workloads, seeds):
        r = res["runs"][f"{w}|{s}"]
        st = [c["name"] for c in r["components"] if c["chosen"]]
        md.append(f"| {w} | {s} | {' '.join(st)} ({len(st)}) | {r['f_imp']:.4f} | "
                  f"{r['planned_ratio']:.4f} |")
    md.append("")
    md.append("| pair | Spearman / Kendall: score | a_c | sqrt(sum v^2) |")
    md.append("|---|---|---|---|")
    for k, v in {**pairs, **within}.items():
        md.append(f"| {k} | {v['score'][0]} / {v['score'][1]} | {v['a'][0]} / {v['a'][1]} | " +
                  (f"{v['raw'][0]} / {v['raw'][1]} |" if "raw" in v else "|"))
    md.append("")
    md.append(f"variance of log a_c: between components {between:.4f}, across workloads "
              f"(same component) {inside:.4f}")
    with open(os.path.join(a.out, "importance.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
