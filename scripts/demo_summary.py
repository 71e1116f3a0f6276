#!/usr/bin/python3
"""demo_summary.py — the table, summary.json and summary.md of `make demo`
from its runs: one `igrad train --out` directory per method and seed.

Usage: demo_summary.py --out DIR --seeds S[,S...] --methods M[,M...]
                       [--workload W] [--ranks P] [--steps N]
                       [--task-out DIR --task-workload W --task-steps N]

Reads DIR/<method>/seed<S>/summary.json for every method and seed and
writes DIR/summary.json, DIR/summary.md (both replaced atomically) and
prints the table. Every comparison is over all seeds: a method's val loss
is the mean over seeds with its spread (min..max), and each ratio to a
reference (payload or val loss against the same sparsifier's *_sync, val
loss against dense) is also given paired by seed (the same seed shares the
data order and initial state, so per-seed ratios are far tighter than the
spread between seeds). A run that profiled itself online (--profile auto)
sends what *_sync sends during its window: its payload ratio is given in
the steady state (the steps after the switch, from metrics.csv) and over
the whole run. With --task-out, the same methods and seeds were also
post-trained on a task workload (exact-match accuracy on held-out
problems): each method gets a "task" block (val loss and task accuracy
per seed, paired ratios and accuracy differences to dense and to *_sync)
and its task_accuracy is that leg's. A row named "baseline" (adtopk_sync
at density 0.01, F32: issue 27's yardstick) gets every other sparse row's
paired payload and val-loss ratios to it, and the "verdict" block says met
or not for issue 27's part 6 (ig against the baseline) and part 7 (the
default adtopk_sync against dense), with the numbers. Needs only the standard library. Not here: running
anything (scripts/demo), plots (scripts/plot_run.py).
"""
import argparse
import csv
import json
import os
import sys

SYNC_OF = {"topk": "topk_sync", "adtopk": "adtopk_sync"}
# The promise and its thresholds (docs/architecture.md, README).
TARGET = {"ig_payload_ratio_max": 0.25, "ig_val_loss_ratio_max": 1.00,
          "sparse_val_loss_ratio_to_dense_max": 1.01}
# Issue 27's parts 6 and 7 (the "verdict" block).
V6 = {"payload_ratio_max": 0.25, "val_loss_ratio_max": 1.005}
V7 = {"val_loss_ratio_to_dense_max": 1.01}


def mean(xs):
    return sum(xs) / len(xs)


def spread(xs):
    return {"min": min(xs), "max": max(xs)}


def load_runs(out, methods, seeds):
    runs = {}
    for m in methods:
        for s in seeds:
            path = os.path.join(out, m, f"seed{s}", "summary.json")
            try:
                with open(path) as f:
                    runs[(m, s)] = json.load(f)
                add_steady_payload(runs[(m, s)], os.path.dirname(path))
            except (OSError, ValueError, KeyError) as e:
                raise SystemExit(f"demo_summary: {path}: {e}")
            if not runs[(m, s)].get("complete", False):
                raise SystemExit(f"demo_summary: {path}: the run did not complete")
    return runs


def paired(runs, m, ref, seeds, key):
    """Per-seed ratio key(m) / key(ref), with their mean and spread."""
    vals = []
    for s in seeds:
        a, b = key(runs[(m, s)]), key(runs[(ref, s)])
        if a is None or b is None or b == 0:
            return None
        vals.append(a / b)
    return {"seeds": vals, "mean": mean(vals), **spread(vals)}


def val_loss(s):
    return s["final"]["val_loss"]


def payload(s):
    """Payload bytes per step in the steady state: for a run that profiled
    itself online (--profile auto), the steps after the switch (its window
    sends what *_sync sends); otherwise the whole run's mean."""
    return s.get("_payload_steady", s["payload_bytes_per_step"])


def whole_run_payload(s):
    return s["payload_bytes_per_step"]


def add_steady_payload(s, run_dir):
    sw = (s.get("online_profile") or {}).get("switch_step")
    if sw is None:
        return
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        after = [float(r["payload_bytes"]) for r in csv.DictReader(f) if int(r["step"]) >= sw]
    if after:
        s["_payload_steady"] = sum(after) / len(after)


def task_acc(s):
    return s["final"].get("task_accuracy")


def paired_diff(runs, m, ref, seeds, key):
    """Per-seed difference key(m) - key(ref), with their mean and spread."""
    vals = [key(runs[(m, s)]) - key(runs[(ref, s)]) for s in seeds]
    return {"seeds": vals, "mean": mean(vals), **spread(vals)}


