#!/usr/bin/env python3
"""Plan-only payload ratios of ig to adtopk_sync on a model layout (no
training): docs/results/gate_other.md, "OPT-125M". The profile is
synthetic: component activity = the kind's factor of `igrad bench sync`
(V 1.5, O 1.3, QKV 1.0, K 0.8, FC2 0.7, Q 0.6, FC1 0.5, EMB/HEAD/NORM 1.0)
times (1 + 0.05 * layer), constant over 4 steps; knee partition. Ratios are
igrad_engine_predict_payload averaged over 2R steps (the engine's plan,
rounding included), so they are exact for that plan.
Usage: gate_other_plan.py CONFIG.json"""
import sys

import igrad

FACTOR = {"V": 1.5, "O": 1.3, "QKV": 1.0, "K": 0.8, "FC2": 0.7, "Q": 0.6, "FC1": 0.5}


def mean_payload(layout, profile, **cfg):
    e = igrad.Engine(layout, profile, cfg, igrad.Comm.self_())
    r = cfg.get("release_period", 4)
    return sum(e.predict_payload(s) for s in range(2 * r)) / (2 * r)


def main(path):
    layout = igrad.Layout.load(path)
    trace = igrad.Trace.create(layout, "adtopk", 0.01)
    for s in range(4):
        for t in range(len(layout)):
            info = layout.tensor(t)
            if info["component"] < 0:
                continue
            a = FACTOR.get(info["kind"], 1.0) * (1 + 0.05 * max(info["layer"], 0))
            trace.record(s, t, a * a * info["count"], 1)
    prof = igrad.Profile.build(trace, method="knee")
    base = mean_payload(layout, None, method="adtopk_sync")
    print("%s: %d components, %d important (knee on the synthetic profile)"
          % (path, len(prof.entries()), len(prof.important())))
    print("| plan | gate_other | κ | f_imp | ratio to adtopk_sync | model ratio |")
    print("|---|---|---|---|---|---|")
    for gate in (True, False):
        for keep in (0.25, 0.05):
            e = igrad.Engine(layout, prof, dict(release_keep=keep, gate_other=gate),
                             igrad.Comm.self_())
            every = sum(e.tensor_plan(t)["step_nbytes"] for t in range(len(layout))
                        if e.tensor_plan(t)["every_step"])
            allb = sum(e.tensor_plan(t)["step_nbytes"] for t in range(len(layout)))
            f_imp = every / allb
            ratio = mean_payload(layout, prof, release_keep=keep, gate_other=gate) / base
            print("| knee | %s | %g | %.3f | %.3f | %.3f |" % (
                "on" if gate else "off", keep, f_imp, ratio, f_imp + keep * (1 - f_imp)))
        fit = igrad.target_fit(layout, prof, 0.25, gate_other=gate)
        print("| --target-ratio 0.25 | %s | %.4g | %.3f | %.3f%s | %.3f |" % (
            "on" if gate else "off", fit["release_keep"], fit["f_imp"], fit["ratio"],
            "" if fit["met"] else " (not met)", fit["model_ratio"]))
        floor = igrad.target_fit(layout, prof, 1e-6, gate_other=gate)
        print("| floor: nothing important, κ 0.05 | %s | 0.05 | %.3f | %.3f | %.3f |" % (
            "on" if gate else "off", floor["f_imp"], floor["ratio"], floor["model_ratio"]))


if __name__ == "__main__":
    main(sys.argv[1])
