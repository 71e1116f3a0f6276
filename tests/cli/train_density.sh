#!/usr/bin/env bash
# tests/cli/train_density.sh — `igrad train`'s density defaults and
# --early-density through the CLI: --density not given resolves to the
# sparse methods' default (read from train --help, where it is documented)
# and to 0.01 for dense, a given --density is kept; --early-density R:N
# sends R's payload for the first N steps and --density's after, records
# itself in summary.json, and --early-density 0.01:2 with --density 0.01
# ends bit for bit as the plain --density 0.01 run (the early engine's
# residuals reach the new engine through the switch step's gradients:
# dropping them would change the parameters); on 2 ranks a run stopped
# before the switch and resumed equals an uninterrupted one; bad values
# and methods it does not serve are refused by name.
#
# Usage: train_density.sh path/to/igrad   (CTest passes the built binary)
set -u
IGRAD=${1:?usage: train_density.sh path/to/igrad}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/igrad-train-density.XXXXXX")
fails=0
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
PY=/usr/bin/python3
[ -x "$PY" ] || PY=python3

mkdir -p "$tmp/corpus"
words=(the cat sat on a mat and dog ran to red house in sun was big)
seed=11
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

# The documented default, from --help (the number after "default: ").
def=$("$IGRAD" train --help 2>&1 | sed -n 's/.*--density RHO.*(default: \([0-9.]*\) for the.*/\1/p')
[ -n "$def" ] || fail "train --help does not document --density's default"

# summary_is RUN PYEXPR: PYEXPR over s (summary.json), y (its config.sync),
# d (the documented default) must hold.
summary_is() {
  "$PY" - "$tmp/$1/summary.json" "$2" "${def:-nan}" <<'PYEOF' || fail "$1: summary.json: $2"
import json, sys
s = json.load(open(sys.argv[1])); y = s["config"]["sync"]; d = float(sys.argv[3])
sys.exit(0 if eval(sys.argv[2]) else 1)
PYEOF
}
# payloads RUN: the payload_bytes column of metrics.csv, space-separated.
payloads() { "$PY" -c 'import csv, sys; print(" ".join(r["payload_bytes"] for r in csv.DictReader(open(sys.argv[1]))))' "$tmp/$1/metrics.csv"; }
hash_of() { grep -o '"param_hash":[[:space:]]*"[^"]*"' "$tmp/$1/checkpoint/train_state.json"; }

run() { local name=$1; shift; "$IGRAD" train "${common[@]}" --steps 4 "$@" --out "$tmp/$name" \
          >"$tmp/$name.log" 2>&1 || fail "$name: exit $? ($(tail -n 2 "$tmp/$name.log"))"; }
run dense --method dense
summary_is dense 'y["density"] == 0.01'
run auto --method adtopk_sync
summary_is auto 'y["density"] == d and d > 0.01 and "early_density" not in y'
run topk --method topk_sync
summary_is topk 'y["density"] == d'
run given --method adtopk_sync --density 0.01
summary_is given 'y["density"] == 0.01'
run given_d --method adtopk_sync --density "$def"
[ "$(hash_of auto)" = "$(hash_of given_d)" ] && [ -n "$(hash_of auto)" ] \
  || fail "--density not given differs from --density $def: $(hash_of auto) vs $(hash_of given_d)"
echo "ok: --density auto = $def for the sparse methods (0.01 for dense), given values kept"

# --early-density: R's payload before N, --density's from N on.
run early --method adtopk_sync --density 0.01 --early-density 0.2:2
summary_is early 'y["density"] == 0.01 and y["early_density"]["density"] == 0.2 and y["early_density"]["steps"] == 2 and y["early_density"]["switch_ms"] >= 0'
run r20 --method adtopk_sync --density 0.2
read -r -a pe <<< "$(payloads early)"; read -r -a p20 <<< "$(payloads r20)"; read -r -a p1 <<< "$(payloads given)"
[ "${#pe[@]}" -eq 4 ] && [ "${pe[0]}" = "${p20[0]}" ] && [ "${pe[1]}" = "${p20[1]}" ] \
  && [ "${pe[2]}" = "${p1[2]}" ] && [ "${pe[3]}" = "${p1[3]}" ] && [ "${pe[0]}" -gt "${pe[3]}" ] \
  || fail "--early-density 0.2:2 payloads ${pe[*]}: not 0.2's (${p20[*]}) then 0.01's (${p1[*]})"
