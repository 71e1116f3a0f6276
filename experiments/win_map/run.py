#!/usr/bin/env python3
"""The win map of docs/results/win_map.md: the projected time-to-quality
speed-up of `ig` and `adtopk_sync` over dense bf16 (the fair baseline of
docs/plan.md §2a: NCCL over one NIC per GPU, ring or tree) for LLaMA-2-7B
and LLaMA-2-70B (configs/), over the inter-node bandwidth per GPU (1 to
400 Gbit/s) x P (8 to 1,024 GPUs, 8 per node, NVLink inside), with
`igrad plan --overlap` (DDP's buckets for dense bf16, the streamed step for
igrad's flat route, hier after backward).

Speed-up to a quality = step speed-up / step-count penalty, the penalty
being (steps the method needs to reach dense's quality) / (steps dense
needs): a parameter (--penalty, default 1.0: as many steps as dense) until
issue 28 part 4 measures it. Per method the better of the engine's two
routes (flat, hier) under `collective = auto` is taken and named; the
projected sparse all-reduce formula is kept in the JSON, not in the map.
Latency per link as the presets of docs/plan.md §3 assume: 25 us up to
10 Gbit/s, 15 us at 25, 8 us at 50-100, 5 us above.

Usage: experiments/win_map/run.py IGRAD_BINARY [--penalty X] [--out DIR]
(writes win_map.json and win_map.png to DIR, default docs/results, and
prints the Markdown tables; about 150 `igrad plan` calls)"""
import argparse
import json
import os
import subprocess

MODELS = [("LLaMA-2-7B", "configs/llama-2-7b.json"), ("LLaMA-2-70B", "configs/llama-2-70b.json")]
GBITS = [1, 2, 5, 10, 25, 50, 100, 200, 400]
RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]
METHODS = ["ig", "adtopk_sync"]


def latency_us(gbit):
    return 25 if gbit <= 10 else 15 if gbit <= 25 else 8 if gbit <= 100 else 5


def run(igrad, src, cfg, P, gbit):
    cmd = [igrad, "plan", "--config", cfg, "--ranks", str(P), "--ranks-per-node", "8",
           "--link", "intra=nvlink", "--link", f"inter={gbit},{latency_us(gbit)}",
           "--method", ",".join(METHODS), "--overlap", "--json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=src).stdout
    d = json.loads(out)
    rows = {(r["method"], r["route"]): r for r in d["rows"]}
    cell = {"compute_ms": d["compute_ms"], "backward_ms": d["backward_ms"],
            "dense_bf16_step_ms": rows[("dense_bf16", "ring_allreduce")]["step_ms"],
            "dense_bf16_exposed_ms": rows[("dense_bf16", "ring_allreduce")]["exposed_ms"]["mean"]}
    for m in METHODS:
        routes = {rt: rows[(m, rt)]["step_speedup_vs_dense_bf16"]
                  for rt in ("flat", "hier", "sparse_allreduce")}
        best = max(("flat", "hier"), key=lambda rt: routes[rt])
        cell[m] = {"step_speedup": routes, "best_route": best, "best_step_speedup": routes[best]}
    return cell


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("igrad")
    ap.add_argument("--penalty", type=float, default=1.0,
                    help="steps to dense's quality / dense's steps (default 1.0)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_dir = a.out or os.path.join(src, "docs", "results")
    igrad = os.path.abspath(a.igrad)
    data = {"penalty": a.penalty, "gbit_per_gpu": GBITS, "ranks": RANKS, "ranks_per_node": 8,
            "latency_us": {str(g): latency_us(g) for g in GBITS}, "cells": {}}
    for name, cfg in MODELS:
        for g in GBITS:
            for P in RANKS:
                c = run(igrad, src, cfg, P, g)
                for m in METHODS:
                    c[m]["time_to_quality_speedup"] = c[m]["best_step_speedup"] / a.penalty
                data["cells"][f"{name}|{g}|{P}"] = c
    with open(os.path.join(out_dir, "win_map.json"), "w") as f:
        json.dump(data, f, separators=(",", ":"))

    def ttq(name, g, P, m):
        return data["cells"][f"{name}|{g}|{P}"][m]["time_to_quality_speedup"]

    lines = []
    for name, _ in MODELS:
        for m in METHODS:
            lines.append(f"**{name}, {m}** — time-to-quality speed-up over dense bf16 "
                         f"(penalty {a.penalty:g}; best engine route: f flat, h hier)\n")
            lines.append("| Gbit/s per GPU | " + " | ".join(f"P={P}" for P in RANKS) + " |")
            lines.append("|---|" + "---|" * len(RANKS))
            for g in reversed(GBITS):
                cells = []
                for P in RANKS:
                    c = data["cells"][f"{name}|{g}|{P}"][m]
                    v = c["time_to_quality_speedup"]
                    cells.append(f"{'**' if v >= 1.0 else ''}{v:.2f}{c['best_route'][0]}"
                                 f"{'**' if v >= 1.0 else ''}")
                lines.append(f"| {g} | " + " | ".join(cells) + " |")
            lines.append("")
            cross = []
            for P in RANKS:
                wins = [g for g in GBITS if ttq(name, g, P, m) >= 1.0]
                cross.append(f"P={P}: " + (f"<= {max(wins)}" if wins else "never"))
            lines.append("Wins (speed-up >= 1) up to Gbit/s per GPU: " + "; ".join(cross) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import TwoSlopeNorm
    fig, axes = plt.subplots(len(MODELS), len(METHODS), figsize=(12, 9), sharex=True, sharey=True)
    for i, (name, _) in enumerate(MODELS):
        for j, m in enumerate(METHODS):
            ax = axes[i][j]
            z = [[ttq(name, g, P, m) for P in RANKS] for g in GBITS]
            lo = min(min(r) for r in z)
            hi = max(max(r) for r in z)
            norm = TwoSlopeNorm(vmin=min(lo, 0.99), vcenter=1.0, vmax=max(hi, 1.01))
            im = ax.pcolormesh(range(len(RANKS) + 1), range(len(GBITS) + 1), z, cmap="RdBu",
                               norm=norm, shading="flat")
            for gi in range(len(GBITS)):
                for pi in range(len(RANKS)):
                    ax.text(pi + 0.5, gi + 0.5, f"{z[gi][pi]:.2f}", ha="center", va="center",
                            fontsize=6)
            ax.set_xticks([k + 0.5 for k in range(len(RANKS))], [str(P) for P in RANKS])
            ax.set_yticks([k + 0.5 for k in range(len(GBITS))], [str(g) for g in GBITS])
            ax.set_title(f"{name}: {m} / dense bf16")
            if j == 0:
                ax.set_ylabel("inter-node Gbit/s per GPU")
            if i == len(MODELS) - 1:
                ax.set_xlabel("GPUs (8 per node)")
            fig.colorbar(im, ax=ax, shrink=0.8)
    fig.suptitle(f"Projected time-to-quality speed-up (igrad plan --overlap, fair NCCL baseline, "
                 f"step-count penalty {a.penalty:g}); blue: igrad faster")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "win_map.png"), dpi=100)


if __name__ == "__main__":
    main()
