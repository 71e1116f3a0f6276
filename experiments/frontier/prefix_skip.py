#!/usr/bin/python3
"""prefix_skip.py — what the target fit's prefix rule costs on one workload.

From importance.py's output (OUT/importance.json and the online profile of
the workload's first seed): two offline profiles, `prefix.json` (the
online profile as the engine built it: the fit takes the longest prefix of
the score order within the payload target) and `skip.json` (the same
scores re-ranked so that the important set is importance.py's "without the
prefix rule" set at kappa's floor: every component that still fits, down
the score order). Each is post-trained with `ig --profile FILE
--target-ratio 0.25` from the demo's base with the demo's post-train
settings, beside `adtopk_sync`, for every seed; the table pairs them by
seed (val loss ratio to adtopk_sync, payload ratio).

Usage: /usr/bin/python3 experiments/frontier/prefix_skip.py
       [--out runs/importance] [--workload fortunes:] [--seeds 1337,7,42]
       [--steps 120] [--base runs/demo/base/checkpoint] [--igrad build/igrad]
"""
import argparse
import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import importance as I  # noqa: E402


def profiles(out, w, seed):
    res = json.load(open(os.path.join(out, "importance.json")))
    skip = set(res["variants"][w]["set_skip_target"])
    src = os.path.join(out, "runs", I.label(w), f"seed{seed}", "profile.json")
    p = json.load(open(src))
    d = os.path.join(out, "skip")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "prefix.json"), "w") as f:
        json.dump(p, f, indent=1)
    # skip: members above 0.5, the others below, the order inside each kept
    for c in p["components"]:
        member = I.comp_name(c) in skip
        c["score"] = 0.5 + 0.5 * c["score"] if member else 0.4995 * c["score"]
        c["important"] = member
    p["tau"] = 0.5
    with open(os.path.join(d, "skip.json"), "w") as f:
        json.dump(p, f, indent=1)
    return d, sorted(skip)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(REPO, "runs/importance"))
    ap.add_argument("--workload", default="fortunes:")
    ap.add_argument("--seeds", default="1337,7,42")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--base", default=os.path.join(REPO, "runs/demo/base/checkpoint"))
    ap.add_argument("--igrad", default=os.path.join(REPO, "build/igrad"))
    a = ap.parse_args()
    seeds = [int(s) for s in a.seeds.split(",") if s]
    d, skip = profiles(a.out, a.workload, seeds[0])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    common = ["--init", a.base, "--data", a.workload, *I.POST, "--steps", str(a.steps),
              "--eval-every", "0"]
    runs = {}
    for seed in seeds:
        for name, extra in (("prefix", ["--method", "ig", "--profile",
                                        os.path.join(d, "prefix.json"), "--target-ratio", "0.25"]),
                            ("skip", ["--method", "ig", "--profile", os.path.join(d, "skip.json"),
                                      "--target-ratio", "0.25"]),
                            ("adtopk_sync", ["--method", "adtopk_sync"])):
            rd = os.path.join(d, f"{name}-s{seed}")
            if not os.path.exists(os.path.join(rd, "summary.json")):
                cmd = ["nice", "-n", "10", "mpirun", "--oversubscribe", "--bind-to", "none",
                       "-np", "2", a.igrad, "train", *common, *extra, "--seed", str(seed),
                       "--out", rd]
                print("+", " ".join(cmd), file=sys.stderr, flush=True)
                subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            runs[(name, seed)] = json.load(open(os.path.join(rd, "summary.json")))
    rows = ["| set | seed | n important | f_imp | κ | payload ratio | val loss | "
            "val loss ratio |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    mean = {}
    for name in ("prefix", "skip"):
        for seed in seeds:
            s, b = runs[(name, seed)], runs[("adtopk_sync", seed)]
            tg = s["config"]["sync"]["target"]
            pr = s["payload_bytes_per_step"] / b["payload_bytes_per_step"]
            lr = s["final"]["val_loss"] / b["final"]["val_loss"]
            mean.setdefault(name, []).append((pr, lr))
            rows.append(f"| {name} | {seed} | {tg['n_important']} | {tg['f_imp']:.4f} | "
                        f"{tg['release_keep']:.4f} | {pr:.4f} | {s['final']['val_loss']:.4f} | "
                        f"{lr:.4f} |")
    for name, v in mean.items():
        rows.append(f"| {name} | mean | | | | {sum(x[0] for x in v) / len(v):.4f} | | "
                    f"{sum(x[1] for x in v) / len(v):.4f} |")
    base = [runs[("adtopk_sync", s)]["final"]["val_loss"] for s in seeds]
    rows.append("")
    rows.append(f"adtopk_sync val loss per seed: {', '.join(f'{x:.4f}' for x in base)}; "
                f"skip set: {' '.join(skip)}")
    text = "\n".join(rows)
    with open(os.path.join(d, "prefix_skip.md"), "w") as f:
        f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
