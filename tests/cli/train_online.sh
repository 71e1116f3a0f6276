#!/usr/bin/env bash
# tests/cli/train_online.sh — `igrad train --method ig --profile auto` on
# the tiny model: the run profiles its first --profile-steps steps itself,
# switches to ig (summary.json: online_profile.switch_step, fewer bytes per
# step after the switch than during the window), writes DIR/profile.json
# (a profile `--profile FILE` accepts), and a run stopped inside the window
# and one stopped after the switch resume to the same parameters as the
# uninterrupted run. --reprofile-every: re-profiles logged in summary.json
# and an exact resume from inside a re-profiling window. --profile auto
# with a method that uses no profile is refused, and so is
# --reprofile-every without --profile auto.
#
# Data: a generated corpus (no network). Runs under mpirun -np 2 when
# mpirun exists, else on 1 rank.
#
# Usage: train_online.sh path/to/igrad   (CTest passes the built binary)
set -u
IGRAD=${1:?usage: train_online.sh path/to/igrad}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/igrad-train-online.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { echo "FAIL: $*" >&2; fails=$((fails + 1)); }
PY=python3
command -v "$PY" >/dev/null || PY=/usr/bin/python3

mkdir -p "$tmp/corpus"
words=(the cat sat on a mat and dog ran to red house in sun was big)
seed=5
for d in 0 1 2 3 4 5 6 7; do
  line=""
  for _ in $(seq 1 400); do
    seed=$(( (seed * 1103515245 + 12345) % 2147483648 ))
    line+="${words[$(( (seed / 65536) % 16 ))]} "
  done
  echo "$line" > "$tmp/corpus/doc$d.txt"
done

launch=()
if command -v mpirun >/dev/null; then
  launch=(mpirun --oversubscribe -np 2)
  [ "$(id -u)" -ne 0 ] || launch+=(--allow-run-as-root)
fi
common=(--data "$tmp/corpus" --seq-len 32 --batch 8 --steps 16 --eval-every 8 --eval-batches 2
        --val-fraction 0.1 --threads 1 --progress quiet --method ig --profile auto
        --profile-steps 5 --profile-partition fixed:0.4 --target-ratio 0)

timeout 120 "${launch[@]}" "$IGRAD" train "${common[@]}" --out "$tmp/full" 2>"$tmp/full.err" \
  || fail "ig --profile auto: $(cat "$tmp/full.err")"
[ -s "$tmp/full/profile.json" ] || fail "no profile.json in the run's --out"
"$PY" - "$tmp/full" <<'EOF' || fail "summary/metrics checks"
import csv, json, os, sys
d = sys.argv[1]
s = json.load(open(os.path.join(d, "summary.json")))
bad = []
op = s.get("online_profile", {})
if op.get("switch_step") != 5: bad.append("online_profile.switch_step %r, want 5" % op.get("switch_step"))
if op.get("file") != "profile.json": bad.append("online_profile.file %r" % op.get("file"))
if not (op.get("build_ms", -1) >= 0): bad.append("online_profile.build_ms %r" % op.get("build_ms"))
p = json.load(open(os.path.join(d, "profile.json")))
imp = sum(1 for c in p["components"] if c["important"])
if s.get("profile", {}).get("important") != imp: bad.append("summary profile.important vs profile.json")
if not (0 < s.get("f_imp", 0) < 1): bad.append("f_imp %r" % s.get("f_imp"))
rows = list(csv.DictReader(open(os.path.join(d, "metrics.csv"))))
pay = [float(r["payload_bytes"]) for r in rows]
win, after = pay[:5], pay[5:]
if min(win) != max(win): bad.append("window payloads vary: %r" % win)
if not (sum(after) / len(after) < min(win)): bad.append("ig after the switch sends no less: %r vs %r" % (after, win))
if bad:
    print("\n".join(bad)); sys.exit(1)
EOF
# the default for ig: --target-ratio 0.25, fitted by the engine at the
# switch; after it, at most a quarter of adtopk_sync's payload per step;
# a run stopped after the switch resumes to the same parameters
targs=(--data "$tmp/corpus" --seq-len 32 --batch 8 --steps 16 --eval-every 8 --eval-batches 2
       --val-fraction 0.1 --threads 1 --progress quiet --method ig --profile auto
       --profile-steps 5)
timeout 120 "${launch[@]}" "$IGRAD" train "${targs[@]}" --out "$tmp/target" 2>"$tmp/target.err" \
  || fail "ig --profile auto (default target): $(cat "$tmp/target.err")"
timeout 120 "${launch[@]}" "$IGRAD" train --data "$tmp/corpus" --seq-len 32 --batch 8 --steps 4 \
  --eval-every 0 --val-fraction 0.1 --threads 1 --progress quiet --method adtopk_sync \
  --out "$tmp/adsync" 2>"$tmp/adsync.err" || fail "adtopk_sync: $(cat "$tmp/adsync.err")"
"$PY" - "$tmp/target" "$tmp/adsync" <<'EOF' || fail "default target checks"
import csv, json, os, sys
s = json.load(open(os.path.join(sys.argv[1], "summary.json")))
ref = json.load(open(os.path.join(sys.argv[2], "summary.json")))["payload_bytes_per_step"]
bad = []
t = s["config"]["sync"].get("target") or {}
if t.get("ratio") != 0.25: bad.append("config.sync.target.ratio %r, want 0.25" % t.get("ratio"))
if not (0 < t.get("planned_ratio", 1) <= 0.25): bad.append("planned ratio %r" % t.get("planned_ratio"))
if s["config"]["sync"]["release_keep"] != t.get("release_keep"):
    bad.append("release_keep %r is not the fitted %r" % (s["config"]["sync"]["release_keep"],
                                                        t.get("release_keep")))
