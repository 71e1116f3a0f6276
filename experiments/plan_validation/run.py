#!/usr/bin/env python3
"""run.py — validates `igrad plan`'s α-β projection on the namespace testbed
(experiments/netem/testbed, issue 12 parts 1 and 3), flat and hier.

Stages (each one's raw output is kept in OUT/raw/ and reused by a rerun;
--fresh forgets them). The 4 x 1 sweep runs first; then, layout by layout,
that layout's sweeps right before its runs (the machine's load drifts):
  1. sweeps: `igrad bench comm` (all-gather, all-reduce, and the hier node
     step's in-flight reduces and broadcasts, over message sizes) on
     4 nodes x 1 rank (every ring hop crosses the shaped veth: the inter
     level) and, for every layout N x L with L > 1, on that layout with
     `--ranks-per-node L` (shared memory inside each node, all N nodes at
     once: the intra level as the engine's node step meets it, the other
     nodes' ranks competing for the 2 cores); and every layout's own
     inter level as its buckets meet it: flat, the bucket collectives over
     all P ranks of the layout; hier, over the N ranks sharing a local
     rank (`bench comm --across-nodes`), the L groups at once sharing each
     node's veth — at 8 processes the 2 cores are part of the link (an
     unshaped 1 MiB all-gather takes 5x as long at 8 x 1 as at 4 x 1), so
     a 4 x 1 fit does not carry over;
  2. fit: α, β per level *and collective* by least squares on the formulas
     of docs/plan.md §2 — all-gather of m bytes per rank (P-1)α + (P-1)mβ,
     all-reduce of n bytes 2(P-1)α + 2(P-1)/P nβ, node reduces / broadcasts
     of n bytes in all (P-1)α + (P-1)/P nβ — minimising relative residuals
     (every size counts alike; intra reduce / bcast only from 256 KiB up:
     the node step always moves every parameter, and below that shared
     memory runs from cache); R² and residuals are reported, and the
     single α, β per level of the last validation (all-gather + all-reduce
     together) for comparison;
  3. measured: `igrad bench sync --json --topology flat|hier
     --ranks-per-node L` (the engine's collective time per step, comm_ms,
     slowest rank, median over steps; hier's includes the node reduces and
     broadcasts; bytes per level from the engine's statistics, averaged
     over ranks) at each layout, and flat again with `--aligned` (the
     step's bucket collectives timed from a barrier: their own time, what
     plan projects, without the engine's wait for ranks still selecting);
     inter fits use only sizes above the tbf burst (INTER_FIT_MIN_BYTES);
  4. projected: `igrad plan --json` for the same model, P, L and knobs with
     --link LEVEL.COLL= the per-collective fits and --profile the profile
     bench sync's runs used (bench sync --profile-out), so both sides
     price the same plans, ig's and iad's included. The projection the
     1.3x target is judged on ("measured/projected": aligned for flat,
     the engine's exchange windows for hier) is plan's own figure on the
     layout's own inter fits with --latency overlap (the engine issues a
     step's buckets at once); also kept: the 4 x 1 fit priced on the
     testbed's network (testbed_ms: one veth per node carrying what its L
     ranks send off the node, run 3's projection), plan's per-GPU figure
     on the 4 x 1 fit, and one fit per level;
and writes OUT/plan_validation.md (tables) and OUT/plan_validation.json.

Usage: experiments/plan_validation/run.py [--out DIR] [--rate 200mbit]
         [--layouts 2x2,4x1,4x2,8x1] [--steps 8] [--reps 7]
         [--allgather recursive_doubling|linear|default] [--fresh]
The default iallgather is recursive doubling (bandwidth-optimal, the ring's
(P-1)m bytes per rank); Open MPI's own choice here is linear, every rank
sending to every other at once, which on a shaped link runs ~1.8x slower
(docs/results/plan_validation.md).
Needs root/CAP_NET_ADMIN (the testbed exits 3 otherwise; so does this).
"""
import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from common import REPO, md_table, median, write_text  # noqa: E402

