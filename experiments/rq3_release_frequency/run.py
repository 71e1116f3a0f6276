#!/usr/bin/python3
"""RQ3 — how often should low-importance components be released, and does
keeping their residual matter?

`ig` (ADTopk, rho = 1 %, kappa = 0.25, staggered, contiguous packing, the
shared knee profile of the post-train workload) runs with release period
R in {1, 2, 4, 8, 16}, each with the residual kept (`--residual on`, the
method) and dropped at non-release steps (`--residual drop`, the
ablation), from the same base; `adtopk_sync` is the reference. Per run:
validation loss / perplexity / accuracy, payload bytes per step and the
ratio to adtopk_sync beside f_imp, sync ms per step.

Outputs (runs/rq3_release_frequency[-MODE]/): results.csv, summary.csv (mean
and std over seeds), quality_traffic.png (validation loss vs payload ratio,
one line per residual policy, and loss vs R), summary.md.
Not here: the runner (../common.py).
Usage: /usr/bin/python3 experiments/rq3_release_frequency/run.py [--mode quick]
       [--periods 1,2,4,8,16] [--release-keep 0.25] [common flags, see --help]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common as C  # noqa: E402

COLS = ["config", "release_period", "residual", "seed", "f_imp", "val_loss", "val_ppl",
        "val_acc", "payload_bytes_per_step", "ratio_to_adtopk_sync", "sync_ms", "comm_ms",
        "step_ms", "tokens_per_s"]
NUM = COLS[4:]


# (row name, igrad train flags): the trainer's old AdamW default, and the
# engine's remedies measured in docs/results/remedies.md
REMEDIES = [("beta1 0.9", ["--beta1", "0.9"]),
            ("momentum 0.9", ["--momentum", "0.9"]),
            ("ef on update", ["--ef-on", "update"])]


def add_args(ap):
    ap.add_argument("--periods", default="1,2,4,8,16", help="release periods R (comma-separated)")
    ap.add_argument("--release-keep", type=float, default=0.25, help="kappa (default 0.25)")


def body():
    exp = C.Experiment("rq3_release_frequency", __doc__, add_args)
    try:
        periods = [int(x) for x in exp.args.periods.split(",")]
    except ValueError:
        raise C.ExperimentError(f"--periods {exp.args.periods!r}: want integers like 1,2,4")
    if not periods or min(periods) < 1:
        raise C.ExperimentError("--periods: every R must be at least 1")
    kappa = exp.args.release_keep
    if not 0 < kappa <= 1:
        raise C.ExperimentError(f"--release-keep {kappa}: want a value in (0, 1]")
    exp.check_data(exp.cfg["data"])
    exp.base()
    profile, _ = exp.shared_profile("knee")

    rows = []
    for seed in exp.seeds:
        ref = exp.method_run("adtopk_sync", seed)
        runs = [("adtopk_sync", None, None, ref)]
        # error-feedback remedies on the sparsifier (igrad train's default
        # for sparse methods is beta1 0 and no engine remedy)
        for name, flags in REMEDIES:
            runs.append((f"adtopk_sync {name}", None, None, exp.method_run(
                "adtopk_sync", seed, label=f"adtopk_sync-{name.replace(' ', '')}-s{seed}",
                extra_flags=flags)))
        for res in ("on", "drop"):
            for R in periods:
                runs.append((f"ig R={R} {res}", R, res, exp.method_run(
                    "ig", seed, profile, label=f"ig-R{R}-{res}-s{seed}", release_period=R,
                    release_keep=kappa, residual=res)))
        for config, R, res, run in runs:
            s = run.stats()
            rows.append({"config": config, "release_period": R, "residual": res, "seed": seed,
                         "f_imp": s["f_imp"], "val_loss": s["val_loss"], "val_ppl": s["val_ppl"],
                         "val_acc": s["val_acc"],
                         "payload_bytes_per_step": s["payload_bytes_per_step"],
                         "ratio_to_adtopk_sync": s["payload_bytes_per_step"] / ref.payload,
                         "sync_ms": s["sync_ms"], "comm_ms": s["comm_ms"], "step_ms": s["step_ms"],
                         "tokens_per_s": s["tokens_per_s"]})
    C.write_csv(os.path.join(exp.out, "results.csv"), COLS, rows)

    configs = list(dict.fromkeys(r["config"] for r in rows))
    agg = []
    for cfg in configs:
        rs = [r for r in rows if r["config"] == cfg]
        a = {"config": cfg, "release_period": rs[0]["release_period"],
             "residual": rs[0]["residual"], "seeds": len(rs)}
        for k in NUM:
            vals = [r[k] for r in rs if r[k] is not None]
            a[k + "_mean"] = C.mean(vals) if vals else None
            a[k + "_std"] = C.std(vals) if vals else None
        agg.append(a)
    C.write_csv(os.path.join(exp.out, "summary.csv"),
                ["config", "release_period", "residual", "seeds"]
                + [k + s for k in NUM for s in ("_mean", "_std")], agg)

    plt = C.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for i, res in enumerate(("on", "drop")):
        pts = sorted((a["release_period"], a["ratio_to_adtopk_sync_mean"], a["val_loss_mean"],
                      a["val_loss_std"]) for a in agg if a["residual"] == res)
        ax.errorbar([p[1] for p in pts], [p[2] for p in pts], yerr=[p[3] for p in pts],
                    marker="o", ms=4, capsize=2, color=f"C{i}", label=f"residual {res}")
        for R, x, y, _ in pts:
            ax.annotate(f"R={R}", (x, y), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax2.errorbar([p[0] for p in pts], [p[2] for p in pts], yerr=[p[3] for p in pts],
                     marker="o", ms=4, capsize=2, color=f"C{i}", label=f"residual {res}")
    ref = next(a for a in agg if a["config"] == "adtopk_sync")
    ax.plot([1.0], [ref["val_loss_mean"]], "ks", label="adtopk_sync")
    ax2.axhline(ref["val_loss_mean"], color="k", ls="--", lw=0.8, label="adtopk_sync")
    ax.set_xlabel("payload / adtopk_sync payload (per step)")
    ax.set_ylabel("validation loss (final)")
    ax.set_title(f"RQ3: quality vs traffic (κ = {kappa})")
    ax.legend(fontsize=7)
    ax2.set_xscale("log", base=2)
    ax2.set_xlabel("release period R")
    ax2.set_ylabel("validation loss (final)")
    ax2.set_title("validation loss vs R")
    ax2.legend(fontsize=7)
    figs = [os.path.join(exp.out, "quality_traffic.png")]
    C.save_fig(fig, figs[0])

    md = ["# RQ3 — release frequency and the residual", "",
          f"`ig` on `{exp.cfg['data']}` with the shared knee profile, κ = {kappa}, release budget "
          f"⌈κRk⌉ per low component every R steps; `drop` discards a low component's residual at "
          f"its non-release steps (ablation). ratio = payload bytes per step / adtopk_sync's; "
          f"f_imp = share of the ADTopk budget sent every step; f_imp + κ(1 − f_imp) is the "
          f"ratio it predicts for any R (κRk every R steps is κk per step on average; each "
          f"row's release budget is rounded up, which costs most at small R).", "",
          C.md_table(["config", "f_imp", "val loss", "ppl", "acc", "payload/step",
                      "ratio to adtopk_sync", "f_imp + κ(1 − f_imp)", "sync ms", "tokens/s"],
                     [[a["config"], C.fmt(a["f_imp_mean"], ".3f"),
                       C.fmt_pm([r["val_loss"] for r in rows if r["config"] == a["config"]]),
                       C.fmt(a["val_ppl_mean"], ".3f"), C.fmt(a["val_acc_mean"]),
                       C.fmt_bytes(a["payload_bytes_per_step_mean"]),
                       C.fmt(a["ratio_to_adtopk_sync_mean"], ".3f"),
                       C.fmt(None if a["f_imp_mean"] is None or a["residual"] is None
                             else a["f_imp_mean"] + kappa * (1 - a["f_imp_mean"]), ".3f"),
                       C.fmt(a["sync_ms_mean"], ".2f"),
                       C.fmt(a["tokens_per_s_mean"], ".0f")] for a in agg]),
          "", "Figure: `quality_traffic.png`.  Data: `results.csv` (per run), `summary.csv`."]
    exp.finish(md, figs)


if __name__ == "__main__":
    C.main(body)
