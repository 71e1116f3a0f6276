#!/usr/bin/env bash
# CLI test: `igrad bench sync --json` on 2 MPI ranks (1 rank if mpirun is
# missing) with a tiny LLaMA config: the JSON has every documented key, and
# the byte counts obey what the methods promise (dense sends every entry,
# ig and iad less than adtopk_sync, ig's ratio = f_imp + kappa (1 - f_imp)
# up to the release rounding); --aligned moves the same bytes. Timings are
# never checked. Also --help and a bad option.
# Usage: bench_sync.sh path/to/igrad   (CTest passes the built binary)
set -euo pipefail
igrad=${1:?usage: $0 IGRAD_BINARY}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

cat >"$tmp/tiny.json" <<'EOF'
{"model_type": "llama", "hidden_size": 128, "intermediate_size": 352,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
 "vocab_size": 1000, "tie_word_embeddings": false}
EOF

ranks=1
launch=()
if command -v mpirun >/dev/null 2>&1; then
  ranks=2
  launch=(mpirun --allow-run-as-root --oversubscribe -np 2)
fi
OMP_NUM_THREADS=1 "${launch[@]}" "$igrad" bench sync --config "$tmp/tiny.json" --steps 3 \
  --profile-steps 4 --json >"$tmp/out.json"
check "bench sync --json keys and byte counts" python3 - "$tmp/out.json" "$ranks" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
ranks = int(sys.argv[2])
assert d["ranks"] == ranks, d["ranks"]
assert d["steps"] == 3, d["steps"]
assert d["layout"]["family"] == "llama" and d["layout"]["params"] > 0, d["layout"]
methods = d["methods"]
assert set(methods) == {"dense", "topk_sync", "adtopk_sync", "iad", "ig"}, set(methods)
keys = {"payload_bytes_per_step", "wire_bytes_per_step", "select_ms", "pack_ms", "comm_ms",
        "unpack_ms", "sync_ms", "comm_window_ms"}
for name, m in methods.items():
    missing = keys - set(m)
    assert not missing, (name, missing)
    for k in keys:
        assert isinstance(m[k], (int, float)) and m[k] >= 0, (name, k, m[k])
# the exchange windows: flat engines have only the buckets' (summed as it is)
for name, m in methods.items():
    w = m["comm_windows_ms"]
    assert set(w) == {"buckets", "node_sums", "node_broadcasts"}, (name, w)
    assert w["node_sums"] == 0 and w["node_broadcasts"] == 0, (name, w)
    assert abs(w["buckets"] - m["comm_window_ms"]) <= 1e-9 * (1 + w["buckets"]), (name, m)
policies = {"direct", "sequential", "greedy", "risk", "contiguous"}
packing = methods["ig"]["packing"]
assert set(packing) == policies, set(packing)
for p, v in packing.items():
    assert {"imbalance", "cv", "overflow"} <= set(v), (p, v)
f_imp = methods["ig"]["f_imp"]
assert 0 < f_imp <= 1 and f_imp == d["f_imp"], f_imp
# the floor pass and every method's ratio to it
assert isinstance(d["floor_ms"], (int, float)) and d["floor_ms"] > 0, d["floor_ms"]
for name, m in methods.items():
    assert abs(m["ratio_to_floor"] - m["sync_ms"] / d["floor_ms"]) <= 1e-9 * m["ratio_to_floor"], (name, m)
# bytes: dense sends every entry as F32; wire = (P-1) x payload for gathers
assert methods["dense"]["payload_bytes_per_step"] == 4 * d["layout"]["params"], methods["dense"]
ad = methods["adtopk_sync"]["payload_bytes_per_step"]
assert methods["ig"]["payload_bytes_per_step"] < ad and methods["iad"]["payload_bytes_per_step"] < ad
ratio = methods["ig"]["ratio_to_sparsifier_sync"]
kappa = d["knobs"]["release_keep"]
assert abs(ratio - (f_imp + kappa * (1 - f_imp))) < 0.05, (ratio, f_imp, kappa)
if ranks > 1:
    ts = methods["topk_sync"]
    assert abs(ts["wire_bytes_per_step"] - (ranks - 1) * ts["payload_bytes_per_step"]) < 1, ts
PY

# --value-dtype bf16: the sparse methods send 2 bytes less per entry than
# with f32 (same selections); dense stays f32; the memory column is there
OMP_NUM_THREADS=1 "$igrad" bench sync --config "$tmp/tiny.json" --steps 2 --profile-steps 4 \
  --json >"$tmp/f32.json"
OMP_NUM_THREADS=1 "$igrad" bench sync --config "$tmp/tiny.json" --steps 2 --profile-steps 4 \
  --value-dtype bf16 --json >"$tmp/bf16.json"
check "bench sync --value-dtype bf16: 2-byte values" python3 - "$tmp/f32.json" "$tmp/bf16.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["knobs"]["value_dtype"] == "F32" and b["knobs"]["value_dtype"] == "BF16", b["knobs"]
ma, mb = a["methods"], b["methods"]
assert mb["dense"]["payload_bytes_per_step"] == ma["dense"]["payload_bytes_per_step"]
for m in ("topk_sync", "adtopk_sync"):
    pa, pb = ma[m]["payload_bytes_per_step"], mb[m]["payload_bytes_per_step"]
    # entries x (2 + idx) vs entries x (4 + idx), idx in (0, 4] bytes an entry
    # (compact index codes: about 1; fixed: 2 or 4): above 1/2, at most 3/4
    assert pa / 2 < pb <= pa * 3 / 4 + 1, (m, pa, pb)
for m in ma.values():
    assert m["dataplane_bytes_per_param"] >= 4 or m is ma["dense"], m
PY

