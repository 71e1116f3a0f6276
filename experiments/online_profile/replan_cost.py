"""experiments/online_profile/replan_cost.py — the cost of one re-plan on
the demo model, alone: an ig engine on one rank (self communicator) for the
layout of a checkpoint, re-planned N times with igrad_engine_set_profile
(alternating two profiles so that every call changes the plan). Prints the
median and range in ms. The switch of `--profile auto` is this plus the
profile build and the exchange of the window (summary.json online_profile).

Usage: IGRAD_LIBRARY=build/libigrad.so /usr/bin/python3 replan_cost.py
       LAYOUT (model.safetensors, config.json, ...) [PROFILE.json PROFILE2.json] [N (20)]
Without profiles, two are built from synthetic traces (fixed:0.4 over
activities in opposite orders).
"""
import statistics
import sys
import time

import igrad


def main():
    args = sys.argv[1:]
    n = int(args.pop()) if args and args[-1].isdigit() else 20
    layout = igrad.Layout.load(args[0])
    if len(args) >= 3:
        profs = [igrad.Profile.load(p, layout) for p in args[1:3]]
    else:
        profs = []
        for sign in (1, -1):
            tr = igrad.Trace.create(layout, "adtopk", 0.01)
            for s in range(4):
                for t in range(len(layout)):
                    c = layout.tensor(t)["component"]
                    if c >= 0:
                        tr.record(s, t, float((1000 + sign * c) ** 2), 1)
            profs.append(igrad.build_profile(tr, method="fixed:0.4"))
    comm = igrad.Comm.self_()
    eng = igrad.Engine(layout, profs[0], igrad.make_config(method="ig", threads=1), comm)
    ms = []
    for i in range(n):
        t0 = time.perf_counter()
        eng.set_profile(profs[(i + 1) % 2])
        ms.append((time.perf_counter() - t0) * 1e3)
    print("set_profile on %d tensors (%d entries): median %.2f ms, min %.2f, max %.2f (%d calls)" % (
        len(layout), sum(layout.tensor(t)["count"] for t in range(len(layout))),
        statistics.median(ms), min(ms), max(ms), n))


if __name__ == "__main__":
    main()
