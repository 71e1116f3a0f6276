#!/usr/bin/python3
"""vs_dense.py — the default sparse methods against dense (issue 27, part 7).

Post-trains the demo's base with `igrad train`'s defaults and the demo's
post-train settings (importance.py's POST / TASK: 2 ranks, 120 steps,
density 1 %, 16 x 64 tokens, lr 1e-3 -> 1e-4, warm-up 10) with `dense`,
`adtopk_sync` and `ig --profile auto --target-ratio 0.25`, per workload
and seed, one run at a time; a run whose summary.json exists is read, not
run again (--run none only reads). Runs that another script made at the
same settings can be reused with --reuse METHOD@W=PREFIX (the runs are
PREFIX-s<seed>/summary.json; the table marks them). The table pairs
by seed: per workload and method, val loss per seed and mean, the mean of
the per-seed ratios to dense and to adtopk_sync, payload bytes per step
(ig with an online profile: after its switch) and, on task workloads,
exact-match accuracy; the whole run's payload (ig's 30 profiling steps
send what adtopk_sync sends) beside it. Writes OUT/vs_dense.md and OUT/vs_dense.json.

Usage: /usr/bin/python3 experiments/frontier/vs_dense.py
       [--out runs/vs_dense] [--workloads lodash:,fortunes:] [--seeds 1337,7,42]
       [--methods dense,adtopk_sync,ig] [--steps 120]
       [--base runs/demo/base/checkpoint] [--igrad build/igrad]
       [--reuse adtopk_sync@fortunes:=runs/importance/skip/adtopk_sync] [--run all|none]
       [--nice 10]
"""
import argparse
import re
import csv
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import importance as I  # noqa: E402

METHODS = {
    "dense": ["--method", "dense"],
    "adtopk_sync": ["--method", "adtopk_sync"],
    "topk_sync": ["--method", "topk_sync"],
    # issue 27's yardstick: adtopk_sync at the settings' 1 % with F32 values
    # whatever the trainer's default value type
    "baseline": ["--method", "adtopk_sync", "--value-dtype", "f32"],
    "ig": ["--method", "ig", "--profile", "auto", "--target-ratio", "0.25"],
    # a probe, not a default: part 7's dense warm-up (30 plain dense steps)
    "adtopk_sync+start30": ["--method", "adtopk_sync", "--start-iter", "30"],
    # probes: a higher density (the last --density given wins over the
    # settings' 0.01)
    "adtopk_sync@rho0.05": ["--method", "adtopk_sync", "--density", "0.05"],
    "adtopk_sync@rho0.2": ["--method", "adtopk_sync", "--density", "0.2"],
}


def method_args(m):
    """A row's flags: METHODS' name, or BASE followed by modifiers — a
    method of METHODS with +startN (N dense warm-up steps, --start-iter N),
    @rhoR (density R: the last --density given wins over the settings'
    0.01), +earlyR:N (density R for the first N steps, then the row's
    density: --early-density R:N) and/or +trX (ig's payload target X,
    --target-ratio X); None if the name is not one."""
    if m in METHODS:
        return METHODS[m]
    mods = re.findall(r"([+@])(start|rho|early|tr)([0-9.:]+)", m)
    base = re.split(r"[+@](?:start|rho|early|tr)", m, maxsplit=1)[0]
    if base not in METHODS or not mods or base + "".join("".join(x) for x in mods) != m:
        return None
    flags = {"start": "--start-iter", "rho": "--density", "early": "--early-density",
             "tr": "--target-ratio"}
    return METHODS[base] + [a for _, k, v in mods for a in (flags[k], v)]


def steady_payload(rd, s):
    """Payload bytes per step after an online profile's switch (before it
    the run sends what adtopk_sync sends); otherwise the run's mean."""
    sw = (s.get("online_profile") or {}).get("switch_step")
    if sw is None:
        return float(s["payload_bytes_per_step"])
    with open(os.path.join(rd, "metrics.csv")) as f:
        after = [float(r["payload_bytes"]) for r in csv.DictReader(f) if int(r["step"]) >= sw]
    return sum(after) / len(after) if after else float(s["payload_bytes_per_step"])


