#!/usr/bin/env bash
# tests/cli/fault_stop.sh — one rank of `igrad train` stopped (SIGSTOP) in
# the middle of a run with --comm-timeout 2: the rank that waits for it must
# end the job with IGRAD_E_TIMEOUT (a message naming the step and what did
# not complete), every process must be gone within 12 s of the stop (the
# timeout plus MPI_Abort's teardown), and the checkpoint left in --out must
# still resume. Run twice: rank 1 stopped (rank 0 reports), and rank 0
# stopped (rank 1 reports, the rank that usually prints nothing).
#
# Usage: fault_stop.sh path/to/igrad   (CTest passes the built binary)
source "$(dirname "$0")/fault_lib.bash"

opts=(--steps 100000 --save-every 5 --comm-timeout 2)
wrap=(bash -c 'echo $$ > "$0.$OMPI_COMM_WORLD_RANK"; exec "$@"')

alive() { [ -e "/proc/$1" ] && [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" != Z ]; }

stop_case() {
  local victim_rank=$1 other=$((1 - $1)) out="$tmp/stop$1"
  rm -f "$tmp/pid$1".*
  "${mpi[@]}" "${wrap[@]}" "$tmp/pid$1" "$IGRAD" train "${common[@]}" "${opts[@]}" \
    --out "$out" >/dev/null 2>"$tmp/stop$1.err" &
  local job=$! step=0
  # Wait for a checkpoint at step >= 10, so the run is well inside its loop.
  for _ in $(seq 1 3000); do
    step=$(sed -n -E 's/.*"step":[[:space:]]*([0-9]+),.*/\1/p' \
           "$out/checkpoint/train_state.json" 2>/dev/null | head -n 1)
    [ "${step:-0}" -ge 10 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.02
  done
  if [ "${step:-0}" -lt 10 ] || [ ! -s "$tmp/pid$1.$victim_rank" ]; then
    fail "rank $victim_rank case: the run did not reach step 10: $(cat "$tmp/stop$1.err")"
    kill -9 "$job" 2>/dev/null; wait "$job"
    return
  fi
  local victim other_pid t0 t1 ended=0
  victim=$(cat "$tmp/pid$1.$victim_rank")
  other_pid=$(cat "$tmp/pid$1.$other")
  t0=$(now_ms)
  kill -STOP "$victim"
  for _ in $(seq 1 1500); do
    if ! kill -0 "$job" 2>/dev/null && ! alive "$victim" && ! alive "$other_pid"; then
      ended=1; break
    fi
    sleep 0.02
  done
  t1=$(now_ms)
  if [ "$ended" -eq 0 ]; then
    fail "rank $victim_rank stopped: the job still runs 30 s later"
    kill -9 "$job" "$victim" "$other_pid" 2>/dev/null
  fi
  wait "$job"
  local jrc=$? ms=$((t1 - t0))
  [ "$jrc" -ne 0 ] || fail "rank $victim_rank stopped: mpirun exit code 0"
  [ "$ms" -le 12000 ] || fail "rank $victim_rank stopped: the job took $ms ms to end (bound 12000)"
  grep -q "did not complete within 2 s" "$tmp/stop$1.err" \
    || fail "rank $victim_rank stopped: no timeout message: $(cat "$tmp/stop$1.err")"
  grep -q "step [0-9]" "$tmp/stop$1.err" \
    || fail "rank $victim_rank stopped: the message names no step: $(cat "$tmp/stop$1.err")"
  if [ "$victim_rank" -eq 0 ]; then
    grep -q "rank 1" "$tmp/stop$1.err" \
      || fail "rank 0 stopped: rank 1 did not report: $(cat "$tmp/stop$1.err")"
  fi
  ok "rank $victim_rank stopped after the step-$step checkpoint: job ended in $ms ms" \
     "(mpirun rc $jrc): $(grep -m1 'did not complete' "$tmp/stop$1.err" | cut -c1-160)"
  # What was left on disk is a checkpoint a later run continues from.
  timeout 60 "${mpi[@]}" "$IGRAD" train "${common[@]}" --steps $((step + 2)) --save-every 5 \
    --comm-timeout 2 --out "$out" --resume >/dev/null 2>"$tmp/resume$1.err" \
    || fail "rank $victim_rank stopped: --resume: $(cat "$tmp/resume$1.err")"
}

stop_case 1
stop_case 0
finish fault_stop
