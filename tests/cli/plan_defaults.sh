#!/usr/bin/env bash
# CLI test: `igrad plan` without --density and --value-dtype prices what
# `igrad train` without them runs (decision 0064). Two 2-rank runs with no
# sync flags, topk_sync and dense, on a tiny corpus; then `igrad plan` of
# their checkpoint's model at P 2, no flags either: its density and value
# dtype (JSON, table header, --help) are the ones train's summary.json
# records and train --help documents, its topk_sync flat payload and wire
# bytes are the ones the run's metrics.csv measured at every step, its
# dense rows are F32 (the dense run's bytes, and the same as at 0.01/F32).
# The plan at the old defaults (0.01, F32) must price different sparse
# bytes, so a plan that ignored train's defaults fails here.
# Skipped (77) without mpirun or without the trainer in this build.
# Usage: plan_defaults.sh path/to/igrad   (CTest passes the built binary)
source "$(dirname "$0")/fault_lib.bash" # IGRAD, tmp, corpus, common, mpi, fail, finish
"$IGRAD" train --help >/dev/null 2>&1 || { echo "SKIP: this build has no trainer"; exit 77; }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else fail "$name"; fi
}

for m in topk_sync dense; do
  "${mpi[@]}" "$IGRAD" train "${common[@]}" --eval-batches 1 --steps 3 --method "$m" \
    --out "$tmp/$m" >"$tmp/$m.log" 2>&1 \
    || { echo "FAIL train --method $m: $(tail -n 3 "$tmp/$m.log")"; exit 1; }
done
ckpt="$tmp/topk_sync/checkpoint"
"$IGRAD" plan --config "$ckpt" --ranks 2 --method dense,topk_sync --json >"$tmp/plan.json"
"$IGRAD" plan --config "$ckpt" --ranks 2 --method dense,topk_sync --density 0.01 \
  --value-dtype f32 --json >"$tmp/old.json"
"$IGRAD" plan --config "$ckpt" --ranks 2 --method dense,topk_sync >"$tmp/plan.txt"
"$IGRAD" plan --help >"$tmp/plan_help.txt"
"$IGRAD" train --help >"$tmp/train_help.txt" 2>&1

check "plan's no-flag defaults are train's: JSON, bytes per step, dense F32" \
  "$PY" - "$tmp" <<'PY'
import csv, json, re, sys
t = sys.argv[1]
plan, old = (json.load(open(f"{t}/{n}.json")) for n in ("plan", "old"))
sync = json.load(open(f"{t}/topk_sync/summary.json"))["config"]["sync"]
dsync = json.load(open(f"{t}/dense/summary.json"))["config"]["sync"]
doc = float(re.search(r"--density RHO.*\(default: ([0-9.]+) for the",
                      open(f"{t}/train_help.txt").read()).group(1))
# the same configuration: what train records and documents
assert plan["density"] == sync["density"] == doc, (plan["density"], sync["density"], doc)
assert plan["value_dtype"] == sync["value_dtype"] != "F32", (plan["value_dtype"], sync["value_dtype"])
assert dsync["value_dtype"] == "F32", dsync
assert (old["density"], old["value_dtype"]) == (0.01, "F32"), (old["density"], old["value_dtype"])
rows = {(r["method"], r["route"]): r for r in plan["rows"]}
olds = {(r["method"], r["route"]): r for r in old["rows"]}
# the same bytes: the plan's every step against the run's every step
# (topk_sync's cycle is one step: the run's 3 steps all match it)
def measured(m):
    return [(int(r["payload_bytes"]), int(r["wire_bytes"]))
            for r in csv.DictReader(open(f"{t}/{m}/metrics.csv"))]
for m in ("topk_sync", "dense"):
    f = rows[(m, "flat")]
    want = (f["payload_nbytes"]["mean"], f["wire_nbytes"]["mean"])
    got = measured(m)
    assert len(got) == 3 and all(g == want for g in got), (m, got, want)
    assert f["payload_nbytes"]["min"] == f["payload_nbytes"]["max"], f["payload_nbytes"]
# dense stays F32 and dense: 4 bytes a parameter, as at 0.01/F32
assert rows[("dense", "flat")]["payload_nbytes"]["mean"] == 4 * plan["params"], rows[("dense", "flat")]
for k in rows:
    if k[0] == "dense" or k[0] == "dense_bf16":
        assert rows[k] == olds[k], (k, rows[k], olds[k])
# the old defaults price other sparse bytes: this check can fail
s, o = rows[("topk_sync", "flat")], olds[("topk_sync", "flat")]
assert s["payload_nbytes"]["mean"] != o["payload_nbytes"]["mean"], (s["payload_nbytes"], o["payload_nbytes"])
print(f"plan = train: density {plan['density']:g}, {plan['value_dtype']} values, "
      f"topk_sync {s['payload_nbytes']['mean']:.0f} B/step (0.01/F32: {o['payload_nbytes']['mean']:.0f})")
PY

# train's own figures (summary.json), as the table and --help must spell them
d=$("$PY" -c 'import json, sys; y = json.load(open(sys.argv[1]))["config"]["sync"]; print("%g %s" % (y["density"], y["value_dtype"]))' "$tmp/topk_sync/summary.json")
read -r dens vdt <<<"$d"
check "table header: density $dens, $vdt values (dense F32)" \
  grep -q "; density $dens, $vdt values (dense F32), R " "$tmp/plan.txt"
check "plan --help: --density's default is train's ($dens)" \
  grep -q -- "--density X            sparsifier density ($dens: igrad train's default" "$tmp/plan_help.txt"
check "plan --help: --value-dtype's default is train's ($vdt)" \
  grep -q "fp8 ($vdt: igrad train's default" "$tmp/plan_help.txt"

finish plan_defaults
