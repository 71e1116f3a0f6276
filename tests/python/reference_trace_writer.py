"""reference_trace_writer.py — an independent writer of activity traces
(Python standard library only, no igrad code), used by
test_trace_reference.py. From known per-step, per-tensor sums of squares
and retained counts of a small OPT-style layout (2 blocks: q/k/v/out_proj,
fc1, fc2) it writes

  component_activity_trace.csv  the reference method's trace, as its
      profiling script writes it: csv.DictWriter (\\r\\n line ends), columns
      step,seed,model_name,workload_name,dataset_name,layer,component,
      raw_activity,d_activity,numel,retained_numel, raw_activity =
      sqrt(sum of retained v^2) of the component, d_activity = raw_activity /
      sqrt(numel), rows by (layer, its component order), steps from 1;
  trace_v1.csv   the same run in igrad's trace CSV v1 (docs/formats.md before
      v2): raw_activity = sqrt(sum / numel) printed %.9g, d_activity the
      printed raw minus the component's printed raw at the previous step;
  numbers.json   the tensors (name, shape) and every record (step, tensor
      index, sumsq, retained), for igrad's own writer (the C API).

Usage: reference_trace_writer.py OUTDIR [--exact]
  --exact: weights only, every component 256 or 1024 entries and every
  activity a multiple of 1/64, so sqrt, division and %.9g are exact and all
  three files carry bit-identical activities; otherwise weights and biases
  (components of 272 and 1088 entries, two tensors added) with arbitrary sums.
"""
import csv
import json
import math
import os
import random
import sys

STEPS = range(1, 31)  # the reference numbers steps from 1
SEED, MODEL, WORKLOAD, DATASET = 42, "facebook/opt-125m", "pubmed", "uiyunkim-hub/pubmed-abstract"
ORDER = {"Q": 0, "K": 1, "V": 2, "QKV": 3, "O": 4, "FC1": 5, "FC2": 6}  # both tools' order
HOT = {"V", "O"}  # components carrying most of the gradient


def layout(exact):
    """(name, shape, layer, component) in named_parameters() order."""
    out = []
    C, F = 16, 64
    for layer in range(2):
        base = "model.decoder.layers.%d." % layer
        for proj, comp, shape in (("self_attn.k_proj", "K", (C, C)), ("self_attn.v_proj", "V", (C, C)),
                                  ("self_attn.q_proj", "Q", (C, C)), ("self_attn.out_proj", "O", (C, C)),
                                  ("fc1", "FC1", (F, C)), ("fc2", "FC2", (C, F))):
            out.append((base + proj + ".weight", shape, layer, comp))
            if not exact:
                out.append((base + proj + ".bias", (shape[0],), layer, comp))
    return out


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def records(tensors, exact):
    """[(step, tensor index, sumsq, retained)] in recording order."""
    rng = random.Random(1234 if exact else 5678)
    out = []
    for step in STEPS:
        for i, (name, shape, layer, comp) in enumerate(tensors):
            k = max(1, math.ceil(0.01 * numel(shape)))
            if exact:
                # activity a = m/64, raw = a * sqrt(n): a square of a dyadic number
                m = rng.randrange(24, 64) if comp in HOT else rng.randrange(0, 16)
                sumsq = (m / 64.0 * math.sqrt(numel(shape))) ** 2
            else:
                scale = 3.0 if comp in HOT else 0.4
                sumsq = rng.uniform(0.2, 1.0) * scale * (1.0 + 0.5 * math.sin(step + i)) / (3 + i)
            out.append((step, i, sumsq, rng.randrange(0, k + 1)))
    return out


def per_component(tensors, recs):
    """{step: {(layer, comp): [sumsq, retained, numel]}} summed in record order."""
    table = {}
    for step, i, sumsq, retained in recs:
        name, shape, layer, comp = tensors[i]
        cell = table.setdefault(step, {}).setdefault((layer, comp), [0.0, 0, 0])
        cell[0] += sumsq
        cell[1] += retained
        cell[2] += numel(shape)
    return table


def write_reference(path, table):
    fields = ["step", "seed", "model_name", "workload_name", "dataset_name",
              "layer", "component", "raw_activity", "d_activity", "numel", "retained_numel"]
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for step in sorted(table):
            for (layer, comp) in sorted(table[step], key=lambda lc: (lc[0], ORDER[lc[1]])):
                sq, retained, n = table[step][(layer, comp)]
                raw = math.sqrt(max(sq, 0.0))
                w.writerow({"step": step, "seed": SEED, "model_name": MODEL,
                            "workload_name": WORKLOAD, "dataset_name": DATASET,
                            "layer": layer, "component": comp, "raw_activity": raw,
                            "d_activity": raw / math.sqrt(n), "numel": n,
                            "retained_numel": retained})


def write_v1(path, table):
    with open(path, "w") as f:
        f.write("# igrad-trace v1 layout_hash=0x0000000000000000 sparsifier=topk density=0.01\n")
        f.write("step,layer,component,raw_activity,d_activity,numel,retained_numel\n")
        prev = {}
        for step in sorted(table):
            for (layer, comp) in sorted(table[step], key=lambda lc: (lc[0], ORDER[lc[1]])):
                sq, retained, n = table[step][(layer, comp)]
                raw = float("%.9g" % math.sqrt(sq / n))
                d = raw - prev[(layer, comp)] if prev else 0.0
                f.write("%d,%d,%s,%.9g,%.9g,%d,%d\n" % (step, layer, comp, raw, d, n, retained))
            prev = {lc: float("%.9g" % math.sqrt(table[step][lc][0] / table[step][lc][2]))
                    for lc in table[step]}


def main():
    if len(sys.argv) not in (2, 3) or (len(sys.argv) == 3 and sys.argv[2] != "--exact"):
        sys.exit("usage: reference_trace_writer.py OUTDIR [--exact]")
    out, exact = sys.argv[1], len(sys.argv) == 3
    tensors = layout(exact)
    recs = records(tensors, exact)
    table = per_component(tensors, recs)
    write_reference(os.path.join(out, "component_activity_trace.csv"), table)
    write_v1(os.path.join(out, "trace_v1.csv"), table)
    with open(os.path.join(out, "numbers.json"), "w") as f:
        json.dump({"tensors": [[t[0], list(t[1])] for t in tensors],
                   "records": [[s, i, repr(sq), r] for s, i, sq, r in recs]}, f)


if __name__ == "__main__":
    main()
