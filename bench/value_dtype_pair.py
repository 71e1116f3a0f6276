#!/usr/bin/python3
"""value_dtype_pair.py — F32 against BF16 wire values in one process.

Two engines per method (topk_sync, adtopk_sync) on the OPT-125M layout
(configs/opt-125m.json), the self communicator, one thread, density 0.01,
take the same synthetic gradients step after step, in alternating order
(A B, B A, ...), so machine drift hits both alike; prints per method and
value dtype the payload and the medians of select/pack/unpack/total ms and
igrad's data-plane bytes per parameter. About 1.5 GB of memory.

Run from the repository root:
    PYTHONPATH=python OMP_NUM_THREADS=1 /usr/bin/python3 bench/value_dtype_pair.py [STEPS]
It prints timings; it asserts nothing about them.
"""
import statistics
import sys

import torch

import igrad


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    layout = igrad.Layout.load("configs/opt-125m.json")
    counts = [layout.tensor(t)["count"] for t in range(len(layout))]
    torch.manual_seed(1)
    g0 = [torch.randn(k) * (1 + (t % 7)) for t, k in enumerate(counts)]
    for method in ("topk_sync", "adtopk_sync"):
        engines = [(dt, igrad.Engine(layout, None, {"method": method, "density": 0.01,
                                                    "threads": 1, "value_dtype": dt},
                                     igrad.Comm.self_())) for dt in ("F32", "BF16")]
        rows = {dt: [] for dt, _ in engines}
        for step in range(steps + 1):  # step 0: warm-up
            for dt, e in (engines if step % 2 == 0 else engines[::-1]):
                g = [x.clone() for x in g0]
                e.sync(step, [x.data_ptr() for x in g])
                if step:
                    rows[dt].append(e.stats())
        for dt, rs in rows.items():
            med = {k: statistics.median(r[k] for r in rs)
                   for k in ("select_ms", "pack_ms", "unpack_ms", "total_ms")}
            print("%-12s %-5s payload %9d B  select %7.1f  pack %6.2f  unpack %6.2f  "
                  "total %7.1f ms  %.3f B/param"
                  % (method, dt, rs[-1]["payload_nbytes"], med["select_ms"], med["pack_ms"],
                     med["unpack_ms"], med["total_ms"], rs[-1]["dataplane_nbytes_per_param"]),
                  flush=True)
        del engines


if __name__ == "__main__":
    main()
