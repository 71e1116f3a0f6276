#!/usr/bin/env bash
# tests/cli/fault_options.sh — one rank started with another run-defining
# option than the other (mpirun MPMD: `-np 1 igrad train A : -np 1 igrad
# train B`). Before the option agreement, --save-every hung forever,
# --steps/--stop-at/--eval-every ended in MPI_ERR_TRUNCATE, and --batch,
# --seq-len, --data were accepted silently. Now every case must end within
# the bound on *every* rank with exit code 1 (each rank's own code is
# recorded by a wrapper, so a rank killed by mpirun does not pass), the
# message naming the option and both values, and no checkpoint.
#
# Usage: fault_options.sh path/to/igrad   (CTest passes the built binary)
source "$(dirname "$0")/fault_lib.bash"

# rank_cmd RCFILE -- CMD...: runs CMD, writes its exit code to RCFILE.<rank>
# and exits 0, so that mpirun never kills the other rank early.
wrap=(bash -c '"$@"; echo $? > "$0.$OMPI_COMM_WORLD_RANK"; exit 0')

# differ NAME NEEDLE -- ARGS0... -- ARGS1...: rank 0 and rank 1 get the
# common options plus their own.
differ() {
  local name=$1 needle=$2 f0=$fails
  shift 3
  local a0=() a1=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do a0+=("$1"); shift; done
  shift
  a1=("$@")
  local out="$tmp/$name" rc="$tmp/$name.rc"
  local t0 t1
  t0=$(now_ms)
  timeout 30 "${mpirun_[@]}" \
    -np 1 "${wrap[@]}" "$rc" "$IGRAD" train "${common[@]}" --out "$out" "${a0[@]}" : \
    -np 1 "${wrap[@]}" "$rc" "$IGRAD" train "${common[@]}" --out "$out" "${a1[@]}" \
    >"$tmp/$name.stdout" 2>"$tmp/$name.err"
  local mrc=$?
  t1=$(now_ms)
  [ "$mrc" -ne 124 ] || fail "$name: no result within 30 s (a hang)"
  for r in 0 1; do
    if [ ! -f "$rc.$r" ]; then
      fail "$name: rank $r did not exit by itself (killed or hung)"
    elif [ "$(cat "$rc.$r")" != 1 ]; then
      fail "$name: rank $r exit code $(cat "$rc.$r"), expected 1"
    fi
  done
  grep -qF -- "$needle" "$tmp/$name.err" \
    || fail "$name: stderr lacks '$needle': $(head -c 600 "$tmp/$name.err")"
  [ ! -e "$out/checkpoint" ] || fail "$name: a checkpoint was left"
  [ "$fails" -eq "$f0" ] && echo "ok: $name in $((t1 - t0)) ms: $(grep -F "igrad: train:" "$tmp/$name.err" | head -n 1)"
  f_last=$fails
}

differ save_every "--save-every differs: rank 0 has 2, rank 1 has 3" -- \
  --steps 6 --save-every 2 -- --steps 6 --save-every 3
differ steps "--steps differs: rank 0 has 6, rank 1 has 5" -- --steps 6 -- --steps 5
differ stop_at "--stop-at differs: rank 0 has 0, rank 1 has 3" -- --steps 6 -- --steps 6 --stop-at 3
differ eval_every "--eval-every differs: rank 0 has 2, rank 1 has 0" -- \
  --steps 6 --eval-every 2 -- --steps 6
differ batch "--batch differs: rank 0 has 4, rank 1 has 8" -- --steps 4 -- --steps 4 --batch 8
differ seq_len "--seq-len differs: rank 0 has 32, rank 1 has 16" -- \
  --steps 4 -- --steps 4 --seq-len 16
cp -r "$tmp/corpus" "$tmp/corpus2"
differ data "--data differs: rank 0 has $tmp/corpus, rank 1 has $tmp/corpus2" -- \
  --steps 4 -- --steps 4 --data "$tmp/corpus2"
differ method "--method differs: rank 0 has dense, rank 1 has topk_sync" -- \
  --steps 4 -- --steps 4 --method topk_sync
differ lr "--lr differs: rank 0 has 0.001, rank 1 has 0.002" -- --steps 4 -- --steps 4 --lr 2e-3
# given on one rank only: named, with what the other has (its default),
# whether the option is always compared or only when given
differ value_dtype_one "--value-dtype differs: rank 0 has F32, rank 1 has (not given: the default for the method)" -- \
  --steps 4 --method topk_sync --value-dtype f32 -- --steps 4 --method topk_sync
differ momentum_one "--momentum differs: rank 0 has 0.5, rank 1 has (not given: the default for the method)" -- \
  --steps 4 --method topk_sync --momentum 0.5 -- --steps 4 --method topk_sync
differ ef_on_one "--ef-on differs: rank 0 has update, rank 1 has grad (the default)" -- \
  --steps 4 --method topk_sync --ef-on update -- --steps 4 --method topk_sync

# --init is compared by what it loads: two checkpoints of different seeds
# (another path on each host is fine, other weights are not).
"$IGRAD" model init --size tiny --seed 1 --out "$tmp/init1" >/dev/null || fail "model init 1"
"$IGRAD" model init --size tiny --seed 2 --out "$tmp/init2" >/dev/null || fail "model init 2"
differ init "--init: parameters of rank 1 differ from rank 0's" -- \
  --steps 3 --init "$tmp/init1" -- --steps 3 --init "$tmp/init2"
cp -r "$tmp/init1" "$tmp/init1copy"
out="$tmp/init_same"
timeout 60 "${mpirun_[@]}" \
  -np 1 "$IGRAD" train "${common[@]}" --out "$out" --steps 2 --init "$tmp/init1" : \
  -np 1 "$IGRAD" train "${common[@]}" --out "$out" --steps 2 --init "$tmp/init1copy" \
  >"$tmp/init_same.out" 2>&1 || fail "--init of equal copies: $(tail -n 5 "$tmp/init_same.out")"
ok "--init of equal checkpoints at different paths is accepted"

# Per rank by design: --threads, --progress, --log-every. The run succeeds.
out="$tmp/per_rank"
timeout 60 "${mpirun_[@]}" \
  -np 1 "$IGRAD" train "${common[@]}" --out "$out" --steps 3 : \
  -np 1 "$IGRAD" train "${common[@]}" --out "$out" --steps 3 --threads 2 --progress plain \
  --log-every 1 >"$tmp/per_rank.out" 2>&1 || fail "per-rank options: $(tail -n 5 "$tmp/per_rank.out")"
[ -s "$out/checkpoint/train_state.json" ] || fail "per-rank options: no checkpoint"
ok "--threads/--progress/--log-every may differ between ranks"

finish fault_options
