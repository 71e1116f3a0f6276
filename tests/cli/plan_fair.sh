#!/usr/bin/env bash
# CLI test: `igrad plan`'s fair dense baseline and its overlap model
# (docs/plan.md §2a, §2b), against hand arithmetic recomputed here:
# dense bf16 as NCCL runs it (rings over the node's --nics-per-node NICs,
# NCCL's ring and tree latency terms, the faster of the two), the hier
# shards sharing NICs when a node has fewer than one per GPU, and
# --overlap (DDP's 25 MiB buckets issued as backward fills them; igrad's
# flat streamed step; hier and sparse all-reduce rows after backward).
# Not here: the bytes per route, the engine routes, --latency and the flags
# plan.sh covers.
# Usage: plan_fair.sh path/to/igrad   (CTest passes the built binary)
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
cfg7="$src/configs/llama-2-7b.json"

# The issue's check: LLaMA-2-7B, P = 256, 8 per node, 100 Gbit/s per GPU.
"$igrad" plan --config "$cfg7" --ranks 256 --ranks-per-node 8 --link inter=100g \
  --method dense --json >"$tmp/k8.json"
"$igrad" plan --config "$cfg7" --ranks 256 --ranks-per-node 8 --link inter=100g \
  --method dense --nics-per-node 1 --json >"$tmp/k1.json"
check "dense bf16 uses every NIC of a node: 2(P-1)/P 2n / 8 per NIC, sync < 450 ms" \
  python3 - "$tmp/k8.json" "$tmp/k1.json" <<'PY'
import json, sys
k8, k1 = (json.load(open(p)) for p in sys.argv[1:])
P, N, L, n = 256, 32, 8, k8["params"]
assert (k8["nics_per_node"], k1["nics_per_node"]) == (8, 1), (k8["nics_per_node"], k1["nics_per_node"])
b8, b1 = (next(r for r in d["rows"] if r["method"] == "dense_bf16") for d in (k8, k1))
v = 2 * (P - 1) / P * 2 * n                       # bytes one rank's ring all-reduce moves
assert abs(b8["nic_nbytes"]["mean"] - v / 8) <= 1e-9 * v, (b8["nic_nbytes"], v / 8)
assert abs(b1["nic_nbytes"]["mean"] - v) <= 1e-9 * v, (b1["nic_nbytes"], v)
B = k8["buckets"]
nv_a, nv_b, e_a, e_b = 3e-6, 3600e9 / 8, 8e-6, 100e9 / 8
lat = B * (2 * (P - N) * nv_a + 2 * (N - 1) * e_a)   # NCCL tuning.cc's ring terms
for d, K in ((b8, 8), (b1, 1)):
    t = 1e3 * (lat + max(v / (K * e_b), v / nv_b))
    assert d["nccl_tree_collectives"]["max"] == 0, d
    assert abs(d["sync_ms"]["mean"] - t) <= 1e-9 * t, (K, d["sync_ms"], t)
assert b8["sync_ms"]["mean"] < 450, b8["sync_ms"]
assert 7.5 < b1["sync_ms"]["mean"] / b8["sync_ms"]["mean"] < 8.0, (b1["sync_ms"], b8["sync_ms"])
# the engine's flat dense F32 buckets are NCCL all-reduces too: twice the bytes
f8 = next(r for r in k8["rows"] if (r["method"], r["route"]) == ("dense", "flat"))
assert abs(f8["nic_nbytes"]["mean"] - 2 * v / 8) <= 1e-9 * v, f8["nic_nbytes"]
PY

# Small buckets at large P: NCCL's tree (2((L-1) a_intra + floor(log2 N) a_inter)
# latency, 2n / (0.92 K B) bandwidth) beats the ring's 2(P-N) + 2(N-1) hops.
for P in 1024 16; do
  "$igrad" plan --config "$src/configs/gpt2.json" --ranks $P --link inter=100g --method dense \
    --json >"$tmp/g$P.json"
