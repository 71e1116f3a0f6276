#!/usr/bin/env python3
"""Time to quality on shaped links (issue 28 part 4).

Post-trains the demo's base checkpoint on the netns testbed
(experiments/netem/testbed: 2 nodes x 1 rank, MPI over TCP on veths shaped
to RATE each way) with `dense`, `adtopk_sync` and `ig` (trainer defaults,
the demo's settings) at several link rates and seeds, evaluating every
--eval-every steps, and writes docs/results/time_to_quality.{json,png} and
prints the per-rate Markdown tables of time_to_quality.md.

Per (rate, seed) the target is dense's final validation loss at that same
rate and seed. For each run:
  steps_to_target   the first evaluated step whose val loss <= target (null
                    if none); wall_s_to_target the training time up to it
  wall_s            training time of the whole run: the sum of the per-step
                    `step_ms` of metrics.csv (forward, backward, sync,
                    optimizer), so evaluation, checkpoint saving and start-up
                    are excluded; wall_s_with_eval is summary.json's wall_s
                    (everything from start-up to the end)
  quality_val_loss  Q = the worse of the target and this run's final val
                    loss: the quality both dense and the method reach
  steps_to_quality, wall_s_to_quality, dense_steps_to_quality,
  dense_wall_s_to_quality
                    the first crossing of Q by the method's and by dense's
                    eval curve (same rate and seed), linearly interpolated
                    between the two evaluations around it (steps and
                    training seconds)
  step_penalty      steps_to_quality / dense_steps_to_quality
  time_to_quality_speedup
                    dense_wall_s_to_quality / wall_s_to_quality
  compute_ms        median step_ms - sync_ms (forward, backward, optimizer)
  load_before/after the 1-minute load average when the run started / ended
                    (the machine is shared: the three methods of a (seed,
                    rate) run back to back so they see similar load)

PowerSGD (powersgd_r4 in the default --methods): torch's PowerSGD
hook in experiments/powersgd/run.py (the same model, base, batches and
validation rows in PyTorch; DDP on gloo), launched through the same testbed:
mpirun starts one rank in each namespace (rank and world from
OMPI_COMM_WORLD_RANK/SIZE), gloo talks over the shaped veths (rank 0 at
SUBNET.1). Its run directory has igrad train's metrics.csv, eval.csv and
summary.json (sync_ms: from the hook's call with DDP's one bucket to
backward's return). Torch's compute per step is not the C trainer's, so its
time is compared with dense in the same implementation on the same link:
torch_dense (plain DDP all-reduce, one bucket) runs --torch-dense-steps
steps (default 20) per (rate, seed) for its step time, and dense's time to
quality there is dense's steps to Q x that median step time (with
--torch-dense-steps = --steps, torch_dense's own eval curve). The step
penalty is against dense's eval curve like every row's.

Runs are kept under --runs (default runs/time_to_quality) and reused when
their summary.json says complete, so an interrupted sweep resumes.

Usage: experiments/time_to_quality/run.py IGRAD_BINARY [--rates 5000,1000,200,50]
           [--seeds 1337,7,42] [--subnet 10.251.0] [--report-only] ...
Needs root / CAP_NET_ADMIN for the testbed (exit 3 where it refuses)."""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import common  # noqa: E402

METHODS = ["dense", "adtopk_sync", "ig"]
COLORS = {"dense": "tab:gray", "adtopk_sync": "tab:orange", "ig": "tab:blue"}
TORCH_DENSE = "torch_dense"  # PyTorch's dense DDP: the time reference of the powersgd_rR rows


def run_dir(a, rate, method, seed):
    return os.path.join(a.runs, f"r{rate}", f"{method}-s{seed}")


def complete(d):
    try:
        with open(os.path.join(d, "summary.json")) as f:
            return json.load(f).get("complete") is True
    except (OSError, ValueError):
        return False


def testbed_cmd(a, rate, env):
    """The testbed (2 nodes x 1 rank, shaped to `rate`) and the mpirun
    options every run gets; the program follows."""
    cmd = [os.path.join(common.REPO, "experiments", "netem", "testbed"), "--nodes", "2",
           "--ranks-per-node", "1", "--rate", f"{rate}mbit",
           # the tbf bucket holds 1 ms at the rate (at least the testbed's 4 packets): with
           # 4 packets a loaded 2-core machine's timers cannot pace 1 Gbit/s
           "--burst", str(max(6000, rate * 125)), "--subnet", a.subnet, "--",
           "-x", "OMP_NUM_THREADS", "-x", "OPENBLAS_NUM_THREADS"]
    for v in ("OPENBLAS_CORETYPE", "IGRAD_DATA_DIR"):
        if v in env:
            cmd += ["-x", v]
    return cmd


