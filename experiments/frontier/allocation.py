#!/usr/bin/python3
"""allocation.py — ig's budget allocation against its partition fit and
adtopk_sync (issue 27, part 3; decision 0059).

vs_dense.py with one more method, `ig+budget` (`ig --profile auto
--target-ratio 0.25 --allocation budget`), and `ig+budget@0.2114` (the same
at the partition fit's planned payload), at the same settings (the demo's
post-train settings, 120 steps, one run at a time, paired by seed); its
options are vs_dense.py's (--reuse reads the runs of adtopk_sync and ig
made there). Writes OUT/vs_dense.md and OUT/vs_dense.json.

Usage: /usr/bin/python3 experiments/frontier/allocation.py --out runs/allocation
       --workloads fortunes:,lodash: --methods adtopk_sync,ig,ig+budget
       --reuse adtopk_sync@fortunes:=runs/vs_dense/fortunes/adtopk_sync ...
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vs_dense as V  # noqa: E402

V.METHODS["ig+budget"] = V.METHODS["ig"] + ["--allocation", "budget"]
# at the partition's planned bytes (0.2114 on the demo's model): the same
# payload, so that the allocation and the volume are told apart (the last
# --target-ratio given wins)
V.METHODS["ig+budget@0.2114"] = V.METHODS["ig+budget"] + ["--target-ratio", "0.2114"]

if __name__ == "__main__":
    V.main()
