#!/usr/bin/env python3
"""The win map of docs/results/win_map.md: the projected time-to-quality
speed-up of `ig` and `adtopk_sync` over dense bf16 (the fair baseline of
docs/plan.md §2a: NCCL over one NIC per GPU, ring or tree) for LLaMA-2-7B
and LLaMA-2-70B (configs/), over the inter-node bandwidth per GPU (1 to
400 Gbit/s) x P (8 to 1,024 GPUs, 8 per node, NVLink inside), with
`igrad plan --overlap` (DDP's buckets for dense bf16, the streamed step for
igrad's flat route, hier after backward), the sparse methods at igrad
train's defaults (ρ 4 %, bf16 values) unless --density / --value-dtype say.

Speed-up to a quality = step speed-up / step-count penalty, the penalty
being (steps the method needs to reach dense's quality) / (steps dense
needs): --penalty X for every method, or per method as
`ig=X,adtopk_sync=Y` (default 1.0: as many steps as dense); the measured
values come from docs/results/time_to_quality.json (issue 28 part 4).
--testbed that JSON overlays its measured points (P = 2 on the netns
testbed): a third row of panels plots every projected cell and every
testbed (rate, seed) as time-to-quality speed-up against dense's step time
over its compute time (1 + dense's exposed sync / compute), the quantity
the two share although their bandwidths and models do not. Per method the better of the engine's two
routes (flat, hier) under `collective = auto` is taken and named; the
projected sparse all-reduce formula is kept in the JSON, not in the map.
Latency per link as the presets of docs/plan.md §3 assume: 25 us up to
10 Gbit/s, 15 us at 25, 8 us at 50-100, 5 us above.

A cell "wins" when its speed-up is at least 1.005 (ties within 0.5 % are
ties); the crossover per P is the highest bandwidth at and below which
every sampled bandwidth wins.

Usage: experiments/win_map/run.py IGRAD_BINARY [--penalty X|ig=X,adtopk_sync=Y]
           [--testbed time_to_quality.json] [--density 0.04] [--value-dtype bf16]
           [--out DIR]
       experiments/win_map/run.py --from-json win_map.json [--penalty ...] [--testbed ...]
(writes win_map.json and win_map.png to DIR, default docs/results, and
prints the Markdown tables; 144 `igrad plan` calls, about 15 minutes on a
shared 2-core machine; --from-json redraws from a previous run's JSON,
applying --penalty to its step speed-ups)"""
import argparse
import json
import os
import subprocess

MODELS = [("LLaMA-2-7B", "configs/llama-2-7b.json"), ("LLaMA-2-70B", "configs/llama-2-70b.json")]
GBITS = [1, 2, 5, 10, 25, 50, 100, 200, 400]
RANKS = [8, 16, 32, 64, 128, 256, 512, 1024]
METHODS = ["ig", "adtopk_sync"]
WIN = 1.005


def latency_us(gbit):
    return 25 if gbit <= 10 else 15 if gbit <= 25 else 8 if gbit <= 100 else 5


def run(igrad, src, cfg, P, gbit, density, value_dtype):
    cmd = [igrad, "plan", "--config", cfg, "--ranks", str(P), "--ranks-per-node", "8",
           "--link", "intra=nvlink", "--link", f"inter={gbit},{latency_us(gbit)}",
           "--method", ",".join(METHODS), "--density", str(density),
           "--value-dtype", value_dtype, "--overlap", "--json"]
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


def parse_penalty(text):
    """'1.2' (every method) or 'ig=1.2,adtopk_sync=1.05' -> {method: penalty}."""
    if "=" not in text:
        return {m: float(text) for m in METHODS}
    pen = {m: 1.0 for m in METHODS}
    for part in text.split(","):
        m, _, v = part.partition("=")
        if m not in METHODS:
            raise SystemExit(f"win_map: --penalty names '{m}', not one of {', '.join(METHODS)}")
        pen[m] = float(v)
    return pen