# --aligned (the buckets' collectives timed from a barrier): the same
# selections, so the same bytes as the engine's own sync, the knob in the
# JSON, a comm time; with the two-level sync it is refused by name
OMP_NUM_THREADS=1 "${launch[@]}" "$igrad" bench sync --config "$tmp/tiny.json" --steps 3 \
  --profile-steps 4 --aligned --json >"$tmp/aligned.json"
check "bench sync --aligned: same bytes, comm timed" python3 - "$tmp/out.json" "$tmp/aligned.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["knobs"]["aligned"] is False and b["knobs"]["aligned"] is True, (a["knobs"], b["knobs"])
for name, m in a["methods"].items():
    n = b["methods"][name]
    for k in ("payload_bytes_per_step", "wire_bytes_per_step", "buckets"):
        assert n[k] == m[k], (name, k, m[k], n[k])
    assert n["comm_ms"] >= 0, (name, n)
if a["ranks"] > 1:
    assert b["methods"]["dense"]["comm_ms"] > 0, b["methods"]["dense"]
PY
set +e
"$igrad" bench sync --aligned --topology hier 2>"$tmp/err3.txt"; rc3=$?
set -e
check "bench sync --aligned --topology hier is refused by name" \
  bash -c "test $rc3 -eq 2 && grep -q -- '--aligned' '$tmp/err3.txt' && grep -q hier '$tmp/err3.txt'"

# --collective sparse_reduce: every sparse bucket through the sparse
# all-reduce by name (what experiments/plan_validation/sar.py times): the
# knob in the JSON, dense untouched, the sparse methods' wire is the
# route's (8-byte entries, not the gather's (P-1) x payload); an unknown
# name is refused by name
if [ "$ranks" -gt 1 ]; then
  OMP_NUM_THREADS=1 "${launch[@]}" "$igrad" bench sync --config "$tmp/tiny.json" --steps 3 \
    --profile-steps 4 --collective sparse_reduce --json >"$tmp/sar.json"
  check "bench sync --collective sparse_reduce" python3 - "$tmp/out.json" "$tmp/sar.json" <<'PY'
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
assert a["knobs"]["collective"] == "auto" and b["knobs"]["collective"] == "sparse_reduce", b["knobs"]
assert b["methods"]["dense"]["wire_bytes_per_step"] == a["methods"]["dense"]["wire_bytes_per_step"]
for name in ("topk_sync", "adtopk_sync"):
    m, n = a["methods"][name], b["methods"][name]
    assert n["payload_bytes_per_step"] > 0 and n["wire_bytes_per_step"] != m["wire_bytes_per_step"], (name, m, n)
PY
fi
set +e
"$igrad" bench sync --collective ring 2>"$tmp/err4.txt"; rc4=$?
set -e
check "bench sync --collective ring is refused by name" \
  bash -c "test $rc4 -ne 0 && grep -q -- \"--collective is 'ring'\" '$tmp/err4.txt'"

# bench comm's in-place all-reduce rows: igrad's call (a copy or the
# 2-rank swap under Open MPI) and MPI's own MPI_IN_PLACE, side by side
if [ "$ranks" -gt 1 ]; then
  "${launch[@]}" "$igrad" bench comm --ops allreduce_in_place,mpi_allreduce_in_place \
    --sizes 4096,262144 --reps 2 --json >"$tmp/comm.json"
  check "bench comm in-place rows" python3 - "$tmp/comm.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
got = sorted((r["op"], r["bytes"]) for r in d["rows"])
want = sorted((op, b) for op in ("allreduce_in_place", "mpi_allreduce_in_place")
              for b in (4096, 262144))
assert got == want, got
assert all(r["ms"] > 0 for r in d["rows"]), d["rows"]
PY
  "${launch[@]}" "$igrad" bench comm --ops reduce,bcast --node-pieces 7 --sizes 4096 --reps 2 \
    --json >"$tmp/pieces.json"
  check "bench comm --node-pieces 7: reduce and bcast rows" python3 - "$tmp/pieces.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert sorted(r["op"] for r in d["rows"]) == ["bcast", "reduce"], d["rows"]
PY
  # groups as MPI formed them: 2 "nodes" of 2 ranks; inside a node {0, 1},
  # across nodes (hier's shard exchange) {0, 2}
  for g in node across; do
    flag=(); [ "$g" = across ] && flag=(--across-nodes)
    mpirun --allow-run-as-root --oversubscribe -np 4 "$igrad" bench comm --ranks-per-node 2 \
      "${flag[@]}" --ops allgather --sizes 4096 --reps 2 --json >"$tmp/group-$g.json"
  done
  check "bench comm --ranks-per-node 2 [--across-nodes]: the groups MPI formed" \
    python3 - "$tmp/group-node.json" "$tmp/group-across.json" <<'PY'
import json, sys
node, across = (json.load(open(p)) for p in sys.argv[1:])
assert node["group_of_rank0"] == [0, 1] and node["group_ranks"] == 2, node
assert across["group_of_rank0"] == [0, 2] and across["group_ranks"] == 2, across
assert len(across["rows"]) == 1 and across["rows"][0]["ms"] > 0, across
PY
fi

"$igrad" bench sync --help >"$tmp/help.txt"
check "bench sync --help names --profile-steps" grep -q -- "--profile-steps" "$tmp/help.txt"
set +e
"$igrad" bench sync --density 2 2>"$tmp/err.txt"; rc=$?
"$igrad" bench sync --config "$tmp/missing.json" --steps 1 2>"$tmp/err2.txt"; rc2=$?
set -e
check "bad --density is a usage error" test "$rc" -eq 2
check "a missing config fails naming it" bash -c "test $rc2 -eq 1 && grep -q missing.json '$tmp/err2.txt'"

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