echo "ok: --early-density 0.2:2 sends ${pe[*]} bytes (0.2's, then 0.01's)"
# The same density on both sides of the switch: the residuals carried
# through the gradients make it the plain run, bit for bit.
run same --method adtopk_sync --density 0.01 --early-density 0.01:2
[ "$(hash_of same)" = "$(hash_of given)" ] && [ -n "$(hash_of same)" ] \
  || fail "--early-density 0.01:2 --density 0.01 differs from the plain run: $(hash_of same) vs $(hash_of given)"
a=$(cut -d, -f1,3 "$tmp/same/metrics.csv"); b=$(cut -d, -f1,3 "$tmp/given/metrics.csv")
[ "$a" = "$b" ] || fail "--early-density 0.01:2: per-step losses differ from the plain run"
run other --method adtopk_sync --density 0.01 --early-density 0.2:2
[ "$(hash_of other)" != "$(hash_of given)" ] || fail "--early-density 0.2:2 changed nothing"
echo "ok: --early-density 0.01:2 = the plain run ($(hash_of same)), residuals carried"

# expect_error NAME NEEDLE ARGS...
expect_error() {
  local name=$1 needle=$2; shift 2
  timeout 120 "$IGRAD" train "${common[@]}" --steps 4 "$@" --out "$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$name: exit code 0"
  grep -qF -- "$needle" "$tmp/$name.err" || fail "$name: stderr lacks '$needle': $(cat "$tmp/$name.err")"
  echo "ok: $name: $(head -n 1 "$tmp/$name.err")"
}
expect_error early_form "is not R:N" --method adtopk_sync --early-density 0.2
expect_error early_rho "is not R:N" --method adtopk_sync --early-density 1.5:2
expect_error early_steps "is not R:N" --method adtopk_sync --early-density 0.2:0
expect_error early_dense "not --method dense" --method dense --early-density 0.2:2
expect_error early_ig "not --method ig" --method ig --profile auto --early-density 0.2:2
expect_error early_late "not before --steps" --method adtopk_sync --early-density 0.2:4
expect_error early_mom "--momentum" --method adtopk_sync --momentum 0.5 --early-density 0.2:2

# Stopped before the switch and resumed = uninterrupted, on 2 ranks.
if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe --bind-to none -np 2)
  [ "$(id -u)" -ne 0 ] || mpi+=(--allow-run-as-root)
  sch=(--method adtopk_sync --density 0.01 --early-density 0.1:3 --steps 6)
  "${mpi[@]}" "$IGRAD" train "${common[@]}" "${sch[@]}" --out "$tmp/whole" >"$tmp/whole.log" 2>&1 \
    || fail "whole: $(tail -n 3 "$tmp/whole.log")"
  "${mpi[@]}" "$IGRAD" train "${common[@]}" "${sch[@]}" --stop-at 2 --out "$tmp/split" >"$tmp/split.log" 2>&1 \
    || fail "split: $(tail -n 3 "$tmp/split.log")"
  "${mpi[@]}" "$IGRAD" train "${common[@]}" "${sch[@]}" --resume --out "$tmp/split" >>"$tmp/split.log" 2>&1 \
    || fail "resume: $(tail -n 3 "$tmp/split.log")"
  [ -n "$(hash_of whole)" ] && [ "$(hash_of whole)" = "$(hash_of split)" ] \
    || fail "resumed across the switch: $(hash_of whole) vs $(hash_of split)"
  echo "ok: stopped at 2, resumed across the switch at 3 = uninterrupted ($(hash_of whole))"
fi

[ "$fails" -eq 0 ] || { echo "$fails failure(s)" >&2; exit 1; }
echo "all density CLI checks passed"
