#!/usr/bin/env bash
# CLI test: `igrad plan --allocation partition|budget` prices ig under the
# allocation it names: the engine plan's ig payload (fixed widths, F32:
# the target's unit) over adtopk_sync's is the planned ratio each reports,
# the two differ (budget spends the target, partition a prefix of the
# score order), budget's meets the target and has no hier row (the
# engine's budget allocation is flat only), the components listed are the
# plan's every-step ones, and the text table says which allocation ran.
# A plan that ignored the option would fail the first two checks.
# Usage: plan_allocation.sh path/to/igrad   (CTest passes the built binary)
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

for a in partition budget; do
  "$igrad" plan --config "$src/configs/llama-2-7b.json" --ranks 8 --method adtopk_sync,ig \
    --target-ratio 0.25 --index-code fixed --density 0.01 --value-dtype f32 --allocation "$a" \
    --json >"$tmp/$a.json"
done
check "plan --allocation: ig priced under the allocation it names" python3 - "$tmp" <<'PY'
import json, sys
d = {a: json.load(open("%s/%s.json" % (sys.argv[1], a))) for a in ("partition", "budget")}
ratio, every = {}, {}
for a, j in d.items():
    assert j["ig_allocation"] == a, (a, j["ig_allocation"])
    rows = {(r["method"], r["route"]): r for r in j["rows"]}
    ig, ad = rows[("ig", "flat")], rows[("adtopk_sync", "flat")]
    r = ig["payload_nbytes"]["mean"] / ad["payload_nbytes"]["mean"]
    assert abs(r - j["ig_planned_ratio"]) <= 1e-9, (a, r, j["ig_planned_ratio"])
    assert j["ig_target_met"] is True and r <= 0.25, (a, r)
    ratio[a] = r
    every[a] = {c["component"] for c in j["ig_components"] if c["every_step"]}
    assert (("ig", "hier") in rows) == (a == "partition"), (a, sorted(rows))
    assert ("adtopk_sync", "hier") in rows
    keeps = {c["keep"] for c in j["ig_components"] if not c["every_step"]}
    assert keeps and all(0.05 <= k <= 1 for k in keeps), keeps
    if a == "partition":
        assert len(keeps) == 1, keeps  # one kappa for every deferred component
bud, par = ratio["budget"], ratio["partition"]
assert bud != par and bud > par, (bud, par)
assert every["budget"] != every["partition"], every
PY

"$igrad" plan --config "$src/configs/llama-2-7b.json" --ranks 8 --method ig --target-ratio 0.25 \
  --density 0.01 --value-dtype f32 --allocation budget >"$tmp/budget.txt"
check "plan --allocation budget: the table names it" \
  grep -q "^# ig allocation budget: planned payload 0\.249[0-9] x adtopk_sync" "$tmp/budget.txt"

set +e
"$igrad" plan --config "$src/configs/llama-2-7b.json" --ranks 8 --allocation knapsack \
  >"$tmp/bad.out" 2>"$tmp/bad.err"
rc=$?
set -e
check "plan --allocation knapsack: refused" \
  test "$rc" = 2 -a "$(cat "$tmp/bad.err")" = "igrad plan: --allocation is 'knapsack' (partition or budget)"

[ "$fails" = 0 ] && echo "PASS" || { echo "FAIL: $fails check(s)"; exit 1; }
