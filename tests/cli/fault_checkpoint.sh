#!/usr/bin/env bash
# tests/cli/fault_checkpoint.sh — checkpoints damaged or mixed by hand, on 2
# MPI ranks, and what saves killed at the wrong moment leave behind. Each
# bad checkpoint must be refused by --resume (exit 1, no hang) with a
# message naming the file, and left as it was; before the whole-checkpoint
# check every one of them resumed with exit 0 and a wrong result:
#   engine files of an earlier save copied in (mixed steps), one flipped
#   byte in model.safetensors, model or optimizer of another run, an
#   edited "step", every file of an earlier save but train_state.json, an
#   out-of-range "ranks" or "step" in train_state.json and a step of 1e300
#   in metrics.csv (undefined double->int casts before).
# Then: a fresh run into an --out that holds a checkpoint is refused
# (--overwrite replaces it); stale checkpoint.tmp.<pid> / .old.<pid> of dead
# processes are removed at the next start (a live process's are kept);
# with checkpoint/ missing and checkpoint.old.<pid> present (a crash
# between the two renames of a save) the previous checkpoint is restored
# and resumed from.
#
# Usage: fault_checkpoint.sh path/to/igrad   (CTest passes the built binary)
source "$(dirname "$0")/fault_lib.bash"

run() { timeout 60 "${mpi[@]}" "$IGRAD" train "${common[@]}" "$@"; }

# The base run: step 5 saved aside, then on to step 10.
A="$tmp/A"
run --out "$A" --steps 20 --save-every 5 --stop-at 5 >/dev/null 2>"$tmp/a5.err" \
  || fail "base run to 5: $(cat "$tmp/a5.err")"
cp -r "$A/checkpoint" "$tmp/ck5"
run --out "$A" --steps 20 --save-every 5 --stop-at 10 --resume >/dev/null 2>"$tmp/a10.err" \
  || fail "base run to 10: $(cat "$tmp/a10.err")"
cp -r "$A/checkpoint" "$tmp/ck10"
# Another run (another seed) to step 10.
run --out "$tmp/B" --steps 20 --save-every 5 --stop-at 10 --seed 99 >/dev/null 2>"$tmp/b.err" \
  || fail "other run: $(cat "$tmp/b.err")"
grep -q '"step":[[:space:]]*10,' "$tmp/ck10/train_state.json" || fail "ck10 is not at step 10"

# case NAME: a fresh copy of the step-10 run under $tmp/case/NAME.
make_case() {
  local d="$tmp/case/$1"
  rm -rf "$d"
  mkdir -p "$d"
  cp -r "$tmp/ck10" "$d/checkpoint"
  cp "$A/metrics.csv" "$A/eval.csv" "$d/" 2>/dev/null
  echo "$d"
}