def summarize_task(task_out, methods, seeds, workload, steps):
    """The task leg: per method its val loss and exact-match accuracy over
    seeds, paired against dense and the same sparsifier's *_sync."""
    runs = load_runs(task_out, methods, seeds)
    res = {}
    for m in methods:
        first = runs[(m, seeds[0])]
        accs = [task_acc(runs[(m, s)]) for s in seeds]
        if any(a is None for a in accs):
            raise SystemExit(f"demo_summary: {task_out}/{m}: no task_accuracy (is {workload!r} "
                             "a task workload?)")
        losses = [val_loss(runs[(m, s)]) for s in seeds]
        r = {"workload": workload, "steps": steps, "val_loss": mean(losses),
             "val_loss_seeds": losses, "task_accuracy": mean(accs),
             "task_accuracy_seeds": accs, "task_accuracy_spread": spread(accs),
             "task_problems": first.get("task_problems"),
             "payload_bytes_per_step": mean([payload(runs[(m, s)]) for s in seeds])}
        ref = SYNC_OF.get(first["config"]["sync"].get("sparsifier"))
        for name, other in (("dense", "dense"), ("sync", ref)):
            if other in methods and other != m:
                r[f"val_loss_ratio_to_{name}"] = paired(runs, m, other, seeds, val_loss)
                r[f"task_accuracy_diff_to_{name}"] = paired_diff(runs, m, other, seeds, task_acc)
                if name == "sync":
                    r["ratio_to_sync"] = paired(runs, m, other, seeds, payload)
        res[m] = r
    return res


def summarize(out, methods, seeds, workload, ranks, steps, task=None):
    runs = load_runs(out, methods, seeds)
    res = {}
    for m in methods:
        first = runs[(m, seeds[0])]
        losses = [val_loss(runs[(m, s)]) for s in seeds]
        r = {"val_loss": mean(losses), "val_loss_seeds": losses,
             "val_loss_spread": spread(losses),
             "payload_bytes_per_step": mean([payload(runs[(m, s)]) for s in seeds]),
             "payload_bytes_per_step_whole_run": mean([whole_run_payload(runs[(m, s)])
                                                       for s in seeds]),
             "sync_ms_per_step": mean([runs[(m, s)]["sync_ms_per_step"] for s in seeds]),
             "tokens_per_s": mean([runs[(m, s)]["tokens_per_s"] for s in seeds]),
             "wall_s": sum(runs[(m, s)].get("wall_s", 0.0) for s in seeds)}
        accs = [task_acc(runs[(m, s)]) for s in seeds]
        if all(a is not None for a in accs):
            r["task_accuracy"] = mean(accs)
            r["task_accuracy_seeds"] = accs
        fimp = [runs[(m, s)].get("f_imp") for s in seeds]
        if all(f is not None for f in fimp):
            r["f_imp"] = mean(fimp)
            kappa = first["config"]["sync"].get("release_keep")
            if m == "ig" and kappa is not None:
                r["release_keep"] = kappa
                r["model_ratio"] = r["f_imp"] + kappa * (1 - r["f_imp"])
        ref = SYNC_OF.get(first["config"]["sync"].get("sparsifier"))
        sw = (first.get("online_profile") or {}).get("switch_step")
        if sw is not None:
            r["online_switch_step"] = sw
        tgt = first["config"]["sync"].get("target")
        if tgt:
            r["target_ratio"] = tgt.get("ratio")
            r["release_keep"] = tgt.get("release_keep", r.get("release_keep"))
        if ref in methods and ref != m:
            r["ratio_to_sync"] = paired(runs, m, ref, seeds, payload)
            r["ratio_to_sync_whole_run"] = paired(runs, m, ref, seeds, whole_run_payload)
            r["val_loss_ratio_to_sync"] = paired(runs, m, ref, seeds, val_loss)
        if "dense" in methods and m != "dense":
            r["val_loss_ratio_to_dense"] = paired(runs, m, "dense", seeds, val_loss)
        if "baseline" in methods and m not in ("baseline", "dense"):
            r["ratio_to_baseline"] = paired(runs, m, "baseline", seeds, payload)
            r["ratio_to_baseline_whole_run"] = paired(runs, m, "baseline", seeds,
                                                      whole_run_payload)
            r["val_loss_ratio_to_baseline"] = paired(runs, m, "baseline", seeds, val_loss)
        res[m] = r
    task_runs = load_runs(task["out"], methods, seeds) if task else None
    if task:
        for m, tr in summarize_task(task["out"], methods, seeds, task["workload"],
                                    task["steps"]).items():
            res[m]["task"] = tr
            res[m]["task_accuracy"] = tr["task_accuracy"]
            res[m]["task_accuracy_seeds"] = tr["task_accuracy_seeds"]
    summary = {"ranks": ranks, "steps": steps, "workload": workload, "seeds": seeds,
               "methods": res}
    if task:
        summary["task_workload"] = task["workload"]
        summary["task_steps"] = task["steps"]
    if "ig" in res and "adtopk_sync" in res and "ratio_to_sync" in res["ig"]:
        ig = res["ig"]
        t = dict(TARGET)
        t["ig_payload_ratio"] = ig["ratio_to_sync"]["mean"]
        t["ig_payload_ratio_whole_run"] = ig["ratio_to_sync_whole_run"]["mean"]
        t["ig_val_loss_ratio"] = ig["val_loss_ratio_to_sync"]["mean"]
        t["ig_val_loss_ratio_seeds"] = ig["val_loss_ratio_to_sync"]["seeds"]
        t["payload_met"] = t["ig_payload_ratio"] <= t["ig_payload_ratio_max"]
        t["val_loss_met"] = t["ig_val_loss_ratio"] <= t["ig_val_loss_ratio_max"]
        if "dense" in res:
            worst = {m: r["val_loss_ratio_to_dense"]["mean"] for m, r in res.items()
                     if "val_loss_ratio_to_dense" in r}
            t["sparse_val_loss_ratio_to_dense"] = worst
            t["tracks_dense_met"] = all(v <= t["sparse_val_loss_ratio_to_dense_max"]
                                        for v in worst.values())
        it = ig.get("task", {}).get("task_accuracy_diff_to_sync")
        if it:  # reported beside the verdict, not part of it: no noise model here
            t["ig_task_accuracy_diff_to_sync"] = it["mean"]
            t["ig_task_accuracy_diff_to_sync_seeds"] = it["seeds"]
        t["met"] = all(v for k, v in t.items() if k.endswith("_met"))
        summary["target"] = t
    summary["verdict"] = verdict(summary, runs, seeds, task_runs)
    return summary


