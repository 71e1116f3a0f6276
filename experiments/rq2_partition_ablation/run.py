#!/usr/bin/python3
"""RQ2 — which partition method should split important from low-importance
components?

One profiling trace (the post-train workload, seed 1) is partitioned with
knee, otsu, gmm2, kmeans2, percentile:30 and fixed:0.2 (`igrad profile
--method`); each profile drives the same online policy (`ig`: ADTopk at
rho = 1 %, R = 4, kappa = 0.25, staggered phases, contiguous packing into 4
buckets) from the same base. `topk_sync` and `adtopk_sync` run as
references. Per run: validation loss / perplexity / accuracy, payload bytes
per step, the ratio to adtopk_sync (the same sparsifier) and to topk_sync
beside f_imp (the share of the ADTopk budget that ig sends every step),
sync and collective ms per step (medians), tokens/s.

Outputs (runs/rq2_partition_ablation[-MODE]/): results.csv (one row per
run), summary.csv (mean and std over seeds), quality_traffic.png,
summary.md. Not here: the runner (../common.py).
Usage: /usr/bin/python3 experiments/rq2_partition_ablation/run.py [--mode quick]
       [--partition M ...] [common flags, see --help]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common as C  # noqa: E402

PARTITIONS = ["knee", "otsu", "gmm2", "kmeans2", "percentile:30", "fixed:0.2"]
REFS = ["topk_sync", "adtopk_sync"]
KAPPA = 0.25  # ig's release keep here (common.Experiment.ig_extra's default)

COLS = ["config", "partition", "seed", "n_important", "n_components", "tau", "f_imp",
        "val_loss", "val_ppl", "val_acc", "payload_bytes_per_step", "ratio_to_adtopk_sync",
        "ratio_to_topk_sync", "sync_ms", "comm_ms", "step_ms", "tokens_per_s"]
NUM = COLS[3:]


def model_ratio(f_imp, kappa):
    """The payload ratio NOTES.md predicts from f_imp (shown beside the
    measured one; budgets rounded up per row make the measured one larger)."""
    return None if f_imp is None else f_imp + kappa * (1 - f_imp)


def add_args(ap):
    ap.add_argument("--partition", action="append",
                    help=f"a partition method of igrad profile; repeat (default: "
                    f"{' '.join(PARTITIONS)})")


def body():
    exp = C.Experiment("rq2_partition_ablation", __doc__, add_args)
    parts = exp.args.partition or PARTITIONS
    exp.check_data(exp.cfg["data"])
    exp.base()
    profiles = {m: exp.shared_profile(m) for m in parts}

    rows = []
    for seed in exp.seeds:
        ref = {m: exp.method_run(m, seed) for m in REFS}
        runs = [(m, None, ref[m]) for m in REFS]
        for m in parts:
            path, prof = profiles[m]
            runs.append((f"ig {m}", prof, exp.method_run("ig", seed, path,
                                                         label=f"ig-{m.replace(':', '')}-s{seed}")))
        for config, prof, run in runs:
            s = run.stats()
            rows.append({
                "config": config, "partition": prof["method"] if prof else "", "seed": seed,
                "n_important": sum(x["important"] for x in prof["components"]) if prof else None,
                "n_components": len(prof["components"]) if prof else None,
                "tau": prof["tau"] if prof else None, "f_imp": s["f_imp"],
                "val_loss": s["val_loss"], "val_ppl": s["val_ppl"], "val_acc": s["val_acc"],
                "payload_bytes_per_step": s["payload_bytes_per_step"],
                "ratio_to_adtopk_sync": s["payload_bytes_per_step"] / ref["adtopk_sync"].payload,
                "ratio_to_topk_sync": s["payload_bytes_per_step"] / ref["topk_sync"].payload,
                "sync_ms": s["sync_ms"], "comm_ms": s["comm_ms"], "step_ms": s["step_ms"],
                "tokens_per_s": s["tokens_per_s"], "run": run})
    C.write_csv(os.path.join(exp.out, "results.csv"), COLS,
                [{k: v for k, v in r.items() if k != "run"} for r in rows])

    configs = list(dict.fromkeys(r["config"] for r in rows))
    agg = []
    for cfg in configs:
        rs = [r for r in rows if r["config"] == cfg]
        a = {"config": cfg, "seeds": len(rs)}
        for k in NUM:
            vals = [r[k] for r in rs if r[k] is not None]
            a[k + "_mean"] = C.mean(vals) if vals else None
            a[k + "_std"] = C.std(vals) if vals else None
        agg.append(a)
    C.write_csv(os.path.join(exp.out, "summary.csv"),
                ["config", "seeds"] + [k + s for k in NUM for s in ("_mean", "_std")], agg)

    # ---- figure: quality vs traffic, and validation curves of seed 1 ----
    plt = C.pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    # Partitions that choose the same set land on the same point: one
    # marker, one legend entry naming them all.
    points = {}
    for a in agg:
        key = (round(a["ratio_to_adtopk_sync_mean"], 4), round(a["val_loss_mean"], 5))
        p = points.setdefault(key, {"names": [], "a": a})
        p["names"].append(a["config"].replace("ig ", ""))
    color = {a["config"]: f"C{i}" for i, a in enumerate(agg)}  # the same in both panels
    for (x, y), p in points.items():
        a = p["a"]
        f = a["f_imp_mean"]
        ax.errorbar(x, y, yerr=a["val_loss_std"] or None, fmt="s" if a["config"] in REFS else "o",
                    color=color[a["config"]], ms=5, capsize=2,
                    label=" = ".join(p["names"]) + (f" (f_imp {f:.2f})" if f else ""))
    ax.legend(fontsize=7)
    ax.set_xlabel("payload / adtopk_sync payload (per step)")
    ax.set_ylabel("validation loss (final)")
    ax.set_title("RQ2: quality vs traffic per partition method")
    for r in rows:
        if r["seed"] != exp.seeds[0]:
            continue
        ev = r["run"].evals
        ax2.plot([int(e["step"]) for e in ev], [float(e["val_loss"]) for e in ev], marker=".",
                 label=r["config"], color=color[r["config"]])
    ax2.set_xlabel("step")
    ax2.set_ylabel("validation loss")
    ax2.set_title(f"validation loss, seed {exp.seeds[0]}")
    ax2.legend(fontsize=7)
    figs = [os.path.join(exp.out, "quality_traffic.png")]
    C.save_fig(fig, figs[0])

    md = ["# RQ2 — partition methods", "",
          f"One trace of `adtopk_sync` on `{exp.cfg['data']}` ({exp.cfg['profile_steps']} steps, "
          f"seed 1), partitioned by each method; `ig` = ADTopk, R = 4, κ = 0.25, staggered, "
          f"contiguous packing into 4 buckets. ratio = payload bytes per step / the reference's; "
          f"f_imp = share of the ADTopk budget sent every step, beside it the ratio it predicts, "
          f"f_imp + κ(1 − f_imp). "
          f"Times are medians over steps; mean ± std over seeds where there are several.", "",
          C.md_table(["config", "important", "τ", "f_imp", "val loss", "ppl", "acc",
                      "payload/step", "ratio to adtopk_sync", "f_imp + κ(1 − f_imp)",
                      "ratio to topk_sync", "sync ms",
                      "collective ms", "tokens/s"],
                     [[a["config"],
                       f"{a['n_important_mean']:.0f}/{a['n_components_mean']:.0f}"
                       if a["n_important_mean"] is not None else "-",
                       C.fmt(a["tau_mean"]), C.fmt(a["f_imp_mean"], ".3f"),
                       C.fmt_pm([r["val_loss"] for r in rows if r["config"] == a["config"]]),
                       C.fmt(a["val_ppl_mean"], ".3f"), C.fmt(a["val_acc_mean"]),
                       C.fmt_bytes(a["payload_bytes_per_step_mean"]),
                       C.fmt(a["ratio_to_adtopk_sync_mean"], ".3f"),
                       C.fmt(model_ratio(a["f_imp_mean"], KAPPA), ".3f"),
                       C.fmt(a["ratio_to_topk_sync_mean"], ".3f"),
                       C.fmt(a["sync_ms_mean"], ".2f"), C.fmt(a["comm_ms_mean"], ".2f"),
                       C.fmt(a["tokens_per_s_mean"], ".0f")] for a in agg]),
          "", "Figure: `quality_traffic.png`.  Data: `results.csv` (per run), `summary.csv`."]
    exp.finish(md, figs)


if __name__ == "__main__":
    C.main(body)
