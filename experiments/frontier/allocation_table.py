#!/usr/bin/python3
"""allocation_table.py — docs/results/allocation.md's "What the allocation
chooses" table from the online profiles of importance.py's runs, by
`igrad plan --allocation budget|partition --json` (the engine plan's own
allocation and target fit; nothing is trained).

Per workload: the budget allocation of the first seed's profile (its
every-step components, the change against the partition's, the deferred
components above the floor 1/(3R) with their kappa, both planned ratios)
and how many distinct every-step sets the budget allocation makes over the
seeds.

Usage: /usr/bin/python3 experiments/frontier/allocation_table.py \\
           --igrad build/igrad --config runs/demo/base/checkpoint/config.json \\
           --runs runs/importance/runs --workloads brown-news,fortunes,lodash,task-recall \\
           --seeds 1337,7,42 [--target-ratio 0.25] [--ranks 2]
(a profile is RUNS/WORKLOAD/seedS/profile.json)
"""
import argparse
import json
import os
import subprocess
import sys


def plan(a, profile, allocation):
    cmd = [a.igrad, "plan", "--config", a.config, "--profile", profile, "--ranks", str(a.ranks),
           "--method", "adtopk_sync,ig", "--target-ratio", str(a.target_ratio),
           "--allocation", allocation, "--density", "0.01", "--value-dtype", "f32", "--json"]
    d = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    if d.get("ig_allocation") != allocation or "ig_components" not in d:
        sys.exit("igrad plan ignored --allocation %s: %s" % (allocation, " ".join(cmd)))
    return d


def every(d):
    return [c["component"] for c in d["ig_components"] if c["every_step"]]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--igrad", default="build/igrad")
    p.add_argument("--config", required=True)
    p.add_argument("--runs", required=True)
    p.add_argument("--workloads", default="brown-news,fortunes,lodash,task-recall")
    p.add_argument("--seeds", default="1337,7,42")
    p.add_argument("--target-ratio", type=float, default=0.25)
    p.add_argument("--ranks", type=int, default=2)
    a = p.parse_args()
    seeds = a.seeds.split(",")
    rows = []
    for w in a.workloads.split(","):
        prof = [os.path.join(a.runs, w, "seed" + s, "profile.json") for s in seeds]
        bud, par = plan(a, prof[0], "budget"), plan(a, prof[0], "partition")
        eb, ep = every(bud), every(par)
        floor = 1.0 / (3 * bud["release_period"])
        above = ["%s %.3g" % (c["component"], c["keep"]) for c in bud["ig_components"]
                 if not c["every_step"] and c["keep"] > floor * (1 + 1e-9)]
        sets = {tuple(every(plan(a, f, "budget"))) for f in prof}
        rows.append("| %s | %d | +%s −%s | %s | %.4f | %.4f | %d |" % (
            w, len(eb), " ".join(c for c in eb if c not in ep),
            " ".join(c for c in ep if c not in eb), ", ".join(above),
            bud["ig_planned_ratio"], par["ig_planned_ratio"], len(sets)))
        n_par = len(ep)
    print("| workload | every step | vs the partition's %d | deferred above the floor 1/%d "
          "| planned ratio (budget) | planned ratio (partition) | sets over seeds |"
          % (n_par, 3 * bud["release_period"]))
    print("|---|---:|---|---|---:|---:|---:|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
