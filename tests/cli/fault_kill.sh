#!/usr/bin/env bash
# tests/cli/fault_kill.sh — kill -9 of one rank (rank 1 of 2) in the middle
# of a run that checkpoints every 5 steps. The whole job must end within
# 10 s of the kill (mpirun sees the dead rank and ends the others; the time
# is printed), and --resume from whatever checkpoint was left (complete,
# or caught between a save's two renames and restored) must finish
# bit-exact against a run that was never interrupted: every file of the
# final checkpoint equal byte for byte. No temporary folders may remain.
#
# Usage: fault_kill.sh path/to/igrad   (CTest passes the built binary)
source "$(dirname "$0")/fault_lib.bash"

opts=(--steps 60 --save-every 5)
ref="$tmp/ref" out="$tmp/victim"
timeout 60 "${mpi[@]}" "$IGRAD" train "${common[@]}" "${opts[@]}" --out "$ref" \
  >/dev/null 2>"$tmp/ref.err" || fail "reference run: $(cat "$tmp/ref.err")"

# Each rank records its pid, then becomes the trainer (exec keeps the pid).
wrap=(bash -c 'echo $$ > "$0.$OMPI_COMM_WORLD_RANK"; exec "$@"')
"${mpi[@]}" "${wrap[@]}" "$tmp/pid" "$IGRAD" train "${common[@]}" "${opts[@]}" --out "$out" \
  >/dev/null 2>"$tmp/victim.err" &
job=$!
# Wait for a checkpoint at step >= 20 (of 60), then kill rank 1.
step=0
for _ in $(seq 1 2000); do
  step=$(sed -n -E 's/.*"step":[[:space:]]*([0-9]+),.*/\1/p' "$out/checkpoint/train_state.json" \
         2>/dev/null | head -n 1)
  [ "${step:-0}" -ge 20 ] && break
  kill -0 "$job" 2>/dev/null || break
  sleep 0.02
done
if [ "${step:-0}" -lt 20 ] || [ ! -s "$tmp/pid.1" ]; then
  fail "the run did not reach a checkpoint at step 20 (step ${step:-none}): $(cat "$tmp/victim.err")"
  wait "$job"
  finish fault_kill
fi
victim=$(cat "$tmp/pid.1")
t0=$(now_ms)
kill -9 "$victim"
ended=0
for _ in $(seq 1 1500); do
  if ! kill -0 "$job" 2>/dev/null; then ended=1; break; fi
  sleep 0.02
done
t1=$(now_ms)
if [ "$ended" -eq 0 ]; then
  fail "the job did not end within 30 s of kill -9 of rank 1"
  kill -9 "$job" "$(cat "$tmp/pid.0")" 2>/dev/null
fi
wait "$job"
jrc=$?
[ "$jrc" -ne 0 ] || fail "mpirun exit code 0 after a rank was killed"
ms=$((t1 - t0))
[ "$ms" -le 10000 ] || fail "the job took $ms ms to end after the kill (bound 10000)"
# Rank 0 is gone too (given a moment to be reaped once mpirun is gone).
r0=$(cat "$tmp/pid.0")
for _ in $(seq 1 100); do
  [ -e "/proc/$r0" ] && [ "$(awk '{print $3}' "/proc/$r0/stat" 2>/dev/null)" != Z ] || break
  sleep 0.02
done
if [ -e "/proc/$r0" ] && [ "$(awk '{print $3}' "/proc/$r0/stat" 2>/dev/null)" != Z ]; then
  fail "rank 0 (pid $r0) still runs 2 s after mpirun ended"
  kill -9 "$r0" 2>/dev/null
fi
ok "kill -9 of rank 1 after the step-$step checkpoint: job ended in $ms ms (mpirun rc $jrc)"
ls "$out" | sed 's/^/  left in --out: /'

timeout 60 "${mpi[@]}" "$IGRAD" train "${common[@]}" "${opts[@]}" --out "$out" --resume \
  >/dev/null 2>"$tmp/resume.err" || fail "--resume after the kill: $(cat "$tmp/resume.err")"
for f in config.json model.safetensors optimizer.safetensors engine.rank0.bin engine.rank1.bin \
         train_state.json; do
  cmp -s "$ref/checkpoint/$f" "$out/checkpoint/$f" \
    || fail "after the resume, checkpoint/$f differs from the uninterrupted run's"
done
left=$(find "$out" -maxdepth 1 -name 'checkpoint.*')
[ -z "$left" ] || fail "left behind after the resume: $left"
ok "--resume finished bit-exact (all 6 checkpoint files equal)"

finish fault_kill
