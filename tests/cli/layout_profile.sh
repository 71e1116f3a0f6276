#!/usr/bin/env bash
# CLI test: `igrad layout` and `igrad profile` as a user runs them — real
# configs, a trace written here, the files they produce, and their errors.
# Usage: layout_profile.sh path/to/igrad   (CTest passes the built binary)
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

# -- layout: table, JSON, errors
"$igrad" layout "$src/configs/llama-2-7b.json" >"$tmp/table.txt"
check "layout table lists q_proj" grep -q "model.layers.31.self_attn.q_proj.weight" "$tmp/table.txt"
"$igrad" layout --json "$src/configs/llama-2-7b.json" >"$tmp/layout.json"
check "layout --json kinds and total" python3 - "$tmp/layout.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
k = d["kinds"]
assert d["family"] == "llama", d["family"]
assert d["total_numel"] == 6738415616, d["total_numel"]
assert (k["Q"], k["K"], k["V"], k["O"], k["FC1"], k["FC2"]) == (32, 32, 32, 32, 64, 32), k
assert len(d["tensors"]) == 291 and set(d["tensors"][0]) >= {"name", "shape", "numel", "layer", "kind"}
PY
set +e
"$igrad" layout "$tmp/missing.json" 2>"$tmp/err.txt"; rc=$?
set -e
check "layout of a missing file fails" test "$rc" -ne 0
check "layout error names the file" grep -q "missing.json" "$tmp/err.txt"

# -- profile: a trace where V and O carry the gradient in both layers
awk 'BEGIN {
  print "# igrad-trace v1 layout_hash=0x0000000000000000 sparsifier=adtopk density=0.01"
  print "step,layer,component,raw_activity,d_activity,numel,retained_numel"
  split("Q K V O FC1 FC2", kinds, " ")
  for (s = 0; s < 20; s++) for (l = 0; l < 2; l++) for (i = 1; i <= 6; i++) {
    hot = (kinds[i] == "V" || kinds[i] == "O")
    a = (hot ? 1.0 : 0.1) + 0.01 * ((s * 7 + i * 3 + l) % 5)
    printf "%d,%d,%s,%.6f,0,4096,41\n", s, l, kinds[i], a
  }
}' >"$tmp/trace.csv"
# kmeans2 splits exactly between the modes; the default knee counts the knee
# point itself as important, so it may admit one more (docs/architecture.md).
"$igrad" profile --trace "$tmp/trace.csv" --window 5:15 --method kmeans2 \
  --out "$tmp/p.json" --csv "$tmp/p.csv" >"$tmp/ranked.txt"
check "profile prints the threshold" grep -qi "tau" "$tmp/ranked.txt"
check "profile JSON (kmeans2) marks exactly V and O important" python3 - "$tmp/p.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
imp = sorted((c["layer"], c["kind"]) for c in d["components"] if c["important"])
assert imp == [(0, "O"), (0, "V"), (1, "O"), (1, "V")], imp
assert d["window"][0] == 5 and d["steps"] == 10, (d["window"], d["steps"])
PY
check "profile CSV has the reference columns" \
  bash -c "head -1 '$tmp/p.csv' | grep -qx 'layer,component,final_score,global_tau,is_important'"
for w in "5:" ":15" "0:20"; do
  check "window form $w" "$igrad" profile --trace "$tmp/trace.csv" --window "$w" --quiet
done
set +e
"$igrad" profile --trace "$tmp/trace.csv" --window 100:200 --out "$tmp/none.json" 2>"$tmp/err.txt"; rc=$?
set -e
check "empty window fails" test "$rc" -ne 0
check "empty window message names the window" grep -q "100" "$tmp/err.txt"
check "nothing written for a failed profile" test ! -e "$tmp/none.json"
set +e
"$igrad" profile --trace "$tmp/trace.csv" --out "$tmp/trace.csv" 2>/dev/null; rc=$?
set -e
check "refuses to overwrite its input" test "$rc" -ne 0
check "input still intact" grep -q "^19,1,FC2" "$tmp/trace.csv"

# -- profile --target-ratio: the important set and kappa of igrad_target_fit
# for the model given by --layout (a name list of the trace's components)
for l in 0 1; do
  for k in q k v o; do echo "model.layers.$l.self_attn.${k}_proj.weight 64 64"; done
  echo "model.decoder.layers.$l.fc1.weight 64 64"
  echo "model.decoder.layers.$l.fc2.weight 64 64"
done >"$tmp/names.txt"
"$igrad" profile --trace "$tmp/trace.csv" --target-ratio 0.5 --layout "$tmp/names.txt" \
  --out "$tmp/t.json" >"$tmp/t.txt"
check "--target-ratio prints the choice" grep -q "^target ratio 0.5 (R 4): .* kappa" "$tmp/t.txt"
check "--target-ratio JSON: threshold, set and kappa of the fit" python3 - "$tmp/t.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["target"]
imp = [c for c in d["components"] if c["important"]]
assert t["ratio"] == 0.5 and t["met"] is True, t
assert t["tau"] == d["tau"] and len(imp) == t["n_important"] and t["n_gated"] == 12, (t, d["tau"])
assert all(c["score"] >= t["tau"] for c in imp), imp
assert 0.05 <= t["release_keep"] <= 1 and t["planned_ratio"] <= 0.5, t
# equal entries per component: f_imp is the important share, the model
# ratio f_imp + kappa (1 - f_imp)
f = len(imp) / 12.0
assert abs(t["f_imp"] - f) < 1e-12, (t, f)
assert abs(t["model_ratio"] - (f + t["release_keep"] * (1 - f))) < 1e-12, t
PY
set +e
"$igrad" profile --trace "$tmp/trace.csv" --target-ratio 0.5 --quiet 2>"$tmp/err.txt"; rc=$?
set -e
check "--target-ratio without --layout fails" test "$rc" -eq 2
check "... naming --layout" grep -q -- "--target-ratio needs --layout" "$tmp/err.txt"
set +e
"$igrad" profile --trace "$tmp/trace.csv" --target-ratio 0 --layout "$tmp/names.txt" 2>"$tmp/err.txt"; rc=$?
set -e
check "--target-ratio 0 fails" test "$rc" -eq 2
check "... naming the range" grep -q "must be in (0, 1\]" "$tmp/err.txt"

[ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
echo "all CLI checks passed"