# refused NAME NEEDLE: --resume of case NAME fails naming NEEDLE and leaves
# the checkpoint byte for byte as it was.
refused() {
  local name=$1 needle=$2 f0=$fails d="$tmp/case/$1"
  local before after
  before=$(cd "$d/checkpoint" && cat ./* | md5sum)
  run --out "$d" --steps 20 --save-every 5 --resume >"$tmp/$name.out" 2>"$tmp/$name.err"
  local rc=$?
  [ "$rc" -eq 1 ] || fail "$name: exit code $rc, expected 1"
  grep -qF -- "$needle" "$tmp/$name.err" \
    || fail "$name: stderr lacks '$needle': $(head -c 800 "$tmp/$name.err")"
  after=$(cd "$d/checkpoint" && cat ./* | md5sum)
  [ "$before" = "$after" ] || fail "$name: the refused checkpoint was changed"
  [ "$fails" -eq "$f0" ] && echo "ok: $name refused: $(grep -F 'igrad: train:' "$tmp/$name.err" | head -n 1 | head -c 300)"
  f_last=$fails
}

d=$(make_case pristine)
run --out "$d" --steps 20 --save-every 5 --resume >/dev/null 2>"$tmp/pristine.err" \
  || fail "an untouched copy does not resume: $(cat "$tmp/pristine.err")"
ok "an untouched copy resumes"

d=$(make_case mixed_engine)
cp "$tmp/ck5"/engine.rank*.bin "$d/checkpoint/"
refused mixed_engine "checkpoint/engine.rank0.bin is not the file this checkpoint was saved with"

d=$(make_case flipped_byte)
f="$d/checkpoint/model.safetensors"
off=$(( $(stat -c %s "$f") - 100 ))
byte=$(od -An -tu1 -j "$off" -N1 "$f" | tr -d ' ')
printf "$(printf '\\%03o' $(( byte ^ 1 )))" | dd of="$f" bs=1 seek="$off" conv=notrunc status=none
cmp -s "$f" "$tmp/ck10/model.safetensors" && fail "flipped_byte: the byte was not changed"
refused flipped_byte "checkpoint/model.safetensors is not the file"

d=$(make_case other_optimizer)
cp "$tmp/B/checkpoint/optimizer.safetensors" "$d/checkpoint/"
refused other_optimizer "checkpoint/optimizer.safetensors is not the file"

d=$(make_case other_model)
cp "$tmp/B/checkpoint/model.safetensors" "$d/checkpoint/"
refused other_model "checkpoint/model.safetensors is not the file"

d=$(make_case edited_step)
sed -i -E 's/("step":[[:space:]]*)10,/\19,/' "$d/checkpoint/train_state.json"
grep -q '"step":[[:space:]]*9,' "$d/checkpoint/train_state.json" || fail "could not edit step"
refused edited_step "says the run is at step 9"

d=$(make_case earlier_save_but_state)
cp "$tmp/ck5"/*.safetensors "$tmp/ck5"/engine.rank*.bin "$d/checkpoint/"
refused earlier_save_but_state "is not the file this checkpoint was saved with"

d=$(make_case ranks_range)
sed -i -E 's/("ranks":[[:space:]]*)2,/\14294967298,/' "$d/checkpoint/train_state.json"
refused ranks_range '"ranks" is 4294967298, not an integer in [1, 2147483647]'

d=$(make_case step_fraction)
sed -i -E 's/("step":[[:space:]]*)10,/\11e300,/' "$d/checkpoint/train_state.json"
refused step_fraction '"step" is 1.0000000000000001e+300, not an integer'

# metrics.csv is read back on resume: a step out of range is refused
# before it is converted (a double -> int64 cast of 1e300 was undefined).
d=$(make_case metrics_range)
sed -i -E '2s/^[0-9]+,/1e300,/' "$d/metrics.csv"
grep -q '^1e300,' "$d/metrics.csv" || fail "could not edit metrics.csv"
run --out "$d" --steps 20 --save-every 5 --resume >/dev/null 2>"$tmp/metrics_range.err"
rc=$?
[ "$rc" -eq 1 ] || fail "metrics_range: exit code $rc, expected 1"
grep -qF "metrics.csv:2: malformed row" "$tmp/metrics_range.err" \
  || fail "metrics_range: $(head -c 600 "$tmp/metrics_range.err")"
ok "metrics.csv with step 1e300 refused: $(grep -F 'igrad: train:' "$tmp/metrics_range.err" | head -c 200)"

# --out safety: a fresh run into an --out with a checkpoint is refused and
# changes nothing; --overwrite replaces checkpoint and metrics.
d=$(make_case fresh_into_used)
before=$(cat "$d/checkpoint"/* "$d/metrics.csv" | md5sum)
run --out "$d" --steps 3 >/dev/null 2>"$tmp/fresh.err"
rc=$?
[ "$rc" -eq 1 ] || fail "fresh run into a used --out: exit code $rc, expected 1"
grep -qF "already holds a checkpoint" "$tmp/fresh.err" \
  || fail "fresh run into a used --out: $(cat "$tmp/fresh.err")"
[ "$before" = "$(cat "$d/checkpoint"/* "$d/metrics.csv" | md5sum)" ] \
  || fail "fresh run into a used --out changed its files"
ok "fresh run into a used --out refused: $(grep -F 'igrad: train:' "$tmp/fresh.err" | head -c 200)"
run --out "$d" --steps 3 --overwrite >/dev/null 2>"$tmp/overwrite.err" \
  || fail "--overwrite: $(cat "$tmp/overwrite.err")"
grep -q '"step":[[:space:]]*3,' "$d/checkpoint/train_state.json" \
  || fail "--overwrite did not leave the new run's checkpoint"
[ "$(tail -n +2 "$d/metrics.csv" | grep -c .)" -eq 3 ] || fail "--overwrite: metrics.csv is not the new run's"
ok "--overwrite replaced the checkpoint and metrics"

# Stale leftovers of dead saves go at the next start; a live process's and
# another host's stay.
d=$(make_case stale)
dp=$(dead_pid)
host=$(host_tag)
for n in "checkpoint.tmp.$dp" "checkpoint.tmp.$dp@$host" "checkpoint.old.$dp@$host" \
         "checkpoint.tmp.$$@$host" "checkpoint.tmp.$dp@another-host.example"; do
  mkdir -p "$d/$n"
  head -c 1000000 /dev/zero > "$d/$n/model.safetensors"
done
run --out "$d" --steps 20 --save-every 5 --resume >/dev/null 2>"$tmp/stale.err" \
  || fail "stale: resume failed: $(cat "$tmp/stale.err")"
for n in "checkpoint.tmp.$dp" "checkpoint.tmp.$dp@$host" "checkpoint.old.$dp@$host"; do
  [ ! -e "$d/$n" ] || fail "stale: $n (dead pid $dp) was not removed"
done
for n in "checkpoint.tmp.$$@$host" "checkpoint.tmp.$dp@another-host.example"; do
  [ -e "$d/$n" ] || fail "stale: $n (live process, or another host) was removed"
done
ok "stale folders of dead pid $dp removed, a live one's and another host's kept"

# A crash between a save's two renames: checkpoint/ missing, the previous
# one at checkpoint.old.<pid>. Restored, resumed to the end, bit-exact
# against the run that was never interrupted.
d=$(make_case between_renames)
mv "$d/checkpoint" "$d/checkpoint.old.$dp@$host"
run --out "$d" --steps 20 --save-every 5 --resume >/dev/null 2>"$tmp/renames.err" \
  || fail "between renames: resume failed: $(cat "$tmp/renames.err")"
grep -qF "restored it from" "$tmp/renames.err" || fail "between renames: no note: $(cat "$tmp/renames.err")"
[ ! -e "$d/checkpoint.old.$dp@$host" ] || fail "between renames: the .old folder is still there"
run --out "$A" --steps 20 --save-every 5 --resume >/dev/null 2>"$tmp/a20.err" \
  || fail "base run to 20: $(cat "$tmp/a20.err")"
cmp -s "$d/checkpoint/model.safetensors" "$A/checkpoint/model.safetensors" \
  || fail "between renames: the resumed model differs from the uninterrupted run's"
ok "checkpoint restored from checkpoint.old.$dp@$host, resumed bit-exact to step 20"

finish fault_checkpoint
