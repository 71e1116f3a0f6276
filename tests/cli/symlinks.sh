#!/usr/bin/env bash
# tests/cli/symlinks.sh — a planted symbolic link never redirects a write.
# The old writers put their temporary at "<file>.tmp.<pid>" with a plain
# fopen, and a process that exec's igrad keeps its PID, so a link planted
# there (or at the file itself) made `igrad train` and `igrad profile`
# write into whatever it pointed at. Here every output name of a run, and
# its old temporary name under the PID the run will have, is a link to a
# victim file; the victim must keep its bytes and every output must be a
# regular file.
#
# Usage: symlinks.sh path/to/igrad   (CTest passes the built binary)
source "$(dirname "$0")/fault_lib.bash" # IGRAD, tmp, corpus, common, fail, finish
mkdir -p "$tmp/out"
echo precious > "$tmp/victim"

# plant DIR PID NAME...: links at each NAME and NAME.tmp.PID to the victim
# (plant_tmp: at NAME.tmp.PID only, for files a resumed run reads first).
plant() {
  local dir=$1 pid=$2
  shift 2
  for n in "$@"; do
    ln -sf "$tmp/victim" "$dir/$n.tmp.$pid"
    ln -sf "$tmp/victim" "$dir/$n"
  done
}
plant_tmp() {
  local dir=$1 pid=$2
  shift 2
  for n in "$@"; do ln -sf "$tmp/victim" "$dir/$n.tmp.$pid"; done
}

# check NAME...: each output is a regular file, the victim unchanged.
check() {
  local what=$1
  shift
  for f in "$@"; do
    [ -f "$f" ] && [ ! -L "$f" ] || fail "$what: $f is not a regular file"
  done
  [ "$(cat "$tmp/victim")" = precious ] || fail "$what: the victim was written: $(head -c 200 "$tmp/victim")"
}

# igrad train: summary.json, metrics.csv, eval.csv and the trace. The
# subshell plants under its own PID, then exec's igrad, which keeps it.
(
  plant "$tmp/out" "$BASHPID" summary.json metrics.csv eval.csv trace.csv
  exec "$IGRAD" train "${common[@]}" --out "$tmp/out" --method topk_sync \
    --trace "$tmp/out/trace.csv" --steps 3
) >"$tmp/train.log" 2>&1 || fail "train: exit code $?: $(cat "$tmp/train.log")"
check train "$tmp/out/summary.json" "$tmp/out/metrics.csv" "$tmp/out/eval.csv" \
  "$tmp/out/trace.csv"

# igrad profile --out, with --target-ratio (which rewrites the file to add
# the target).
(
  plant "$tmp/out" "$BASHPID" profile.json
  exec "$IGRAD" profile --trace "$tmp/out/trace.csv" --out "$tmp/out/profile.json" \
    --layout "$tmp/out/checkpoint/config.json" --target-ratio 0.25
) >"$tmp/profile.log" 2>&1 || fail "profile: exit code $?: $(cat "$tmp/profile.log")"
check profile "$tmp/out/profile.json"

# A resumed run rewrites metrics.csv and eval.csv up to its step, then
# appends (a link put at the file between the two is refused, O_NOFOLLOW).
"$IGRAD" train "${common[@]}" --out "$tmp/out2" --method topk_sync --steps 2 >/dev/null 2>&1 \
  || fail "train out2: exit code $?"
if [ -f "$tmp/out2/metrics.csv" ]; then
  (
    plant "$tmp/out2" "$BASHPID" summary.json
    plant_tmp "$tmp/out2" "$BASHPID" metrics.csv eval.csv
    exec "$IGRAD" train "${common[@]}" --out "$tmp/out2" --method topk_sync --steps 4 --resume
  ) >"$tmp/resume.log" 2>&1 || fail "resume: exit code $?: $(cat "$tmp/resume.log")"
  check resume "$tmp/out2/summary.json" "$tmp/out2/metrics.csv"
fi

finish symlinks
