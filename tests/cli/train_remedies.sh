#!/usr/bin/env bash
# tests/cli/train_remedies.sh — `igrad train`'s error-feedback remedies
# through the CLI: --beta1 auto resolves to 0.9 for dense and 0 for sparse
# methods (summary.json says so, with beta1_source), given values are kept,
# the remedy options reach summary.json, bad values and remedies with
# method dense are refused by name, removed options (--residual-decay,
# --momentum-masking) are unknown, and a 2-rank run with momentum and a
# dense warm-up stopped and resumed (velocities in the
# engine state) ends with the same parameters as an uninterrupted one.
# --ef-on: grad (the default) is bit for bit the run without the flag,
# update keeps beta1 auto at 0 (sparse), summary.json records it, and a bad
# value is refused.
#
# Usage: train_remedies.sh path/to/igrad   (CTest passes the built binary)
set -u
IGRAD=${1:?usage: train_remedies.sh path/to/igrad}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/igrad-train-remedies.XXXXXX")
fails=0
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

mkdir -p "$tmp/corpus"
words=(the cat sat on a mat and dog ran to red house in sun was big)
seed=7
for d in 0 1 2 3 4 5; do
  line=""
  for w in $(seq 1 300); do
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    line+="${words[$(( (seed / 65536) % 16 ))]} "
  done
  echo "$line" > "$tmp/corpus/doc$d.txt"
done
common=(--data "$tmp/corpus" --seq-len 32 --batch 4 --eval-every 0 --eval-batches 1 --threads 1
        --progress quiet)

# summary_is RUN PYEXPR: PYEXPR over s (summary.json) must hold.
summary_is() {
  "$PY" - "$tmp/$1/summary.json" "$2" <<'PYEOF' || fail "$1: summary.json: $2"
import json, sys
s = json.load(open(sys.argv[1])); c = s["config"]; y = c["sync"]
sys.exit(0 if eval(sys.argv[2]) else 1)
PYEOF
}

run() { local name=$1; shift; "$IGRAD" train "${common[@]}" --steps 3 "$@" --out "$tmp/$name" \
          >"$tmp/$name.log" 2>&1 || fail "$name: exit $? ($(tail -n 2 "$tmp/$name.log"))"; }
run dense --method dense
summary_is dense 'c["beta1"] == 0.9 and c["beta1_source"] == "auto" and y["momentum"] == 0'
run sparse --method adtopk_sync
summary_is sparse 'c["beta1"] == 0 and c["beta1_source"] == "auto" and y["momentum"] == 0 and y["start_iter"] == 0'
run given --method topk_sync --beta1 0.5 --momentum 0.9 --start-iter 1
summary_is given 'c["beta1"] == 0.5 and c["beta1_source"] == "given" and y["momentum"] == 0.9 and y["start_iter"] == 1 and "residual_decay" not in y and "momentum_masking" not in y'
echo "ok: auto and given values in summary.json"

# --ef-on grad = no flag, bit for bit (parameters and the per-step losses).
run efgrad --method adtopk_sync --ef-on grad
summary_is efgrad 'c["ef_on"] == "grad"'
summary_is sparse 'c["ef_on"] == "grad"'
for f in checkpoint/train_state.json metrics.csv; do
  if [ "$f" = metrics.csv ]; then a=$(cut -d, -f1,3 "$tmp/sparse/$f"); b=$(cut -d, -f1,3 "$tmp/efgrad/$f")
  else a=$(grep -o '"param_hash":[^,]*' "$tmp/sparse/$f"); b=$(grep -o '"param_hash":[^,]*' "$tmp/efgrad/$f"); fi
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "--ef-on grad differs from no flag in $f: '$a' vs '$b'"
done
run efupd --method adtopk_sync --ef-on update
summary_is efupd 'c["ef_on"] == "update" and c["beta1"] == 0 and c["beta1_source"] == "auto"'
a=$(grep -o '"param_hash":[^,]*' "$tmp/sparse/checkpoint/train_state.json")
b=$(grep -o '"param_hash":[^,]*' "$tmp/efupd/checkpoint/train_state.json")
[ "$a" != "$b" ] || fail "--ef-on update ended with the parameters of --ef-on grad"
echo "ok: --ef-on grad = no flag ($a); update recorded, beta1 auto 0"
# Its checkpoint records the mode, and --resume without the flag (which
# would continue from rank 0's moments) is refused by name.
grep -q '"ef_on":[[:space:]]*"update"' "$tmp/efupd/checkpoint/train_state.json" \
  || fail "the --ef-on update checkpoint does not record ef_on"
if "$IGRAD" train "${common[@]}" --steps 6 --method adtopk_sync --resume --out "$tmp/efupd" \
     >"$tmp/efres.out" 2>"$tmp/efres.err"; then
  fail "--resume of an --ef-on update checkpoint without the flag: exit code 0"
fi
grep -qF -- "was trained with --ef-on update" "$tmp/efres.err" \
  || fail "resume of an --ef-on update checkpoint: $(cat "$tmp/efres.err")"
echo "ok: $(head -n 1 "$tmp/efres.err")"

# expect_error NAME NEEDLE ARGS...
expect_error() {
  local name=$1 needle=$2; shift 2
  timeout 120 "$IGRAD" train "${common[@]}" --steps 2 "$@" --out "$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$name: exit code 0"
  grep -qF -- "$needle" "$tmp/$name.err" || fail "$name: stderr lacks '$needle': $(cat "$tmp/$name.err")"
  echo "ok: $name: $(head -n 1 "$tmp/$name.err")"
}
expect_error dense_momentum "--momentum" --method dense --momentum 0.9
expect_error momentum_range "config.momentum" --method adtopk_sync --momentum 1
expect_error decay_removed "--residual-decay" --method adtopk_sync --residual-decay 0.9
expect_error masking_removed "--momentum-masking" --method adtopk_sync --momentum-masking off
expect_error ef_word "--ef-on" --method adtopk_sync --ef-on params

# Stopped and resumed = uninterrupted, on 2 ranks.
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe --bind-to none -np 2)
  [ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
  rem=(--method adtopk_sync --momentum 0.9 --start-iter 2 --steps 6)
  "${mpi[@]}" "$IGRAD" train "${common[@]}" "${rem[@]}" --out "$tmp/whole" >"$tmp/whole.log" 2>&1 \
    || fail "whole: $(tail -n 3 "$tmp/whole.log")"
  "${mpi[@]}" "$IGRAD" train "${common[@]}" "${rem[@]}" --stop-at 3 --out "$tmp/split" >"$tmp/split.log" 2>&1 \
    || fail "split: $(tail -n 3 "$tmp/split.log")"
  "${mpi[@]}" "$IGRAD" train "${common[@]}" "${rem[@]}" --resume --out "$tmp/split" >>"$tmp/split.log" 2>&1 \
    || fail "resume: $(tail -n 3 "$tmp/split.log")"
  a=$(grep -o '"param_hash":[[:space:]]*"[^"]*"' "$tmp/whole/checkpoint/train_state.json")
  b=$(grep -o '"param_hash":[[:space:]]*"[^"]*"' "$tmp/split/checkpoint/train_state.json")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "resumed parameters differ: '$a' vs '$b'"
  echo "ok: stopped at 3 and resumed = uninterrupted ($a)"
fi

[ "$fails" -eq 0 ] || { echo "$fails failure(s)" >&2; exit 1; }
echo "all remedies CLI checks passed"
