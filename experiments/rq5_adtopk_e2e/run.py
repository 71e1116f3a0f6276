#!/usr/bin/python3
"""RQ5 — end to end: what do dense, topk_sync, adtopk_sync, iad and ig cost
and reach, and what is ig's wall-clock gain where bandwidth is short?

Quality runs: the five methods post-train the same base on the same data,
schedule and seeds over plain mpirun (shared memory): validation loss /
perplexity / accuracy, payload and modelled wire bytes per step, ratios to
topk_sync and to the same sparsifier's *_sync beside f_imp, select /
collective / sync / step ms (medians over steps), the engine's overhead
(sync minus collective) as a share of step time, tokens/s; window-averaged
training-loss, validation-loss and payload curves.

Task leg: the five methods and seeds again on the mode's task workload
(synthetic key-value recall, loss on the response only, exact-match
accuracy on held-out problems; iad and ig profile themselves online on the
task, --profile auto): val loss and task accuracy per seed, their means
and spreads, and the paired ratios and differences to the same
sparsifier's *_sync.

Network runs: the five methods again for a few steps inside
experiments/netem/run-shaped (MPI over TCP on a loopback shaped with tc) at
each --rates entry (default: unshaped `none`, 1gbit, 100mbit): step,
sync and collective ms per method and link, and the speed-up of ig over
topk_sync and dense (their time / ig's time), plus ig's sync time as a
fraction of topk_sync's (the design's target is <= 0.35 at 1 Gbit/s). Link
`shm` runs the same short runs over plain mpirun (shared memory); all of
them run back to back, so their times compare (the quality runs' times
were taken over a longer span, while the machine's load may have changed).
Where run-shaped refuses
(no root / CAP_NET_ADMIN / iproute2) the network runs are skipped and
summary.md says why; the quality runs still count.

Outputs (runs/rq5_adtopk_e2e[-MODE]/): results.csv, summary.csv, task.csv,
net.csv, speedup.csv, curves.png, network.png, summary.md.
Not here: the runner (../common.py), the shaping (../netem/run-shaped).
Usage: /usr/bin/python3 experiments/rq5_adtopk_e2e/run.py [--mode quick]
       [--rates none,1gbit,100mbit] [--net-steps N] [common flags, see --help]
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common as C  # noqa: E402

METHODS = ["dense", "topk_sync", "adtopk_sync", "iad", "ig"]
SYNC_OF = {"topk": "topk_sync", "adtopk": "adtopk_sync"}

COLS = ["method", "seed", "f_imp", "val_loss", "val_ppl", "val_acc", "payload_bytes_per_step",
        "wire_bytes_per_step", "ratio_to_topk_sync", "ratio_to_own_sync", "select_ms",
        "comm_ms", "sync_ms", "step_ms", "overhead_share", "tokens_per_s"]
NUM = COLS[2:]
TASK_COLS = ["method", "seed", "f_imp", "val_loss", "task_accuracy", "task_problems",
             "payload_bytes_per_step", "ratio_to_own_sync", "val_loss_ratio_to_own_sync",
             "task_accuracy_diff_to_own_sync"]
NET_COLS = ["link", "method", "steps", "f_imp", "payload_bytes_per_step", "wire_bytes_per_step",
            "comm_ms", "sync_ms", "step_ms", "tokens_per_s"]
SPEED_COLS = ["link", "f_imp", "ig_payload_ratio_to_topk_sync", "ig_step_speedup_vs_topk_sync",
              "ig_step_speedup_vs_dense", "ig_sync_speedup_vs_topk_sync", "ig_sync_speedup_vs_dense",
              "ig_sync_ratio_to_topk_sync"]


def add_args(ap):
    ap.add_argument("--rates", help="links for the network runs, comma-separated tc rates or "
                    "`none` (unshaped TCP); empty: no network runs (default none,1gbit,100mbit)")
    ap.add_argument("--net-steps", type=int, help="steps of each network run")


def sync_ref(run):
    sp = run.summary["config"]["sync"]["sparsifier"]
    return SYNC_OF.get(sp) if run.summary["method"] != "dense" else None


def paired_cell(vals, spec):
    """Mean (min..max) of per-seed paired values; '-' without any."""
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{format(C.mean(vals), spec)} ({format(min(vals), spec)}..{format(max(vals), spec)})"


def window_avg(xs, w):
    """Means over consecutive windows of w steps: (window centres, means)."""
    cx, cy = [], []
    for i in range(0, len(xs) - w + 1, w):
        cx.append(i + (w - 1) / 2)
        cy.append(sum(xs[i:i + w]) / w)
    return cx, cy


def body():
    exp = C.Experiment("rq5_adtopk_e2e", __doc__, add_args)
    c = exp.cfg
    rates = c["rates"] if exp.args.rates is None else [r for r in exp.args.rates.split(",") if r]
    net_steps = exp.args.net_steps or c["net_steps"]
    exp.check_data(c["data"])
    exp.base()
    profile, _ = exp.shared_profile("knee")

    # ---- quality runs ----
    rows, by = [], {}
    for seed in exp.seeds:
        runs = {m: exp.method_run(m, seed, profile) for m in METHODS}
        for m, run in runs.items():
            by[(m, seed)] = run
            s = run.stats()
            ref = sync_ref(run)
            rows.append({"method": m, "seed": seed, "f_imp": s["f_imp"], "val_loss": s["val_loss"],
                         "val_ppl": s["val_ppl"], "val_acc": s["val_acc"],
                         "payload_bytes_per_step": s["payload_bytes_per_step"],
                         "wire_bytes_per_step": s["wire_bytes_per_step"],
                         "ratio_to_topk_sync": s["payload_bytes_per_step"] / runs["topk_sync"].payload,
                         "ratio_to_own_sync": s["payload_bytes_per_step"] / runs[ref].payload
                         if ref else None,
                         "select_ms": s["select_ms"], "comm_ms": s["comm_ms"],
                         "sync_ms": s["sync_ms"], "step_ms": s["step_ms"],
                         "overhead_share": (s["sync_ms"] - s["comm_ms"]) / s["step_ms"],
                         "tokens_per_s": s["tokens_per_s"]})
    C.write_csv(os.path.join(exp.out, "results.csv"), COLS, rows)
    agg = []
    for m in METHODS:
        rs = [r for r in rows if r["method"] == m]
        a = {"method": m, "seeds": len(rs)}
        for k in NUM:
            vals = [r[k] for r in rs if r[k] is not None]
            a[k + "_mean"] = C.mean(vals) if vals else None
            a[k + "_std"] = C.std(vals) if vals else None
        agg.append(a)
    C.write_csv(os.path.join(exp.out, "summary.csv"),
                ["method", "seeds"] + [k + s for k in NUM for s in ("_mean", "_std")], agg)

    # ---- task leg: exact-match accuracy on held-out problems ----
    task_rows = []
    for seed in exp.seeds:
        truns = {m: exp.task_run(m, seed) for m in METHODS}
        for m, run in truns.items():
            s, ref = run.stats(), sync_ref(run)
            acc = run.final.get("task_accuracy")
            r0 = truns[ref] if ref else None
            task_rows.append({
                "method": m, "seed": seed, "f_imp": s["f_imp"], "val_loss": s["val_loss"],
                "task_accuracy": acc, "task_problems": run.summary.get("task_problems"),
                "payload_bytes_per_step": s["payload_bytes_per_step"],
                "ratio_to_own_sync": s["payload_bytes_per_step"] / r0.payload if r0 else None,
                "val_loss_ratio_to_own_sync": s["val_loss"] / r0.final["val_loss"] if r0 else None,
                "task_accuracy_diff_to_own_sync": acc - r0.final["task_accuracy"] if r0 else None})
    C.write_csv(os.path.join(exp.out, "task.csv"), TASK_COLS, task_rows)

    # ---- network runs: short, back to back, so their times compare ----
    net, notes = [], []

    def net_runs(link, rate):
        for m in METHODS:
            run = exp.train(f"{m}-{link}", m, c["data"], seed=1, steps=net_steps,
                            profile=profile if m in ("iad", "ig") else None,
                            extra=(["--sparsifier", "adtopk"] if m == "iad" else
                                   exp.ig_extra() if m == "ig" else []),
                            rate=rate, eval_every=0, eval_batches=1)
            s = run.stats()
            net.append({"link": link, "method": m, "steps": net_steps, "f_imp": s["f_imp"],
                        "payload_bytes_per_step": s["payload_bytes_per_step"],
                        "wire_bytes_per_step": s["wire_bytes_per_step"],
                        "comm_ms": s["comm_ms"], "sync_ms": s["sync_ms"],
                        "step_ms": s["step_ms"], "tokens_per_s": s["tokens_per_s"]})

    net_runs("shm", None)
    if rates:
        why = exp.netem_check()
        if why:
            notes.append(f"Network runs skipped: {why}")
            exp.log(notes[-1])
        else:
            try:
                for rate in rates:
                    net_runs(rate, rate)
            except C.NetemUnavailable as e:
                notes.append(f"Network runs stopped: {e}")
                exp.log(notes[-1])
    else:
        notes.append("Shaped runs not asked for (--rates empty).")
    C.write_csv(os.path.join(exp.out, "net.csv"), NET_COLS, net)
    links = list(dict.fromkeys(r["link"] for r in net))
    speed = []
    for link in links:
        t = {r["method"]: r for r in net if r["link"] == link}
        if not all(m in t for m in ("dense", "topk_sync", "ig")):
            continue
        ig, tk, de = t["ig"], t["topk_sync"], t["dense"]
        speed.append({"link": link, "f_imp": ig["f_imp"],
                      "ig_payload_ratio_to_topk_sync": ig["payload_bytes_per_step"]
                      / tk["payload_bytes_per_step"],
                      "ig_step_speedup_vs_topk_sync": tk["step_ms"] / ig["step_ms"],
                      "ig_step_speedup_vs_dense": de["step_ms"] / ig["step_ms"],
                      "ig_sync_speedup_vs_topk_sync": tk["sync_ms"] / ig["sync_ms"],
                      "ig_sync_speedup_vs_dense": de["sync_ms"] / ig["sync_ms"],
                      "ig_sync_ratio_to_topk_sync": ig["sync_ms"] / tk["sync_ms"]})
    C.write_csv(os.path.join(exp.out, "speedup.csv"), SPEED_COLS, speed)

    # ---- figures ----
    plt = C.pyplot()
    figs = []
    w = max(1, c["steps"] // 10)
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for i, m in enumerate(METHODS):
        seeds_runs = [by[(m, s)] for s in exp.seeds]
        loss = [C.mean(v) for v in zip(*[r.col("loss") for r in seeds_runs])]
        pay = [C.mean(v) for v in zip(*[r.col("payload_bytes") for r in seeds_runs])]
        axes[0].plot(*window_avg(loss, w), marker=".", color=f"C{i}", label=m)
        axes[2].plot(*window_avg(pay, w), marker=".", color=f"C{i}", label=m)
        ev = [[(int(e["step"]), float(e["val_loss"])) for e in r.evals] for r in seeds_runs]
        steps = [p[0] for p in ev[0]]
        axes[1].plot(steps, [C.mean([e[j][1] for e in ev]) for j in range(len(steps))],
                     marker=".", color=f"C{i}", label=m)
    axes[0].set_title(f"training loss (mean over {w}-step windows)")
    axes[1].set_title("validation loss")
    axes[2].set_title(f"payload bytes per step ({w}-step windows)")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=7)
    fig.suptitle(f"RQ5: post-training on {c['data']}, {c['ranks']} ranks, "
                 f"{len(exp.seeds)} seed(s)")
    figs.append(os.path.join(exp.out, "curves.png"))
    C.save_fig(fig, figs[-1])

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    width = 0.8 / len(METHODS)
    for i, m in enumerate(METHODS):
        for axx, key in ((ax, "step_ms"), (ax2, "sync_ms")):
            vals = [next((r[key] for r in net if r["link"] == l and r["method"] == m),
                         float("nan")) for l in links]
            axx.bar([j + (i - 2) * width for j in range(len(links))], vals, width,
                    color=f"C{i}", label=m)
    for axx, t in ((ax, "step time"), (ax2, "sync time")):
        axx.set_xticks(range(len(links)), [{"shm": "shared mem", "none": "TCP unshaped"}
                                           .get(l, "TCP " + l) for l in links])
        axx.set_yscale("log")
        axx.set_ylabel("ms per step (median)")
        axx.set_title(f"RQ5: {t} per link")
        axx.legend(fontsize=7)
    figs.append(os.path.join(exp.out, "network.png"))
    C.save_fig(fig, figs[-1])

    # ---- summary ----
    md = ["# RQ5 — end to end", "",
          f"Post-training on `{c['data']}` from the shared base; `iad` and `ig` on ADTopk with the "
          f"shared knee profile (ig: R = 4, κ = 0.25, staggered, contiguous into 4 buckets). "
          f"ratio = payload bytes per step / topk_sync's, and / the same sparsifier's *_sync; "
          f"f_imp = share of the ADTopk budget sent every step. Times are medians over steps "
          f"(MPI over shared memory); overhead = (sync − collective) / step time.", "",
          C.md_table(["method", "f_imp", "val loss", "ppl", "acc", "payload/step", "ratio to topk_sync",
                      "ratio to own *_sync", "select ms", "collective ms", "sync ms", "step ms",
                      "overhead", "tokens/s"],
                     [[a["method"], C.fmt(a["f_imp_mean"], ".3f"),
                       C.fmt_pm([r["val_loss"] for r in rows if r["method"] == a["method"]]),
                       C.fmt(a["val_ppl_mean"], ".3f"), C.fmt(a["val_acc_mean"]),
                       C.fmt_bytes(a["payload_bytes_per_step_mean"]),
                       C.fmt(a["ratio_to_topk_sync_mean"], ".3f"),
                       C.fmt(a["ratio_to_own_sync_mean"], ".3f"), C.fmt(a["select_ms_mean"], ".2f"),
                       C.fmt(a["comm_ms_mean"], ".2f"), C.fmt(a["sync_ms_mean"], ".2f"),
                       C.fmt(a["step_ms_mean"], ".1f"), C.fmt(a["overhead_share_mean"], ".1%"),
                       C.fmt(a["tokens_per_s_mean"], ".0f")] for a in agg]),
          "", "Times in this table come from runs spread over the whole script (and shared with "
          "RQ2–RQ4), so the machine's load may differ between rows; compare times in the next "
          "section, whose runs ran back to back.", "",
          f"## Task leg: `{c['task']}`, {c['task_steps']} steps", "",
          "The same methods, base and seeds post-trained on the synthetic recall task (loss on "
          f"the response only, batch {c['task_batch']} × {C.TASK_SEQ_LEN} tokens, lr "
          f"{C.TASK_LR}); task accuracy = exact match on the held-out problems; `iad`/`ig` "
          "profile themselves online on the task (`--profile auto`). Paired columns: per seed "
          "against the same sparsifier's *_sync, then the mean (min..max) over seeds.", "",
          C.md_table(["method", "val loss", "task accuracy", "ratio to own *_sync",
                      "val loss / own *_sync", "accuracy − own *_sync"],
                     [[m, C.fmt_pm([r["val_loss"] for r in task_rows if r["method"] == m]),
                       C.fmt_pm([r["task_accuracy"] for r in task_rows if r["method"] == m],
                                ".3f"),
                       paired_cell([r["ratio_to_own_sync"] for r in task_rows
                                    if r["method"] == m], ".3f"),
                       paired_cell([r["val_loss_ratio_to_own_sync"] for r in task_rows
                                    if r["method"] == m], ".4f"),
                       paired_cell([r["task_accuracy_diff_to_own_sync"] for r in task_rows
                                    if r["method"] == m], "+.3f")] for m in METHODS]),
          "",
          f"## Bandwidth-limited runs ({net_steps} steps each, seed 1, back to back)", "",
          "Links: `shm` plain mpirun (shared memory); `none` TCP over an unshaped loopback in a "
          "network namespace; a rate = that loopback (MTU 1500) shaped by `tc tbf` with a "
          "6000-byte bucket (experiments/netem/run-shaped; both directions share the rate).",
          ""]
    md += notes + ([""] if notes else [])
    md += [C.md_table(["link", "method", "f_imp", "payload/step", "collective ms", "sync ms",
                       "step ms", "tokens/s"],
                      [[r["link"], r["method"], C.fmt(r["f_imp"], ".3f"),
                        C.fmt_bytes(r["payload_bytes_per_step"]), C.fmt(r["comm_ms"], ".2f"),
                        C.fmt(r["sync_ms"], ".2f"), C.fmt(r["step_ms"], ".1f"),
                        C.fmt(r["tokens_per_s"], ".0f")] for r in net]),
           "", "Speed-up of `ig` (the other method's time / ig's time):", "",
           C.md_table(["link", "f_imp", "ig payload / topk_sync", "step vs topk_sync",
                       "step vs dense", "sync vs topk_sync", "sync vs dense",
                       "ig sync / topk_sync sync"],
                      [[r["link"], C.fmt(r["f_imp"], ".3f"),
                        C.fmt(r["ig_payload_ratio_to_topk_sync"], ".3f"),
                        C.fmt(r["ig_step_speedup_vs_topk_sync"], ".2f") + "×",
                        C.fmt(r["ig_step_speedup_vs_dense"], ".2f") + "×",
                        C.fmt(r["ig_sync_speedup_vs_topk_sync"], ".2f") + "×",
                        C.fmt(r["ig_sync_speedup_vs_dense"], ".2f") + "×",
                        C.fmt(r["ig_sync_ratio_to_topk_sync"], ".3f")] for r in speed]),
           "", "Figures: `curves.png`, `network.png`.  Data: `results.csv`, `summary.csv`, "
           "`task.csv`, `net.csv`, `speedup.csv`."]
    exp.finish(md, figs)


if __name__ == "__main__":
    C.main(body)
