#!/usr/bin/python3
"""RQ4 — how should a step's sparse payload be packed into buckets?

`ig` (ADTopk, rho = 1 %, R = 4, kappa = 0.25, staggered, the shared knee
profile) runs with each bucket policy — direct, sequential, greedy, risk,
contiguous — into the same number of buckets, from the same base; `iad`
(one collective per tensor, no packing) is the reference. Packing decides
only which bucket carries which block, never what is sent, so validation
loss must agree across the policies (the table shows it). Per run, from
the engine's per-step stats: bucket imbalance (max/min load) and its
coefficient of variation, overflow (buckets above 1.05 x the mean load)
per step, select / pack / collective / unpack / sync ms and step ms
(medians over steps), payload bytes per step beside f_imp. These runs are
RQ4's own (half the post-train steps, run back to back) so that their times
compare.

Outputs (runs/rq4_packing_ablation[-MODE]/): results.csv, summary.csv (mean
and std over seeds), packing.png (imbalance and CV; time per phase),
summary.md. Not here: the runner (../common.py).
Usage: /usr/bin/python3 experiments/rq4_packing_ablation/run.py [--mode quick]
       [--buckets 4] [--rate RATE] [common flags, see --help]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common as C  # noqa: E402

POLICIES = ["direct", "sequential", "greedy", "risk", "contiguous"]
COLS = ["config", "pack", "seed", "buckets", "f_imp", "imbalance_median", "imbalance_max",
        "cv_median", "overflow_per_step", "payload_bytes_per_step", "select_ms", "pack_ms",
        "comm_ms",
        "unpack_ms", "sync_ms", "step_ms", "tokens_per_s", "val_loss"]
NUM = COLS[3:]


def add_args(ap):
    ap.add_argument("--buckets", type=int, default=4, help="buckets per step (default 4)")
    ap.add_argument("--rq4-steps", type=int,
                    help="steps of each packing run (default: half the post-train steps)")
    ap.add_argument("--rate", help="run over experiments/netem/run-shaped at this rate "
                    "(e.g. 1gbit) instead of shared memory")


def body():
    exp = C.Experiment("rq4_packing_ablation", __doc__, add_args)
    B = exp.args.buckets
    if B < 1:
        raise C.ExperimentError(f"--buckets {B}: want at least 1")
    rate = exp.args.rate
    if rate:
        why = exp.netem_check()
        if why:
            raise C.ExperimentError(f"--rate {rate} asked for, but {why}")
    exp.check_data(exp.cfg["data"])
    exp.base()
    profile, _ = exp.shared_profile("knee")
    sfx = f"-{rate}" if rate else ""
    # RQ4 compares times, so its runs are its own and run back to back (not
    # shared with RQ2/3/5, whose runs ran at other moments and loads), and
    # shorter: packing does not change what is sent, only how.
    steps = exp.args.rq4_steps or max(2, exp.cfg["steps"] // 2)
    timing = dict(steps=steps, eval_every=0)

    rows = []
    for seed in exp.seeds:
        runs = [("iad (per tensor)", "", exp.method_run("iad", seed, profile, rate=rate,
                                                         label=f"iad-s{seed}{sfx}", **timing))]
        for p in POLICIES:
            runs.append((f"ig {p}", p, exp.method_run("ig", seed, profile, pack=p, buckets=B,
                                                      rate=rate, label=f"ig-{p}-s{seed}{sfx}", **timing)))
        for config, p, run in runs:
            s = run.stats()
            imb = run.col("imbalance")
            rows.append({"config": config, "pack": p, "seed": seed,
                         "buckets": C.median(run.col("buckets")), "f_imp": s["f_imp"],
                         "imbalance_median": C.median(imb), "imbalance_max": max(imb),
                         "cv_median": run.med("cv"),
                         "overflow_per_step": C.mean(run.col("overflow")),
                         "payload_bytes_per_step": s["payload_bytes_per_step"],
                         "select_ms": s["select_ms"], "pack_ms": s["pack_ms"],
                         "comm_ms": s["comm_ms"],
                         "unpack_ms": s["unpack_ms"], "sync_ms": s["sync_ms"],
                         "step_ms": s["step_ms"], "tokens_per_s": s["tokens_per_s"],
                         "val_loss": s["val_loss"]})
    C.write_csv(os.path.join(exp.out, "results.csv"), COLS, rows)

    configs = list(dict.fromkeys(r["config"] for r in rows))
    agg = []
    for cfg in configs:
        rs = [r for r in rows if r["config"] == cfg]
        a = {"config": cfg, "seeds": len(rs)}
        for k in NUM:
            a[k + "_mean"] = C.mean([r[k] for r in rs])
            a[k + "_std"] = C.std([r[k] for r in rs])
        agg.append(a)
    C.write_csv(os.path.join(exp.out, "summary.csv"),
                ["config", "seeds"] + [k + s for k in NUM for s in ("_mean", "_std")], agg)

    plt = C.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    ig = [a for a in agg if a["config"].startswith("ig ")]
    names = [a["config"][3:] for a in ig]
    x = range(len(ig))
    # An empty bucket makes max/min infinite (sequential can leave one):
    # such a bar is drawn at the top of the axis, hatched and marked.
    imb = [a["imbalance_median_mean"] for a in ig]
    finite = [v for v in imb + [1 + a["cv_median_mean"] for a in ig] if C.math.isfinite(v)]
    top = max(1.1, max(finite, default=1.1) * 1.15)
    for i, v in enumerate(imb):
        ok = C.math.isfinite(v)
        ax.bar(i - 0.2, v if ok else top, 0.4, color="C0", hatch=None if ok else "//",
               label="imbalance max/min (median)" if i == 0 else None)
        if not ok:
            ax.text(i - 0.2, top * 0.97, "∞", ha="center", va="top", fontsize=9)
    ax.bar([i + 0.2 for i in x], [1 + a["cv_median_mean"] for a in ig], 0.4, color="C1",
           label="1 + CV (median)")
    ax.axhline(1, color="k", lw=0.6)
    ax.set_xticks(list(x), names)
    ax.set_ylim(0.9, top)
    ax.set_title(f"RQ4: bucket balance ({B} buckets; 1 = even)")
    ax.legend(fontsize=7)
    allc = agg
    bottom = [0.0] * len(allc)
    for key, col in (("select_ms", "C1"), ("pack_ms", "C2"), ("comm_ms", "C3"),
                     ("unpack_ms", "C4")):
        vals = [a[key + "_mean"] for a in allc]
        ax2.bar(range(len(allc)), vals, 0.6, bottom=bottom, color=col, label=key[:-3])
        bottom = [b + v for b, v in zip(bottom, vals)]
    ax2.plot(range(len(allc)), [a["sync_ms_mean"] for a in allc], "k_", ms=14, label="sync (total)")
    ax2.set_xticks(range(len(allc)), [a["config"].replace("ig ", "").replace(" (per tensor)", "")
                                      for a in allc])
    ax2.set_ylabel("ms per step (median)")
    ax2.set_title("time per phase" + (f" over {rate}" if rate else " (shared memory)"))
    ax2.legend(fontsize=7)
    figs = [os.path.join(exp.out, "packing.png")]
    C.save_fig(fig, figs[0])

    losses = {round(a["val_loss_mean"], 6) for a in ig}
    md = ["# RQ4 — packing policies", "",
          f"`ig` on `{exp.cfg['data']}` (shared knee profile, R = 4, κ = 0.25) packed into {B} "
          f"buckets by each policy; `iad` sends one collective per tensor; RQ4's own runs of "
          f"{steps} steps, back to back, evaluated at the end. Imbalance = max/min "
          f"bucket load, CV = std/mean of the loads, overflow = buckets above 1.05 × the mean, per "
          f"step; times are medians over steps"
          + (f", over a {rate} link (run-shaped)" if rate else ", MPI over shared memory") + ". "
          f"f_imp = share of the ADTopk budget sent every step.", "",
          C.md_table(["config", "f_imp", "imbalance", "max imbalance", "CV", "overflow/step",
                      "payload/step", "select ms", "pack ms", "collective ms", "unpack ms",
                      "sync ms",
                      "step ms", "val loss"],
                     [[a["config"], C.fmt(a["f_imp_mean"], ".3f"),
                       C.fmt(a["imbalance_median_mean"], ".3f"), C.fmt(a["imbalance_max_mean"], ".3f"),
                       C.fmt(a["cv_median_mean"], ".3f"), C.fmt(a["overflow_per_step_mean"], ".2f"),
                       C.fmt_bytes(a["payload_bytes_per_step_mean"]),
                       C.fmt(a["select_ms_mean"], ".2f"), C.fmt(a["pack_ms_mean"], ".3f"),
                       C.fmt(a["comm_ms_mean"], ".2f"), C.fmt(a["unpack_ms_mean"], ".3f"),
                       C.fmt(a["sync_ms_mean"], ".2f"), C.fmt(a["step_ms_mean"], ".1f"),
                       C.fmt(a["val_loss_mean"])] for a in agg]),
          "", ("The validation loss is the same for every policy, as it must be (packing moves "
               "blocks between buckets, not values)." if len(losses) == 1 else
               f"Note: the validation loss differs between policies ({sorted(losses)}); packing "
               f"should not change what is sent — worth a look."),
          "", "Figure: `packing.png`.  Data: `results.csv` (per run), `summary.csv`."]
    exp.finish(md, figs)


if __name__ == "__main__":
    C.main(body)
