#!/usr/bin/env bash
# CLI test: parameter names — `igrad layout --unmapped` (tensors inside
# numbered blocks that no rule maps, with their share of the entries),
# `igrad layout --map FILE` (user rules before the built-in ones), bad map
# files by file and line, and `igrad train --map FILE`: a 3-step run with
# rules that map a block tensor differently, a bad map refused, and two MPI
# ranks with different rules refused by the engine, naming the tensor.
# Usage: names.sh path/to/igrad   (CTest passes the built binary)
set -euo pipefail
igrad=${1:?usage: $0 IGRAD_BINARY}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
check() { # check NAME CONDITION...
  local name=$1; shift
  if "$@"; then echo "ok   $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}

# nn.TransformerEncoderLayer names, one unknown module and one unknown 1-D tensor
cat >"$tmp/model.txt" <<'TXT'
encoder.layers.0.self_attn.in_proj_weight 96 32
encoder.layers.0.self_attn.in_proj_bias 96
encoder.layers.0.self_attn.out_proj.weight 32 32
encoder.layers.0.linear1.weight 64 32
encoder.layers.0.linear2.weight 32 64
encoder.layers.0.mystery.weight 64 32
encoder.layers.0.gamma 32
head.weight 10 32
TXT
"$igrad" layout --unmapped "$tmp/model.txt" >"$tmp/unmapped.txt"
check "--unmapped lists the unknown module with its share" \
  grep -Eq '^encoder\.layers\.0\.mystery\.weight +2048 +19\.162%$' "$tmp/unmapped.txt"
check "--unmapped lists the unknown 1-D tensor" grep -q '^encoder.layers.0.gamma ' "$tmp/unmapped.txt"
check "--unmapped total line" grep -q '2 of 8 tensors inside numbered blocks map to no component (OTHER), 2080 of 10688 entries (19.46%)' "$tmp/unmapped.txt"
check "--unmapped leaves out mapped tensors" bash -c "! grep -q in_proj '$tmp/unmapped.txt'"

printf '# mine\nglob:*.mystery.weight FC1 block\nencoder\\.layers\\.([0-9]+)\\.gamma NORM 1\n' >"$tmp/rules.map"
"$igrad" layout --unmapped --map "$tmp/rules.map" "$tmp/model.txt" >"$tmp/unmapped2.txt"
check "--map: nothing unmapped" grep -q '0 of 8 tensors' "$tmp/unmapped2.txt"
"$igrad" layout --map "$tmp/rules.map" "$tmp/model.txt" >"$tmp/table.txt"
check "--map: the rule's kind and layer" grep -Eq '^encoder\.layers\.0\.mystery\.weight .* 0  FC1$' "$tmp/table.txt"
check "--map: built-in rules still apply" grep -Eq '^encoder\.layers\.0\.self_attn\.in_proj_weight .* 0  QKV$' "$tmp/table.txt"

printf 'glob:*.mystery.weight FC9 block\n' >"$tmp/bad.map"
set +e
"$igrad" layout --map "$tmp/bad.map" "$tmp/model.txt" 2>"$tmp/err.txt"; rc=$?
"$igrad" layout --map 2>"$tmp/err2.txt"; rc2=$?
"$igrad" layout --unmapped --json "$tmp/model.txt" 2>"$tmp/err3.txt"; rc3=$?
set -e
check "bad map file fails" test "$rc" -ne 0
check "bad map error names file, line and kind" grep -q "bad.map:1: unknown component kind 'FC9'" "$tmp/err.txt"
check "--map without FILE is a usage error" test "$rc2" -eq 2
check "--unmapped and --json exclude each other" test "$rc3" -eq 2

# -- train --map: a tiny corpus, 3 steps
mkdir -p "$tmp/corpus"
for d in 0 1 2 3; do
  for i in $(seq 1 60); do printf 'the cat sat on the mat and the dog ran %d. ' "$i"; done >"$tmp/corpus/doc$d.txt"
done
common=(--data "$tmp/corpus" --seq-len 32 --batch 4 --steps 3 --eval-every 0 --threads 1 --progress quiet
        --method adtopk_sync)
printf 'model\\.layers\\.([0-9]+)\\.mlp\\.up_proj\\.weight FC2 1\n' >"$tmp/train.map"
"$igrad" train "${common[@]}" --out "$tmp/run" --map "$tmp/train.map" 2>"$tmp/train_err.txt"
check "train --map runs 3 steps" test "$(wc -l <"$tmp/run/metrics.csv")" -eq 4
check "train: built-in names of the trainer's model leave nothing unmapped" \
  bash -c "! grep -q 'match no name rule' '$tmp/train_err.txt'"
set +e
"$igrad" train "${common[@]}" --out "$tmp/run2" --map "$tmp/bad.map" 2>"$tmp/train_err2.txt"; rc=$?
set -e
check "train --map with a bad file fails" test "$rc" -ne 0
check "train --map error names the file" grep -q "bad.map:1" "$tmp/train_err2.txt"

# -- two ranks with different rules: the engine's layout agreement names the tensor
if command -v mpirun >/dev/null 2>&1; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  set +e
  timeout 120 mpirun --oversubscribe --bind-to none \
    -np 1 "$igrad" train "${common[@]}" --out "$tmp/run3" --map "$tmp/train.map" : \
    -np 1 "$igrad" train "${common[@]}" --out "$tmp/run3" >"$tmp/mpi.txt" 2>&1; rc=$?
  set -e
  check "ranks with different rules fail" test "$rc" -ne 0
  check "the mismatch names the tensor and both assignments" grep -q \
    "layout differs at tensor model.layers.0.mlp.up_proj.weight (index 6): rank 0 maps it to (layer 0, FC2), rank 1 to (layer 0, FC1)" \
    "$tmp/mpi.txt"
else
  echo "SKIP two ranks with different rules: no mpirun"
fi

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all checks passed"
