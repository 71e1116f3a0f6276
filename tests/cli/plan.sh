#!/usr/bin/env bash
# CLI test: `igrad plan` on shipped configs — the JSON's bytes against
# formulas recomputed here (dense moves 4 bytes per parameter, ring
# all-reduce and all-gather wire bytes and alpha-beta times), the release
# cycle of ig, the link presets, and every bad flag's message.
# (The engine-vs-plan equality itself is tests/mpi_plan.c at np 2 and 4.)
# Usage: plan.sh path/to/igrad   (CTest passes the built binary)
set -euo pipefail
igrad=${1:?usage: $0 IGRAD_BINARY}
src=${IGRAD_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

"$igrad" plan --config "$src/configs/llama-2-7b.json" --ranks 64 --ranks-per-node 8 \
  --link intra=nvlink --link inter=100,8 --compute-ms 1000 --json >"$tmp/p64.json"
check "plan JSON: bytes and times follow the formulas" python3 - "$tmp/p64.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
P, n, B = d["ranks"], d["params"], d["buckets"]
assert (P, d["nodes"], d["ranks_per_node"], n) == (64, 8, 8, 6738415616), d
rows = {(r["method"], r["route"]): r for r in d["rows"]}
dense = rows[("dense", "engine")]
assert dense["payload_nbytes"]["min"] == dense["payload_nbytes"]["max"] == 4 * n, dense
wire = 2 * (P - 1) / P * 4 * n
assert abs(dense["wire_nbytes"]["mean"] - wire) <= 1e-9 * wire, (dense["wire_nbytes"], wire)
bw, lat = 100e9 / 8, 8e-6
bf16 = rows[("dense_bf16", "ring_allreduce")]
t = 1e3 * (B * 2 * (P - 1) * lat + 2 * (P - 1) / P * 2 * n / bw)
assert abs(bf16["sync_ms"]["mean"] - t) <= 1e-9 * t, (bf16["sync_ms"], t)
assert abs(bf16["step_ms"] - (1000 + t)) <= 1e-6 and bf16["step_speedup_vs_dense_bf16"] == 1.0
ig = rows[("ig", "engine")]
assert d["cycle_steps"] == 4 and ig["steps"] == 4, (d["cycle_steps"], ig["steps"])
ad = rows[("adtopk_sync", "engine")]
assert 0.45 < ig["payload_nbytes"]["mean"] / ad["payload_nbytes"]["mean"] < 0.55, (ig, ad)
for k in ("hier", "sparse_allreduce"):
    assert rows[("ig", k)]["projected"] is True
assert rows[("ig", "engine")]["projected"] is False
steps = [s["payload_nbytes"] for s in ig["per_step"]]
assert [s["step"] for s in ig["per_step"]] == [0, 1, 2, 3], ig["per_step"]
assert (min(steps), max(steps)) == (ig["payload_nbytes"]["min"], ig["payload_nbytes"]["max"])
assert abs(sum(steps) / 4 - ig["payload_nbytes"]["mean"]) <= 1e-9 * max(steps)
assert ig["intra_nbytes"] is None and rows[("ig", "hier")]["inter_nbytes"]["mean"] > 0
sar = rows[("ig", "sparse_allreduce")]
v = 2 * (P - 1) / P * ig["payload_nbytes"]["mean"]
assert abs(sar["wire_nbytes"]["mean"] - v) <= 1e-9 * v, (sar["wire_nbytes"], v)
PY

"$igrad" plan --config "$src/configs/gpt2.json" --ranks 16 --method topk_sync \
  --collective gather --link inter=25g --json >"$tmp/gather.json"
check "plan JSON: forced gather wire = (P-1) x payload" python3 - "$tmp/gather.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = [r for r in d["rows"] if r["method"] == "topk_sync" and r["route"] == "engine"][0]
p = r["payload_nbytes"]["mean"]
assert p > 0 and r["wire_nbytes"]["mean"] == 15 * p, r
assert d["inter"]["name"] == "25g" and d["inter"]["gbit_per_s"] == 25, d["inter"]
PY

"$igrad" plan --config "$src/configs/gpt2.json" --ranks 8 >"$tmp/table.txt"
check "plan table lists every method" grep -q "^ig  *sparse_allreduce  *proj" "$tmp/table.txt"
"$igrad" plan --list-links >"$tmp/links.txt"
check "presets are listed with their figures" grep -q "400g .*400 Gbit/s" "$tmp/links.txt"

bad() { # bad NAME PATTERN ARGS...: exit 2 (usage) or 1 (load) and the message
  local name=$1 pat=$2; shift 2
  set +e
  "$igrad" plan "$@" >/dev/null 2>"$tmp/err.txt"; local rc=$?
  set -e
  check "$name fails" test "$rc" -ne 0
  check "$name names it" grep -q -- "$pat" "$tmp/err.txt"
}
cfg="$src/configs/gpt2.json"
bad "no --config" "--config MODEL.json is required" --ranks 4
bad "--ranks 0" "--ranks is 0" --config "$cfg" --ranks 0
bad "--ranks text" "ranks" --config "$cfg" --ranks many
bad "P not a multiple of L" "not a multiple of --ranks-per-node 8" --config "$cfg" --ranks 12
bad "bad link" "'fast' is neither a preset" --config "$cfg" --ranks 8 --link inter=fast
bad "bad link level" "expected intra=SPEC or inter=SPEC" --config "$cfg" --ranks 8 --link x=100g
bad "zero bandwidth" "both > 0" --config "$cfg" --ranks 8 --link inter=0,5
bad "bad method" "'foo' is not a method" --config "$cfg" --ranks 8 --method dense,foo
bad "bad target ratio" "--target-ratio is 2" --config "$cfg" --ranks 8 --target-ratio 2
bad "bad density" "config.density" --config "$cfg" --ranks 8 --density 0
bad "unknown flag" "unknown argument '--frobnicate'" --config "$cfg" --ranks 8 --frobnicate
bad "missing config file" "missing.json" --config "$tmp/missing.json" --ranks 8
bad "negative compute" "--compute-ms is -1" --config "$cfg" --ranks 8 --compute-ms -1

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
