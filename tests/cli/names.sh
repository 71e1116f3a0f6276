#!/usr/bin/env bash
# CLI test: parameter names — `igrad layout --unmapped` (tensors inside
# numbered blocks that no rule maps, with their share of the entries),
# `igrad layout --map FILE` (user rules before the built-in ones), bad map
# files by file and line, and `igrad train --map FILE`: a 3-step run with
# rules that map a block tensor differently, a bad map refused, and two MPI
# ranks with different rules refused by the engine, naming the tensor;
# `igrad profile/plan/bench sync --map FILE` (a trace or profile of a run
# with rules needs the same rules; bench's components change with them);
# MoE, T5 and timm names through `igrad layout --unmapped`.
# Usage: names.sh path/to/igrad   (CTest passes the built binary)
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

# -- profile --map: the trace of a run with rules carries their layout hash
"$igrad" train "${common[@]}" --out "$tmp/runt" --map "$tmp/train.map" --trace "$tmp/mapped.csv" \
  2>"$tmp/train_err3.txt"
"$igrad" profile --help >"$tmp/help_profile.txt"
check "profile --help lists --map" grep -q -- "--map FILE   user name rules ('PATTERN KIND LAYER'" "$tmp/help_profile.txt"
set +e
"$igrad" profile --trace "$tmp/mapped.csv" --target-ratio 0.5 --layout "$tmp/runt/checkpoint" \
  >/dev/null 2>"$tmp/perr.txt"; rc=$?
"$igrad" profile --trace "$tmp/mapped.csv" --map "$tmp/train.map" 2>"$tmp/perr2.txt"; rc2=$?
"$igrad" profile --trace "$tmp/mapped.csv" --target-ratio 0.5 --layout "$tmp/runt/checkpoint" \
  --map "$tmp/bad.map" 2>"$tmp/perr3.txt"; rc3=$?
set -e
check "profile without the run's rules fails" test "$rc" -ne 0
check "... not the model of the trace, naming the hashes" \
  grep -q "is not the model of the trace (layout hash 0x" "$tmp/perr.txt"
"$igrad" profile --trace "$tmp/mapped.csv" --target-ratio 0.5 --layout "$tmp/runt/checkpoint" \
  --map "$tmp/train.map" >"$tmp/pmap.txt"
check "profile --map: the layout is the trace's and the target is fitted" \
  grep -q "^target ratio 0.5 (R 4): " "$tmp/pmap.txt"
check "profile --map with a bad file fails naming it" \
  bash -c "test $rc3 -ne 0 && grep -q 'bad.map:1' '$tmp/perr3.txt'"
check "profile --map without --layout is a usage error" test "$rc2" -eq 2

# a trace of a model whose names all map to no component has no rows: the hint names the cause
head -2 "$tmp/mapped.csv" >"$tmp/norows.csv"
set +e
"$igrad" profile --trace "$tmp/norows.csv" 2>"$tmp/perr4.txt"; rc=$?
set -e
check "profile of a trace without rows fails" test "$rc" -ne 0
check "... saying no traced tensor mapped, pointing to --unmapped and --map" bash -c \
  "grep -q 'no traced tensor mapped to a component' '$tmp/perr4.txt' && grep -q 'igrad layout --unmapped' '$tmp/perr4.txt' && grep -q -- '--map FILE' '$tmp/perr4.txt'"

# -- plan --map: a profile made under rules is refused without them
"$igrad" profile --trace "$tmp/mapped.csv" --out "$tmp/mapped.json" --quiet
"$igrad" plan --help >"$tmp/help_plan.txt"
check "plan --help lists --map" \
  grep -q -- "--map FILE             user name rules ('PATTERN KIND LAYER'" "$tmp/help_plan.txt"
set +e
"$igrad" plan --config "$tmp/runt/checkpoint" --ranks 2 --method ig --profile "$tmp/mapped.json" \
  >/dev/null 2>"$tmp/plerr.txt"; rc=$?
"$igrad" plan --config "$tmp/runt/checkpoint" --ranks 2 --method ig --map "$tmp/bad.map" \
  >/dev/null 2>"$tmp/plerr2.txt"; rc2=$?
set -e
check "plan without the profile's rules fails" test "$rc" -ne 0
check "... the profile was made for another layout" grep -q "was made for layout 0x" "$tmp/plerr.txt"
"$igrad" plan --config "$tmp/runt/checkpoint" --ranks 2 --method ig --profile "$tmp/mapped.json" \
  --map "$tmp/train.map" --json >"$tmp/plan_map.json"
check "plan --map with the profile's rules plans ig" python3 - "$tmp/plan_map.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = [r for r in d["rows"] if r["method"] == "ig"]
assert rows and all(r["payload_nbytes"]["mean"] > 0 for r in rows), rows
PY
check "plan --map with a bad file fails naming it" \
  bash -c "test $rc2 -ne 0 && grep -q 'bad.map:1' '$tmp/plerr2.txt'"