def se(xs):
    """Standard error of the mean of xs (None below 2 values)."""
    if len(xs) < 2:
        return None
    m = mean(xs)
    return (sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) ** 0.5


def verdict(summary, runs, seeds, task_runs=None):
    """Issue 27's parts 6 and 7 against the yardstick row "baseline"
    (adtopk_sync at density 0.01, F32 values): part 6, ig at <= 0.25 x its
    payload (after ig's online window; the whole run beside it) at <= 1.005
    x its val loss (means of per-seed ratios) with task accuracy within
    noise (the mean paired difference ig - baseline is not below -2 x the
    standard error of the per-seed differences; the task leg's, else the
    main runs' when they have task accuracy; None when not measured or
    fewer than 2 seeds); part 7, the default sparse method (the row
    adtopk_sync, run with the trainer's defaults) within 1 % of dense's val
    loss. None when a row it needs is missing."""
    res = summary["methods"]
    v = {"baseline": "adtopk_sync --density 0.01 --value-dtype f32 (the row baseline)",
         "ratios": "means of per-seed ratios (paired by seed)",
         "noise": "2 x the standard error of the paired per-seed differences"}
    p6 = None
    if "ig" in res and "baseline" in res:
        p6 = dict(V6)
        pr = paired(runs, "ig", "baseline", seeds, payload)
        pw = paired(runs, "ig", "baseline", seeds, whole_run_payload)
        vl = paired(runs, "ig", "baseline", seeds, val_loss)
        p6.update({"payload_ratio": pr["mean"], "payload_ratio_seeds": pr["seeds"],
                   "payload_ratio_whole_run": pw["mean"],
                   "val_loss_ratio": vl["mean"], "val_loss_ratio_seeds": vl["seeds"]})
        p6["payload_met"] = p6["payload_ratio"] <= p6["payload_ratio_max"]
        p6["val_loss_met"] = p6["val_loss_ratio"] <= p6["val_loss_ratio_max"]
        src = task_runs if task_runs is not None else runs
        accs = [(task_acc(src[("ig", s)]), task_acc(src[("baseline", s)])) for s in seeds]
        if all(a is not None and b is not None for a, b in accs):
            d = [a - b for a, b in accs]
            e = se(d)
            p6.update({"task_accuracy_diff": mean(d), "task_accuracy_diff_seeds": d,
                       "task_accuracy_noise": None if e is None else 2 * e,
                       "task_accuracy_met": None if e is None else mean(d) >= -2 * e})
        else:
            p6.update({"task_accuracy_diff": None, "task_accuracy_met": None})
        p6["met"] = (p6["payload_met"] and p6["val_loss_met"]
                     and p6["task_accuracy_met"] is not False)
    v["part6"] = p6
    p7 = None
    if "adtopk_sync" in res and "dense" in res:
        p7 = dict(V7)
        first = runs[("adtopk_sync", seeds[0])]["config"]["sync"]
        vd = paired(runs, "adtopk_sync", "dense", seeds, val_loss)
        p7.update({"default": "adtopk_sync", "density": first.get("density"),
                   "early_density": first.get("early_density"),
                   "val_loss_ratio_to_dense": vd["mean"],
                   "val_loss_ratio_to_dense_seeds": vd["seeds"],
                   "payload_ratio_to_baseline": (paired(runs, "adtopk_sync", "baseline", seeds,
                                                        whole_run_payload)["mean"]
                                                 if "baseline" in res else None)})
        p7["met"] = p7["val_loss_ratio_to_dense"] <= p7["val_loss_ratio_to_dense_max"]
        p7["others"] = {m: r["val_loss_ratio_to_dense"]["mean"] for m, r in res.items()
                        if m not in ("adtopk_sync", "dense") and "val_loss_ratio_to_dense" in r}
    v["part7"] = p7
    v["met"] = bool(p6 and p6["met"] and p7 and p7["met"])
    return v


