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
        "--threads", "1", "--progress", "quiet"]
TASK = ["--response-only", "--lr", "3e-3", "--min-lr", "1e-4", "--warmup", "10",
        "--eval-batches", "8", "--density", "0.01", "--seq-len", "128", "--batch", "8",
        "--threads", "1", "--progress", "quiet"]


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
    tgt = summ["config"]["sync"].get("target") or {}
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
            "target_ratio": tgt.get("ratio"), "release_keep": tgt.get("release_keep"),
            "alpha": prof["alpha"]}


def read_trace(path):
    """Rank 0's trace: {(layer, kind): [(raw, d, numel, retained) per step]}."""
    rows = {}
    with open(path) as f:
        for line in f:
            if line.startswith("#") or line.startswith("step,"):
                continue
            step, layer, kind, raw, d, numel, ret = line.strip().split(",")
            rows.setdefault((int(layer), kind), []).append(
                (float(raw), float(d), int(numel), int(ret)))
    return rows


def score_of(per_step, alpha):
    """profile.c's score of per-step activities {comp: [a_s]}: alpha times
    the min-max normalized mean plus (1 - alpha) times the share of steps
    above the per-step median over components."""
    names = list(per_step)
    ns = len(per_step[names[0]])
    mean = {c: sum(v) / ns for c, v in per_step.items()}
    lo, hi = min(mean.values()), max(mean.values())
    above = dict.fromkeys(names, 0)
    for s in range(ns):
        col = sorted(per_step[c][s] for c in names)
        n = len(col)
        med = col[n // 2] if n % 2 else 0.5 * (col[n // 2 - 1] + col[n // 2])
        for c in names:
            above[c] += per_step[c][s] > med
    return {c: alpha * ((mean[c] - lo) / (hi - lo) if hi > lo else 1.0) +
            (1 - alpha) * above[c] / ns for c in names}


# Scores of the same trace under other normalizations of a[s,c] (the sum
# of retained v^2 of component c at step s, its numel n and retained count k).
VARIANTS = {
    "sqrt(sum v^2 / n) (today)": lambda raw, d, n, k: d,
    "sqrt(sum v^2) (none)": lambda raw, d, n, k: raw,
    "sqrt(sum v^2 / k) (per retained entry)": lambda raw, d, n, k: raw / math.sqrt(max(k, 1)),
    "sum v^2 / n (energy per entry)": lambda raw, d, n, k: raw * raw / n,
}


def fit_set(scores, numel, f_cap):
    """The largest prefix by score whose numel share is at most f_cap (the
    target fit's rule with bytes approximated by numel); ties are one class."""
    order = sorted(scores, key=lambda c: -scores[c])
    total = sum(numel.values())
    best, used = 0, 0
    for i, c in enumerate(order):
        used += numel[c]
        tie = i + 1 < len(order) and scores[order[i + 1]] == scores[c]
        if used / total <= f_cap and not tie:
            best = i + 1
        elif used / total > f_cap:
            break
    return set(order[:best])


def fit_skip(scores, numel, f_cap):
    """The same cap without the prefix rule: down the score order, every
    component that still fits (a greedy knapsack by score, which is already
    a per-entry density)."""
    order = sorted(scores, key=lambda c: -scores[c])
    total = sum(numel.values())
    chosen, used = set(), 0
    for c in order:
        if (used + numel[c]) / total <= f_cap:
            chosen.add(c)
            used += numel[c]
    return chosen


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
    # centered per workload: the score is invariant to a workload's overall
    # gradient scale (min-max magnitude, median-relative persistence)
    la = {}
    for w in workloads:
        logs = [math.log(x) for x in per[w]["a"]]
        mu = sum(logs) / len(logs)
        la[w] = [x - mu for x in logs]
    n, m = len(names), len(workloads)
    grand = sum(sum(v) for v in la.values()) / (n * m)
    comp_mean = [sum(la[w][i] for w in workloads) / m for i in range(n)]
    between = sum((cm - grand) ** 2 for cm in comp_mean) / n
    inside = sum((la[w][i] - comp_mean[i]) ** 2 for w in workloads for i in range(n)) / (n * m)
    res["log_a_variance"] = {"between_components": between, "across_workloads": inside}

    # the same traces under other normalizations (rank 0's trace, seed 1)
    var = {}
    for w in workloads:
        tr = read_trace(os.path.join(a.out, "runs", label(w), f"seed{seeds[0]}", "trace.csv"))
        r = res["runs"][f"{w}|{seeds[0]}"]
        key = {(c["name"]): c for c in r["components"]}
        numel = {}
        for (layer, kind), v in tr.items():
            numel[kind if layer < 0 else f"{layer}.{kind}"] = v[0][2]
        # the cap the run's own fit met: its f_imp share of numel
        chosen = [n for n in key if key[n]["chosen"]]
        f_cap = sum(numel[n] for n in chosen) / sum(numel.values())
        var[w] = {"f_cap_numel": f_cap}
        for vn, fn in VARIANTS.items():
            per_step = {(k if l < 0 else f"{l}.{k}"): [fn(*x) for x in v]
                        for (l, k), v in tr.items()}
            sc = score_of(per_step, r["alpha"])
            var[w][vn] = {"scores": [sc[n] for n in names],
                          "set": sorted(fit_set(sc, numel, f_cap)),
                          "set_skip": sorted(fit_skip(sc, numel, f_cap))}
        # the cap the target could reach with kappa at its floor: f + k(1 - f) <= X
        x, k = r["target_ratio"], r["release_keep"]
        var[w]["f_cap_target"] = (x - k) / (1 - k)
        sc = dict(zip(names, per[w]["score"]))
        var[w]["set_skip_target"] = sorted(fit_skip(sc, numel, var[w]["f_cap_target"]))
    vpairs = {}
    for vn in VARIANTS:
        for w1, w2 in itertools.combinations(workloads, 2):
            vpairs.setdefault(vn, {})[f"{w1} vs {w2}"] = corr(var[w1][vn]["scores"],
                                                               var[w2][vn]["scores"])
    res["variants"] = var
    res["variant_pairs"] = vpairs
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
    md.append("")
    md.append("Other normalizations of a[s,c], same traces (rank 0, seed "
              f"{seeds[0]}); set: the largest score prefix within the run's own numel share")
    md.append("")
    md.append("| normalization | " + " | ".join(f"{label(w)}: set" for w in workloads) +
              " | Spearman / Kendall of scores, mean over pairs (min) |")
    md.append("|---|" + "---|" * len(workloads) + "---|")
    for vn in VARIANTS:
        ps = list(vpairs.get(vn, {}).values()) or [(float("nan"), float("nan"))]
        sp = sum(p[0] for p in ps) / len(ps)
        kt = sum(p[1] for p in ps) / len(ps)
        md.append(f"| {vn} | " + " | ".join(
            " ".join(var[w][vn]["set"]) + f" ({len(var[w][vn]['set'])})" for w in workloads) +
            f" | {sp:.3f} / {kt:.3f} ({min(p[0] for p in ps):.3f}) |")
    md.append("")
    md.append("Without the prefix rule (today's score, seed-mean): every component that "
              "still fits, down the score order")
    md.append("")
    md.append("| workload | cap: run's numel share | set | cap at kappa's floor "
              "(X - k)/(1 - k) | set |")
    md.append("|---|---|---|---|---|")
    today = next(iter(VARIANTS))
    for w in workloads:
        md.append(f"| {w} | {var[w]['f_cap_numel']:.4f} | "
                  f"{' '.join(var[w][today]['set_skip'])} ({len(var[w][today]['set_skip'])}) | "
                  f"{var[w]['f_cap_target']:.4f} | {' '.join(var[w]['set_skip_target'])} "
                  f"({len(var[w]['set_skip_target'])}) |")
    with open(os.path.join(a.out, "importance.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