def run_env():
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if common.blas_coretype():
        env["OPENBLAS_CORETYPE"] = common.blas_coretype()
    return env


def launch(d, cmd, env, rate, method, seed):
    """Runs `cmd` (a testbed command) for run directory `d`, logging to
    d/log.txt; run.json records the command, the rate and the load."""
    load0 = os.getloadavg()[0]
    t0 = time.time()
    with open(os.path.join(d, "log.txt"), "w") as log:
        p = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if p.returncode == 3:
        raise common.NetemUnavailable(f"the testbed refused (see {d}/log.txt)")
    if p.returncode != 0 or not complete(d):
        raise common.ExperimentError(f"{method} at {rate} Mbit/s seed {seed} failed "
                                     f"(exit {p.returncode}); see {d}/log.txt")
    with open(os.path.join(d, "run.json"), "w") as f:
        json.dump({"cmd": cmd[cmd.index("--") + 1:], "rate_mbps": rate,
                   "load_before": load0, "load_after": os.getloadavg()[0],
                   "elapsed_s": time.time() - t0}, f, indent=1)
    print(f"  {method:12s} {rate:5d} Mbit/s seed {seed}: {time.time() - t0:6.1f} s "
          f"(load {load0:.2f} -> {os.getloadavg()[0]:.2f})", flush=True)


def train(a, rate, method, seed):
    if is_torch(method):
        return train_torch(a, rate, method, seed)
    d = run_dir(a, rate, method, seed)
    if complete(d):
        return
    os.makedirs(d, exist_ok=True)
    env = run_env()
    cmd = testbed_cmd(a, rate, env)
    cmd += [a.igrad, "train", "--method", method, "--init", os.path.abspath(a.base), "--data", a.data,
            "--steps", str(a.steps), "--seq-len", "64", "--batch", "16",
            "--lr", "1e-3", "--min-lr", "1e-4", "--warmup", "10", "--threads", "1",
            "--val-fraction", "0.1", "--eval-batches", "8", "--seed", str(seed),
            "--eval-every", str(a.eval_every), "--progress", "plain", "--out", d]
    if a.density:
        cmd += ["--density", a.density]  # not given: the trainer's default
    if a.value_dtype and method != "dense":
        cmd += ["--value-dtype", a.value_dtype]
    if method == "ig":
        cmd += ["--profile", "auto"]  # as scripts/demo runs it: ig profiles itself online
    launch(d, cmd, env, rate, method, seed)


def is_torch(method):
    return method.startswith("powersgd_r") or method == TORCH_DENSE


