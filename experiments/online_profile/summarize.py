"""experiments/online_profile/summarize.py — the table of run: per seed,
the important sets of the online profile (OUT/auto_sSEED/profile.json)
and the offline one (Jaccard, and which components differ), f_imp, the
payload per step after the switch against the window's (the window's steps
send exactly what adtopk_sync sends) and against the offline-profile run,
val loss, and the switch's cost (gather_ms, build_ms from summary.json).
Writes OUT/summary.json and OUT/summary.md.

Usage: summarize.py OUT OFFLINE_PROFILE SEED...
"""
import csv
import json
import os
import sys


def important(path):
    p = json.load(open(path))
    return {(c["layer"], c["kind"]) for c in p["components"] if c["important"]}, p


def payloads(run):
    rows = list(csv.DictReader(open(os.path.join(run, "metrics.csv"))))
    return [(int(r["step"]), float(r["payload_bytes"])) for r in rows]


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def main():
    out, offline, seeds = sys.argv[1], sys.argv[2], sys.argv[3:]
    off_set, off_p = important(offline)
    rows = []
    for seed in seeds:
        a, o = os.path.join(out, "auto_s" + seed), os.path.join(out, "offline_s" + seed)
        sa, so = (json.load(open(os.path.join(d, "summary.json"))) for d in (a, o))
        on_set, on_p = important(os.path.join(a, "profile.json"))
        W = sa["online_profile"]["profile_steps"]
        pa, po = payloads(a), payloads(o)
        window = [b for s, b in pa if s < W]
        after = [b for s, b in pa if s >= W]
        off_after = [b for s, b in po if s >= W]
        jac = len(on_set & off_set) / len(on_set | off_set)
        rows.append({
            "seed": int(seed), "W": W,
            "important_online": len(on_set), "important_offline": len(off_set),
            "components": len(on_p["components"]),
            "jaccard": jac,
            "only_online": sorted("%d.%s" % c for c in on_set - off_set),
            "only_offline": sorted("%d.%s" % c for c in off_set - on_set),
            "f_imp_online": sa.get("f_imp"), "f_imp_offline": so.get("f_imp"),
            "payload_window": mean(window),  # = adtopk_sync's payload per step
            "payload_after_switch": mean(after),
            "payload_offline_same_steps": mean(off_after),
            "ratio_online": mean(after) / mean(window),
            "ratio_offline": mean(off_after) / mean(window),
            "payload_run_online": sa["payload_bytes_per_step"],
            "payload_run_offline": so["payload_bytes_per_step"],
            "val_loss_online": sa["final"]["val_loss"], "val_loss_offline": so["final"]["val_loss"],
            "steps": sa["final"]["step"],
            "gather_ms": sa["online_profile"]["gather_ms"],
            "build_ms": sa["online_profile"]["build_ms"],
            "wall_s_online": sa["wall_s"], "wall_s_offline": so["wall_s"],
        })
    json.dump({"offline_profile": offline, "runs": rows}, open(os.path.join(out, "summary.json"), "w"),
              indent=1)
    lines = ["| seed | important online / offline (of C) | Jaccard | only online | only offline "
             "| f_imp online / offline | payload ratio to adtopk_sync after step W: online / offline "
             "| val loss online / offline | switch: gather ms, build ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append("| %d | %d / %d (of %d) | %.3f | %s | %s | %.3f / %.3f | %.3f / %.3f | %.4f / %.4f "
                     "| %.2f, %.2f |" % (
                         r["seed"], r["important_online"], r["important_offline"], r["components"],
                         r["jaccard"], " ".join(r["only_online"]) or "–",
                         " ".join(r["only_offline"]) or "–", r["f_imp_online"], r["f_imp_offline"],
                         r["ratio_online"], r["ratio_offline"], r["val_loss_online"],
                         r["val_loss_offline"], r["gather_ms"], r["build_ms"]))
    open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
