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
set -euo pipefail
igrad=${1:?usage: $0 IGRAD_BINARY}
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: no mpirun"; exit 77; }
"$igrad" train --help >/dev/null 2>&1 || { echo "SKIP: this build has no trainer"; exit 77; }
tmp=$(mktemp -d "${TMPDIR:-/tmp}/igrad-plan-defaults.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3
fails=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

mkdir -p "$tmp/corpus"
words=(the cat sat on a mat and dog ran to red house in sun was big)
seed=7
for d in 0 1 2 3; do
  line=""
  for w in $(seq 1 300); do
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    line+="${words[$(( (seed / 65536) % 16 ))]} "
  done
  echo "$line" >"$tmp/corpus/doc$d.txt"
done
for m in topk_sync dense; do
  mpirun --oversubscribe --bind-to none -np 2 "$igrad" train --data "$tmp/corpus" --seq-len 32 \
    --batch 4 --steps 3 --eval-every 0 --eval-batches 1 --threads 1 --progress quiet \
    --method "$m" --out "$tmp/$m" >"$tmp/$m.log" 2>&1 \
    || { echo "FAIL train --method $m: $(tail -n 3 "$tmp/$m.log")"; exit 1; }
done
ckpt="$tmp/topk_sync/checkpoint"
"$igrad" plan --config "$ckpt" --ranks 2 --method dense,topk_sync --json >"$tmp/plan.json"
"$igrad" plan --config "$ckpt" --ranks 2 --method dense,topk_sync --density 0.01 \
  --value-dtype f32 --json >"$tmp/old.json"
"$igrad" plan --config "$ckpt" --ranks 2 --method dense,topk_sync >"$tmp/plan.txt"
"$igrad" plan --help >"$tmp/plan_help.txt"
"$igrad" train --help >"$tmp/train_help.txt" 2>&1

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

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
