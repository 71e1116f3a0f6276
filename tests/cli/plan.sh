#!/usr/bin/env bash
# CLI test: `igrad plan` on shipped configs — the JSON's bytes against
# formulas recomputed here (dense moves 4 bytes per parameter, ring
# all-reduce and all-gather wire bytes and alpha-beta times), the release
# cycle of ig, the hier route (its bytes per level and shard against the
# formulas, and against `igrad bench sync --topology hier` measured at np 4
# when mpirun is there), per-collective links, the link presets, and every
# bad flag's message. (The flat engine-vs-plan equality step by step is
# tests/mpi_plan.c at np 2 and 4; hier's is tests/mpi_hier.c.)
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

# The checks that pin numbers pass the density and values they were made at
# (0.01, F32), not plan's defaults (train's: tests/cli/plan_defaults.sh).
"$igrad" plan --config "$src/configs/llama-2-7b.json" --ranks 64 --ranks-per-node 8 \
  --link intra=nvlink --link inter=100,8 --compute-ms 1000 --density 0.01 --value-dtype f32 \
  --json >"$tmp/p64.json"
check "plan JSON: bytes and times follow the formulas" python3 - "$tmp/p64.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
P, n, B = d["ranks"], d["params"], d["buckets"]
assert (P, d["nodes"], d["ranks_per_node"], n) == (64, 8, 8, 6738415616), d
rows = {(r["method"], r["route"]): r for r in d["rows"]}
dense = rows[("dense", "flat")]
assert dense["payload_nbytes"]["min"] == dense["payload_nbytes"]["max"] == 4 * n, dense
wire = 2 * (P - 1) / P * 4 * n
assert abs(dense["wire_nbytes"]["mean"] - wire) <= 1e-9 * wire, (dense["wire_nbytes"], wire)
bw, lat = 100e9 / 8, 8e-6
# NCCL's rings over the 8 NICs of a node (one per GPU): B ring all-reduces,
# each 2(P-N) NVLink hops and 2(N-1) network hops of latency, the bytes of
# one rank spread over the node's 8 NICs (tests/cli/plan_fair.sh has more)
bf16 = rows[("dense_bf16", "ring_allreduce")]
assert d["nics_per_node"] == 8 and bf16["nccl_tree_collectives"]["max"] == 0, bf16
t = 1e3 * (B * (2 * (P - 8) * 3e-6 + 2 * (8 - 1) * lat) + 2 * (P - 1) / P * 2 * n / (8 * bw))
assert abs(bf16["sync_ms"]["mean"] - t) <= 1e-9 * t, (bf16["sync_ms"], t)
assert abs(bf16["step_ms"] - (1000 + t)) <= 1e-6 and bf16["step_speedup_vs_dense_bf16"] == 1.0
ig = rows[("ig", "flat")]
assert d["cycle_steps"] == 4 and ig["steps"] == 4, (d["cycle_steps"], ig["steps"])
ad = rows[("adtopk_sync", "flat")]
assert 0.45 < ig["payload_nbytes"]["mean"] / ad["payload_nbytes"]["mean"] < 0.55, (ig, ad)
assert rows[("ig", "sparse_allreduce")]["projected"] is True
assert rows[("ig", "flat")]["projected"] is False and rows[("ig", "hier")]["projected"] is False
steps = [s["payload_nbytes"] for s in ig["per_step"]]
assert [s["step"] for s in ig["per_step"]] == [0, 1, 2, 3], ig["per_step"]
assert (min(steps), max(steps)) == (ig["payload_nbytes"]["min"], ig["payload_nbytes"]["max"])
assert abs(sum(steps) / 4 - ig["payload_nbytes"]["mean"]) <= 1e-9 * max(steps)
# flat: the engine's split of the wire bytes, intra = wire (L-1)/(P-1)
L, N = 8, 8
for r in (dense, ig):
    w, i, o = r["wire_nbytes"]["mean"], r["intra_nbytes"]["mean"], r["inter_nbytes"]["mean"]
    assert abs(i - w * (L - 1) / (P - 1)) <= 1e-9 * w and abs(i + o - w) <= 1e-9 * w, r
    assert r["intra_ms"]["max"] == 0 and r["inter_ms"]["mean"] == r["sync_ms"]["mean"], r