TESTBED = os.path.join(REPO, "experiments", "netem", "testbed")
IGRAD = os.path.join(REPO, "build", "igrad")
MODEL = os.path.join(REPO, "experiments", "plan_validation", "llama-tiny.json")
METHODS = ["dense", "topk_sync", "adtopk_sync", "ig", "iad"]
OPS = ["allgather", "allreduce", "reduce", "bcast"]
AG_SIZES = [1024, 4096, 16384, 65536, 262144, 1048576]
AR_SIZES = [4096, 16384, 65536, 262144, 1048576, 4194304]
# the node step moves every parameter (16 MiB for llama-tiny): up to 16 MiB
# inside a node (cheap there); over the veth the bucket sizes suffice
NODE_SIZES_INTRA = AR_SIZES + [16777216]
NODE_FIT_MIN_INTRA = 262144
# The testbed's tbf lets a burst of 6000 bytes through unshaped; a
# collective that moves less than a few bursts per rank times the raw veth,
# not the shaped link (a 1 KiB all-gather here ran in 0.07 ms). Inter fits
# use the sizes whose β term moves at least INTER_FIT_MIN_BYTES per rank —
# every bucket of the runs below moves more.
TBF_BURST = 6000
INTER_FIT_MIN_BYTES = 4 * TBF_BURST


