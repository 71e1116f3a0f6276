#!/usr/bin/env bash
# CLI test: experiments/netem/testbed and `igrad bench comm`. On 2 "nodes"
# x 1 rank the two ranks really run in two different network namespaces
# (neither the test's own) and reach each other over the shaped veths; a
# 2-rank `igrad bench comm --json` sweep there returns one row per
# (collective, size) for all four collectives (allgather, allreduce, and
# the hier node step's reduce and bcast); the testbed's namespaces are gone afterwards; bad
# testbed options exit 2 and bad bench comm input exits 2 with a message;
# --subnet puts the nodes in the /24 asked for, a malformed one exits 2,
# and a second testbed on a subnet already in use is refused (exit 2)
# while one on another subnet runs.
# Without root / CAP_NET_ADMIN or mpirun it exits 77 (CTest: skipped).
# Usage: testbed.sh path/to/igrad   (CTest passes the built binary)
set -euo pipefail
igrad=${1:?usage: $0 IGRAD_BINARY}
here=$(cd "$(dirname "$0")/../.." && pwd)
testbed=$here/experiments/netem/testbed
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1

# bench comm input errors need no privileges
set +e
"$igrad" bench comm --sizes 6 >"$tmp/e1" 2>&1; rc1=$?
"$igrad" bench comm >"$tmp/e2" 2>&1; rc2=$?
"$igrad" bench comm --ops allgather,scatter >"$tmp/e3" 2>&1; rc3=$?
"$igrad" bench comm --node-pieces 0 >"$tmp/e4" 2>&1; rc4=$?
"$igrad" bench comm --across-nodes >"$tmp/e5" 2>&1; rc5=$?
set -e
check "bench comm --sizes 6 exits 2 naming the size" \
  bash -c "[ $rc1 -eq 2 ] && grep -q '6 is not a positive multiple of 4' '$tmp/e1'"
check "bench comm outside mpirun exits 2" \
  bash -c "[ $rc2 -eq 2 ] && grep -q 'under mpirun' '$tmp/e2'"
check "bench comm --ops scatter exits 2 naming it" \
  bash -c "[ $rc3 -eq 2 ] && grep -q \"'scatter' is not a collective\" '$tmp/e3'"
check "bench comm --node-pieces 0 exits 2 naming it" \
  bash -c "[ $rc4 -eq 2 ] && grep -q 'node-pieces is 0' '$tmp/e4'"
check "bench comm --across-nodes alone exits 2 naming --ranks-per-node" \
  bash -c "[ $rc5 -eq 2 ] && grep -q 'across-nodes needs --ranks-per-node' '$tmp/e5'"

command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found"; exit 77; }
set +e
"$testbed" --check >"$tmp/check" 2>&1; rc=$?
set -e
if [ $rc -eq 3 ]; then echo "SKIP: $(cat "$tmp/check")"; exit 77; fi
check "testbed --check" [ $rc -eq 0 ]

set +e
"$testbed" --nodes 0 -- true >/dev/null 2>&1; rc1=$?
"$testbed" --nodes 2 -- -np 2 true >/dev/null 2>&1; rc2=$?
set -e
check "testbed --nodes 0 exits 2" [ $rc1 -eq 2 ]
check "testbed refuses -np (exits 2)" [ $rc2 -eq 2 ]

before=$(ip netns list | awk '{print $1}' | sort)
timeout 120 "$testbed" --nodes 2 --ranks-per-node 1 --rate 1gbit -- \
  sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(readlink /proc/self/ns/net)"' >"$tmp/ns" 2>/dev/null
own=$(readlink /proc/self/ns/net)
check "two ranks in two namespaces, neither the test's" python3 - "$tmp/ns" "$own" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l.startswith("rank ")]
ns = {r[1]: r[2] for r in rows}
assert sorted(ns) == ["0", "1"], rows
assert ns["0"] != ns["1"] and sys.argv[2] not in ns.values(), ns
PY
timeout 120 "$testbed" --nodes 2 --ranks-per-node 1 --rate 1gbit -- \
  "$igrad" bench comm --sizes 4096,65536 --reps 2 --json >"$tmp/comm.json" 2>/dev/null
check "bench comm sweep across the namespaces" python3 - "$tmp/comm.json" <<'PY'
import json, sys
d = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
assert d["ranks"] == 2 and d["reps"] == 2, d
got = [(r["op"], r["bytes"]) for r in d["rows"]]
assert got == [(op, b) for op in ("allgather", "allreduce", "reduce", "bcast")
               for b in (4096, 65536)], got
assert all(r["ms"] > 0 for r in d["rows"]), d["rows"]
PY
# --subnet: the nodes live in the /24 asked for, and while a testbed holds a
# subnet a second one on it is refused (exit 2) -- so two run at once only
# on different subnets. 10.252.0 / 10.253.0: not the default, so a testbed
# another job runs with the default does not collide with this check.
sub=10.252.0
set +e
"$testbed" --nodes 1 --subnet 10.300.0 -- true >/dev/null 2>"$tmp/badsub"; rc_bad=$?
set -e
check "testbed --subnet 10.300.0 exits 2 naming it" \
  bash -c "[ $rc_bad -eq 2 ] && grep -q 'subnet must be three octets' '$tmp/badsub'"
timeout 120 "$testbed" --nodes 2 --ranks-per-node 1 --rate 1gbit --subnet "$sub" -- \
  sh -c 'echo "rank $OMPI_COMM_WORLD_RANK $(ip -4 -o addr show | awk "{print \$4}" | tr "\n" " ")"' \
  >"$tmp/sub" 2>/dev/null
check "testbed --subnet $sub: rank i has $sub.(i+1)/24" python3 - "$tmp/sub" "$sub" <<'PY'
import sys
sub = sys.argv[2]
rows = {l.split()[1]: l.split()[2:] for l in open(sys.argv[1]) if l.startswith("rank ")}
assert sorted(rows) == ["0", "1"], rows
for r, addrs in rows.items():
    assert f"{sub}.{int(r) + 1}/24" in addrs, (r, addrs)
    assert not any(a.startswith("10.231.0.") for a in addrs), (r, addrs)
PY
# a testbed holding $sub (its rank waits for a file), then a second one on it
held=10.253.0
timeout 120 "$testbed" --nodes 1 --subnet "$held" -- \
  sh -c "touch '$tmp/up'; i=0; while [ ! -e '$tmp/go' ] && [ \$i -lt 600 ]; do sleep 0.1; i=\$((i+1)); done" \
  >/dev/null 2>&1 &
holder=$!
for _ in $(seq 600); do [ -e "$tmp/up" ] && break; sleep 0.1; done
set +e
"$testbed" --nodes 1 --subnet "$held" -- true >/dev/null 2>"$tmp/busy"; rc_busy=$?
"$testbed" --nodes 1 --subnet 10.254.0 -- true >/dev/null 2>&1; rc_free=$?
set -e
touch "$tmp/go"
set +e
wait "$holder"; rc_holder=$?
set -e
check "a second testbed on a subnet in use exits 2 naming it" \
  bash -c "[ -e '$tmp/up' ] && [ $rc_busy -eq 2 ] && grep -q 'subnet $held.0/24 is already on an interface' '$tmp/busy'"
check "meanwhile a testbed on another subnet runs" [ $rc_free -eq 0 ]
check "the holding testbed ends normally" [ $rc_holder -eq 0 ]

after=$(ip netns list | awk '{print $1}' | sort)
check "no testbed namespace left" bash -c "! comm -13 <(echo '$before') <(echo '$after') | grep -q '^igtb'"

[ $fails -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all checks passed"