def verdict_line(v):
    parts = []
    p6, p7 = v.get("part6"), v.get("part7")
    if p6:
        t = ("not measured" if p6["task_accuracy_diff"] is None else
             f"{p6['task_accuracy_diff']:+.3f}" + (
                 "" if p6["task_accuracy_noise"] is None
                 else f" (noise +/-{p6['task_accuracy_noise']:.3f})"))
        parts.append(f"part 6: ig {p6['payload_ratio']:.3f} x baseline bytes (<= "
                     f"{p6['payload_ratio_max']}), {p6['val_loss_ratio']:.4f} x its val loss "
                     f"(<= {p6['val_loss_ratio_max']}), task accuracy {t}: "
                     + ("met" if p6["met"] else "NOT met"))
    if p7:
        parts.append(f"part 7: adtopk_sync at its default density {p7['density']} "
                     f"{p7['val_loss_ratio_to_dense']:.4f} x dense (<= "
                     f"{p7['val_loss_ratio_to_dense_max']}): "
                     + ("met" if p7["met"] else "NOT met"))
    return "Verdict (issue 27) " + "; ".join(parts) if parts else ""


def fmt_bytes(b):
    for u in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or u == "GiB":
            return f"{b:.0f} {u}" if u == "B" else f"{b:.1f} {u}"
        b /= 1024


def table(summary):
    head = ["method", "val loss (mean)", "spread", "vs dense", "vs *_sync", "task acc",
            "payload/step", "ratio to *_sync", "whole run", "f_imp", "sync ms/step", "tokens/s"]
    rows = []
    for m, r in summary["methods"].items():
        sp = r["val_loss_spread"]
        vd = r.get("val_loss_ratio_to_dense")
        rs = r.get("ratio_to_sync")
        rw = r.get("ratio_to_sync_whole_run")
        vs = r.get("val_loss_ratio_to_sync")
        rows.append([m, f"{r['val_loss']:.4f}", f"{sp['min']:.4f}..{sp['max']:.4f}",
                     f"{vd['mean']:.4f}" if vd else "-",
                     f"{vs['mean']:.4f}" if vs else "-",
                     f"{r['task_accuracy']:.3f}" if "task_accuracy" in r else "-",
                     fmt_bytes(r["payload_bytes_per_step"]),
                     f"{rs['mean']:.3f}" if rs else "-",
                     f"{rw['mean']:.3f}" if rw else "-",
                     f"{r['f_imp']:.3f}" if "f_imp" in r else "-",
                     f"{r['sync_ms_per_step']:.2f}", f"{r['tokens_per_s']:.0f}"])
    return head, rows