# -- bench sync --map: 4 layers' down_proj made FC1 leave 4 fewer components
cat >"$tmp/tiny.json" <<'JSON'
{"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
 "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 4,
 "vocab_size": 256, "tie_word_embeddings": false}
JSON
printf 'model\\.layers\\.([0-9]+)\\.mlp\\.down_proj\\.weight FC1 1\n' >"$tmp/down.map"
OMP_NUM_THREADS=1 "$igrad" bench sync --config "$tmp/tiny.json" --steps 1 --profile-steps 2 \
  --json >"$tmp/b0.json" 2>/dev/null
OMP_NUM_THREADS=1 "$igrad" bench sync --config "$tmp/tiny.json" --steps 1 --profile-steps 2 \
  --map "$tmp/down.map" --json >"$tmp/b1.json" 2>/dev/null
check "bench sync --map: the rules change the components (31 -> 27)" \
  python3 - "$tmp/b0.json" "$tmp/b1.json" <<'PY'
import json, sys
a, b = (json.load(open(p))["layout"] for p in sys.argv[1:3])
assert a["components"] == 31 and b["components"] == 27, (a, b)
assert a["params"] == b["params"] and a["tensors"] == b["tensors"], (a, b)
PY
"$igrad" bench sync --help >"$tmp/help_bench.txt"
check "bench sync --help lists --map" \
  grep -q -- "--map FILE             user name rules ('PATTERN KIND LAYER'" "$tmp/help_bench.txt"
set +e
"$igrad" bench sync --config "$tmp/tiny.json" --steps 1 --map "$tmp/bad.map" >/dev/null \
  2>"$tmp/berr.txt"; rc=$?
set -e
check "bench sync --map with a bad file fails naming it" \
  bash -c "test $rc -ne 0 && grep -q 'bad.map:1' '$tmp/berr.txt'"

# -- built-in names of MoE, T5 and timm models: nothing unmapped
"$igrad" layout --unmapped "$src/configs/mixtral-8x7b.json" >"$tmp/mixtral.txt"
check "mixtral: routers and experts all mapped" \
  grep -q ": 0 of 995 tensors inside numbered blocks map to no component" "$tmp/mixtral.txt"
cat >"$tmp/moe.txt" <<'TXT'
model.embed_tokens.weight 256 32
model.layers.0.input_layernorm.weight 32
model.layers.0.self_attn.q_proj.weight 32 32
model.layers.0.self_attn.k_proj.weight 32 32
model.layers.0.self_attn.v_proj.weight 32 32
model.layers.0.self_attn.o_proj.weight 32 32
model.layers.0.post_attention_layernorm.weight 32
model.layers.0.mlp.gate.weight 4 32
model.layers.0.mlp.experts.0.gate_proj.weight 16 32
model.layers.0.mlp.experts.0.up_proj.weight 16 32
model.layers.0.mlp.experts.0.down_proj.weight 32 16
model.layers.0.mlp.experts.3.gate_proj.weight 16 32
model.layers.0.mlp.experts.3.up_proj.weight 16 32
model.layers.0.mlp.experts.3.down_proj.weight 32 16
model.layers.0.mlp.shared_expert.gate_proj.weight 64 32
model.layers.0.mlp.shared_expert.up_proj.weight 64 32
model.layers.0.mlp.shared_expert.down_proj.weight 32 64
model.layers.0.mlp.shared_expert_gate.weight 1 32
encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight 32 4
blocks.1.ls1.gamma 32
blocks.1.ls2.gamma 32
model.norm.weight 32
lm_head.weight 256 32
TXT
"$igrad" layout --unmapped "$tmp/moe.txt" >"$tmp/moe_unmapped.txt"
check "qwen2-moe, T5 bias, timm layer scales: nothing unmapped" \
  grep -q ": 0 of 23 tensors inside numbered blocks map to no component" "$tmp/moe_unmapped.txt"
"$igrad" layout "$tmp/moe.txt" >"$tmp/moe_table.txt"
check "qwen2-moe router mlp.gate is the layer's FC1" \
  grep -Eq '^model\.layers\.0\.mlp\.gate\.weight .* 0  FC1$' "$tmp/moe_table.txt"
check "qwen2-moe shared_expert_gate is FC1" \
  grep -Eq '^model\.layers\.0\.mlp\.shared_expert_gate\.weight .* 0  FC1$' "$tmp/moe_table.txt"
check "T5 relative_attention_bias is block 0's Q" \
  grep -Eq '^encoder\.block\.0\.layer\.0\.SelfAttention\.relative_attention_bias\.weight .* 0  Q$' \
  "$tmp/moe_table.txt"
check "timm ls1.gamma is the block's NORM" grep -Eq '^blocks\.1\.ls1\.gamma .* 1  NORM$' "$tmp/moe_table.txt"

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