rows = list(csv.DictReader(open(os.path.join(sys.argv[1], "metrics.csv"))))
after = [float(r["payload_bytes"]) for r in rows][5:]
if not (sum(after) / len(after) <= 0.25 * ref * (1 + 1e-9)):
    bad.append("after the switch %.1f bytes/step, adtopk_sync %.1f" % (sum(after) / len(after), ref))
if bad:
    print("\n".join(bad)); sys.exit(1)
EOF
out="$tmp/tstop"
timeout 120 "${launch[@]}" "$IGRAD" train "${targs[@]}" --out "$out" --stop-at 9 2>"$out.err" \
  || fail "target stop at 9: $(cat "$out.err")"
timeout 120 "${launch[@]}" "$IGRAD" train "${targs[@]}" --out "$out" --resume 2>"$out.err2" \
  || fail "target resume from 9: $(cat "$out.err2")"
cmp -s "$tmp/target/checkpoint/model.safetensors" "$out/checkpoint/model.safetensors" \
  || fail "target: resumed after the switch differs from the uninterrupted run"

# the built profile is a profile igrad train accepts
timeout 120 "${launch[@]}" "$IGRAD" train "${common[@]/auto/$tmp/full/profile.json}" --steps 4 \
  --out "$tmp/reuse" 2>"$tmp/reuse.err" || fail "--profile DIR/profile.json: $(cat "$tmp/reuse.err")"

# stopped inside the window (step 3) and after the switch (step 9): exact resume
for stop in 3 9; do
  out="$tmp/stop$stop"
  timeout 120 "${launch[@]}" "$IGRAD" train "${common[@]}" --out "$out" --stop-at $stop \
    2>"$out.err" || fail "stop at $stop: $(cat "$out.err")"
  timeout 120 "${launch[@]}" "$IGRAD" train "${common[@]}" --out "$out" --resume \
    2>"$out.err2" || fail "resume from $stop: $(cat "$out.err2")"
  cmp -s "$tmp/full/checkpoint/model.safetensors" "$out/checkpoint/model.safetensors" \
    || fail "resumed from step $stop: parameters differ from the uninterrupted run"
  cmp -s "$tmp/full/profile.json" "$out/profile.json" \
    || fail "resumed from step $stop: profile.json differs"
done

# a method without a profile
if timeout 60 "$IGRAD" train --data "$tmp/corpus" --method adtopk_sync --profile auto \
     --steps 2 --progress quiet --out "$tmp/bad" 2>"$tmp/bad.err"; then
  fail "--profile auto with adtopk_sync was accepted"
fi
grep -qF -- "--profile auto profiles online for iad and ig" "$tmp/bad.err" \
  || fail "message for --profile auto with adtopk_sync: $(cat "$tmp/bad.err")"

# --reprofile-every 4: re-profiles at steps 8, 12 and 16 (4-step windows
# after the switch at 4, each ending at a release-period boundary), logged
# in summary.json; a run stopped inside a re-profiling window resumes
# exactly
rargs=(--data "$tmp/corpus" --seq-len 32 --batch 8 --steps 18 --eval-every 0 --val-fraction 0.1
       --threads 1 --progress quiet --method ig --profile auto --profile-steps 4
       --reprofile-every 4 --reprofile-margin 0)
timeout 120 "${launch[@]}" "$IGRAD" train "${rargs[@]}" --out "$tmp/reprof" 2>"$tmp/reprof.err" \
  || fail "--reprofile-every: $(cat "$tmp/reprof.err")"
"$PY" - "$tmp/reprof" <<'EOF' || fail "re-profiling summary checks"
import json, os, sys
op = json.load(open(os.path.join(sys.argv[1], "summary.json"))).get("online_profile", {})
bad = []
if op.get("reprofile_every") != 4: bad.append("reprofile_every %r" % op.get("reprofile_every"))
if op.get("reprofile_margin") != 0: bad.append("reprofile_margin %r" % op.get("reprofile_margin"))
if op.get("reprofiles") != 3: bad.append("reprofiles %r, want 3" % op.get("reprofiles"))
log = op.get("reprofile_log", [])
if [e.get("step") for e in log] != [8, 12, 16]: bad.append("reprofile_log steps %r" % log)
if log and log[-1].get("replans") != op.get("reprofile_replans"): bad.append("log vs replans %r" % op)
if any(not (e.get("ms", -1) >= 0) or e.get("flips", -1) < 0 for e in log): bad.append("log %r" % log)
if bad:
    print("\n".join(bad)); sys.exit(1)
EOF
out="$tmp/rstop"
timeout 120 "${launch[@]}" "$IGRAD" train "${rargs[@]}" --out "$out" --stop-at 14 2>"$out.err" \
  || fail "re-profiling stop at 14: $(cat "$out.err")"
timeout 120 "${launch[@]}" "$IGRAD" train "${rargs[@]}" --out "$out" --resume 2>"$out.err2" \
  || fail "re-profiling resume from 14: $(cat "$out.err2")"
cmp -s "$tmp/reprof/checkpoint/model.safetensors" "$out/checkpoint/model.safetensors" \
  || fail "re-profiling: resumed inside a window differs from the uninterrupted run"
if timeout 60 "$IGRAD" train --data "$tmp/corpus" --method ig --profile "$tmp/full/profile.json" \
     --reprofile-every 4 --steps 2 --progress quiet --out "$tmp/bad2" 2>"$tmp/bad2.err"; then
  fail "--reprofile-every with a profile file was accepted"
fi
grep -qF -- "it needs --profile auto" "$tmp/bad2.err" \
  || fail "message for --reprofile-every without --profile auto: $(cat "$tmp/bad2.err")"

[ "$fails" -eq 0 ] && echo "train_online: ok"
exit $((fails > 0))
