#!/usr/bin/env python3
"""Prints the gate_other results table (docs/results/gate_other.md) from
igrad train output directories named <row>-s<seed> under RUNS (argv[1]).
Payload: mean bytes per step over the run (summary.json per_step); the
ratio is to adtopk_sync of the same seed; model ratio f_imp + kappa(1 -
f_imp) with kappa from config.sync.release_keep; val loss: the final
evaluation."""
import json
import os
import sys

runs = sys.argv[1]
rows = {}
for d in sorted(os.listdir(runs)):
    path = os.path.join(runs, d, "summary.json")
    if not os.path.exists(path):
        continue
    s = json.load(open(path))
    name, seed = d.rsplit("-s", 1)
    sync = s["config"]["sync"]
    rows.setdefault(name, {})[seed] = {
        "payload": s["per_step"]["payload_bytes"]["mean"],
        "f_imp": s.get("f_imp"),
        "kappa": sync.get("release_keep"),
        "val": s["eval"][-1][1],
        "target": sync.get("target"),
        "gate": sync.get("gate_other"),
    }
base = rows.get("adtopk_sync", {})
print("| run | seed | payload B/step | / adtopk_sync | f_imp | κ | model ratio | val loss | / adtopk_sync |")
print("|---|---|---|---|---|---|---|---|---|")
for name in sorted(rows):
    for seed, r in sorted(rows[name].items()):
        b = base.get(seed)
        ratio = r["payload"] / b["payload"] if b else float("nan")
        vr = r["val"] / b["val"] if b else float("nan")
        fi = r["f_imp"]
        model = fi + r["kappa"] * (1 - fi) if fi is not None and name != "adtopk_sync" else None
        print("| %s | %s | %.0f | %.3f | %s | %s | %s | %.4f | %.4f |" % (
            name, seed, r["payload"], ratio, "%.3f" % fi if fi is not None and name != "adtopk_sync" else "–",
            "%.4g" % r["kappa"] if name != "adtopk_sync" else "–",
            "%.3f" % model if model is not None else "–", r["val"], vr))