def train_torch(a, rate, method, seed):
    """A PyTorch run (experiments/powersgd/run.py: the same model, base,
    batches and validation rows; DDP on gloo) as two ranks of the testbed,
    one per namespace, over the shaped veths. TORCH_DENSE is torch's plain
    DDP all-reduce for --torch-dense-steps steps: the dense step time of
    the same implementation on the same link."""
    d = run_dir(a, rate, method, seed)
    if complete(d):
        return
    os.makedirs(d, exist_ok=True)
    dense = method == TORCH_DENSE
    steps = a.torch_dense_steps if dense else a.steps
    env = run_env()
    script = os.path.join(common.REPO, "experiments", "powersgd", "run.py")
    args = ["--base", os.path.abspath(a.base), "--workloads", a.data,
            "--methods", "dense" if dense else method, "--seeds", str(seed),
            "--steps", str(steps), "--out", os.path.join(a.runs, "torch")]
    # the batches, written once here (the two ranks would race to write them)
    subprocess.run([sys.executable, script, *args, "--prepare-only"], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    cmd = testbed_cmd(a, rate, env)
    cmd += [sys.executable, script, *args, "--rank-from-env", "--master-addr", f"{a.subnet}.1",
            "--eval-every", str(a.eval_every if steps == a.steps else 0), "--run-dir", d]
    launch(d, cmd, env, rate, method, seed)


def curve(d):
    """(steps, cumulative training seconds at the end of each step) and
    the eval rows [(step, val_loss, training seconds at that step)]."""
    steps = common.read_csv(os.path.join(d, "metrics.csv"))
    cum, t = [0.0], 0.0
    for r in steps:
        t += float(r["step_ms"]) / 1000.0
        cum.append(t)  # cum[s]: training time of steps 0..s-1
    ev = [(int(r["step"]), float(r["val_loss"])) for r in
          common.read_csv(os.path.join(d, "eval.csv"))]
    return cum, [(s, v, cum[s]) for s, v in ev]


def read_run(d):
    """A complete run: its curve (cum, ev), summary.json and run.json
    (empty when the runner did not write one)."""
    cum, ev = curve(d)
    with open(os.path.join(d, "summary.json")) as f:
        summ = json.load(f)
    try:
        with open(os.path.join(d, "run.json")) as f:
            info = json.load(f)
    except OSError:
        info = {}
    return cum, ev, summ, info


def first_at_or_below(ev, target):
    for s, v, w in ev:
        if v <= target:
            return s, w
    return None, None


def crossing(ev, cum, target):
    """The first crossing of `target` by the eval curve, linearly
    interpolated between the two evaluations around it: (fractional step,
    training seconds there), or (None, None)."""
    for i, (s, v, _) in enumerate(ev):
        if v <= target:
            if i == 0:
                return float(s), cum[s]
            s0, v0, _ = ev[i - 1]
            x = s0 + (v0 - target) / (v0 - v) * (s - s0)
            k = int(x)
            w = cum[k] + (x - k) * (cum[min(k + 1, len(cum) - 1)] - cum[k])
            return x, w
    return None, None


def collect(a):
    rows = []
    for rate in a.rates:
        for seed in a.seeds:
            dd = run_dir(a, rate, "dense", seed)
            if not complete(dd):
                continue
            dense_cum, dense_ev = curve(dd)
            target = dense_ev[-1][1]
            for m in METHODS:
                d = run_dir(a, rate, m, seed)
                if not complete(d):
                    continue
                cum, ev, summ, info = read_run(d)
                s_t, w_t = first_at_or_below(ev, target)
                final = ev[-1][1]
                q = max(target, final)  # the quality both reach
                x_m, xw_m = crossing(ev, cum, q)
                x_d, xw_d = crossing(dense_ev, dense_cum, q)
                best = min(ev, key=lambda e: e[1])
                metr = common.read_csv(os.path.join(d, "metrics.csv"))
                rows.append({
                    "rate_mbps": rate, "method": m, "seed": seed,
                    "target_val_loss": target, "steps_to_target": s_t,
                    "wall_s_to_target": w_t, "final_val_loss": final, "wall_s": cum[-1],
                    "steps": len(cum) - 1, "eval_every": a.eval_every,
                    "wall_s_with_eval": summ.get("wall_s"),
                    "best_val_loss": best[1], "best_step": best[0],
                    "quality_val_loss": q, "steps_to_quality": x_m, "wall_s_to_quality": xw_m,
                    "dense_steps_to_quality": x_d, "dense_wall_s_to_quality": xw_d,
                    "step_penalty": x_m / x_d if x_m and x_d else None,
                    "time_to_quality_speedup": xw_d / xw_m if xw_m and xw_d else None,
                    "median_step_ms": common.median([float(r["step_ms"]) for r in metr[1:]]),
                    "median_sync_ms": common.median([float(r["sync_ms"]) for r in metr[1:]]),
                    "compute_ms": common.median([float(r["step_ms"]) - float(r["sync_ms"])
                                                 for r in metr[1:]]),
                    "wire_bytes_per_step": common.median([float(r["wire_bytes"])
                                                          for r in metr[1:]]),
                    "load_before": info.get("load_before"), "load_after": info.get("load_after"),
                    "curve": [[s, v, round(w, 3)] for s, v, w in ev],
                })
            rows += torch_rows(a, rate, seed, target, dense_cum, dense_ev)
    return rows


def torch_rows(a, rate, seed, target, dense_cum, dense_ev):
    """The powersgd_rR rows of (rate, seed): the target, the quality Q and
    the step penalty as the other rows' (against the C trainer's dense eval
    curve, which torch's dense reproduces to 7 digits); the time-to-quality
    and step-time speed-ups against TORCH_DENSE (dense in the same
    implementation over the same link): its own curve if it ran all --steps
    with evaluations, otherwise dense's steps to Q x its median step time."""
    td = run_dir(a, rate, TORCH_DENSE, seed)
    if not complete(td):
        return []
    tmetr = common.read_csv(os.path.join(td, "metrics.csv"))
    td_step = common.median([float(r["step_ms"]) for r in tmetr[1:]])
    td_sync = common.median([float(r["sync_ms"]) for r in tmetr[1:]])
    td_full = len(tmetr) == a.steps and a.eval_every > 0
    rows = []
    for m in a.torch_methods:
        d = run_dir(a, rate, m, seed)
        if not complete(d):
            continue
        cum, ev, summ, info = read_run(d)
        metr = common.read_csv(os.path.join(d, "metrics.csv"))
        s_t, w_t = first_at_or_below(ev, target)
        final = ev[-1][1]
        q = max(target, final)
        x_m, xw_m = crossing(ev, cum, q)
        x_d, _ = crossing(dense_ev, dense_cum, q)
        if td_full:
            t_cum, t_ev = curve(td)
            _, xw_d = crossing(t_ev, t_cum, q)
        else:
            xw_d = x_d * td_step / 1000.0 if x_d is not None else None
        best = min(ev, key=lambda e: e[1])
        step_ms = common.median([float(r["step_ms"]) for r in metr[1:]])
        sync_ms = common.median([float(r["sync_ms"]) for r in metr[1:]])
        rows.append({
            "rate_mbps": rate, "method": m, "seed": seed, "implementation": "torch",
            "target_val_loss": target, "steps_to_target": s_t,
            "wall_s_to_target": w_t, "final_val_loss": final, "wall_s": cum[-1],
            "steps": len(cum) - 1, "eval_every": a.eval_every,
            "wall_s_with_eval": summ.get("wall_s"),
            "best_val_loss": best[1], "best_step": best[0],
            "quality_val_loss": q, "steps_to_quality": x_m, "wall_s_to_quality": xw_m,
            "dense_steps_to_quality": x_d, "dense_wall_s_to_quality": xw_d,
            "dense_wall_s_source": ("torch_dense's own eval curve" if td_full else
                                    "dense's steps to quality x torch_dense's median step_ms"),
            "torch_dense_steps": len(tmetr), "torch_dense_step_ms": td_step,
            "torch_dense_sync_ms": td_sync,
            "step_penalty": x_m / x_d if x_m and x_d else None,
            "time_to_quality_speedup": xw_d / xw_m if xw_m and xw_d else None,
            "step_time_speedup": td_step / step_ms,
            "median_step_ms": step_ms, "median_sync_ms": sync_ms,
            "compute_ms": common.median([float(r["step_ms"]) - float(r["sync_ms"])
                                         for r in metr[1:]]),
            "wire_bytes_per_step": common.median([float(r["wire_bytes"]) for r in metr[1:]]),
            "load_before": info.get("load_before"), "load_after": info.get("load_after"),
            "curve": [[s, v, round(w, 3)] for s, v, w in ev],
        })
    return rows


def same_compute(r, dense, trio):
    """The time-to-quality speed-up had every method of a (rate, seed) the
    same compute per step (the mean of the three medians; the machine's
    load moves compute between runs, not the method): dense's steps to Q
    x (C + dense's sync) over the method's steps to Q x (C + its sync).
    An estimate from measured parts, labelled as such."""
    if not r["step_penalty"]:
        return None
    c = common.mean([t["compute_ms"] for t in trio])
    return (r["dense_steps_to_quality"] * (c + dense["median_sync_ms"])
            / (r["steps_to_quality"] * (c + r["median_sync_ms"])))


def fmt_list(xs, spec):
    return ", ".join("–" if x is None else format(x, spec) for x in xs)


def torch_table(a, rate, by):
    """The PowerSGD rows of `rate` (seeds with a row), a Markdown table."""
    table = []
    for m in a.torch_methods:
        seeds = [s for s in a.seeds if (rate, m, s) in by]
        if not seeds:
            continue
        rs = [by[(rate, m, s)] for s in seeds]
        sp = [r["step_time_speedup"] for r in rs]
        ttq = [r["time_to_quality_speedup"] for r in rs]
        pen = [r["step_penalty"] for r in rs]
        table.append([
            m, ", ".join(map(str, seeds)), fmt_list([r["final_val_loss"] for r in rs], ".4f"),
            fmt_list([r["steps_to_target"] for r in rs], "d"),
            fmt_list([r["wall_s_to_target"] for r in rs], ".1f"),
            fmt_list([r["wall_s"] for r in rs], ".1f"),
            fmt_list([r["torch_dense_step_ms"] for r in rs], ".0f"),
            fmt_list([r["torch_dense_sync_ms"] for r in rs], ".0f"),
            fmt_list([r["compute_ms"] for r in rs], ".0f"),
            fmt_list([r["median_sync_ms"] for r in rs], ".0f"),
            f"{common.mean(sp):.2f}× ({fmt_list(sp, '.2f')})",
            f"{common.mean(pen):.2f} ({fmt_list(pen, '.2f')})" if None not in pen
            else fmt_list(pen, ".2f"),
            f"{common.mean(ttq):.2f}× ({fmt_list(ttq, '.2f')})" if None not in ttq
            else fmt_list(ttq, ".2f"),
            fmt_list([r["load_before"] for r in rs], ".1f"),
        ])
    if not table:
        return []
    return [f"PowerSGD at {rate} Mbit/s (PyTorch; speed-ups against torch's dense DDP on the "
            f"same link):\n",
            common.md_table(["method", "seeds", "final val loss", "steps to target", "s to target",
                             "wall s", "torch dense ms/step", "torch dense sync ms",
                             "compute ms/step", "sync ms/step", "step-time speed-up (paired)",
                             "step penalty (paired)", "time-to-quality speed-up (paired)",
                             "load at start"], table), ""]


def report(a, rows):
    out_json = os.path.join(a.out, "time_to_quality.json")
    meta = {"workload": a.data, "base": "the demo's base checkpoint (runs/demo/base)",
            "ranks": 2, "testbed": "experiments/netem/testbed --nodes 2 --ranks-per-node 1",
            "steps": a.steps, "eval_every": a.eval_every, "seeds": a.seeds,
            "rates_mbps": a.rates, "target": "dense's final val loss at the same rate and seed",
            "density": a.density or "igrad train's default (0.04 for the sparse methods)",
            "value_dtype": a.value_dtype or "igrad train's default (bf16 for the sparse methods)",
            "wall_s": "sum of per-step step_ms (evaluation, checkpointing and start-up "
                      "excluded); wall_s_with_eval: summary.json's wall_s"}
    if a.torch_methods:
        meta["torch"] = (
            "powersgd_rR rows: experiments/powersgd/run.py (the same model, base, batches and "
            "validation rows in PyTorch; DDP on gloo, one rank per namespace over the shaped "
            "veths; torch's PowerSGD hook, one bucket); sync_ms there: from the hook's call "
            "(every gradient ready) to backward's return. Their time-to-quality and step-time "
            "speed-ups are against torch_dense (plain DDP all-reduce, one bucket, same link), "
            f"run {a.torch_dense_steps} steps per (rate, seed); their step penalty against "
            "dense's eval curve, as every row's")
    with open(out_json, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
        f.write("\n")

    by = {(r["rate_mbps"], r["method"], r["seed"]): r for r in rows}
    lines = []
    for rate in a.rates:
        seeds = [s for s in a.seeds if all((rate, m, s) in by for m in METHODS)]
        if not seeds:
            lines += torch_table(a, rate, by)
            continue
        dense = [by[(rate, "dense", s)] for s in seeds]
        lines.append(f"### {rate} Mbit/s per direction (seeds {', '.join(map(str, seeds))})\n")
        lines.append(
            f"dense per step: {common.mean([r['median_step_ms'] for r in dense]):.0f} ms, of "
            f"which sync {common.mean([r['median_sync_ms'] for r in dense]):.0f} ms (medians, "
            f"mean over seeds).\n")
        table = []
        for m in METHODS:
            rs = [by[(rate, m, s)] for s in seeds]
            wall_ratio = [by[(rate, "dense", s)]["wall_s"] / r["wall_s"] for s, r in zip(seeds, rs)]
            ttq = [r["time_to_quality_speedup"] for r in rs]
            pen = [r["step_penalty"] for r in rs]
            est = [same_compute(r, by[(rate, "dense", s)], [by[(rate, x, s)] for x in METHODS])
                   for s, r in zip(seeds, rs)]
            table.append([
                m, fmt_list([r["final_val_loss"] for r in rs], ".4f"),
                fmt_list([r["steps_to_target"] for r in rs], "d"),
                fmt_list([r["wall_s_to_target"] for r in rs], ".1f"),
                fmt_list([r["wall_s"] for r in rs], ".1f"),
                f"{common.mean(wall_ratio):.2f}× ({fmt_list(wall_ratio, '.2f')})",
                fmt_list([r["compute_ms"] for r in rs], ".0f"),
                fmt_list([r["median_sync_ms"] for r in rs], ".0f"),
                f"{common.mean(pen):.2f} ({fmt_list(pen, '.2f')})",
                f"{common.mean(ttq):.2f}× ({fmt_list(ttq, '.2f')})",
                f"{common.mean(est):.2f}× ({fmt_list(est, '.2f')})",
                fmt_list([r["load_before"] for r in rs], ".1f"),
            ])
        lines.append(common.md_table(
            ["method", "final val loss", "steps to target", "s to target", "wall s",
             "step-time speed-up (paired)", "compute ms/step", "sync ms/step",
             "step penalty (paired)", "time-to-quality speed-up (paired)",
             "same-compute estimate", "load at start"],
            table))
        lines.append("")
        lines += torch_table(a, rate, by)
    text = "\n".join(lines)
    print(text)

    plt = common.pyplot()
    rates = [r for r in a.rates if any(x["rate_mbps"] == r for x in rows)]
    fig, axes = plt.subplots(1, len(rates), figsize=(4.2 * len(rates), 3.6), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for r in rows:
            if r["rate_mbps"] != rate:
                continue
            xs = [c[2] for c in r["curve"]]
            ys = [c[1] for c in r["curve"]]
            ax.plot(xs, ys, color=COLORS.get(r["method"], "tab:green"), lw=1, alpha=0.8,
                    label=r["method"] if r["seed"] == a.seeds[0] else None)
            if r["method"] == "dense":
                ax.axhline(r["target_val_loss"], color="tab:gray", lw=0.5, ls=":")
        ax.set_title(f"{rate} Mbit/s per direction")
        ax.set_xlabel("training wall time, s (eval excluded)")
        ax.set_ylabel("val loss")
        ax.set_ylim(top=min(ax.get_ylim()[1], 2.6))
        ax.legend()
    fig.suptitle(f"Val loss vs wall time, {a.data} from the demo base, 2 ranks on the netns "
                 f"testbed (dotted: dense's final val loss per seed)")
    common.save_fig(fig, os.path.join(a.out, "time_to_quality.png"))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("igrad")
    ap.add_argument("--rates", default="5000,1000,200,50", help="Mbit/s, comma-separated")
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--methods", default=",".join(METHODS + ["powersgd_r4"]))
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--density", default=None, help="--density for every run (default: the trainer's)")
    ap.add_argument("--value-dtype", default=None, help="the sparse runs' --value-dtype (the trainer's)")
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--torch-dense-steps", type=int, default=20,
                    help="steps of torch_dense, the powersgd_rR rows' time reference (with "
                    "--steps: a full run with evaluations, its own eval curve used)")
    ap.add_argument("--data", default="brown:news")
    ap.add_argument("--base", default=os.path.join("runs", "demo", "base", "checkpoint"))
    ap.add_argument("--subnet", default="10.251.0")
    ap.add_argument("--runs", default=os.path.join(common.REPO, "runs", "time_to_quality"))
    ap.add_argument("--out", default=os.path.join(common.REPO, "docs", "results"))
    ap.add_argument("--report-only", action="store_true", help="only read the runs there are")
    a = ap.parse_args()
    a.igrad = os.path.abspath(a.igrad)
    a.runs = os.path.abspath(a.runs)  # the ranks' working directory is not ours to rely on
    a.rates = [int(x) for x in a.rates.split(",")]
    a.seeds = [int(x) for x in a.seeds.split(",")]
    methods = a.methods.split(",")
    a.torch_methods = [m for m in methods if m.startswith("powersgd_r")]
    if not a.report_only:
        for seed in a.seeds:           # seed-major: a seed's runs see similar load
            for rate in a.rates:
                for m in methods:      # the methods of a (seed, rate) back to back
                    train(a, rate, m, seed)
                if a.torch_methods:    # PowerSGD's time reference, beside it
                    train(a, rate, TORCH_DENSE, seed)
    report(a, collect(a))


if __name__ == "__main__":
    try:
        main()
    except common.NetemUnavailable as e:
        print(f"time_to_quality: {e}", file=sys.stderr)
        sys.exit(common.NETEM_REFUSED)
    except common.ExperimentError as e:
        print(f"time_to_quality: {e}", file=sys.stderr)
        sys.exit(common.EXIT_FAIL)
