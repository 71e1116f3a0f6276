"""reprofile_summary.py — one line per run of experiments/online_profile/
reprofile: the components moved at each re-profile (summary.json's
online_profile.reprofile_log), how many re-planned, and the cost of a
re-profile (its ms, measured inside the engine: exchange, build,
hysteresis, agreement and any re-plan) next to the median step and sync
time of the run's steps (metrics.csv). JSON of all of it on the last line.

Usage: reprofile_summary.py RUN_DIR...
"""
import csv
import json
import os
import statistics
import sys


def summarize(d):
    s = json.load(open(os.path.join(d, "summary.json")))
    op = s["online_profile"]
    log = op.get("reprofile_log", [])
    rows = list(csv.DictReader(open(os.path.join(d, "metrics.csv"))))
    after = [r for r in rows if int(r["step"]) >= op["profile_steps"]]
    ms = [e["ms"] for e in log]
    return {
        "run": os.path.basename(d.rstrip("/")),
        "margin": op["reprofile_margin"],
        "switch_step": op["switch_step"],
        "reprofiles": op["reprofiles"],
        "replans": op["reprofile_replans"],
        "flips": [e["flips"] for e in log],
        "flip_steps": [e["step"] for e in log if e["flips"]],
        "reprofile_ms_median": statistics.median(ms) if ms else None,
        "reprofile_ms_max": max(ms) if ms else None,
        "step_ms_median": statistics.median(float(r["step_ms"]) for r in after),
        "sync_ms_median": statistics.median(float(r["sync_ms"]) for r in after),
        "switch_gather_ms": op["gather_ms"],
        "switch_build_ms": op["build_ms"],
        "payload_after_switch": statistics.mean(float(r["payload_bytes"]) for r in after),
        "window_payload": float(rows[0]["payload_bytes"]),
        "val_loss": s["final"]["val_loss"],
    }


def main():
    out = [summarize(d) for d in sys.argv[1:]]
    for r in out:
        print("%-22s m=%-5g re-profiles %d, re-plans %d, moved per window %s; re-profile "
              "%.3f ms median (max %.3f), step %.1f ms, sync %.2f ms; payload %.3f x window; "
              "val loss %.4f"
              % (r["run"], r["margin"], r["reprofiles"], r["replans"], r["flips"],
                 r["reprofile_ms_median"] or 0, r["reprofile_ms_max"] or 0, r["step_ms_median"],
                 r["sync_ms_median"], r["payload_after_switch"] / r["window_payload"],
                 r["val_loss"]))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