# hier: intra = node sum + broadcast of every parameter, 2(L-1)/L 4n; its
# time (L-1) alpha + (L-1)/L 4n beta each on nvlink; inter = the busiest
# shard's, and 1/L of flat's or less for ig
nv_bw, nv_lat = 3600e9 / 8, 3e-6
for m in ("dense", "topk_sync", "adtopk_sync", "ig"):
    h = rows[(m, "hier")]
    intra = 2 * (L - 1) / L * 4 * n
    assert h["intra_nbytes"]["min"] == h["intra_nbytes"]["max"], h["intra_nbytes"]
    assert abs(h["intra_nbytes"]["mean"] - intra) <= 1e-9 * intra, (m, h["intra_nbytes"], intra)
    w = h["wire_nbytes"]["mean"]
    assert abs(h["intra_nbytes"]["mean"] + h["inter_nbytes"]["mean"] - w) <= 1e-9 * w, h
    t = 1e3 * 2 * ((L - 1) * nv_lat + (L - 1) / L * 4 * n / nv_bw)
    assert abs(h["intra_ms"]["mean"] - t) <= 1e-9 * t, (m, h["intra_ms"], t)
    shards = h["by_local_rank"]
    assert [s["local_rank"] for s in shards] == list(range(L)), shards
    busiest = max(s["inter_nbytes"] for s in shards)
    if h["steps"] == 1:
        assert busiest == h["inter_nbytes"]["max"], (m, busiest, h["inter_nbytes"])
    assert h["inter_nbytes"]["max"] >= busiest and h["payload_nbytes"]["mean"] > 0, (m, h)
assert rows[("ig", "hier")]["inter_nbytes"]["mean"] <= ig["inter_nbytes"]["mean"] / L, \
    (rows[("ig", "hier")]["inter_nbytes"], ig["inter_nbytes"])
assert abs(rows[("ig", "hier")]["sync_ms"]["mean"] - rows[("ig", "hier")]["intra_ms"]["mean"]
           - rows[("ig", "hier")]["inter_ms"]["mean"]) <= 1e-9 * rows[("ig", "hier")]["sync_ms"]["mean"]
sar = rows[("ig", "sparse_allreduce")]
v = 2 * (P - 1) / P * ig["payload_nbytes"]["mean"]
assert abs(sar["wire_nbytes"]["mean"] - v) <= 1e-9 * v, (sar["wire_nbytes"], v)
PY

"$igrad" plan --config "$src/configs/gpt2.json" --ranks 16 --method topk_sync \
  --collective gather --link inter=25g --json >"$tmp/gather.json"
check "plan JSON: forced gather wire = (P-1) x payload" python3 - "$tmp/gather.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
r = [r for r in d["rows"] if r["method"] == "topk_sync" and r["route"] == "flat"][0]
p = r["payload_nbytes"]["mean"]
assert p > 0 and r["wire_nbytes"]["mean"] == 15 * p, r
assert d["inter"]["name"] == "25g" and d["inter"]["gbit_per_s"] == 25, d["inter"]
PY

# hier under forced gather at 4 nodes x 2: every shard's inter bytes are
# (N-1) x its payload, its time on inter.allgather (here its own link)
"$igrad" plan --config "$src/configs/gpt2.json" --ranks 8 --ranks-per-node 2 --method topk_sync \
  --collective gather --link inter=25g --link inter.allgather=10,40 --link intra.reduce=100,2 \
  --json >"$tmp/hg.json"
check "plan JSON: hier gather shards, per-collective links" python3 - "$tmp/hg.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
h = [r for r in d["rows"] if r["method"] == "topk_sync" and r["route"] == "hier"][0]
N, L, n = 4, 2, d["params"]
sh = h["by_local_rank"]
assert len(sh) == L and all(s["inter_nbytes"] == (N - 1) * s["payload_nbytes"] for s in sh), sh
assert h["payload_nbytes"]["max"] == max(s["payload_nbytes"] for s in sh), (h, sh)
bc = d["inter"]["by_collective"]
assert (bc["allgather"]["gbit_per_s"], bc["allgather"]["latency_us"]) == (10, 40), bc
assert bc["allreduce"]["name"] == "25g" and d["intra"]["by_collective"]["reduce"]["gbit_per_s"] == 100
bw, lat = 10e9 / 8, 40e-6
# topk_sync's buckets carry equal budgets only roughly: the slowest shard's sum
t = max((4 * (N - 1)) * lat + s["inter_nbytes"] / bw for s in sh) * 1e3
assert abs(h["inter_ms"]["mean"] - t) <= 1e-6 * t, (h["inter_ms"], t)
ti = 1e3 * ((L - 1) * 2e-6 + (L - 1) / L * 4 * n / (100e9 / 8)
            + (L - 1) * 3e-6 + (L - 1) / L * 4 * n / (3600e9 / 8))
assert abs(h["intra_ms"]["mean"] - ti) <= 1e-9 * ti, (h["intra_ms"], ti)
PY