def task_table(summary):
    head = ["method", "task val loss", "vs dense", "vs *_sync", "task acc (mean)",
            "per seed", "acc - *_sync", "payload ratio to *_sync"]
    rows = []
    for m, r in summary["methods"].items():
        t = r.get("task")
        if not t:
            continue
        vd, vs = t.get("val_loss_ratio_to_dense"), t.get("val_loss_ratio_to_sync")
        ds, rs = t.get("task_accuracy_diff_to_sync"), t.get("ratio_to_sync")
        rows.append([m, f"{t['val_loss']:.4f}", f"{vd['mean']:.4f}" if vd else "-",
                     f"{vs['mean']:.4f}" if vs else "-", f"{t['task_accuracy']:.3f}",
                     " ".join(f"{a:.3f}" for a in t["task_accuracy_seeds"]),
                     f"{ds['mean']:+.3f}" if ds else "-", f"{rs['mean']:.3f}" if rs else "-"])
    return head, rows


def text_table(head, rows):
    w = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(head)]
    lines = ["  ".join(h.ljust(w[i]) if i == 0 else h.rjust(w[i]) for i, h in enumerate(head))]
    for row in rows:
        lines.append("  ".join(c.ljust(w[i]) if i == 0 else c.rjust(w[i])
                               for i, c in enumerate(row)))
    return "\n".join(lines)


def md_table(head, rows):
    md = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    return md + ["| " + " | ".join(row) + " |" for row in rows]


def target_line(t):
    line = (f"Target: ig payload {t['ig_payload_ratio']:.3f} x adtopk_sync after its online "
            f"profiling window ({t['ig_payload_ratio_whole_run']:.3f} x over the whole run; <= "
            f"{t['ig_payload_ratio_max']}), ig val loss {t['ig_val_loss_ratio']:.4f} x adtopk_sync "
            f"(<= {t['ig_val_loss_ratio_max']:.2f}; per seed "
            + ", ".join(f"{v:.4f}" for v in t["ig_val_loss_ratio_seeds"]) + ")")
    if "sparse_val_loss_ratio_to_dense" in t:
        line += (", sparse vs dense " + ", ".join(
            f"{m} {v:.4f}" for m, v in t["sparse_val_loss_ratio_to_dense"].items())
            + f" (<= {t['sparse_val_loss_ratio_to_dense_max']})")
    line += ": met" if t["met"] else ": NOT met"
    if "ig_task_accuracy_diff_to_sync" in t:
        line += ("; task accuracy ig - adtopk_sync " + ", ".join(
            f"{v:+.3f}" for v in t["ig_task_accuracy_diff_to_sync_seeds"])
            + " per seed (reported, not part of the verdict)")
    return line


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # never a half-written summary under the name


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--methods", required=True)
    ap.add_argument("--workload", default="")
    ap.add_argument("--ranks", type=int, default=0)
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--task-out", help="the task leg's runs (DIR/<method>/seed<S>)")
    ap.add_argument("--task-workload", default="")
    ap.add_argument("--task-steps", type=int, default=0)
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",") if s]
    methods = [m for m in a.methods.split(",") if m]
    task = {"out": a.task_out, "workload": a.task_workload, "steps": a.task_steps} \
        if a.task_out else None
    summary = summarize(a.out, methods, seeds, a.workload, a.ranks, a.steps, task)
    write_atomic(os.path.join(a.out, "summary.json"), json.dumps(summary, indent=2) + "\n")
    head, rows = table(summary)
    print()
    print(f"igrad demo: post-training on {a.workload}, {a.ranks} ranks, {a.steps} steps, "
          f"seeds {', '.join(map(str, seeds))} (val loss: mean over seeds; vs dense and "
          f"ratio to *_sync: mean of per-seed ratios)")
    print(text_table(head, rows))
    md = [f"Post-training on `{a.workload}`, {a.ranks} ranks, {a.steps} steps, seeds "
          f"{', '.join(map(str, seeds))} (measured by `make demo`; val loss is the mean over "
          f"seeds, ratios are means of per-seed ratios).", ""] + md_table(head, rows)
    if task:
        th, tr = task_table(summary)
        what = (f"Task leg: post-training on `{a.task_workload}`, {a.task_steps} steps, the "
                "same methods and seeds; val loss on the held-out problems' responses, task "
                "accuracy = exact match on them")
        print()
        print(what.replace("`", "") + ":")
        print(text_table(th, tr))
        md += ["", what + ".", ""] + md_table(th, tr)
    if "target" in summary:
        line = target_line(summary["target"])
        print(line)
        md += ["", line]
    line = verdict_line(summary["verdict"])
    if line:
        print(line)
        md += ["", line]
    write_atomic(os.path.join(a.out, "summary.md"), "\n".join(md) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
