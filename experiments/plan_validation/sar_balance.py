#!/usr/bin/env python3
"""sar_balance.py — the sparse all-reduce's busiest receiver on the
trainer's real gradients (issue 28 part 3): reads `igrad train` runs'
summary.json (config.sync.sar_busiest_over_mean, per step: the busiest
owner's received entries over the mean, summed over the step's sparse
all-reduce buckets) and prints, per run and per variant, mean and max over
all steps and over the steps from the first release period after the
online profile's switch on (every index space's first call runs on equal
ranges: the switch's re-plan starts the kept split points over, so the
first R steps with the sparse all-reduce after it are left out; runs
without --profile auto: from step R). Paired by seed.

Usage: experiments/plan_validation/sar_balance.py \
         balanced=runs/bal_p4_s{seed} equal=runs/eq_p4_s{seed} --seeds 1337,7,42
         [--json OUT]
"""
import argparse
import json
import os


def stats(per_step, first):
    xs = [v for s, v in per_step if s >= first]
    return {"mean": sum(xs) / len(xs), "max": max(xs), "steps": len(xs)} if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=DIR pattern with {seed}")
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    out = {"runs": []}
    for v in args.variants:
        name, pat = v.split("=", 1)
        for seed in args.seeds.split(","):
            d = pat.format(seed=seed)
            with open(os.path.join(d, "summary.json")) as f:
                s = json.load(f)
            sb = s["config"]["sync"].get("sar_busiest_over_mean")
            if not sb:
                raise SystemExit(f"{d}: no sparse all-reduce step")
            ps = [tuple(x) for x in sb["per_step"]]
            R = s["config"]["sync"]["release_period"]
            sw = (s.get("online_profile") or {}).get("switch_step", 0)
            after_sw = [st for st, _ in ps if st >= sw]
            first = (after_sw[R] if len(after_sw) > R else after_sw[-1] + 1) if after_sw else 0
            row = {"variant": name, "seed": int(seed), "ranks": s.get("ranks"),
                   "all_steps": stats(ps, -1), "from_step": first, "after": stats(ps, first),
                   "final_val_loss": (s.get("final") or {}).get("val_loss")}
            out["runs"].append(row)
            print(f"{name:9s} seed {seed:5s}: all {row['all_steps']['mean']:.4f} / "
                  f"{row['all_steps']['max']:.4f} ({row['all_steps']['steps']} steps); from step "
                  f"{first}: {row['after']['mean']:.4f} / {row['after']['max']:.4f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
