#!/usr/bin/env python3
"""sar.py — fits the sparse all-reduce's time model (route.c, igrad plan's
`sparse_allreduce` rows) to the namespace testbed, as run.py did for the
all-gather (issue 28 part 3).

For each layout N x 1 (every rank its own node, every message over a
shaped veth; one run at a time, on --subnet so that another testbed can
run beside it):
  1. sweep: `igrad bench comm` all-gather and all-reduce over the sizes
     above the tbf burst, fitted per collective (run.py's fit_alpha_beta):
     the link α, β that plan is given (--link inter.COLL=GBITS,LAT_US);
  2. measured: `igrad bench sync --collective sparse_reduce` on llama-tiny at
     each --densities value (f32 values, every bucket of the sparse
     methods through the sparse all-reduce by name, --collective
     sparse_reduce; checked against plan's wire bytes), the engine's exchange window per step
     (comm_window_ms: issue of the first bucket to the end of the last,
     slowest rank once every rank joined; median over steps), for the
     sparse methods;
  3. projected: `igrad plan --collective sparse_reduce --json` for the
     same model, P, knobs and profile (bench sync --profile-out) with the
     link fits: the engine's `flat` row, every bucket through the engine's
     sparse all-reduce (route.c's planned wire bytes, priced by
     plan_engine_sar_s: 4(P-1) α + W β per bucket on the all-reduce
     link). Not the `sparse_allreduce` row: that is the idealised Ok-Topk
     projection of docs/plan.md §2 (2(P-1)/P of the gather payload), not
     what the engine runs;
  4. fit: t = c_α n_b α + c_β W β over the step's n_b buckets, W the
     planned wire bytes per rank, α, β the all-reduce link's; c_α (α per
     bucket) and c_β by least squares on relative residuals over every
     layout, density and method, and each layout's fit tried on the other;
     the ratios measured / projected for plan's model (17 α per bucket,
     1.8 W β since this fit; docs/plan.md §2) and for the model before it
     (4 (P-1) α per bucket + W β).
Writes OUT/sar_fit.json and prints a table (markdown).

Usage: experiments/plan_validation/sar.py [--out DIR] [--rate 200mbit] [--queue 50ms]
         [--subnet 10.241.0] [--layouts 4x1,8x1] [--densities 0.01,0.04]
         [--steps 8] [--reps 5] [--fresh]
Needs root/CAP_NET_ADMIN (the testbed exits 3 otherwise; so does this).
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402

SPARSE = ["topk_sync", "adtopk_sync", "iad", "ig"]
SIZES = [16384, 65536, 262144, 1048576]


def plan_sar(P, links, profile, density):
    cmd = [R.IGRAD, "plan", "--config", R.MODEL, "--ranks", str(P), "--ranks-per-node", "1",
           "--nics-per-node", "1"] + links + [
        "--method", ",".join(SPARSE), "--density", str(density), "--buckets", "4",
        "--release-period", "4", "--profile", profile, "--value-dtype", "f32",
        "--collective", "sparse_reduce", "--json"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"sar.py: igrad plan failed: {p.stderr.strip()}")
    return {r["method"]: r for r in json.loads(p.stdout)["rows"]
            if r["route"] == "flat"}, cmd


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(R.REPO, "runs", "sar_fit"))
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--delay", default="")
    ap.add_argument("--queue", default="",
                    help="tbf queue limit of every veth end as time (the testbed's --latency, "
                         "default 50ms): a deep queue drops nothing, as a lossless fabric")
    ap.add_argument("--subnet", default="10.241.0")
    ap.add_argument("--layouts", default="4x1,8x1")
    ap.add_argument("--densities", default="0.01,0.04")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--allgather", default="recursive_doubling",
                    choices=["default", "linear", "recursive_doubling"])
    ap.add_argument("--run-timeout", type=float, default=420.0)
    ap.add_argument("--tries", type=int, default=2)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    layouts = [tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(",")]
    densities = [float(d) for d in args.densities.split(",")]

    points, fits = [], {}
    for N, L in layouts:
        P = N * L
        name = f"{N}x{L}"
        out = R.run_testbed(args, N, L, [R.IGRAD, "bench", "comm", "--json", "--reps",
                                         str(args.reps), "--ops", "allgather,allreduce",
                                         "--sizes", ",".join(map(str, SIZES))],
                            f"sweep-{name}.json")
        rows = R.last_json(out)["rows"]
        f = R.inter_fits(rows, P)
        fits[name] = {op: {k: v for k, v in x.items() if k != "residuals"}
                      for op, x in f.items()}
        links = []
        for op in [None, "allgather", "allreduce"]:
            spec = R.link_spec(f[op or "allgather"])
            links += ["--link", (f"inter.{op}=" if op else "inter=") + spec]
        for d in densities:
            prof = os.path.join(args.out, "raw", f"profile-{name}-{d}.json")
            out = R.run_testbed(args, N, L, [
                R.IGRAD, "bench", "sync", "--config", R.MODEL, "--json", "--steps",
                str(args.steps), "--density", str(d), "--buckets", "4", "--release-period",
                "4", "--collective", "sparse_reduce", "--threads", "1", "--profile-out", prof],
                f"sync-{name}-{d}.json")
            meas = R.last_json(out)["methods"]
            proj, cmd = plan_sar(P, links, prof, d)
            ar = f["allreduce"]
            for m in SPARSE:
                if m not in meas or m not in proj:
                    continue
                pr = proj[m]
                nb = pr["collectives"]["mean"]
                wire = pr["wire_nbytes"]["mean"]
                points.append({
                    "layout": name, "P": P, "density": d, "method": m,
                    "measured_ms": meas[m]["comm_window_ms"],
                    "measured_wire_bytes": meas[m]["wire_bytes_per_step"],
                    "planned_wire_bytes": wire, "buckets": nb,
                    "projected_ms": pr["sync_ms"]["mean"],
                    "alpha_term_ms": nb * ar["alpha_us"] * 1e-3,
                    "beta_term_ms": wire * ar["beta_ns_per_byte"] * 1e-6,
                    "old_model_ms": (nb * 4 * (P - 1) * ar["alpha_us"] * 1e-3
                                     + wire * ar["beta_ns_per_byte"] * 1e-6),
                    "plan_cmd": " ".join(os.path.relpath(c, R.REPO) if c.startswith(R.REPO)
                                         else c for c in cmd)})

    c_a, c_b = fit(points)
    cross = {}
    for lay in sorted({p["layout"] for p in points}):
        ca, cb = fit([p for p in points if p["layout"] == lay])
        others = [p for p in points if p["layout"] != lay]
        r = [p["measured_ms"] / (ca * p["alpha_term_ms"] + cb * p["beta_term_ms"])
             for p in others]
        cross[lay] = {"c_alpha": ca, "c_beta": cb, "others_ratio": [min(r), max(r)] if r else []}
    for p in points:
        p["ratio_old_model"] = p["measured_ms"] / p["old_model_ms"]
        p["ratio"] = p["measured_ms"] / p["projected_ms"]
        p["fitted_ms"] = c_a * p["alpha_term_ms"] + c_b * p["beta_term_ms"]
    res = {"rate": args.rate, "queue": args.queue or "50ms", "layouts": args.layouts, "densities": densities,
           "steps": args.steps, "link_fits": fits, "c_alpha": c_a, "c_beta": c_b,
           "fit_per_layout": cross, "points": points}
    R.write_text(os.path.join(args.out, "sar_fit.json"), json.dumps(res, indent=1) + "\n")
    print(f"fit: {c_a:.2f} alpha per bucket, {c_b:.3f} x W beta; per layout: "
          + "; ".join(f"{k}: {v['c_alpha']:.2f}, {v['c_beta']:.3f}, on the others "
                      f"{v['others_ratio'][0]:.2f}-{v['others_ratio'][1]:.2f}"
                      for k, v in cross.items() if v["others_ratio"]))
    print("| layout | density | method | buckets | wire B (measured / planned) | measured ms | "
          "projected ms | measured / projected | before: projected ms | before: ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in points:
        print(f"| {p['layout']} | {p['density']} | {p['method']} | {p['buckets']:.0f} | "
              f"{p['measured_wire_bytes']:.0f} / {p['planned_wire_bytes']:.0f} | "
              f"{p['measured_ms']:.1f} | {p['projected_ms']:.1f} | **{p['ratio']:.2f}** | "
              f"{p['old_model_ms']:.1f} | {p['ratio_old_model']:.2f} |")


def fit(points):
    """t = c_a A + c_b B on relative residuals (A, B: the α and β terms)."""
    return R.lsq_ab([(p["alpha_term_ms"], p["beta_term_ms"], p["measured_ms"]) for p in points])


if __name__ == "__main__":
    main()