def testbed_points(path):
    """The measured points of time_to_quality.json, one per (rate, method,
    seed) of the sparse methods: time-to-quality speed-up at the quality
    the method reaches (dense's training time to the method's final val
    loss over the method's training time) and dense's step time over its
    compute time at that rate and seed."""
    with open(path) as f:
        rows = json.load(f)["rows"]
    dense = {(r["rate_mbps"], r["seed"]): r for r in rows if r["method"] == "dense"}
    out = []
    for r in rows:
        d = dense.get((r["rate_mbps"], r["seed"]))
        if r["method"] not in METHODS or d is None or not r.get("time_to_quality_speedup"):
            continue
        out.append({"rate_mbps": r["rate_mbps"], "method": r["method"], "seed": r["seed"],
                    "dense_slowdown": d["median_step_ms"] / (d["median_step_ms"] -
                                                             d["median_sync_ms"]),
                    "time_to_quality_speedup": r["time_to_quality_speedup"]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("igrad", nargs="?")
    ap.add_argument("--from-json", default=None, help="redraw from this win_map.json")
    ap.add_argument("--penalty", default="1.0",
                    help="steps to dense's quality / dense's steps: X for every method or "
                         "ig=X,adtopk_sync=Y (default 1.0)")
    ap.add_argument("--testbed", default=None,
                    help="docs/results/time_to_quality.json: overlay its measured points")
    ap.add_argument("--density", type=float, default=0.04,
                    help="the sparse methods' density (default 0.04, igrad train's)")
    ap.add_argument("--value-dtype", default="bf16",
                    help="their wire values (default bf16, igrad train's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out_dir = a.out or os.path.join(src, "docs", "results")
    if a.from_json:
        with open(a.from_json) as f:
            data = json.load(f)
    elif a.igrad:
        igrad = os.path.abspath(a.igrad)
        data = {"gbit_per_gpu": GBITS, "ranks": RANKS, "ranks_per_node": 8,
                "latency_us": {str(g): latency_us(g) for g in GBITS},
                "density": a.density, "value_dtype": a.value_dtype, "cells": {}}
        for name, cfg in MODELS:
            for g in GBITS:
                for P in RANKS:
                    data["cells"][f"{name}|{g}|{P}"] = run(igrad, src, cfg, P, g, a.density,
                                                           a.value_dtype)
    else:
        ap.error("give IGRAD_BINARY or --from-json")
    penalty = parse_penalty(a.penalty)
    data["penalty"] = penalty
    for c in data["cells"].values():
        for m in METHODS:
            c[m]["time_to_quality_speedup"] = c[m]["best_step_speedup"] / penalty[m]
    points = testbed_points(a.testbed) if a.testbed else []
    data["testbed_points"] = points
    with open(os.path.join(out_dir, "win_map.json"), "w") as f:
        json.dump(data, f, separators=(",", ":"))

    def ttq(name, g, P, m):
        return data["cells"][f"{name}|{g}|{P}"][m]["time_to_quality_speedup"]

    lines = []
    for name, _ in MODELS:
        for m in METHODS:
            lines.append(f"**{name}, {m}** — time-to-quality speed-up over dense bf16 "
                         f"(penalty {penalty[m]:.3g}; best engine route: f flat, h hier)\n")
            lines.append("| Gbit/s per GPU | " + " | ".join(f"P={P}" for P in RANKS) + " |")
            lines.append("|---|" + "---|" * len(RANKS))
            for g in reversed(GBITS):
                cells = []
                for P in RANKS:
                    c = data["cells"][f"{name}|{g}|{P}"][m]
                    v = c["time_to_quality_speedup"]
                    b = "**" if v >= WIN else ""
                    cells.append(f"{b}{v:.2f}{c['best_route'][0]}{b}")
                lines.append(f"| {g} | " + " | ".join(cells) + " |")
            lines.append("")
            cross = []
            for P in RANKS:
                top = None
                for g in GBITS:  # ascending: the last bandwidth of an unbroken run of wins
                    if ttq(name, g, P, m) < WIN:
                        break
                    top = g
                cross.append(f"P={P}: " + (f"≤ {top}" if top else "never"))
            lines.append("Wins (bold, ≥ 1.005) at every sampled bandwidth up to, Gbit/s per "
                         "GPU: " + "; ".join(cross) + "\n")
    print("\n".join(lines))

    import matplotlib
    matplotlib.use("Agg")
    import math
    import matplotlib.pyplot as plt
    rows = len(MODELS) + (1 if points else 0)
    fig, axes = plt.subplots(rows, len(METHODS), figsize=(12, 4.5 * rows), squeeze=False)
    for i, (name, _) in enumerate(MODELS):
        for j, m in enumerate(METHODS):
            ax = axes[i][j]
            z = [[ttq(name, g, P, m) for P in RANKS] for g in GBITS]
            zc = [[math.log2(v) for v in r] for r in z]  # colour: log2, 0.25x red .. 4x blue
            im = ax.pcolormesh(range(len(RANKS) + 1), range(len(GBITS) + 1), zc, cmap="RdBu",
                               vmin=-2, vmax=2, shading="flat")
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
            fig.colorbar(im, ax=ax, shrink=0.8, label="log2 speed-up")
    if points:
        for j, m in enumerate(METHODS):
            ax = axes[len(MODELS)][j]
            for (name, _), mk in zip(MODELS, ("o", "s")):
                xs, ys = [], []
                for g in GBITS:
                    for P in RANKS:
                        c = data["cells"][f"{name}|{g}|{P}"]
                        xs.append(c["dense_bf16_step_ms"] / c["compute_ms"])
                        ys.append(c[m]["time_to_quality_speedup"])
                ax.scatter(xs, ys, s=10, marker=mk, color="0.6", label=f"{name} (projected)")
            mine = [p for p in points if p["method"] == m]
            for rate in sorted({p["rate_mbps"] for p in mine}):
                pr = [p for p in mine if p["rate_mbps"] == rate]
                ax.scatter([p["dense_slowdown"] for p in pr],
                           [p["time_to_quality_speedup"] for p in pr], s=40, marker="*",
                           zorder=3, label=f"testbed P=2, {rate} Mbit/s (measured)")
            ax.axhline(1.0, color="k", lw=0.5)
            xr = [1.0, max(ax.get_xlim()[1], 2.0)]
            ax.plot(xr, [x / penalty[m] for x in xr], color="k", lw=0.7, ls="--",
                    label="dense step/compute / penalty (no overlap, free sparse sync)")
            ax.set_xscale("log")
            ax.set_yscale("log")
            ax.set_xlabel("dense step time / compute time")
            ax.set_ylabel("time-to-quality speed-up")
            ax.set_title(f"{m} / dense: projected cells and testbed points")
            ax.legend(fontsize=6)
    pen = ", ".join(f"{m} {penalty[m]:.3g}" for m in METHODS)
    fig.suptitle(f"Projected time-to-quality speed-up (igrad plan --overlap, fair NCCL baseline, "
                 f"step-count penalty {pen}); blue: igrad faster")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, "win_map.png"), dpi=100)


if __name__ == "__main__":
    main()
