#!/usr/bin/python3
"""RQ1 — is component importance stable across workloads, profiling windows
and seeds?

From one base model, a short adtopk_sync post-train on each workload records
rank 0's activity trace; `igrad profile` (knee) turns each trace into a
profile (component scores, threshold tau, important set). The script then
compares profiles pairwise:
  * across workloads (seed 1, whole window);
  * across three consecutive windows of one trace (the first workload);
  * across seeds of the first workload (different data order);
  * online against offline, per workload: the profile `ig --profile auto
    --profile-steps W` builds inside the real run (its first W steps, every
    rank's selections summed) against the offline one of the same data and
    seed (rank 0's trace, W = the profiling run's steps); the switch's cost
    (exchange + build + re-plan, ms) from its summary.json.
Per pair: Jaccard of the important sets, top-k overlap (k = a quarter of
the components), Spearman rank correlation of the scores, |delta tau|.

Outputs (runs/rq1_workload_stability[-MODE]/): profiles.csv (every
component score), profile_summary.csv, pairs.csv, heatmaps.png (workload x
workload), scores.png (scores by layer and kind per workload),
stability.png (the three groups side by side), summary.md.

Not here: training with a profile (RQ2–RQ5), the runner (../common.py).
Usage: /usr/bin/python3 experiments/rq1_workload_stability/run.py [--mode quick]
       [--workload SPEC ...] [--stability-seeds N] [common flags, see --help]
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common as C  # noqa: E402

# the library's order (igrad_kind_t); EMB, HEAD and NORM are components too
KINDS = ["Q", "K", "V", "QKV", "O", "FC1", "FC2", "EMB", "HEAD", "NORM"]
KIND_COLORS = {"Q": "#4c72b0", "K": "#55a868", "V": "#c44e52", "QKV": "#937860",
               "O": "#8172b2", "FC1": "#ccb974", "FC2": "#64b5cd", "EMB": "#8c8c8c",
               "HEAD": "#dd8452", "NORM": "#da8bc3"}


def add_args(ap):
    ap.add_argument("--workload", action="append",
                    help="a workload (--data spec); repeat for several (default: the mode's "
                    "list) [IGRAD_EXP_WORKLOADS, space-separated]")
    ap.add_argument("--stability-seeds", type=int,
                    help="seeds of the first workload for the seed comparison (default 3; "
                    "2 in smoke mode)")


def components(profile):
    return {(c["layer"], c["kind"]): c for c in profile["components"]}


def compare(pa, pb):
    """Pairwise stability metrics of two profiles of the same layout."""
    ca, cb = components(pa), components(pb)
    if set(ca) != set(cb):
        raise C.ExperimentError("profiles of different layouts cannot be compared")
    keys = sorted(ca)
    ia = {k for k in keys if ca[k]["important"]}
    ib = {k for k in keys if cb[k]["important"]}
    union = ia | ib
    jac = len(ia & ib) / len(union) if union else 1.0
    k = max(1, math.ceil(len(keys) / 4))
    # Ties in score break by the (layer, kind) order, the same in both.
    top = lambda c: set(sorted(keys, key=lambda x: (-c[x]["score"], x))[:k])  # noqa: E731
    overlap = len(top(ca) & top(cb)) / k
    rho = C.spearman([ca[x]["score"] for x in keys], [cb[x]["score"] for x in keys])
    return {"jaccard": jac, "topk_overlap": overlap, "k": k, "spearman": rho,
            "abs_dtau": abs(pa["tau"] - pb["tau"]), "n_imp_a": len(ia), "n_imp_b": len(ib)}


def budget_share(trace, profile, window):
    """Share of the components' sparsifier budget (entries retained by
    adtopk, summed over the window's steps) that falls in important
    components — measured from the trace, OTHER tensors not included."""
    imp = {(c["layer"], c["kind"]) for c in profile["components"] if c["important"]}
    lo, hi = window
    tot = sel = 0
    with open(trace) as f:
        rows = [l for l in f if not l.startswith("#")]
    for r in C.csv.DictReader(rows):
        s = int(r["step"])
        if lo <= s < hi:
            n = int(r["retained_numel"])
            tot += n
            if (int(r["layer"]), r["component"]) in imp:
                sel += n
    return sel / tot if tot else float("nan")


def body():
    exp = C.Experiment("rq1_workload_stability", __doc__, add_args)
    a, c = exp.args, exp.cfg
    workloads = a.workload or (os.environ.get("IGRAD_EXP_WORKLOADS", "").split() or c["workloads"])
    if len(workloads) < 2:
        raise C.ExperimentError("RQ1 needs at least two workloads")
    for w in workloads:
        exp.check_data(w)
    nseeds = a.stability_seeds or (2 if exp.mode == "smoke" else 3)
    steps = c["profile_steps"]
    if steps < 3:
        raise C.ExperimentError("RQ1 needs --profile-steps of at least 3 (three windows)")
    exp.base()

    profiles = {}  # name -> dict(profile, group, data, seed, window, trace)

    def add(name, group, data, seed, trace, window):
        path, prof = exp.build_profile(trace, "knee", window=window)
        profiles[name] = dict(profile=prof, group=group, data=data, seed=seed, window=window,
                              trace=trace, path=path)

    labels = [exp.label_of(w) for w in workloads]
    if len(set(labels)) != len(labels):
        raise C.ExperimentError(f"workload labels collide: {labels}")
    for w, lab in zip(workloads, labels):
        run = exp.profiling_run(w, seed=1, label=f"profile-{lab}")
        add(lab, "workload", w, 1, os.path.join(run.path, "trace.csv"), (0, steps))
    main_w, main_l = workloads[0], labels[0]
    main_trace = profiles[main_l]["trace"]
    cuts = [0, steps // 3, 2 * steps // 3, steps]
    win_names = []
    for i in range(3):
        name = f"{main_l}@{cuts[i]}:{cuts[i + 1]}"
        add(name, "window", main_w, 1, main_trace, (cuts[i], cuts[i + 1]))
        win_names.append(name)
    seed_names = [main_l]
    for s in range(2, nseeds + 1):
        run = exp.profiling_run(main_w, seed=s, label=f"profile-{main_l}-s{s}")
        name = f"{main_l}#s{s}"
        add(name, "seed", main_w, s, os.path.join(run.path, "trace.csv"), (0, steps))
        seed_names.append(name)

    # online: the profile the real run builds itself over the same W steps
    online_names, online_cost = [], {}
    for w, lab in zip(workloads, labels):
        run = exp.train(f"online-{lab}", "ig", w, seed=1, steps=steps + 1, eval_every=0,
                        extra=["--profile", "auto", "--profile-steps", str(steps),
                               "--sparsifier", "adtopk"])
        path = os.path.join(run.path, "profile.json")
        with open(path) as f:
            prof = json.load(f)
        with open(os.path.join(run.path, "summary.json")) as f:
            op = json.load(f).get("online_profile", {})
        name = f"{lab}~online"
        profiles[name] = dict(profile=prof, group="online", data=w, seed=1, window=(0, steps),
                              trace=profiles[lab]["trace"], path=path)
        online_names.append((lab, name))
        online_cost[name] = (op.get("gather_ms"), op.get("build_ms"))

    # ---- tables ----
    comp_rows, sum_rows = [], []
    for name, p in profiles.items():
        prof = p["profile"]
        for comp in sorted(prof["components"], key=lambda x: (x["layer"], KINDS.index(x["kind"]))):
            comp_rows.append({"profile": name, "group": p["group"], "data": p["data"],
                              "seed": p["seed"], "window": f"{p['window'][0]}:{p['window'][1]}",
                              "layer": comp["layer"], "kind": comp["kind"], "numel": comp["numel"],
                              "mean_activity": comp["mean_activity"], "magnitude": comp["magnitude"],
                              "persistence": comp["persistence"], "score": comp["score"],
                              "important": int(comp["important"]), "tau": prof["tau"]})
        imp = [f"{x['layer']}{x['kind']}" for x in prof["components"] if x["important"]]
        sum_rows.append({"profile": name, "group": p["group"], "data": p["data"], "seed": p["seed"],
                         "window": f"{p['window'][0]}:{p['window'][1]}", "tau": prof["tau"],
                         "n_important": len(imp), "n_components": len(prof["components"]),
                         "imp_budget_share": budget_share(p["trace"], prof, p["window"]),
                         "important": " ".join(imp)})
    C.write_csv(os.path.join(exp.out, "profiles.csv"),
                ["profile", "group", "data", "seed", "window", "layer", "kind", "numel",
                 "mean_activity", "magnitude", "persistence", "score", "important", "tau"],
                comp_rows)
    C.write_csv(os.path.join(exp.out, "profile_summary.csv"),
                ["profile", "group", "data", "seed", "window", "tau", "n_important",
                 "n_components", "imp_budget_share", "important"], sum_rows)

    pair_rows = []
    groups = {"workload": labels, "window": win_names, "seed": seed_names}
    for g, names in groups.items():
        for i in range(len(names)):
            for j in range(i + 1, len(names)):
                m = compare(profiles[names[i]]["profile"], profiles[names[j]]["profile"])
                pair_rows.append(dict(group=g, a=names[i], b=names[j], **m))
    for off, on in online_names:
        m = compare(profiles[off]["profile"], profiles[on]["profile"])
        pair_rows.append(dict(group="online", a=off, b=on, **m))
    groups["online"] = [on for _, on in online_names]
    pair_cols = ["group", "a", "b", "jaccard", "topk_overlap", "k", "spearman", "abs_dtau",
                 "n_imp_a", "n_imp_b"]
    C.write_csv(os.path.join(exp.out, "pairs.csv"), pair_cols, pair_rows)

    # ---- figures ----
    plt = C.pyplot()
    figs = []
    n = len(labels)
    mats = {}
    for key in ("jaccard", "topk_overlap", "spearman", "abs_dtau"):
        m = [[1.0 if key != "abs_dtau" else 0.0] * n for _ in range(n)]
        for r in pair_rows:
            if r["group"] == "workload":
                i, j = labels.index(r["a"]), labels.index(r["b"])
                m[i][j] = m[j][i] = r[key]
        mats[key] = m
    fig, axes = plt.subplots(2, 2, figsize=(8, 7))
    titles = {"jaccard": "Jaccard of important sets", "topk_overlap": "top-k overlap",
              "spearman": "Spearman of scores", "abs_dtau": "|Δτ|"}
    for ax, key in zip(axes.flat, mats):
        lim = (0, max(1e-9, max(max(r) for r in mats[key]))) if key == "abs_dtau" else \
            ((-1, 1) if key == "spearman" else (0, 1))
        im = ax.imshow(mats[key], vmin=lim[0], vmax=lim[1],
                       cmap="viridis_r" if key == "abs_dtau" else "viridis")
        ax.set_xticks(range(n), labels, rotation=40, ha="right")
        ax.set_yticks(range(n), labels)
        for i in range(n):
            for j in range(n):
                ax.text(j, i, f"{mats[key][i][j]:.2f}", ha="center", va="center", fontsize=7,
                        color="w" if (mats[key][i][j] - lim[0]) / (lim[1] - lim[0] or 1) < 0.5
                        and key != "abs_dtau" else "k")
        ax.set_title(titles[key])
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle("RQ1: importance profiles across workloads (same base, knee)")
    figs.append(os.path.join(exp.out, "heatmaps.png"))
    C.save_fig(fig, figs[-1])

    fig, axes = plt.subplots(n, 1, figsize=(9, 1.7 * n + 0.6), sharex=True, squeeze=False)
    for ax, lab in zip(axes[:, 0], labels):
        prof = profiles[lab]["profile"]
        kinds = [k for k in KINDS if any(x["kind"] == k for x in prof["components"])]
        width = 1.0 / (len(kinds) + 1)
        for comp in prof["components"]:
            ki = kinds.index(comp["kind"])
            ax.bar(comp["layer"] + ki * width, comp["score"], width,
                   color=KIND_COLORS[comp["kind"]], alpha=1.0 if comp["important"] else 0.35,
                   edgecolor="k" if comp["important"] else "none", linewidth=0.5)
        ax.axhline(prof["tau"], color="k", ls="--", lw=0.8)
        ax.set_ylabel(lab)
        ax.set_ylim(0, 1.05)
    comps0 = profiles[labels[0]]["profile"]["components"]
    layers = sorted({x["layer"] for x in comps0})
    kinds0 = [k for k in KINDS if any(x["kind"] == k for x in comps0)]
    w0 = 1.0 / (len(kinds0) + 1)
    axes[-1, 0].set_xticks([l + w0 * (len(kinds0) - 1) / 2 for l in layers],
                           [f"layer {l}" for l in layers])
    from matplotlib.patches import Patch
    axes[0, 0].legend(handles=[Patch(color=KIND_COLORS[k], label=k) for k in kinds0],
                      ncol=len(kinds0), fontsize=7, loc="upper right")
    axes[0, 0].set_title("component scores by layer and kind (solid, outlined: important; "
                         "dashed: τ)")
    figs.append(os.path.join(exp.out, "scores.png"))
    C.save_fig(fig, figs[-1])

    fig, ax = plt.subplots(figsize=(7, 3.2))
    metrics = ["jaccard", "topk_overlap", "spearman"]
    for gi, g in enumerate(groups):
        rows = [r for r in pair_rows if r["group"] == g]
        for mi, key in enumerate(metrics):
            vals = [r[key] for r in rows]
            x = gi + (mi - 1) * 0.25
            ax.bar(x, C.mean(vals), 0.23, color=f"C{mi}", label=key if gi == 0 else None)
            ax.plot([x] * len(vals), vals, "k.", ms=3)
    ax.set_xticks(range(len(groups)),
                  [f"{g}s ({len([r for r in pair_rows if r['group'] == g])} pairs)" for g in groups])
    ax.set_ylim(min(0, min(r["spearman"] for r in pair_rows if not math.isnan(r["spearman"])))
                if any(not math.isnan(r["spearman"]) for r in pair_rows) else 0, 1.05)
    ax.legend(fontsize=7)
    ax.set_title("RQ1: stability of the profile (bars: mean, dots: pairs)")
    figs.append(os.path.join(exp.out, "stability.png"))
    C.save_fig(fig, figs[-1])

    # ---- summary ----
    md = ["# RQ1 — workload stability of component importance", "",
          f"Profiles: `adtopk_sync` post-trains of {steps} steps from the same base, rank 0's "
          f"trace, `igrad profile --method knee` (whole run unless a window is given). "
          f"imp share: the important components' share of the components' ADTopk budget "
          f"(retained entries, from the trace; OTHER tensors not counted).", "",
          C.md_table(["profile", "data", "seed", "window", "τ", "important", "imp share",
                      "important components"],
                     [[r["profile"], f"`{r['data']}`", r["seed"], r["window"], f"{r['tau']:.4f}",
                       f"{r['n_important']}/{r['n_components']}",
                       C.fmt(r["imp_budget_share"], ".3f"), r["important"]] for r in sum_rows]),
          "", f"Pairs (k = {pair_rows[0]['k']} for the top-k overlap):", "",
          C.md_table(["group", "a", "b", "Jaccard", "top-k", "Spearman", "abs Δτ"],
                     [[r["group"], r["a"], r["b"], f"{r['jaccard']:.3f}", f"{r['topk_overlap']:.3f}",
                       C.fmt(r["spearman"], ".3f"), f"{r['abs_dtau']:.4f}"] for r in pair_rows]),
          "", "Means per group:", "",
          C.md_table(["group", "pairs", "Jaccard", "top-k", "Spearman", "abs Δτ"],
                     [[g, len(rs), C.fmt_pm([r["jaccard"] for r in rs], ".3f"),
                       C.fmt_pm([r["topk_overlap"] for r in rs], ".3f"),
                       C.fmt_pm([r["spearman"] for r in rs], ".3f"),
                       C.fmt_pm([r["abs_dtau"] for r in rs], ".4f")]
                      for g in groups for rs in [[r for r in pair_rows if r["group"] == g]]]),
          "", "Online (`ig --profile auto`, the run's own first "
          f"{steps} steps, every rank's selections summed) vs offline (rank 0's trace of a "
          "separate run): the `online` rows above. Cost of the switch (one exchange of the "
          "window, profile build, re-plan and agreement), ms:", "",
          C.md_table(["profile", "exchange ms", "build + re-plan ms"],
                     [[n, C.fmt(online_cost[n][0], ".2f"), C.fmt(online_cost[n][1], ".2f")]
                      for _, n in online_names]),
          "", "Figures: `heatmaps.png`, `scores.png`, `stability.png`.  Data: `profiles.csv`, "
          "`profile_summary.csv`, `pairs.csv`."]
    exp.finish(md, figs)


if __name__ == "__main__":
    C.main(body)