# --latency overlap: a step's buckets all in flight, so the step pays their
# bandwidth terms and the largest bucket's latency terms; sum (default) every
# bucket's. The hier route's shards likewise; the node step is unchanged.
for l in sum overlap; do
  "$igrad" plan --config "$src/configs/gpt2.json" --ranks 8 --ranks-per-node 2 \
    --method dense,topk_sync --collective gather --link inter=10,40 --latency "$l" \
    --json >"$tmp/lat-$l.json"
done
check "plan --latency overlap: one bucket's latency per step, bandwidth terms unchanged" \
  python3 - "$tmp/lat-sum.json" "$tmp/lat-overlap.json" <<'PY'
import json, sys
s, o = (json.load(open(p)) for p in sys.argv[1:])
assert (s["latency"], o["latency"]) == ("sum", "overlap"), (s["latency"], o["latency"])
rs = {(r["method"], r["route"]): r for r in s["rows"]}
ro = {(r["method"], r["route"]): r for r in o["rows"]}
lat, bw = 40e-6, 10e9 / 8
P, N, L, B = 8, 4, 2, s["buckets"]
nv = 3e-6 # nvlink's alpha: NCCL's rings cross P - N NVLink hops, N - 1 network ones
# flat topk_sync, forced gather: B all-gathers over P ranks, (P-N) intra and
# (N-1) inter alpha each, the bytes over the node's L NICs
f_s, f_o = rs[("topk_sync", "flat")], ro[("topk_sync", "flat")]
assert f_s["collectives"]["mean"] == B, f_s["collectives"]
want = 1e3 * (B - 1) * ((P - N) * nv + (N - 1) * lat)
got = f_s["sync_ms"]["mean"] - f_o["sync_ms"]["mean"]
assert abs(got - want) <= 1e-9 * f_s["sync_ms"]["mean"], (got, want)
t = 1e3 * ((P - N) * nv + (N - 1) * lat + (P - 1) * f_o["payload_nbytes"]["mean"] / (L * bw))
assert abs(f_o["sync_ms"]["mean"] - t) <= 1e-9 * t, (f_o["sync_ms"], t)
# dense_bf16's ring all-reduces: 2(P-N) intra and 2(N-1) inter alpha each
d_s, d_o = rs[("dense_bf16", "ring_allreduce")], ro[("dense_bf16", "ring_allreduce")]
assert d_o["nccl_tree_collectives"]["max"] == 0, d_o
want = 1e3 * (B - 1) * (2 * (P - N) * nv + 2 * (N - 1) * lat)
got = d_s["sync_ms"]["mean"] - d_o["sync_ms"]["mean"]
assert abs(got - want) <= 1e-9 * d_s["sync_ms"]["mean"], (got, want)
# hier topk_sync: the node step the same, every shard's buckets one latency
h_s, h_o = rs[("topk_sync", "hier")], ro[("topk_sync", "hier")]
assert h_s["intra_ms"] == h_o["intra_ms"], (h_s["intra_ms"], h_o["intra_ms"])
t = max(1e3 * ((N - 1) * lat + sh["inter_nbytes"] / bw) for sh in h_o["by_local_rank"])
assert abs(h_o["inter_ms"]["mean"] - t) <= 1e-6 * t, (h_o["inter_ms"], t)
assert h_o["inter_ms"]["mean"] < h_s["inter_ms"]["mean"], (h_o["inter_ms"], h_s["inter_ms"])
PY

# the plan's hier bytes equal the engine's measured ones (np 4, 2 nodes x 2):
# bench sync averages bytes over ranks, i.e. over the shards
if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  tiny="$src/experiments/plan_validation/llama-tiny.json"
  mpirun --oversubscribe --bind-to none -np 4 "$igrad" bench sync --config "$tiny" --steps 2 \
    --profile-steps 2 --topology hier --ranks-per-node 2 --threads 1 --json >"$tmp/bs.json"
  "$igrad" plan --config "$tiny" --ranks 4 --ranks-per-node 2 --method dense,topk_sync \
    --density 0.01 --value-dtype f32 --json >"$tmp/bp.json" # bench sync's defaults
  check "plan hier bytes = bench sync --topology hier measured (np 4)" \
    python3 - "$tmp/bs.json" "$tmp/bp.json" <<'PY'
import json, sys
lines = [l for l in open(sys.argv[1]).read().splitlines() if l.startswith("{")]
meas = json.loads(lines[-1])["methods"]
rows = {(r["method"], r["route"]): r for r in json.load(open(sys.argv[2]))["rows"]}
for m in ("dense", "topk_sync"):
    h, b = rows[(m, "hier")], meas[m]
    sh = h["by_local_rank"]
    pay = sum(s["payload_nbytes"] for s in sh) / len(sh)
    inter = sum(s["inter_nbytes"] for s in sh) / len(sh)
    for name, plan, got in (("payload", pay, b["payload_bytes_per_step"]),
                            ("inter", inter, b["inter_wire_bytes_per_step"]),
                            ("intra", h["intra_nbytes"]["mean"], b["intra_wire_bytes_per_step"])):
        assert abs(plan - got) <= 1e-9 * got, (m, name, plan, got)
