#!/usr/bin/env python3
"""shards.py — the two-level sync's shards in bytes, measured on a 2 x 2
netns testbed beside what `igrad plan` predicts (issue 28 part 3, the last
item).

For each --configs model: `igrad bench sync --topology hier` on 2 nodes of
2 ranks (experiments/netem/testbed, --subnet so that another testbed can
run beside it; nodes as MPI reports them, one network namespace each) at
the bench's defaults (density 0.01, 4 buckets, R 4, f32 values, the
profile it builds), which reports each shard's payload per step as its
owners' engines sent it (`shards`: per local rank, the mean over the two
owners and the timed steps); then `igrad plan` for the same model, 4
ranks, 2 per node, the same knobs and the bench's profile
(--profile-out): its hier row's `by_local_rank` payloads. Bytes do not
depend on the link, so the rate only sets how long a run takes.
Writes OUT/shards.json and prints a markdown table.

Usage: experiments/plan_validation/shards.py [--out DIR] [--subnet 10.243.0]
         [--configs experiments/plan_validation/llama-tiny.json,...]
         [--methods ig,adtopk_sync] [--steps 8] [--profile-steps 16]
         [--rate 1gbit] [--fresh]
Needs root/CAP_NET_ADMIN (the testbed exits 3 otherwise; so does this).
"""
import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run as R  # noqa: E402

NODES, RPN = 2, 2


def rel(path):
    return os.path.relpath(path, R.REPO) if os.path.isabs(path) and path.startswith(R.REPO) \
        else path


def plan_shards(config, methods, profile):
    """igrad plan's hier rows: payload per local rank (mean over the cycle)."""
    cmd = [R.IGRAD, "plan", "--config", config, "--ranks", str(NODES * RPN),
           "--ranks-per-node", str(RPN), "--nics-per-node", "1", "--method", ",".join(methods),
           "--density", "0.01", "--buckets", "4", "--release-period", "4", "--value-dtype",
           "f32", "--profile", profile, "--json"]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        raise SystemExit(f"shards.py: igrad plan failed: {p.stderr.strip()}")
    rows = {r["method"]: r for r in json.loads(p.stdout)["rows"] if r["route"] == "hier"}
    return rows, cmd


def spread(xs):
    mean = sum(xs) / len(xs)
    return {"bytes": xs, "min": min(xs), "max": max(xs), "mean": mean,
            "max_over_mean": max(xs) / mean if mean > 0 else None}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(R.REPO, "runs", "shards"))
    ap.add_argument("--subnet", default="10.243.0")
    ap.add_argument("--configs", default=R.MODEL)
    ap.add_argument("--methods", default="ig,adtopk_sync")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--profile-steps", type=int, default=16)
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--delay", default="")
    ap.add_argument("--allgather", default="default",
                    choices=["default", "linear", "recursive_doubling"])
    ap.add_argument("--run-timeout", type=float, default=1800.0)
    ap.add_argument("--tries", type=int, default=2)
    ap.add_argument("--fresh", action="store_true")
    args = ap.parse_args()
    os.makedirs(os.path.join(args.out, "raw"), exist_ok=True)
    methods = args.methods.split(",")

    rows = []
    for config in args.configs.split(","):
        config = os.path.abspath(config)
        name = os.path.splitext(os.path.basename(config))[0]
        prof = os.path.join(args.out, "raw", f"profile-{name}.json")
        bench = [R.IGRAD, "bench", "sync", "--config", config, "--topology", "hier",
                 "--json", "--steps", str(args.steps), "--profile-steps", str(args.profile_steps),
                 "--threads", "1", "--profile-out", prof]
        out = R.run_testbed(args, NODES, RPN, bench, f"sync-{name}.json")
        d = R.last_json(out)
        assert d["ranks"] == NODES * RPN, d["ranks"]
        plan, cmd = plan_shards(config, methods, prof)
        for m in methods:
            sh = d["methods"][m]["shards"]
            assert sh and sh["count"] == RPN, (m, sh)
            pr = sorted(plan[m]["by_local_rank"], key=lambda s: s["local_rank"])
            rows.append({
                "config": rel(config), "params": d["layout"]["params"],
                "tensors": d["layout"]["tensors"], "layout": f"{NODES}x{RPN}", "method": m,
                "measured_payload": spread(sh["payload_bytes_per_step"]),
                "measured_inter_wire": spread(sh["inter_wire_bytes_per_step"]),
                "planned_payload": spread([s["payload_nbytes"] for s in pr]),
                "planned_inter_wire": spread([s["inter_nbytes"] for s in pr]),
                "steps": d["steps"],
                "bench_cmd": "experiments/netem/testbed --nodes 2 --ranks-per-node 2 --rate "
                             f"{args.rate} --subnet {args.subnet} -- "
                             + " ".join(rel(c) for c in bench),
                "plan_cmd": " ".join(rel(c) for c in cmd)})
    res = {"subnet": args.subnet, "rate": args.rate, "rows": rows}
    R.write_text(os.path.join(args.out, "shards.json"), json.dumps(res, indent=1) + "\n")
    print("| config | method | measured shard payload, B/step (per local rank) | max / mean "
          "| planned (igrad plan) | max / mean | measured / planned (busiest) |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        mp, pp = r["measured_payload"], r["planned_payload"]
        print(f"| {os.path.basename(r['config'])} | {r['method']} | "
              f"{' / '.join(f'{x:.0f}' for x in mp['bytes'])} | **{mp['max_over_mean']:.4f}** | "
              f"{' / '.join(f'{x:.0f}' for x in pp['bytes'])} | {pp['max_over_mean']:.4f} | "
              f"{mp['max'] / pp['max']:.4f} |")


if __name__ == "__main__":
    main()
