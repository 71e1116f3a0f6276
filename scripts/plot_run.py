#!/usr/bin/python3
"""plot_run.py — plots of `igrad train` runs: validation loss per evaluation
and payload bytes per step, side by side in one PNG (and task accuracy per
evaluation as a third panel when the runs have a task workload). Runs with the same
method (several seeds) are one line, their mean, with a band from the
lowest to the highest run; bytes are drawn from the first run of each.

Usage: /usr/bin/python3 scripts/plot_run.py --out demo.png [--title T] RUN_DIR...

Each RUN_DIR is an `igrad train --out` directory (eval.csv, metrics.csv and,
for the label, summary.json's "method"). Needs only matplotlib (Debian's
python3-matplotlib); no numpy or torch. Not here: running anything, the
summary table (scripts/demo).
"""
import argparse
import csv
import json
import os
import sys


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def as_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return float("nan")


def label_of(run_dir):
    """The run's method, with its density for a sparse method (the demo's
    baseline and adtopk_sync differ only there)."""
    try:
        with open(os.path.join(run_dir, "summary.json")) as f:
            s = json.load(f)
    except (OSError, ValueError):
        return os.path.basename(run_dir.rstrip("/"))
    m = s.get("method") or os.path.basename(run_dir.rstrip("/"))
    d = ((s.get("config") or {}).get("sync") or {}).get("density")
    return m if m == "dense" or not isinstance(d, (int, float)) else f"{m} ρ {d:g}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="PNG to write")
    ap.add_argument("--title", default="", help="figure title")
    ap.add_argument("runs", nargs="+", help="igrad train output directories")
    args = ap.parse_args()

    import matplotlib
    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    # Runs with the same label (one method, several seeds) are one line:
    # the mean over the runs, with a band from the lowest to the highest.
    groups = {}
    for run in args.runs:
        try:
            evals = read_csv(os.path.join(run, "eval.csv"))
            steps = read_csv(os.path.join(run, "metrics.csv"))
        except OSError as e:
            print(f"plot_run: {run}: {e}", file=sys.stderr)
            return 1
        groups.setdefault(label_of(run), []).append((evals, steps))

    # a task workload: every evaluation has a task accuracy (not NaN, not absent)
    has_task = all(as_float(r.get("task_accuracy")) == as_float(r.get("task_accuracy"))
                   for members in groups.values() for ev, _ in members for r in ev)
    ncols = 3 if has_task else 2
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4.5))
    ax_loss, ax_bytes = axes[0], axes[1]

    def mean_band(ax, members, key, label):
        curves = [{as_float(r["step"]): as_float(r[key]) for r in ev} for ev, _ in members]
        xs = sorted(set.intersection(*(set(c) for c in curves)))
        ys = [[c[x] for c in curves] for x in xs]
        n = len(members)
        line, = ax.plot(xs, [sum(y) / n for y in ys], marker="o", ms=3,
                        label=label if n == 1 else f"{label} (mean of {n})")
        if n > 1:
            ax.fill_between(xs, [min(y) for y in ys], [max(y) for y in ys],
                            color=line.get_color(), alpha=0.15, lw=0)

    for label, members in groups.items():
        mean_band(ax_loss, members, "val_loss", label)
        if has_task:
            mean_band(axes[2], members, "task_accuracy", label)
        st = members[0][1]
        ax_bytes.plot([as_float(r["step"]) for r in st],
                      [as_float(r["payload_bytes"]) for r in st], lw=1, label=label)

    ax_loss.set_xlabel("optimizer steps")
    ax_loss.set_ylabel("validation loss (nats/byte)")
    ax_loss.set_title("validation loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    ax_bytes.set_xlabel("step")
    ax_bytes.set_ylabel("payload bytes per rank")
    ax_bytes.set_yscale("log")
    ax_bytes.set_title("bytes sent per step (log scale)")
    ax_bytes.grid(alpha=0.3, which="both")
    ax_bytes.legend()
    if has_task:
        axes[2].set_xlabel("optimizer steps")
        axes[2].set_ylabel("exact match on held-out problems")
        axes[2].set_title("task accuracy")
        axes[2].grid(alpha=0.3)
        axes[2].legend()
    if args.title:
        fig.suptitle(args.title)
    fig.tight_layout()
    tmp = args.out + ".tmp.png"
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, args.out)  # never leave a half-written PNG under the name
    return 0


if __name__ == "__main__":
    sys.exit(main())
