# tests/cli/fault_lib.bash — shared by the fault_*.sh tests (sourced, not a
# test itself: CTest runs tests/cli/*.sh only). Sets IGRAD, tmp (removed at
# exit), a generated corpus in $tmp/corpus, `common` options for a tiny
# fast run, `mpi` (mpirun -np 2 ...), fail(), and MPMD helpers.
set -u
IGRAD=${1:?usage: $0 path/to/igrad}
IGRAD=$(cd "$(dirname "$IGRAD")" && pwd)/$(basename "$IGRAD")
tmp=$(mktemp -d "${TMPDIR:-/tmp}/igrad-fault.XXXXXX")
fails=0
trap 'rm -rf "$tmp"' EXIT

fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }

finish() {
  if [ "$fails" -ne 0 ]; then
    echo "$1: $fails failure(s)" >&2
    exit 1
  fi
  echo "$1: all ok"
  exit 0
}

if ! command -v mpirun >/dev/null; then
  echo "SKIP: no mpirun"
  exit 77
fi
mpirun_=(mpirun --oversubscribe)
[ "$(id -u)" -ne 0 ] || mpirun_+=(--allow-run-as-root)
mpi=("${mpirun_[@]}" -np 2)

# 8 documents of pseudo-sentences (deterministic).
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
common=(--data "$tmp/corpus" --seq-len 32 --batch 4 --eval-every 0 --threads 1 --progress quiet)

# A pid no process has (a reaped child).
dead_pid() {
  sleep 0 &
  local p=$!
  wait "$p"
  echo "$p"
}

# This host as the trainer writes it into checkpoint.tmp.<pid>@<host>.
host_tag() { hostname | tr -c 'A-Za-z0-9._\n-' '_' | head -c 63; }

now_ms() { date +%s%3N; }

# ok MESSAGE: prints "ok: MESSAGE" only if nothing failed since the last ok.
f_last=0
ok() {
  [ "$fails" -eq "$f_last" ] && echo "ok: $*"
  f_last=$fails
}