def run_testbed(args, nodes, rpn, cmd, raw_name):
    """Runs cmd on the testbed; returns its stdout (cached in raw/)."""
    path = os.path.join(args.out, "raw", raw_name)
    if os.path.exists(path) and not args.fresh:
        with open(path) as f:
            return f.read()
    tb = [TESTBED, "--nodes", str(nodes), "--ranks-per-node", str(rpn), "--rate", args.rate]
    if args.delay:
        tb += ["--delay", args.delay]
    if getattr(args, "queue", ""):  # the tbf queue limit (testbed --latency; its default 50ms)
        tb += ["--latency", args.queue]
    if getattr(args, "subnet", ""):  # two testbeds at once need different subnets
        tb += ["--subnet", args.subnet]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if args.allgather != "default":  # libnbc's MPI_Iallgather: 1 linear, 2 recursive doubling
        env["OMPI_MCA_coll_libnbc_iallgather_algorithm"] = {"linear": "1",
                                                            "recursive_doubling": "2"}[args.allgather]
    # Before the testbed gave every daemon its own hostname, a launch
    # sometimes left one daemon missing and mpirun waiting for ever
    # (docs/results/plan_validation.md, "Launches"): a run that hangs is
    # stopped with SIGTERM, so that the testbed cleans up, and tried again.
    for attempt in range(1, args.tries + 1):
        t0 = time.time()
        p = subprocess.Popen(tb + ["--"] + cmd, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        try:
            out, err = p.communicate(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            p.terminate()
            out, err = p.communicate()
            print(f"run.py: {raw_name}: no result after {args.run_timeout} s "
                  f"(attempt {attempt}), stopped", file=sys.stderr)
            continue
        print(f"run.py: {raw_name}: {nodes}x{rpn} rc {p.returncode} in "
              f"{time.time() - t0:.1f} s", file=sys.stderr)
        if p.returncode == 3:
            sys.stderr.write(err)
            sys.exit(3)
        if p.returncode != 0:
            sys.stderr.write(err[-4000:])
            raise SystemExit(f"run.py: {raw_name} failed (rc {p.returncode})")
        with open(path, "w") as f:
            f.write(out)
        return out
    raise SystemExit(f"run.py: {raw_name}: no result in {args.tries} attempts")


def last_json(text):
    """The last line of text that parses as a JSON object (mpirun may add lines)."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit("run.py: no JSON object in the output")


def ring_coeffs(op, P, nbytes):
    """(α coefficient, β coefficient) of one collective (docs/plan.md §2)."""
    if op == "allgather":
        return P - 1, (P - 1) * nbytes
    if op == "allreduce":
        return 2 * (P - 1), 2 * (P - 1) / P * nbytes
    return P - 1, (P - 1) / P * nbytes  # reduce, bcast: the hier node step


def lsq_ab(terms):
    """Least squares of t = x·a + y·b over (a, b, t) on relative residuals
    (each row scaled by 1/t); x < 0 (a negative latency) refits y alone."""
    s_aa = s_ab = s_bb = s_at = s_bt = 0.0
    for a, b, t in terms:
        w = 1.0 / (t * t)
        s_aa += w * a * a
        s_ab += w * a * b
        s_bb += w * b * b
        s_at += w * a * t
        s_bt += w * b * t
    det = s_aa * s_bb - s_ab * s_ab
    x = (s_at * s_bb - s_bt * s_ab) / det
    y = (s_aa * s_bt - s_ab * s_at) / det
    if x < 0:
        x, y = 0.0, s_bt / s_bb
    return x, y


def fit_alpha_beta(rows, P):
    """Least squares of t = a α + b β on relative residuals (rows scaled by 1/t)."""
    alpha, beta = lsq_ab([(*ring_coeffs(r["op"], P, r["bytes"]), r["ms"] / 1e3) for r in rows])
    ts = [r["ms"] / 1e3 for r in rows]
    preds = [ring_coeffs(r["op"], P, r["bytes"])[0] * alpha
             + ring_coeffs(r["op"], P, r["bytes"])[1] * beta for r in rows]
    mean_t = sum(ts) / len(ts)
    ss_res = sum((t - p) ** 2 for t, p in zip(ts, preds))
    ss_tot = sum((t - mean_t) ** 2 for t in ts)
    resid = [{"op": r["op"], "bytes": r["bytes"], "measured_ms": t * 1e3,
              "fitted_ms": p * 1e3, "ratio": t / p if p > 0 else float("nan")}
             for r, t, p in zip(rows, ts, preds)]
    return {"alpha_us": alpha * 1e6, "beta_ns_per_byte": beta * 1e9,
            "gbits": 8.0 / (beta * 1e9) if beta > 0 else float("inf"),
            "r2": 1.0 - ss_res / ss_tot if ss_tot > 0 else float("nan"),
            "max_rel_residual": max(abs(x["ratio"] - 1.0) for x in resid),
            "residuals": resid}


def sweep(args, nodes, rpn, name, groups):
    """bench comm rows of every collective at the sizes its fit uses.
    groups: "world" (all ranks in one group, every collective), "intra"
    (inside each node of rpn ranks, all nodes at once, every collective) or
    "across" (the bucket collectives among the ranks sharing a local rank,
    one per node, all rpn groups at once: hier's shard exchange)."""
    intra = groups == "intra"
    node_sizes = [b for b in NODE_SIZES_INTRA if b >= NODE_FIT_MIN_INTRA] if intra else AR_SIZES
    want = {"allgather": AG_SIZES, "allreduce": AR_SIZES, "reduce": node_sizes,
            "bcast": node_sizes}
    sizes = sorted(set(AG_SIZES + AR_SIZES + node_sizes))
    group = {"world": [], "intra": ["--ranks-per-node", str(rpn)],
             "across": ["--ranks-per-node", str(rpn), "--across-nodes", "--ops",
                        "allgather,allreduce"]}[groups]
    out = run_testbed(args, nodes, rpn,
                      [IGRAD, "bench", "comm", "--json", "--reps", str(args.reps),
                       "--sizes", ",".join(map(str, sizes))] + group, f"sweep-{name}.json")
    return [r for r in last_json(out)["rows"] if r["bytes"] in want.get(r["op"], [])]


def inter_fits(rows, P):
    """Per-collective fits of an inter-level sweep over groups of P ranks,
    on the sizes above the tbf burst."""
    fit_rows = [r for r in rows if ring_coeffs(r["op"], P, r["bytes"])[1] >= INTER_FIT_MIN_BYTES]
    return {op: fit_alpha_beta([r for r in fit_rows if r["op"] == op], P)
            for op in OPS if any(r["op"] == op for r in fit_rows)}


def link_spec(fit, share=1):
    """GBITS,LAT_US of a fitted link; share > 1: the bandwidth split that many ways."""
    return f"{fit['gbits'] / share:.6g},{max(fit['alpha_us'], 0.001):.6g}"


def link_flags(inter_fits, intra_fits, share=1, inter_latency_only=False):
    """--link flags: every collective's own fit on both levels;
    inter_latency_only: the inter level at its fitted α but (practically)
    unbounded bandwidth, so plan returns the latency terms alone there."""
    flags = []
    for lvl, fits, sh in (("inter", inter_fits, share), ("intra", intra_fits, 1)):
        for op in [None] + OPS:
            f = fits[op or "allgather"]
            spec = (f"1e6,{max(f['alpha_us'], 0.001):.6g}" if lvl == "inter"
                    and inter_latency_only else link_spec(f, sh))
            flags += ["--link", (f"{lvl}.{op}=" if op else f"{lvl}=") + spec]
    return flags


def testbed_ms(lat_row, row, N, L, inter_fits, method, topo):
    """The testbed's network: one veth per node carries the inter-node bytes
    of its L ranks at the fitted rate of the method's collective, plus
    plan's latency terms and intra level (lat_row: plan with the inter
    bandwidth unbounded). The all-gathers (recursive doubling) and hier's
    shard exchanges cross with L x plan's inter bytes per rank (per shard
    for hier). Flat dense runs Open MPI's all-reduce for >= 64 KiB at
    P >= 4: recursive halving then doubling (libnbc redscat_allgather),
    whose rounds at distance < L stay inside a node of consecutive ranks,
    so a node's link carries 2 (N - 1) / N of the vector — a node-aware
    ring's bytes, where plan's per-rank figure, 2 (P - L) / P, assumes
    every rank exchanges with every off-node peer."""
    op = "allreduce" if method == "dense" else "allgather"
    beta_ms = inter_fits[op]["beta_ns_per_byte"] * 1e-6
    if method == "dense" and topo == "flat":
        node_bytes = 2.0 * (N - 1) / N * shard_mean(row, "payload_nbytes")
    else:
        node_bytes = L * shard_mean(row, "inter_nbytes")
    # The engine issues every bucket of a step at once (non-blocking MPI):
    # their latencies overlap, so the step pays one collective's α terms on
    # the inter level (plan sums them: each bucket's in turn).
    colls = max(1.0, row["collectives"]["mean"] / (L if topo == "hier" else 1))
    latency = lat_row["intra_ms"]["mean"] + lat_row["inter_ms"]["mean"] / colls
    return latency + node_bytes * beta_ms


def plan_rows(P, L, links, profile, extra=()):
    """igrad plan's rows by (method, route) and the command; profile: the
    one bench sync's runs used (--profile-out), so ig's and iad's plans are
    theirs."""
    # the testbed's node has one veth: one NIC per node, not one per rank
    cmd = [IGRAD, "plan", "--config", MODEL, "--ranks", str(P), "--ranks-per-node", str(L),
           "--nics-per-node", "1"] + links + list(extra) + [
               "--method", ",".join(METHODS), "--density", "0.01", "--value-dtype", "f32",
               "--buckets", "4", "--release-period", "4", "--profile", profile, "--json"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"run.py: igrad plan failed: {p.stderr.strip()}")
    plan = json.loads(p.stdout)
    return {(r["method"], r["route"]): r for r in plan["rows"]}, cmd


def median_methods(rounds):
    """bench sync's methods over repeated runs: every time the median over
    the runs ("<key>_range": its min and max), bytes and counts the first
    run's (the same in every run: the same seed and plans)."""
    out = {}
    for m, first in rounds[0].items():
        row = dict(first)
        for key in ("comm_ms", "comm_window_ms", "sync_ms"):
            xs = [r[m][key] for r in rounds]
            row[key], row[key + "_range"] = median(xs), [min(xs), max(xs)]
        row["comm_windows_ms"] = {w: median([r[m]["comm_windows_ms"][w] for r in rounds])
                                  for w in first["comm_windows_ms"]}
        out[m] = row
    return out


def shard_mean(row, key):
    """A hier row's bytes averaged over its shards (what bench sync averages
    over ranks); a flat row's mean."""
    if row.get("by_local_rank"):
        return sum(s[key] for s in row["by_local_rank"]) / len(row["by_local_rank"])
    return row[key]["mean"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "runs", "plan_validation"))
    ap.add_argument("--rate", default="200mbit")
    ap.add_argument("--delay", default="")
    ap.add_argument("--layouts", default="2x2,4x1,4x2,8x1")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--allgather", default="recursive_doubling",
                    choices=["default", "linear", "recursive_doubling"],
                    help="Open MPI libnbc iallgather algorithm (default: its own choice, "
                         "linear here)")
    ap.add_argument("--run-timeout", type=float, default=240.0,
                    help="seconds before one testbed run counts as hung (default 240)")
    ap.add_argument("--tries", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3,
                    help="rounds of every layout's bench sync runs; times are the "
                         "median over them (default 3)")
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats is {args.repeats} (at least 1)")
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    if not os.access(IGRAD, os.X_OK):
        raise SystemExit(f"run.py: {IGRAD} not built (make build)")

    layouts = [tuple(int(x) for x in lay.split("x")) for lay in args.layouts.split(",")]
    inter_rows = sweep(args, 4, 1, "4x1", "world")
    # the last validation's single α, β per level (all-gather + all-reduce)
    joint = {"inter": fit_alpha_beta([r for r in inter_rows if r["op"] in OPS[:2]], 4)}
    # what plan takes now: every collective its own α, β on every level
    per_op = {"inter": inter_fits(inter_rows, 4)}

    table, bytes_rows = [], []
    for N, L in layouts:
        P, lay = N * L, f"{N}x{L}"
        # The layout's own sweeps, right before its runs (the machine's
        # load drifts over minutes): inside its nodes, and its inter level
        # as its buckets meet it — flat, the bucket collectives over all P
        # ranks as laid out; hier, over the N ranks of one local rank, the
        # L groups at once (sharing each node's veth, and the 2 cores with
        # every other rank)
        if L > 1:
            rows = sweep(args, N, L, f"{lay}-intra", "intra")
            joint[f"intra {lay}"] = fit_alpha_beta([r for r in rows if r["op"] in OPS[:2]], L)
            per_op[f"intra {lay}"] = {op: fit_alpha_beta([r for r in rows if r["op"] == op], L)
                                      for op in OPS}
        per_op[f"inter {lay} flat"] = inter_fits(sweep(args, N, L, f"{lay}-world", "world"), P)
        if L > 1:
            per_op[f"inter {lay} hier"] = inter_fits(
                sweep(args, N, L, f"{lay}-across", "across"), N)
        # N x 1 moves nothing inside a node (plan's flat ring runs on inter
        # there): the intra level is never priced, any fit will do
        ikey = f"intra {lay}" if L > 1 else "inter"
        intra = per_op[ikey]
        # One OpenMP thread per rank: bench sync's default is cores / ranks
        # on the node, which at N x 1 is 2 threads for every rank of the
        # 2-core machine. (At 2 x 2 the default already is 1.)
        threads = ["--threads", "1"] if L == 1 else []
        meas, aligned = {}, {}
        sync_cmd = [IGRAD, "bench", "sync", "--json", "--config", MODEL, "--steps",
                    str(args.steps), "--profile-steps", "8", "--density", "0.01", "--buckets",
                    "4", "--release-period", "4", "--ranks-per-node", str(L)] + threads
        profile = os.path.join(args.out, "raw", f"profile-{lay}.json")
        # --repeats rounds of the layout's runs, interleaved (flat, hier,
        # flat aligned; again ...); each row's times are the median over
        # the rounds, with their range (the same command's hier node sums
        # moved by 1.5x between runs here)
        runs = {"flat": [], "hier": [], "aligned": []}
        for k in range(args.repeats):
            sfx = f"-r{k + 1}" if k else ""
            for topo in (["flat", "hier"] if L > 1 else ["flat"]):
                # the namespaces see the host's files: rank 0 writes the profile here
                extra = ["--profile-out", profile] if topo == "flat" and not k else []
                out = run_testbed(args, N, L, sync_cmd + ["--topology", topo] + extra,
                                  f"sync-{lay}-{topo}{sfx}.json")
                runs[topo].append(last_json(out)["methods"])
            # the flat buckets' collectives timed from a barrier (bench sync
            # --aligned): what plan projects, without the engine's wait for
            # ranks still selecting (4 ranks share 2 cores here)
            out = run_testbed(args, N, L, sync_cmd + ["--aligned"],
                              f"sync-{lay}-flat-aligned{sfx}.json")
            runs["aligned"].append(last_json(out)["methods"])
        meas = {t: median_methods(r) for t, r in runs.items() if r and t != "aligned"}
        aligned["flat"] = median_methods(runs["aligned"])
        links = link_flags(per_op["inter"], intra)
        proj, cmd = plan_rows(P, L, links, profile)
        # The testbed has one veth per node, shared by its L ranks; plan's
        # inter figure is per GPU (one NIC each). Also priced: the node
        # link's bandwidth split L ways.
        shared = plan_rows(P, L, link_flags(per_op["inter"], intra, L), profile)[0] \
            if L > 1 else proj
        latency = plan_rows(P, L, link_flags(per_op["inter"], intra, 1, True), profile)[0]
        # plan's own projection on this layout's own inter fits (the
        # target's), with --latency overlap: the engine issues a step's
        # buckets at once (non-blocking MPI), so their latencies overlap
        own = {}
        for topo in meas:
            key = f"inter {lay} {topo}"
            own[topo] = plan_rows(P, L, link_flags(dict(per_op["inter"], **per_op[key]), intra),
                                  profile, ["--latency", "overlap"])
        # the last validation's way: one α, β per level
        single = plan_rows(P, L, ["--link", "inter=" + link_spec(joint["inter"]),
                                  "--link", "intra=" + link_spec(joint[ikey])],
                           profile)[0]
        for topo, mt in meas.items():
            for m in METHODS:
                mm, pp = mt[m], proj[(m, topo)]
                # the testbed's network: one veth per node
                tb_ms = testbed_ms(latency[(m, topo)], pp, N, L, per_op["inter"], m, topo)
                al = aligned.get(topo, {}).get(m, {}).get("comm_ms")
                # what the target is judged on: flat, the aligned collectives;
                # hier (no begin/end), the engine's exchange windows (each
                # from the last rank's start to the last rank's end)
                judged = al if topo == "flat" else mm["comm_window_ms"]
                judged_range = (aligned[topo][m]["comm_ms_range"] if topo == "flat"
                                else mm["comm_window_ms_range"])
                intra_proj = latency[(m, topo)]["intra_ms"]["mean"]
                oo = own[topo][0][(m, topo)]
                table.append({"layout": lay, "P": P, "topology": topo, "method": m,
                              "projected_own_ms": oo["sync_ms"]["mean"],
                              "projected_own_intra_ms": oo["intra_ms"]["mean"],
                              "projected_own_inter_ms": oo["inter_ms"]["mean"],
                              "ratio_own": judged / oo["sync_ms"]["mean"],
                              "measured_judged_range_ms": judged_range,
                              "ratio_own_range": [x / oo["sync_ms"]["mean"] for x in judged_range],
                              "plan_cmd_own": " ".join(
                                  os.path.relpath(c, REPO) if c.startswith(REPO) else c
                                  for c in own[topo][1]),
                              "measured_comm_ms": mm["comm_ms"],
                              "measured_aligned_ms": al,
                              "measured_window_ms": mm["comm_window_ms"],
                              "measured_windows_ms": mm["comm_windows_ms"],
                              "measured_judged_ms": judged,
                              "projected_testbed_ms": tb_ms,
                              "projected_testbed_intra_ms": intra_proj,
                              "projected_testbed_inter_ms": tb_ms - intra_proj,
                              "ratio_testbed": judged / tb_ms,
                              "measured_sync_ms": mm["sync_ms"],
                              "projected_ms": pp["sync_ms"]["mean"],
                              "projected_intra_ms": pp["intra_ms"]["mean"],
                              "projected_inter_ms": pp["inter_ms"]["mean"],
                              "ratio": mm["comm_ms"] / pp["sync_ms"]["mean"],
                              "projected_shared_ms": shared[(m, topo)]["sync_ms"]["mean"],
                              "projected_single_fit_ms": single[(m, topo)]["sync_ms"]["mean"],
                              "collectives_measured": mm["buckets"],
                              "collectives_projected": pp["collectives"]["mean"],
                              "measured_payload": mm["payload_bytes_per_step"],
                              "projected_payload": shard_mean(pp, "payload_nbytes"),
                              "measured_intra": mm["intra_wire_bytes_per_step"],
                              "measured_inter": mm["inter_wire_bytes_per_step"],
                              "projected_intra": pp["intra_nbytes"]["mean"],
                              "projected_inter": shard_mean(pp, "inter_nbytes"),
                              "plan_cmd": " ".join(os.path.relpath(c, REPO) if c.startswith(REPO)
                                                   else c for c in cmd)})
        if "hier" in meas:
            for m in METHODS:
                f, h = meas["flat"][m]["inter_wire_bytes_per_step"], \
                    meas["hier"][m]["inter_wire_bytes_per_step"]
                bytes_rows.append({"layout": lay, "L": L, "method": m, "flat_inter": f,
                                   "hier_inter": h, "hier_over_flat": h / f if f else float("nan"),
                                   "target_met": h <= f / L})

    res = {"rate": args.rate, "delay": args.delay, "iallgather": args.allgather,
           "model": os.path.relpath(MODEL, REPO), "fits": per_op, "single_fits": joint,
           "rows": table, "inter_bytes": bytes_rows}
    write_text(os.path.join(args.out, "plan_validation.json"), json.dumps(res, indent=1) + "\n")
    md = [f"# plan validation: {args.rate}{' + ' + args.delay if args.delay else ''}, "
          f"{res['model']}, iallgather {args.allgather}", ""]
    md.append(md_table(["level", "collective", "α µs", "Gbit/s", "R²", "max |measured/fit − 1|"],
                       [[lvl, op, f"{f['alpha_us']:.1f}", f"{f['gbits']:.3f}", f"{f['r2']:.4f}",
                         f"{f['max_rel_residual']:.2f}"]
                        for lvl, fits in per_op.items() for op, f in fits.items()]
                       + [[lvl, "allgather+allreduce (one fit)", f"{f['alpha_us']:.1f}",
                           f"{f['gbits']:.3f}", f"{f['r2']:.4f}", f"{f['max_rel_residual']:.2f}"]
                          for lvl, f in joint.items()]))
    md.append("")
    for lvl, fits in per_op.items():
        md.append(f"**{lvl}** residuals")
        md.append("")
        md.append(md_table(["op", "bytes", "measured ms", "fit ms", "measured/fit"],
                           [[r["op"], r["bytes"], f"{r['measured_ms']:.3f}",
                             f"{r['fitted_ms']:.3f}", f"{r['ratio']:.2f}"]
                            for f in fits.values() for r in f["residuals"]]))
        md.append("")
    md.append(md_table(["layout", "topology", "method", "payload meas / plan KiB",
                        "colls meas / plan",
                        "measured ms: aligned (flat) or window (hier) / engine comm",
                        "projected ms: plan on the layout's fits (intra + inter)",
                        "measured/projected", f"range over {args.repeats} runs",
                        "engine comm / projected",
                        "projected ms: 4x1 fit, testbed network", "measured/that",
                        "plan, 4x1 fit, per-GPU links", "plan, one fit per level"],
                       [[r["layout"], r["topology"], r["method"],
                         f"{r['measured_payload'] / 1024:.1f} / {r['projected_payload'] / 1024:.1f}",
                         f"{r['collectives_measured']:.0f} / {r['collectives_projected']:.1f}",
                         f"{r['measured_judged_ms']:.1f} / {r['measured_comm_ms']:.1f}",
                         f"{r['projected_own_ms']:.1f} ({r['projected_own_intra_ms']:.1f} + "
                         f"{r['projected_own_inter_ms']:.1f})",
                         f"**{r['ratio_own']:.2f}**",
                         f"{r['ratio_own_range'][0]:.2f}–{r['ratio_own_range'][1]:.2f}",
                         f"{r['measured_comm_ms'] / r['projected_own_ms']:.2f}",
                         f"{r['projected_testbed_ms']:.1f}", f"{r['ratio_testbed']:.2f}",
                         f"{r['projected_ms']:.1f} ({r['projected_intra_ms']:.1f} + "
                         f"{r['projected_inter_ms']:.1f})",
                         f"{r['projected_single_fit_ms']:.1f}"]
                        for r in table]))
    md.append("")
    md.append(md_table(["layout", "method", "node sums + broadcasts ms (window)",
                        "projected node step ms", "shard buckets ms (window)",
                        "projected inter ms"],
                       [[r["layout"], r["method"],
                         f"{r['measured_windows_ms']['node_sums']:.1f} + "
                         f"{r['measured_windows_ms']['node_broadcasts']:.1f}",
                         f"{r['projected_own_intra_ms']:.1f}",
                         f"{r['measured_windows_ms']['buckets']:.1f}",
                         f"{r['projected_own_inter_ms']:.1f}"]
                        for r in table if r["topology"] == "hier"]))
    md.append("")
    md.append(md_table(["layout", "topology", "method", "intra KiB meas / plan",
                        "inter KiB meas / plan"],
                       [[r["layout"], r["topology"], r["method"],
                         f"{r['measured_intra'] / 1024:.1f} / {r['projected_intra'] / 1024:.1f}",
                         f"{r['measured_inter'] / 1024:.1f} / {r['projected_inter'] / 1024:.1f}"]
                        for r in table]))
    md.append("")
    md.append(md_table(["layout", "method", "flat inter KiB", "hier inter KiB", "hier / flat",
                        "≤ 1/L"],
                       [[r["layout"], r["method"], f"{r['flat_inter'] / 1024:.1f}",
                         f"{r['hier_inter'] / 1024:.1f}", f"{r['hier_over_flat']:.3f}",
                         "yes" if r["target_met"] else "no"] for r in bytes_rows]))
    write_text(os.path.join(args.out, "plan_validation.md"), "\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