done
check "dense bf16: the faster of NCCL's ring and tree" python3 - "$tmp/g1024.json" "$tmp/g16.json" <<'PY'
import json, math, sys
for path in sys.argv[1:]:
    d = json.load(open(path))
    P, L, n, B = d["ranks"], 8, d["params"], d["buckets"]
    N = P // L
    r = next(r for r in d["rows"] if r["method"] == "dense_bf16")
    nv_a, nv_b, e_a, e_b = 3e-6, 3600e9 / 8, 8e-6, 100e9 / 8
    # the plan's B buckets split 2n bytes; both formulas are linear in bytes,
    # so for all-ring or all-tree steps the split does not matter
    ring = B * (2 * (P - N) * nv_a + 2 * (N - 1) * e_a) + 2 * (P - 1) / P * 2 * n / (L * e_b)
    tree = B * 2 * ((L - 1) * nv_a + math.floor(math.log2(N)) * e_a) + 2 * 2 * n / (0.92 * L * e_b)
    trees = r["nccl_tree_collectives"]["mean"]
    want = tree if P == 1024 else ring
    assert trees == (B if P == 1024 else 0), (P, trees)
    assert abs(r["sync_ms"]["mean"] - 1e3 * want) <= 1e-9 * 1e3 * want, (P, r["sync_ms"], ring, tree)
    # the tree moves 2n per node over its L NICs (0.92 makes it slower, not bigger)
    nic = 2 * 2 * n / L if P == 1024 else 2 * (P - 1) / P * 2 * n / L
    assert abs(r["nic_nbytes"]["mean"] - nic) <= 1e-9 * nic, (P, r["nic_nbytes"], nic)
PY

# hier shards share NICs: 4 nodes x 4, forced gather, --latency overlap, so
# every shard pays (N-1) alpha once; K NICs carry L/K shards each, whose
# bandwidth terms add up.
for K in 1 2 4; do
  "$igrad" plan --config "$src/configs/gpt2.json" --ranks 16 --ranks-per-node 4 --method topk_sync \
    --collective gather --link inter=10,40 --latency overlap --nics-per-node $K --json >"$tmp/h$K.json"
