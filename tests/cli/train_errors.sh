#!/usr/bin/env bash
# tests/cli/train_errors.sh — `igrad train` on bad input, through the CLI:
# missing data, an unreadable file (as root: run as nobody via setpriv),
# an empty corpus, a sequence longer than the data, a checkpoint whose
# config.json does not match its tensors, a truncated model.safetensors,
# iad without a profile, the removed --gate-other, --target-ratio with
# dense, --trace with dense, a batch that 2 MPI ranks
# cannot split, missing data on 2 MPI ranks. Each must exit non-zero with a
# message naming the problem, and leave no checkpoint and no temporary
# files behind. Then a run killed (SIGKILL) while checkpointing every step
# must leave either no checkpoint or a complete one that --resume accepts.
#
# Usage: train_errors.sh path/to/igrad   (CTest passes the built binary)
set -u
IGRAD=${1:?usage: train_errors.sh path/to/igrad}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/igrad-train-errors.XXXXXX")
fails=0
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

# A small corpus: 8 documents of pseudo-sentences.
mkdir -p "$tmp/corpus"
words=(the cat sat on a mat and dog ran to red house in sun was big)
seed=1
for d in 0 1 2 3 4 5 6 7; do
  line=""
  for w in $(seq 1 300); do
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    line+="${words[$(( (seed / 65536) % 16 ))]} "
  done
  echo "$line" > "$tmp/corpus/doc$d.txt"
done
common=(--seq-len 32 --batch 4 --steps 3 --eval-every 0 --threads 1 --progress quiet)

# expect_error NAME NEEDLE OUTDIR -- COMMAND...: non-zero exit, NEEDLE in
# stderr, no checkpoint or temporary files under OUTDIR.
expect_error() {
  local name=$1 needle=$2 out=$3
  shift 4
  local err="$tmp/$name.err"
  timeout 120 "$@" >"$tmp/$name.out" 2>"$err"
  local rc=$?
  [ "$rc" -ne 0 ] || fail "$name: exit code 0"
  [ "$rc" -ne 124 ] || fail "$name: timed out (a hang?)"
  grep -qF -- "$needle" "$err" || fail "$name: stderr lacks '$needle': $(cat "$err")"
  [ ! -e "$out/checkpoint" ] || fail "$name: a checkpoint was left in $out"
  if [ -d "$out" ] && find "$out" -name '*.tmp.*' | grep -q .; then
    fail "$name: temporary files left: $(find "$out" -name '*.tmp.*')"
  fi
  echo "ok: $name: $(head -c 200 "$err" | head -n 1)"
}

expect_error missing "no-such-file" "$tmp/o1" -- \
  "$IGRAD" train --data "$tmp/no-such-file" --out "$tmp/o1" "${common[@]}"

expect_error value_dtype_name "--value-dtype is 'f8' (f32, bf16, fp16 or fp8)" "$tmp/o1v" -- \
  "$IGRAD" train --data "$tmp/corpus" --out "$tmp/o1v" --value-dtype f8 "${common[@]}"
expect_error value_dtype_dense "config.value_dtype is BF16, but method dense" "$tmp/o1d" -- \
  "$IGRAD" train --data "$tmp/corpus" --out "$tmp/o1d" --method dense --value-dtype bf16 \
  "${common[@]}"

# As root (who reads any file) the case runs as the unprivileged user
# nobody through setpriv (util-linux); without setpriv it fails, not skips.
cp "$tmp/corpus/doc0.txt" "$tmp/unreadable.txt"
chmod 000 "$tmp/unreadable.txt"
as_user=()
if [ "$(id -u)" -eq 0 ]; then
  if command -v setpriv >/dev/null; then
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    chmod 711 "$tmp"
    mkdir -m 777 "$tmp/o2"
  else
    fail "unreadable: running as root and no setpriv to drop privileges"
  fi
fi
expect_error unreadable "unreadable.txt" "$tmp/o2" -- \
  "${as_user[@]}" "$IGRAD" train --data "$tmp/unreadable.txt" --out "$tmp/o2" "${common[@]}"

: > "$tmp/empty.txt"
expect_error empty "empty corpus" "$tmp/o3" -- \
  "$IGRAD" train --data "$tmp/empty.txt" --out "$tmp/o3" "${common[@]}"

mkdir -p "$tmp/short"
echo "a few bytes" > "$tmp/short/a.txt"
echo "and a few more" > "$tmp/short/b.txt"
expect_error seq_too_long "sequence length 32" "$tmp/o4" -- \
  "$IGRAD" train --data "$tmp/short" --out "$tmp/o4" "${common[@]}"