PY
else
  echo "SKIP plan hier bytes = bench sync measured (no mpirun)"
fi

"$igrad" plan --config "$src/configs/gpt2.json" --ranks 8 >"$tmp/table.txt"
check "plan table lists every method" grep -q "^ig  *sparse_allreduce  *proj" "$tmp/table.txt"
# auto's link and the opt-in: qwen2-0.5b at P 8 over 100g takes the
# sparse all-reduce for every sparse bucket, without the opt-in none
"$igrad" plan --config "$src/configs/qwen2-0.5b.json" --ranks 8 --ranks-per-node 1 \
  --link inter=100g --method topk_sync --density 0.01 --value-dtype f32 --auto-sparse-reduce \
  --json >"$tmp/sar.json"
"$igrad" plan --config "$src/configs/qwen2-0.5b.json" --ranks 8 --ranks-per-node 1 \
  --link inter=100g --method topk_sync --density 0.01 --value-dtype f32 --json >"$tmp/nosar.json"
check "auto prices with the link: sparse all-reduce only with the opt-in, and faster" \
  python3 - "$tmp/sar.json" "$tmp/nosar.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:3])
ra = {r["route"]: r for r in a["rows"] if r["method"] == "topk_sync"}
rb = {r["route"]: r for r in b["rows"] if r["method"] == "topk_sync"}
fa, fb = ra["flat"], rb["flat"]
assert fa["sparse_reduce_buckets"]["mean"] == 4 and fa["gather_buckets"]["mean"] == 0, fa
assert fb["sparse_reduce_buckets"]["mean"] == 0 and fb["gather_buckets"]["mean"] == 4, fb
assert fa["payload_nbytes"]["mean"] != fb["payload_nbytes"]["mean"]  # 8 bytes per entry
assert fa["sync_ms"]["mean"] < fb["sync_ms"]["mean"], (fa["sync_ms"], fb["sync_ms"])
PY
"$igrad" plan --config "$src/configs/gpt2.json" --ranks 8 --auto-sparse-reduce >"$tmp/t2.txt"
check "plan header names auto's link" grep -q "auto prices flat buckets at 3000 ns, 3600000 Mbit/s" "$tmp/t2.txt"
set +e
"$igrad" train --link fast --steps 1 >/dev/null 2>"$tmp/err.txt"; rc=$?
set -e
check "igrad train --link fast fails" test "$rc" -ne 0
check "igrad train --link names it" grep -q "igrad train: --link: 'fast' is neither a preset" "$tmp/err.txt"
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
bad "bad link level" "expected intra=SPEC, inter=SPEC or LEVEL.COLL=SPEC" --config "$cfg" --ranks 8 --link x=100g
bad "bad link collective" "COLL: allgather, allreduce, reduce, bcast" --config "$cfg" --ranks 8 --link inter.scatter=100g
bad "bad per-collective spec" "--link inter.reduce: 'slow' is neither" --config "$cfg" --ranks 8 --link inter.reduce=slow
bad "--ranks-per-node 0" "--ranks-per-node is 0" --config "$cfg" --ranks 8 --ranks-per-node 0
bad "--ranks-per-node text" "ranks-per-node" --config "$cfg" --ranks 8 --ranks-per-node two
bad "P not a multiple of a given L" "--ranks 12 is not a multiple of --ranks-per-node 5" --config "$cfg" --ranks 12 --ranks-per-node 5
bad "zero bandwidth" "bandwidth 0 Gbit/s is outside" --config "$cfg" --ranks 8 --link inter=0,5
bad "infinite link" "bandwidth 1e+308 Gbit/s is outside" --config "$cfg" --ranks 8 --json --link inter=1e308,1e308
bad "hex link" "is neither a preset" --config "$cfg" --ranks 8 --link inter=0x64,8
bad "bad method" "'foo' is not a method" --config "$cfg" --ranks 8 --method dense,foo
bad "bad target ratio" "--target-ratio is 2" --config "$cfg" --ranks 8 --target-ratio 2
bad "bad --latency" "--latency is 'max' (sum or overlap)" --config "$cfg" --ranks 8 --latency max
bad "bad density" "config.density" --config "$cfg" --ranks 8 --density 0
bad "unknown flag" "unknown argument '--frobnicate'" --config "$cfg" --ranks 8 --frobnicate
bad "missing config file" "missing.json" --config "$tmp/missing.json" --ranks 8
bad "negative compute" "--compute-ms is -1" --config "$cfg" --ranks 8 --compute-ms -1

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