done
check "hier: shards on one NIC share its bandwidth" python3 - "$tmp/h1.json" "$tmp/h2.json" "$tmp/h4.json" <<'PY'
import json, sys
N, L, a, bw = 4, 4, 40e-6, 10e9 / 8
for path, K in zip(sys.argv[1:], (1, 2, 4)):
    d = json.load(open(path))
    h = next(r for r in d["rows"] if (r["method"], r["route"]) == ("topk_sync", "hier"))
    sh = h["by_local_rank"]
    assert h["steps"] == 1 and len(sh) == L, h
    nics = [sum(s["inter_nbytes"] for s in sh if s["local_rank"] * K // L == k) for k in range(K)]
    t = 1e3 * max((N - 1) * a + b / bw for b in nics)
    assert abs(h["inter_ms"]["mean"] - t) <= 1e-9 * t, (K, h["inter_ms"], t)
    assert abs(h["nic_nbytes"]["mean"] - max(nics)) <= 1e-9 * max(nics), (K, h["nic_nbytes"], nics)
PY

# --overlap: DDP's buckets (1 MiB, then 25 MiB) of bf16 gradients, ready as
# backward (backward_share of compute) produces bytes at a steady rate,
# all-reduced one after another; exposed = how long the last ends after
# backward. Recomputed here for two compute times.
for c in 50 5000; do
  "$igrad" plan --config "$cfg7" --ranks 64 --link inter=25g --method dense,ig --overlap \
    --backward-share 0.5 --compute-ms $c --json >"$tmp/o$c.json"
done
"$igrad" plan --config "$cfg7" --ranks 64 --link inter=25g --method dense,ig \
  --compute-ms 5000 --json >"$tmp/none.json"
check "--overlap: DDP's buckets, the streamed flat step, hier after backward" \
  python3 - "$tmp/o50.json" "$tmp/o5000.json" "$tmp/none.json" <<'PY'
import json, math, sys
o50, o5k, none = (json.load(open(p)) for p in sys.argv[1:])
P, L, n = 64, 8, o50["params"]
N = P // L
nv_a, nv_b, e_a, e_b = 3e-6, 3600e9 / 8, 15e-6, 25e9 / 8
def allreduce(size):
    ring = 2 * (P - N) * nv_a + 2 * (N - 1) * e_a + max(2 * (P - 1) / P * size / (L * e_b),
                                                        2 * (P - 1) / P * size / nv_b)
    tree = 2 * ((L - 1) * nv_a + math.floor(math.log2(N)) * e_a) + max(2 * size / (L * e_b),
                                                                      2 * size / nv_b) / 0.92
    return min(ring, tree)
total, first, cap = 2 * n, 2 ** 20, 25 * 2 ** 20
sizes = [first] + [cap] * math.ceil((total - first) / cap)
sizes[-1] = total - first - cap * (len(sizes) - 2)
assert abs(sum(sizes) - total) < 1 and sizes[-1] > 0
for d, c in ((o50, 50e-3), (o5k, 5.0)):
    assert d["overlap"] is True and d["backward_share"] == 0.5 and d["ddp_buckets"] == len(sizes), d
    back = 0.5 * c
    assert abs(d["backward_ms"] - 1e3 * back) <= 1e-9, d["backward_ms"]
    end, done, sync = 0.0, 0.0, 0.0
    for s in sizes:
        done += s
        t = allreduce(s)
        end = max(end, back * done / total) + t
        sync += t
    exposed = max(0.0, end - back)
    rows = {(r["method"], r["route"]): r for r in d["rows"]}
    b = rows[("dense_bf16", "ring_allreduce")]
    assert b["overlap_model"] == "DDP buckets" and b["collectives"]["mean"] == len(sizes), b
    assert abs(b["sync_ms"]["mean"] - 1e3 * sync) <= 1e-9 * 1e3 * sync, (b["sync_ms"], sync)
    assert abs(b["exposed_ms"]["mean"] - 1e3 * exposed) <= 1e-6, (b["exposed_ms"], exposed)
    assert abs(b["step_ms"] - 1e3 * (c + exposed)) <= 1e-6, (b["step_ms"], c, exposed)
    # hier and the sparse all-reduce have no streamed step: all exposed
    for k in (("ig", "hier"), ("ig", "sparse_allreduce"), ("dense", "hier")):
        r = rows[k]
        assert r["exposed_ms"] == r["sync_ms"], (k, r["exposed_ms"], r["sync_ms"])
        assert r["overlap_model"] == "after backward (last bucket)", (k, r["overlap_model"])
    f = rows[("dense", "flat")]
    assert f["overlap_model"] == "streamed step" and f["exposed_ms"]["mean"] <= f["sync_ms"]["mean"]
    for r in d["rows"]:
        want = (d["compute_ms"] + b["exposed_ms"]["mean"]) / (d["compute_ms"] + r["exposed_ms"]["mean"])
        assert abs(r["step_speedup_vs_dense_bf16"] - want) <= 1e-12, r
    if c == 50e-3: # backward of 25 ms hides next to nothing
        assert exposed > 0.9 * sync and f["exposed_ms"]["mean"] > 0.9 * f["sync_ms"]["mean"], f
    else:          # 2.5 s of backward: the last bucket is exposed, the last quarter for flat
        # (a small remainder bucket may still wait for the one before it)
        assert allreduce(sizes[-1]) <= exposed <= allreduce(sizes[-1]) + allreduce(cap), exposed
        q = f["exposed_ms"]["mean"] / f["sync_ms"]["mean"]
        assert 0.22 < q < 0.28, q  # the last of 4 contiguous buckets of a 7B layout
# without --overlap: exposed = sync, step = compute + sync, DDP not used
rows = {(r["method"], r["route"]): r for r in none["rows"]}
assert none["overlap"] is False and "ddp_buckets" not in none
for r in none["rows"]:
    assert r["exposed_ms"] == r["sync_ms"] and r["overlap_model"] == "none", r
    assert abs(r["step_ms"] - (5000 + r["sync_ms"]["mean"])) <= 1e-6, r
assert rows[("dense_bf16", "ring_allreduce")]["collectives"]["mean"] == none["buckets"]
PY

"$igrad" plan --config "$cfg7" --ranks 64 --overlap --compute-ms 900 >"$tmp/table.txt"
check "table: overlap header and exposed column" grep -q "^# --overlap: backward 600.0 ms (0.667 of compute)" "$tmp/table.txt"
check "table: NIC count in the links line" grep -q "; 8 NICs per node" "$tmp/table.txt"

bad() { # bad NAME PATTERN ARGS...: a usage error and its message
  local name=$1 pat=$2; shift 2
  set +e
  "$igrad" plan "$@" >/dev/null 2>"$tmp/err.txt"; local rc=$?
  set -e
  check "$name fails" test "$rc" -eq 2
  check "$name names it" grep -q -- "$pat" "$tmp/err.txt"
}
cfg="$src/configs/gpt2.json"
bad "--nics-per-node 0" "--nics-per-node is 0" --config "$cfg" --ranks 16 --nics-per-node 0
bad "--nics-per-node 3 of 8" "--nics-per-node 3 does not divide --ranks-per-node 8" --config "$cfg" --ranks 16 --nics-per-node 3
bad "--nics-per-node 16 of 8" "--nics-per-node 16 does not divide" --config "$cfg" --ranks 16 --nics-per-node 16
bad "--backward-share 0" "--backward-share is 0 (must be in (0, 1])" --config "$cfg" --ranks 8 --backward-share 0
bad "--backward-share 1.5" "--backward-share is 1.5" --config "$cfg" --ranks 8 --backward-share 1.5

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