"$IGRAD" model init --size tiny --out "$tmp/ck_bad_config" >/dev/null || fail "model init"
sed -i -E 's/("hidden_size":[[:space:]]*)32/\148/' "$tmp/ck_bad_config/config.json"
grep -qE '"hidden_size":[[:space:]]*48' "$tmp/ck_bad_config/config.json" \
  || fail "could not edit hidden_size in config.json"
expect_error config_mismatch "model.embed_tokens.weight" "$tmp/o5" -- \
  "$IGRAD" train --init "$tmp/ck_bad_config" --data "$tmp/corpus" --out "$tmp/o5" "${common[@]}"

"$IGRAD" model init --size tiny --out "$tmp/ck_truncated" >/dev/null || fail "model init"
size=$(stat -c %s "$tmp/ck_truncated/model.safetensors")
truncate -s $((size - 1000)) "$tmp/ck_truncated/model.safetensors"
expect_error truncated "truncated" "$tmp/o6" -- \
  "$IGRAD" train --init "$tmp/ck_truncated" --data "$tmp/corpus" --out "$tmp/o6" "${common[@]}"

expect_error iad_no_profile "needs --profile" "$tmp/o7" -- \
  "$IGRAD" train --method iad --data "$tmp/corpus" --out "$tmp/o7" "${common[@]}"

expect_error gate_other_removed "--gate-other" "$tmp/o7g" -- \
  "$IGRAD" train --gate-other off --data "$tmp/corpus" --out "$tmp/o7g" "${common[@]}"
expect_error target_ratio_dense "--target-ratio needs --method ig (not dense)" "$tmp/o7t" -- \
  "$IGRAD" train --target-ratio 0.25 --data "$tmp/corpus" --out "$tmp/o7t" "${common[@]}"

expect_error trace_dense "not dense" "$tmp/o8" -- \
  "$IGRAD" train --trace "$tmp/t.csv" --data "$tmp/corpus" --out "$tmp/o8" "${common[@]}"

expect_error resume_nothing "no checkpoint" "$tmp/o9" -- \
  "$IGRAD" train --resume --data "$tmp/corpus" --out "$tmp/o9" "${common[@]}"

if command -v mpirun >/dev/null; then
  mpi=(mpirun --oversubscribe -np 2)
  [ "$(id -u)" -ne 0 ] || mpi=(mpirun --allow-run-as-root --oversubscribe -np 2)
  expect_error mpi_batch "not divisible" "$tmp/o10" -- \
    "${mpi[@]}" "$IGRAD" train --data "$tmp/corpus" --out "$tmp/o10" "${common[@]}" --batch 3
  expect_error mpi_missing "no-such-file" "$tmp/o11" -- \
    "${mpi[@]}" "$IGRAD" train --data "$tmp/no-such-file" --out "$tmp/o11" "${common[@]}"
else
  echo "SKIPPED: MPI cases (no mpirun); the test reports Skipped"
  skipped=1
fi

# Crash while checkpointing: every step saves, the run is killed at a
# point that varies from run to run. Whatever the moment, checkpoint/ is
# absent or complete, and a complete one resumes.
out="$tmp/killed"
"$IGRAD" train --data "$tmp/corpus" --out "$out" --seq-len 32 --batch 4 --steps 400 \
  --save-every 1 --eval-every 0 --threads 1 --progress quiet >/dev/null 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  [ -e "$out/checkpoint/train_state.json" ] && break
  sleep 0.05
done
sleep 0.$((RANDOM % 10))
kill -9 "$pid" 2>/dev/null
wait "$pid" 2>/dev/null
if [ -e "$out/checkpoint" ]; then
  for f in config.json model.safetensors optimizer.safetensors train_state.json engine.rank0.bin; do
    [ -s "$out/checkpoint/$f" ] || fail "killed run: checkpoint/ lacks $f"
  done
  "$IGRAD" layout "$out/checkpoint" >/dev/null || fail "killed run: igrad layout rejects checkpoint/"
  "$IGRAD" train --resume --data "$tmp/corpus" --out "$out" --seq-len 32 --batch 4 --steps 400 \
    --stop-at 400 --eval-every 0 --threads 1 --progress quiet >/dev/null 2>"$tmp/resume.err" \
    || fail "killed run: --resume failed: $(cat "$tmp/resume.err")"
  echo "ok: killed run left a complete checkpoint, resumed to the end"
else
  echo "ok: killed run left no checkpoint (killed before the first one)"
fi

if [ "$fails" -ne 0 ]; then
  echo "train_errors: $fails failure(s)" >&2
  exit 1
fi
if [ "${skipped:-0}" -ne 0 ]; then
  echo "train_errors: the cases that ran are ok, some were skipped"
  exit 77
fi
echo "train_errors: all ok"