def record(rd, source):
    s = json.load(open(os.path.join(rd, "summary.json")))
    return {"val_loss": s["final"]["val_loss"], "val_acc": s["final"]["val_acc"],
            "task_accuracy": s["final"].get("task_accuracy"),
            "payload_bytes_per_step": steady_payload(rd, s),
            "payload_bytes_per_step_run": float(s["payload_bytes_per_step"]), "steps": s["steps"],
            "complete": s["complete"], "source": source,
            "profile": s["config"].get("profile")}


def mean(v):
    return sum(v) / len(v) if v else None


def fmt(x, f):
    return "–" if x is None else format(x, f)


def parse_reuse(items):
    """--reuse METHOD@W=PATH items as {(W, METHOD): PATH}."""
    reuse = {}
    for r in items:
        key, d = r.rsplit("=", 1)  # a workload may have = in it (task:recall:size=1)
        m, w = key.rsplit("@", 1)  # a method may have @rhoR in its name
        reuse[(w, m)] = d
    return reuse


def collect(a, workloads, methods, seeds, reuse):
    """Runs what is missing (one training at a time, seed outermost: a
    partial set is still paired) and reads every run: {(w, m, seed): record}.
    `a` has out, run, nice, igrad, base and steps."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    runs = {}
    for seed in seeds:
        for w in workloads:
            for m in methods:
                if method_args(m) is None and (w, m) not in reuse:
                    continue  # a name only --reuse gives (e.g. another script's variant)
                if (w, m) in reuse:  # PREFIX-s<seed>, or a path with {seed} in it
                    p = reuse[(w, m)]
                    rd, src = p.format(seed=seed) if "{seed}" in p else f"{p}-s{seed}", "reused"
                else:
                    rd, src = os.path.join(a.out, I.label(w), f"{m}-s{seed}"), "this script"
                done = os.path.exists(os.path.join(rd, "summary.json"))
                if not done and a.run == "all" and src == "this script":
                    cmd = ["nice", "-n", str(a.nice), "mpirun", "--oversubscribe", "--bind-to", "none",
                           "-np", "2", a.igrad, "train", "--init", a.base, "--data", w,
                           *(I.TASK if w.startswith("task:") else I.POST), *method_args(m),
                           "--steps", str(a.steps), "--eval-every", "0", "--seed", str(seed),
                           "--out", rd]
                    print("+", " ".join(cmd), file=sys.stderr, flush=True)
                    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
                    done = True
                if done:
                    runs[(w, m, seed)] = record(rd, src)
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="runs/vs_dense")
    ap.add_argument("--workloads", default="lodash:,fortunes:")
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--methods", default="dense,adtopk_sync,ig")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--base", default="runs/demo/base/checkpoint")
    ap.add_argument("--igrad", default="build/igrad")
    ap.add_argument("--reuse", action="append", default=[],
                    help="METHOD@W=PREFIX: read METHOD's runs on workload W from "
                    "PREFIX-s<seed> (made elsewhere at the same settings), run none")
    ap.add_argument("--run", choices=("all", "none"), default="all")
    ap.add_argument("--nice", type=int, default=10, help="the runs' niceness (10)")
    a = ap.parse_args()
    os.chdir(REPO)  # relative paths, as the runs record them
    seeds = [int(s) for s in a.seeds.split(",") if s]
    workloads = [w for w in a.workloads.split(",") if w]
    methods = [m for m in a.methods.split(",") if m]
    runs = collect(a, workloads, methods, seeds, parse_reuse(a.reuse))
    table(a, workloads, methods, seeds, runs)


def table(a, workloads, methods, seeds, runs):
    rows, out = [], {"settings": {"steps": a.steps, "seeds": seeds, "post": I.POST,
                                  "task": I.TASK, "methods": METHODS}, "workloads": {}}
    head = ["workload", "method", "seeds", "val loss per seed", "val loss mean",
            "÷ dense (paired)", "÷ adtopk_sync (paired)", "payload B/step",
            "payload ÷ adtopk_sync", "whole run's payload ÷ adtopk_sync", "exact match",
            "÷ adtopk_sync at its ρ (val loss; whole run's payload)"]
    rows.append("| " + " | ".join(head) + " |")
    rows.append("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for w in workloads:
        ow = out["workloads"][w] = {}
        for m in methods:
            have = [s for s in seeds if (w, m, s) in runs]
            if not have:
                continue
            r = {s: runs[(w, m, s)] for s in have}

            def paired(ref):
                ps = [s for s in have if (w, ref, s) in runs]
                if not ps:
                    return None, None, []
                return (mean([r[s]["val_loss"] / runs[(w, ref, s)]["val_loss"] for s in ps]),
                        mean([r[s]["payload_bytes_per_step"]
                              / runs[(w, ref, s)]["payload_bytes_per_step"] for s in ps]), ps)
            vd, _, pd = paired("dense")
            # a row at another density (…@rhoR) against adtopk_sync at the same R
            rho = re.search(r"@rho([0-9.]+)", m)
            same = f"adtopk_sync@rho{rho.group(1)}" if rho and m != f"adtopk_sync@rho{rho.group(1)}" \
                else None
            vs, _, ss = paired(same) if same else (None, None, [])
            psame = mean([r[s]["payload_bytes_per_step_run"]
                          / runs[(w, same, s)]["payload_bytes_per_step_run"] for s in ss]) \
                if ss else None
            va, pa, ps = paired("adtopk_sync")
            pw = mean([r[s]["payload_bytes_per_step_run"]
                       / runs[(w, "adtopk_sync", s)]["payload_bytes_per_step_run"] for s in ps])
            acc = [r[s]["task_accuracy"] for s in have if r[s]["task_accuracy"] is not None]
            ow[m] = {"per_seed": {str(s): r[s] for s in have},
                     "val_loss_mean": mean([r[s]["val_loss"] for s in have]),
                     "val_loss_ratio_dense": vd, "paired_dense_seeds": pd,
                     "val_loss_ratio_adtopk_sync": va, "payload_ratio_adtopk_sync": pa,
                     "paired_adtopk_sync_seeds": ps,
                     "payload_bytes_per_step": mean([r[s]["payload_bytes_per_step"]
                                                     for s in have]),
                     "task_accuracy_mean": mean(acc) if acc else None,
                     "same_density_reference": same, "val_loss_ratio_same_density": vs,
                     "whole_run_payload_ratio_same_density": psame,
                     "paired_same_density_seeds": ss}
            g = ow[m]
            rows.append(
                f"| {w} | {m}{' (reused)' if any(r[s]['source'] == 'reused' for s in have) else ''}"
                f" | {', '.join(map(str, have))} | "
                f"{', '.join(format(r[s]['val_loss'], '.4f') for s in have)} | "
                f"{g['val_loss_mean']:.4f} | {fmt(vd, '.4f')} | {fmt(va, '.4f')} | "
                f"{g['payload_bytes_per_step']:.0f} | {fmt(pa, '.4f')} | {fmt(pw, '.4f')} | "
                f"{fmt(g['task_accuracy_mean'], '.3f')} | "
                + (f"{vs:.4f}; {psame:.4f} ({same})" if vs is not None else "–") + " |")
    os.makedirs(a.out, exist_ok=True)
    text = "\n".join(rows)
    with open(os.path.join(a.out, "vs_dense.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(a.out, "vs_dense.json"), "w") as f:
        json.dump(out, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
