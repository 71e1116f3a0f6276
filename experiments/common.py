"""common.py — the shared runner of the RQ1–RQ5 experiment scripts.

What lives here: the mode settings (smoke / quick / full) and their
overrides from flags and IGRAD_EXP_* environment variables; checks that
fail early with a clear message (missing corpus, missing base checkpoint,
igrad not built, mpirun missing or failing); launching `igrad train` under
`mpirun` (or through experiments/netem/run-shaped on a shaped link) and
`igrad profile`; a cache of finished runs keyed by everything that decides
their result (arguments, ranks, link, the igrad binary and the files it
reads), so RQ scripts share one base, one profile and identical runs;
reading metrics.csv / eval.csv / summary.json; writing CSV and Markdown;
small statistics (mean, std, Spearman) and matplotlib setup.

What does not: the questions themselves (rqN_*/run.py), shaping the
network (netem/run-shaped), the trainer (igrad train). Every number the
scripts report comes from a run's own files; nothing is estimated here.

Layout of the outputs (ROOT = IGRAD_EXP_RUNS or runs/):
  ROOT/rqN_name[-MODE]/       one RQ's CSV results, PNG figures, summary.md,
                              runs.csv (label -> run directory) and runs/
                              (symlinks to the runs it used)
  ROOT/exp_shared[-MODE]/     the base checkpoint, profiling traces and
                              profiles, generated smoke corpora, and every
                              `igrad train` run (train/<method>-<hash>/)
The quick mode has no suffix; smoke and full add -smoke / -full.
"""
import argparse
import csv
import functools
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN_SHAPED = os.path.join(REPO, "experiments", "netem", "run-shaped")

# Exit codes of the scripts: 1 for a failed experiment (with a message),
# 2 for bad usage; run-shaped's "cannot shape here" is 3.
EXIT_FAIL = 1
NETEM_REFUSED = 3


class ExperimentError(Exception):
    """A failure the user can act on; the message says what and how."""


class NetemUnavailable(ExperimentError):
    """run-shaped refused (no privileges or tools): shaped runs are skipped."""


# Brown genres of the base: every genre except the post-training workloads
# (news, fiction, romance, learned), so each workload is new to the base.
BASE_DATA = ("brown:editorial+reviews+religion+hobbies+lore+belles_lettres+government"
             "+mystery+science_fiction+adventure+humor")

# Every setting of a mode; flags and environment variables override them.
MODES = {
    # A few steps of the tiny model on generated text: keeps the scripts
    # from rotting (tests/python/test_experiments_smoke.py), measures nothing.
    "smoke": dict(size="tiny", seq_len=32, batch=8, ranks=2, base_steps=20, base_lr=3e-3,
                  profile_steps=8, steps=8, warmup=2, eval_every=4, eval_batches=1,
                  seeds=1, net_steps=4, rates=["none", "100mbit"],
                  data="gen:news", task="task:recall:size=1:train=200:test=20", task_steps=4,
                  # the tiny base's 64 positions are fewer than a problem's
                  # bytes: the smoke task leg trains a fresh small model
                  task_batch=2, task_size="small",
                  workloads=["gen:news", "gen:fiction", "gen:learned", "gen:verse"]),
    # The default: a small model (3M parameters) on 2 ranks, short
    # post-trains, 3 seeds (seed-to-seed spread of the val loss is larger
    # than most method differences: comparisons are paired by seed). With
    # one seed all five scripts took well under an hour on 2 cores; three
    # seeds take about three times as long.
    "quick": dict(size="small", seq_len=128, batch=16, ranks=2, base_steps=240, base_lr=2e-3,
                  profile_steps=30, steps=80, warmup=10, eval_every=20, eval_batches=4,
                  seeds=3, net_steps=12, rates=["none", "1gbit", "100mbit"],
                  data="brown:news", task="task:recall:size=1:test=200", task_steps=120,
                  task_batch=8,
                  workloads=["brown:news", "brown:fiction+romance", "brown:learned", "kjv:",
                             "fortunes:"]),
    # Scaled up: longer base and post-trains, 3 seeds, 4 ranks.
    "full": dict(size="small", seq_len=128, batch=16, ranks=4, base_steps=1000, base_lr=2e-3,
                 profile_steps=100, steps=300, warmup=20, eval_every=25, eval_batches=8,
                 seeds=3, net_steps=30, rates=["none", "1gbit", "100mbit"],
                 data="brown:news", task="task:recall:size=1:test=500", task_steps=300,
                 task_batch=8,
                 # every workload new to the base (see BASE_DATA)
                 workloads=["brown:news", "brown:fiction", "brown:romance", "brown:learned",
                            "kjv:", "fortunes:"]),
}

# Settings every post-train shares (as scripts/demo): the same schedule,
# density and validation split for every method.
POST_LR, POST_MIN_LR, DENSITY, VAL_FRACTION = 1e-3, 1e-4, 0.01, 0.1
# The task workload (mode key "task", exact-match accuracy on held-out
# problems; docs/results/task.md): loss on the response only, rows of 128
# tokens (the longest problem must fit), the learning rate at which recall
# leaves the floor within the steps a quick run has.
TASK_SEQ_LEN, TASK_LR = 128, 3e-3


def say(prefix, t0, msg):
    print(f"[{prefix} {time.time() - t0:5.0f}s] {msg}", flush=True)


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def env_or(name, default, conv=str):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return conv(v)
    except ValueError:
        raise ExperimentError(f"environment variable {name}={v!r} is not a valid value")


# ---------------------------------------------------------------------------
# Small statistics (no numpy needed)
# ---------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def blas_coretype():
    """The OPENBLAS_CORETYPE every run gets (scripts/blas-env: OpenBLAS
    0.3.21 runs its SSE3 kernels on this machine's CPU unless told), or ''.
    Part of each run's stamp: another kernel sums in another order."""
    p = subprocess.run([os.path.join(REPO, "scripts", "blas-env")], capture_output=True,
                       text=True)
    return p.stdout.strip() if p.returncode == 0 else ""


def mean(xs):
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return sum(xs) / len(xs) if xs else float("nan")


def std(xs):
    """Sample standard deviation; 0 for a single value (one seed)."""
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def median(xs):
    xs = sorted(x for x in xs if x is not None and not math.isnan(x))
    if not xs:
        return float("nan")
    n = len(xs)
    return xs[n // 2] if n % 2 else 0.5 * (xs[n // 2 - 1] + xs[n // 2])


def ranks_avg(xs):
    """Ranks 1..n with ties given their average rank (as Spearman needs)."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    r = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            r[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return r


def pearson(xs, ys):
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return float("nan")
    return sxy / math.sqrt(sxx * syy)


def spearman(xs, ys):
    """Spearman's rho: Pearson correlation of the average ranks."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("spearman needs two equally long lists of at least 2 values")
    return pearson(ranks_avg(xs), ranks_avg(ys))


# ---------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------

def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def write_csv(path, columns, rows):
    """rows: dicts; every row must have exactly `columns` (a check that
    keeps the written header honest)."""
    tmp = path + ".tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(columns)
        for r in rows:
            extra = set(r) - set(columns)
            if extra:
                raise ValueError(f"{path}: row has columns not in the header: {sorted(extra)}")
            w.writerow([fmt_cell(r.get(c)) for c in columns])
    os.replace(tmp, path)


def fmt_cell(v):
    if v is None:
        return ""
    if isinstance(v, float):
        return "nan" if math.isnan(v) else repr(v) if abs(v) < 1e-3 and v != 0 else f"{v:.6g}"
    return str(v)


def write_text(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def md_table(head, rows):
    """A Markdown table: columns with a number in any row right-aligned,
    the rest left. Cells may not contain '|'."""
    def numeric(v):
        try:
            float(str(v).split(" ")[0].rstrip("×%"))
            return True
        except ValueError:
            return False
    align = [("---:" if any(numeric(r[i]) for r in rows) else "---") for i in range(len(head))]
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def fmt_bytes(b):
    if b is None or (isinstance(b, float) and math.isnan(b)):
        return "-"
    for u in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or u == "GiB":
            return f"{b:.0f} {u}" if u == "B" else f"{b:.1f} {u}"
        b /= 1024


def fmt(v, spec=".4f", none="-"):
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return none
    return format(v, spec)


def fmt_pm(vals, spec=".4f"):
    """mean, with ± std when there is more than one value."""
    vals = [v for v in vals if v is not None and not math.isnan(v)]
    if not vals:
        return "-"
    if len(vals) == 1:
        return format(vals[0], spec)
    return f"{format(mean(vals), spec)} ± {format(std(vals), spec)}"


def pyplot():
    """matplotlib's pyplot on the file-only backend, or a clear error."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ExperimentError("matplotlib is missing (Debian python3-matplotlib: "
                              "scripts/bootstrap --with-python); run with /usr/bin/python3")
    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "figure.dpi": 100})
    return plt


def save_fig(fig, path):
    # Small PNGs: they are committed under docs/results/.
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    import matplotlib.pyplot as plt
    plt.close(fig)


# ---------------------------------------------------------------------------
# A run of igrad train, as the scripts read it
# ---------------------------------------------------------------------------

class Run:
    """One finished `igrad train` output directory."""

    def __init__(self, path, label=None):
        self.path = path
        self.label = label or os.path.basename(path)
        with open(os.path.join(path, "summary.json")) as f:
            self.summary = json.load(f)
        self._metrics = self._eval = None

    @property
    def metrics(self):
        if self._metrics is None:
            self._metrics = read_csv(os.path.join(self.path, "metrics.csv"))
        return self._metrics

    @property
    def evals(self):
        if self._eval is None:
            self._eval = read_csv(os.path.join(self.path, "eval.csv"))
        return self._eval

    def col(self, name):
        return [float(r[name]) for r in self.metrics]

    def med(self, name):
        """Median over steps of a metrics.csv column."""
        return median(self.col(name))

    @property
    def final(self):
        return self.summary["final"]

    @property
    def payload(self):
        return float(self.summary["payload_bytes_per_step"])

    @property
    def f_imp(self):
        return self.summary.get("f_imp")

    @property
    def steady_payload(self):
        """Payload bytes per step after an online profile's switch (before
        it the run sends what *_sync sends); otherwise the whole run's."""
        sw = (self.summary.get("online_profile") or {}).get("switch_step")
        after = [float(r["payload_bytes"]) for r in self.metrics
                 if sw is not None and int(r["step"]) >= sw]
        return mean(after) if after else self.payload

    def stats(self):
        """The numbers every RQ table draws from (per-step medians over the
        run's own metrics.csv; tokens/s over the whole run)."""
        s = self.summary
        return {
            "val_loss": s["final"]["val_loss"], "val_ppl": s["final"]["val_ppl"],
            "val_acc": s["final"]["val_acc"],
            "payload_bytes_per_step": self.payload,
            "wire_bytes_per_step": mean(self.col("wire_bytes")),
            "sent_entries_per_step": mean(self.col("sent_entries")),
            "select_ms": self.med("select_ms"), "pack_ms": self.med("pack_ms"),
            "comm_ms": self.med("comm_ms"), "unpack_ms": self.med("unpack_ms"),
            "sync_ms": self.med("sync_ms"), "step_ms": self.med("step_ms"),
            "tokens_per_s": float(s["tokens_per_s"]),
            "f_imp": s.get("f_imp"),
        }


# ---------------------------------------------------------------------------
# The experiment: settings, checks, launching, caching
# ---------------------------------------------------------------------------

class Experiment:
    """Parses the common flags, holds the settings of the mode, and runs
    things. `name` is the output folder name (e.g. rq2_partition_ablation)."""

    def __init__(self, name, description, add_args=None, argv=None):
        self.name = name
        self.tag = name.split("_")[0]
        self.t0 = time.time()
        self.load0 = os.getloadavg()
        self.executed = self.reused = 0
        ap = argparse.ArgumentParser(
            description=description,
            formatter_class=argparse.RawDescriptionHelpFormatter,
            epilog=ENV_HELP)
        ap.add_argument("--mode", choices=sorted(MODES), default=None,
                        help="smoke | quick (default) | full  [IGRAD_EXP_MODE]")
        ap.add_argument("--size", help="model preset for a pretrained base: tiny|small|base "
                        "[IGRAD_EXP_SIZE]")
        ap.add_argument("--steps", type=int, help="post-training steps [IGRAD_EXP_STEPS]")
        ap.add_argument("--seeds", type=int, help="seeds per configuration [IGRAD_EXP_SEEDS]")
        ap.add_argument("--ranks", type=int, help="MPI ranks [IGRAD_EXP_RANKS]")
        ap.add_argument("--base-steps", type=int, help="pretraining steps of the base")
        ap.add_argument("--profile-steps", type=int, help="steps of a profiling run")
        ap.add_argument("--seq-len", type=int)
        ap.add_argument("--batch", type=int, help="global sequences per step")
        ap.add_argument("--data", help="post-training workload (a --data spec of igrad train)")
        ap.add_argument("--base", help="use this checkpoint as the base instead of "
                        "pretraining one [IGRAD_EXP_BASE]")
        ap.add_argument("--runs-root", help="output root (default runs/) [IGRAD_EXP_RUNS]")
        ap.add_argument("--igrad", help="igrad binary (default build/igrad) [IGRAD]")
        ap.add_argument("--mpirun", help="MPI launcher command [IGRAD_EXP_MPIRUN]")
        ap.add_argument("--force", action="store_true",
                        help="rerun every run instead of reusing finished ones")
        if add_args:
            add_args(ap)
        self.args = a = ap.parse_args(argv)

        mode = a.mode or env_or("IGRAD_EXP_MODE", "quick")
        if mode not in MODES:
            raise ExperimentError(f"IGRAD_EXP_MODE={mode!r}: want one of {', '.join(MODES)}")
        self.mode = mode
        c = dict(MODES[mode])
        for key, env, conv in (("size", "IGRAD_EXP_SIZE", str), ("steps", "IGRAD_EXP_STEPS", int),
                               ("seeds", "IGRAD_EXP_SEEDS", int), ("ranks", "IGRAD_EXP_RANKS", int)):
            c[key] = env_or(env, c[key], conv)
        for key in ("size", "steps", "seeds", "ranks", "base_steps", "profile_steps",
                    "seq_len", "batch", "data"):
            if getattr(a, key, None) is not None:
                c[key] = getattr(a, key)
        for key in ("steps", "seeds", "ranks", "base_steps", "profile_steps", "seq_len", "batch"):
            if c[key] < 1:
                raise ExperimentError(f"--{key.replace('_', '-')} must be at least 1, not {c[key]}")
        if c["batch"] % c["ranks"]:
            raise ExperimentError(f"the batch ({c['batch']}) must be a multiple of the ranks "
                                  f"({c['ranks']})")
        c["eval_every"] = min(c["eval_every"], c["steps"])
        self.cfg = c
        self.seeds = list(range(1, c["seeds"] + 1))

        suffix = "" if mode == "quick" else "-" + mode
        root = a.runs_root or env_or("IGRAD_EXP_RUNS", os.path.join(REPO, "runs"))
        self.root = os.path.abspath(root)
        self.out = os.path.join(self.root, name + suffix)
        self.shared = os.path.join(self.root, "exp_shared" + suffix)
        self.igrad = os.path.abspath(a.igrad or env_or("IGRAD", os.path.join(REPO, "build", "igrad")))
        self.mpirun = shlex.split(a.mpirun or env_or("IGRAD_EXP_MPIRUN", "mpirun"))
        if not self.mpirun:
            raise ExperimentError("the MPI launcher command is empty (--mpirun / IGRAD_EXP_MPIRUN)")
        self.data_dir = os.environ.get("IGRAD_DATA_DIR") or os.path.join(REPO, "data")
        base = a.base or os.environ.get("IGRAD_EXP_BASE")
        self.base_given = os.path.abspath(base) if base else None
        self._bin_sha = None
        self.used = []  # (label, Run) in the order the script asked for them

        if not (os.path.isfile(self.igrad) and os.access(self.igrad, os.X_OK)):
            raise ExperimentError(f"igrad binary {self.igrad} not found (run `make`, or give "
                                  f"--igrad / IGRAD)")
        if self.base_given:
            self.check_checkpoint(self.base_given)
        os.makedirs(self.out, exist_ok=True)
        os.makedirs(os.path.join(self.shared, "train"), exist_ok=True)
        self.log(f"mode {mode}: {c['size'] if not self.base_given else 'given base'} model, "
                 f"{c['ranks']} ranks, {c['steps']} steps, {len(self.seeds)} seed(s); "
                 f"output {os.path.relpath(self.out, REPO) if self.out.startswith(REPO) else self.out}")

    # ---- messages ----
    def log(self, msg):
        say(self.tag, self.t0, msg)

    # ---- checks ----
    def check_checkpoint(self, path):
        missing = [f for f in ("config.json", "model.safetensors")
                   if not os.path.isfile(os.path.join(path, f))]
        if missing:
            raise ExperimentError(
                f"base checkpoint {path} not found or incomplete (missing "
                f"{', '.join(missing)}); give an `igrad train` checkpoint directory with --base, "
                f"or leave --base out to pretrain one")

    def corpus_files(self, spec):
        """The files a --data spec needs (for a clear error before launching)."""
        need = []
        for part in spec.split(","):
            if part.startswith("gen:") or part.startswith("task:"):
                continue  # generated on demand (smoke mode; the task generator)
            if part.startswith("brown:"):
                genres = part[6:]
                if genres in ("", "all"):
                    need.append(os.path.join(self.data_dir, "brown", "genres.txt"))
                else:
                    need += [os.path.join(self.data_dir, "brown", g + ".txt")
                             for g in genres.split("+")]
            elif part.startswith("fortunes:"):
                names = part[9:]
                d = os.path.join(self.data_dir, "fortunes")
                need += [os.path.join(d, n + ".txt") for n in names.split("+")] if names else [d]
            elif part.startswith("kjv:") or part.startswith("lodash:"):
                name = part.split(":")[0]
                need.append(os.path.join(self.data_dir, name, name + ".txt"))
            else:
                for prefix in ("text:", "jsonl:", "alpaca:"):
                    if part.startswith(prefix):
                        part = part[len(prefix):]
                need.append(part)
        return need

    def check_data(self, spec):
        for path in self.corpus_files(spec):
            if not os.path.exists(path):
                corpus = spec.split(":")[0] if ":" in spec else None
                hint = (f"run scripts/fetch-corpus {corpus}" if corpus in ("brown", "fortunes", "kjv", "lodash")
                        else "check the path")
                raise ExperimentError(
                    f"corpus for --data {spec} not found: {path} is missing ({hint}; data "
                    f"directory {self.data_dir}, set IGRAD_DATA_DIR to use another)")

    def data_arg(self, spec):
        """The --data value igrad train gets: gen:NAME becomes a generated
        folder (smoke mode), everything else passes through."""
        if spec.startswith("gen:"):
            return generated_corpus(os.path.join(self.shared, "corpora"), spec[4:])
        return spec

    @staticmethod
    def label_of(spec):
        return spec.rstrip(":").replace("brown:", "").replace("gen:", "gen-")

    # ---- the igrad binary ----
    def bin_sha(self):
        if self._bin_sha is None:
            self._bin_sha = sha256_file(self.igrad)
        return self._bin_sha

    def mpi_cmd(self, ranks):
        cmd = list(self.mpirun)
        if os.path.basename(cmd[0]) in ("mpirun", "mpiexec", "orterun"):
            cmd += ["--oversubscribe", "--bind-to", "none"]
            if os.geteuid() == 0:
                cmd.append("--allow-run-as-root")
        return cmd + ["-np", str(ranks)]

    # ---- launching ----
    def _launch(self, cmd, log_path, what, shaped=False):
        # The corpora the checks above looked at are the ones igrad reads.
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                   IGRAD_DATA_DIR=self.data_dir)
        if blas_coretype():
            env["OPENBLAS_CORETYPE"] = blas_coretype()
        t = time.time()
        try:
            with open(log_path, "w") as log:
                log.write("$ " + " ".join(shlex.quote(x) for x in cmd) + "\n")
                log.flush()
                # restore_signals=False: mpirun inherits Python's SIG_IGN for
                # SIGPIPE, so a peer socket closed first at teardown is an
                # EPIPE it handles, not a kill by signal 13 after the run
                # finished (seen once under `make asan` in CI: exit -13
                # after "done: 8 steps").
                rc = subprocess.call(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     cwd=REPO, restore_signals=False)
        except FileNotFoundError:
            raise ExperimentError(
                f"cannot launch MPI for {what}: '{cmd[0]}' not found (install Open MPI: "
                f"scripts/bootstrap; or give the launcher with --mpirun / IGRAD_EXP_MPIRUN)")
        except PermissionError:
            raise ExperimentError(f"cannot launch MPI for {what}: '{cmd[0]}' is not executable")
        with open(log_path, errors="replace") as f:
            text = f.read()
        if rc != 0:
            lines = [l for l in text.splitlines()[1:] if l.strip()]
            if shaped and rc == NETEM_REFUSED and "run-shaped: cannot shape" in text:
                raise NetemUnavailable(next(l for l in lines if "run-shaped: cannot shape" in l))
            mine = [l for l in lines if l.startswith("igrad:")]
            if mine:
                raise ExperimentError(f"igrad train failed for {what} (exit {rc}): {mine[-1]} "
                                      f"(log: {log_path})")
            tail = " | ".join(lines[-4:]) if lines else "(no output)"
            raise ExperimentError(
                f"MPI launch failed for {what}: `{' '.join(cmd[:6])} ...` exited with {rc} before "
                f"igrad reported anything; last output: {tail} (log: {log_path})")
        return time.time() - t

    def train(self, label, method, data, seed=1, steps=None, ranks=None, init=None,
              profile=None, trace=False, rate=None, eval_every=None, eval_batches=None,
              extra=(), keep_checkpoint=False, lr=POST_LR, min_lr=POST_MIN_LR, warmup=None,
              size=None):
        """Runs (or reuses) one `igrad train`. init=None: the shared base.
        rate: None for plain mpirun (shared memory); 'none', '1gbit', ...
        for a run inside run-shaped's namespace. Returns a Run."""
        c = self.cfg
        steps = steps or c["steps"]
        ranks = ranks or c["ranks"]
        self.check_data(data)
        args = ["--data", self.data_arg(data), "--method", method, "--steps", str(steps),
                "--seed", str(seed), "--seq-len", str(c["seq_len"]), "--batch", str(c["batch"]),
                "--lr", repr(lr), "--min-lr", repr(min_lr),
                "--warmup", str(c["warmup"] if warmup is None else warmup),
                "--val-fraction", repr(VAL_FRACTION), "--density", repr(DENSITY),
                "--eval-every", str(c["eval_every"] if eval_every is None else eval_every),
                "--eval-batches", str(eval_batches or c["eval_batches"]),
                "--threads", "1", "--progress", "plain", "--log-every", str(max(1, steps // 10))]
        inputs = {}
        if size:
            args += ["--size", size]
        else:
            init = init or self.base()
            args += ["--init", init]
            inputs["init"] = sha256_file(os.path.join(init, "model.safetensors"))
        if profile:
            args += ["--profile", profile]
            inputs["profile"] = sha256_file(profile)
        args += list(extra)
        if rate is not None:
            inputs["run-shaped"] = sha256_file(RUN_SHAPED)  # the shaping decides the times
        stamp = {"v": 1, "args": args, "ranks": ranks, "rate": rate, "trace": bool(trace),
                 "igrad": self.bin_sha(), "inputs": inputs, "blas": blas_coretype(),
                 "data_dir": self.data_dir if not data.startswith("gen:") else None}
        key = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:12]
        rdir = os.path.join(self.shared, "train", f"{method}-{key}")
        stamp_path = os.path.join(rdir, "igrad-exp.stamp.json")
        what = f"run '{label}' ({method}, {data}, seed {seed})"
        if not self.args.force and self._finished(rdir, stamp_path, stamp):
            self.reused += 1
            run = Run(rdir, label)
        else:
            shutil.rmtree(rdir, ignore_errors=True)
            os.makedirs(rdir)
            full = args + ["--out", rdir]
            if trace:
                full += ["--trace", os.path.join(rdir, "trace.csv")]
            if rate is None:
                cmd = self.mpi_cmd(ranks) + [self.igrad, "train"] + full
            else:
                cmd = ([RUN_SHAPED, "--rate", rate, "--", "--oversubscribe", "--bind-to", "none",
                        "-np", str(ranks), self.igrad, "train"] + full)
            where = "" if rate is None else f" over a {rate} link" if rate != "none" else \
                " over unshaped TCP"
            self.log(f"{label}: {method} on {data}, {steps} steps, {ranks} ranks{where}")
            secs = self._launch(cmd, os.path.join(rdir, "train.log"), what, shaped=rate is not None)
            if not os.path.isfile(os.path.join(rdir, "summary.json")):
                raise ExperimentError(f"{what}: igrad train exited 0 but wrote no summary.json "
                                      f"in {rdir}")
            if not keep_checkpoint:
                # Only the base is read again; checkpoints are ~60 MB a run.
                shutil.rmtree(os.path.join(rdir, "checkpoint"), ignore_errors=True)
            write_text(stamp_path, json.dumps(stamp, indent=1, sort_keys=True) + "\n")
            self.executed += 1
            run = Run(rdir, label)
            self.log(f"{label}: done in {secs:.0f} s, val loss {run.final['val_loss']:.4f}, "
                     f"payload {fmt_bytes(run.payload)}/step")
        if not run.summary.get("complete", True):
            raise ExperimentError(f"{what}: the run in {rdir} is incomplete")
        self.used.append((label, run))
        return run

    @staticmethod
    def _finished(rdir, stamp_path, stamp):
        try:
            with open(stamp_path) as f:
                if json.load(f) != json.loads(json.dumps(stamp)):
                    return False
            with open(os.path.join(rdir, "summary.json")) as f:
                return bool(json.load(f).get("complete", False))
        except (OSError, ValueError):
            return False

    # ---- the base ----
    def base(self, size=None):
        """The checkpoint every post-train starts from: --base, or a base
        pretrained once per mode and model size (dense, on Brown genres
        other than the workloads) and cached under exp_shared. size=None:
        the mode's (or --size's) preset."""
        size = size or self.cfg["size"]
        if self.base_given and size == self.cfg["size"]:
            return self.base_given
        bases = self.__dict__.setdefault("_bases", {})
        if size in bases:
            return bases[size]
        c = self.cfg
        data = "gen:base" if self.mode == "smoke" else BASE_DATA
        run = self.train("base" if size == c["size"] else f"base-{size}", "dense", data,
                         seed=1337, steps=c["base_steps"],
                         size=size, lr=c["base_lr"], min_lr=c["base_lr"] / 10,
                         warmup=max(1, c["base_steps"] // 10),
                         eval_every=max(1, c["base_steps"] // 3), keep_checkpoint=True)
        self.used.pop()  # the base is not one of the RQ's runs
        ckpt = os.path.join(run.path, "checkpoint")
        self.check_checkpoint(ckpt)
        bases[size] = ckpt
        return ckpt

    # ---- profiles ----
    def profiling_run(self, data, seed=1, steps=None, label=None, init=None):
        """The adtopk_sync post-train that records rank 0's activity trace
        (from `init`, default the shared base)."""
        steps = steps or self.cfg["profile_steps"]
        run = self.train(label or f"profile-{self.label_of(data)}-s{seed}", "adtopk_sync", data,
                         seed=seed, steps=steps, trace=True, eval_every=0, init=init)
        return run

    def build_profile(self, trace, method="knee", window=None, tag=None):
        """`igrad profile` over a trace; returns (profile.json path, parsed)."""
        name = tag or method.replace(":", "")
        if window:
            name += f"-w{window[0]}_{window[1]}"
        d = os.path.join(os.path.dirname(trace), "profiles")
        os.makedirs(d, exist_ok=True)
        out = os.path.join(d, name + ".json")
        cmd = [self.igrad, "profile", "--trace", trace, "--method", method, "--quiet",
               "--out", out, "--csv", os.path.join(d, name + ".csv")]
        if window:
            cmd += ["--window", f"{window[0]}:{window[1]}"]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise ExperimentError(f"igrad profile --method {method} failed on {trace}: "
                                  f"{(p.stderr or p.stdout).strip()}")
        with open(out) as f:
            return out, json.load(f)

    def shared_profile(self, method="knee", seed=1):
        """The one profile RQ2–RQ5 share: the post-train workload's profiling
        run (seed 1), partitioned by `method`."""
        traces = self.__dict__.setdefault("_traces", {})
        if seed not in traces:
            run = self.profiling_run(self.cfg["data"], seed=seed)
            self.used.pop()
            traces[seed] = os.path.join(run.path, "trace.csv")
        return self.build_profile(traces[seed], method)

    # ---- the five methods, with the same knobs everywhere ----
    @staticmethod
    def ig_extra(release_period=4, release_keep=0.25, residual="on", pack="contiguous",
                 buckets=4, schedule="staggered"):
        """igrad train flags of an `ig` run. Always spelled out in the same
        order, so identical runs of different RQs share one cached run."""
        return ["--sparsifier", "adtopk", "--release-period", str(release_period),
                "--release-keep", repr(float(release_keep)), "--residual", residual,
                "--schedule", schedule, "--pack", pack, "--buckets", str(buckets)]

    def method_run(self, method, seed, profile=None, label=None, extra_flags=(), **kw):
        """dense / topk_sync / adtopk_sync / iad / ig on the post-train
        workload from the base; iad and ig on ADTopk with `profile`; ig's
        knobs in kw (see ig_extra), the rest goes to train()."""
        ig_kw = {k: kw.pop(k) for k in ("release_period", "release_keep", "residual", "pack",
                                        "buckets", "schedule") if k in kw}
        extra = []
        if method in ("iad", "ig"):
            if not profile:
                raise ExperimentError(f"{method} needs a profile")
            extra = ["--sparsifier", "adtopk"] if method == "iad" else self.ig_extra(**ig_kw)
        elif ig_kw:
            raise ExperimentError(f"{method} takes no ig knobs ({', '.join(ig_kw)})")
        else:
            profile = None
        return self.train(label or f"{method}-s{seed}", method, self.cfg["data"], seed=seed,
                          profile=profile, extra=extra + list(extra_flags), **kw)

    def task_run(self, method, seed):
        """One method on the mode's task workload: response-only loss, rows
        of TASK_SEQ_LEN tokens, the mode's task batch and steps, TASK_LR;
        evaluated (val loss, exact match) at the end and halfway. From the
        shared base, or a fresh model of the mode's task_size if it has one.
        iad and ig (ADTopk; ig with ig_extra's knobs) profile themselves
        online on the task (--profile auto over the mode's profile_steps, at
        most half the run): the user's path, and no profile of another
        layout or workload is needed."""
        c = self.cfg
        steps = c["task_steps"]
        flags = ["--response-only", "--seq-len", str(TASK_SEQ_LEN), "--batch",
                 str(c["task_batch"])]
        if method in ("iad", "ig"):
            flags += ["--profile", "auto", "--profile-steps",
                      str(max(1, min(c["profile_steps"], steps // 2)))]
            flags += ["--sparsifier", "adtopk"] if method == "iad" else self.ig_extra()
        return self.train(f"{method}-task-s{seed}", method, c["task"], seed=seed, steps=steps,
                          extra=flags, lr=TASK_LR, eval_every=max(1, steps // 2),
                          size=c.get("task_size"))

    # ---- netem ----
    def netem_check(self):
        """None when run-shaped can shape here, else its refusal message."""
        p = subprocess.run([RUN_SHAPED, "--check"], capture_output=True, text=True)
        if p.returncode == 0:
            return None
        return (p.stderr or p.stdout).strip() or f"run-shaped --check exited {p.returncode}"

    # ---- the end ----
    def finish(self, summary_lines, figures=()):
        """Writes runs.csv, the runs/ symlinks and summary.md; prints where."""
        links = os.path.join(self.out, "runs")
        shutil.rmtree(links, ignore_errors=True)
        os.makedirs(links)
        rows, seen = [], set()
        for label, run in self.used:
            rows.append({"label": label, "method": run.summary.get("method"),
                         "run_dir": os.path.relpath(run.path, self.out)})
            if label not in seen:
                seen.add(label)
                os.symlink(os.path.relpath(run.path, links), os.path.join(links, label))
        write_csv(os.path.join(self.out, "runs.csv"), ["label", "method", "run_dir"], rows)
        wall = time.time() - self.t0
        load1 = os.getloadavg()
        c = self.cfg
        head = [f"Mode `{self.mode}`: model "
                f"{'from ' + self.base_given if self.base_given else c['size'] + ' (base pretrained ' + str(c['base_steps']) + ' steps, dense)'}"
                f", {c['ranks']} ranks, {c['steps']} post-training steps, global batch "
                f"{c['batch']} x {c['seq_len']} tokens, density {DENSITY}, seeds "
                f"{', '.join(map(str, self.seeds))}.",
                f"Wall time {wall:.0f} s ({self.executed} runs executed, {self.reused} reused "
                f"from the cache); load average {self.load0[0]:.1f} at the start, "
                f"{load1[0]:.1f} at the end, on {os.cpu_count()} cores.", ""]
        text = "\n".join(head + list(summary_lines)) + "\n"
        write_text(os.path.join(self.out, "summary.md"), text)
        self.log(f"done in {wall:.0f} s: {os.path.join(self.out, 'summary.md')}"
                 + (f", {', '.join(os.path.basename(f) for f in figures)}" if figures else ""))


ENV_HELP = """environment: IGRAD_EXP_MODE (smoke|quick|full), IGRAD_EXP_SIZE,
IGRAD_EXP_STEPS, IGRAD_EXP_SEEDS, IGRAD_EXP_RANKS, IGRAD_EXP_BASE,
IGRAD_EXP_RUNS (output root), IGRAD_EXP_MPIRUN, IGRAD (binary),
IGRAD_DATA_DIR (corpora, as igrad train). Flags win over the environment."""


# ---------------------------------------------------------------------------
# Generated corpora (smoke mode: no corpus download needed)
# ---------------------------------------------------------------------------

_POOLS = {
    "base": "the a of and to in is was it for on with as by at from that this be are".split(),
    "news": "city council vote mayor police report tax budget election court said today "
            "state week official".split(),
    "fiction": "she he looked door night smiled heart whispered dark room eyes felt love "
               "remembered".split(),
    "learned": "theory results function analysis data method equation observed therefore "
               "sample measure value".split(),
    "verse": "lord thee thou unto shall hath said israel king land house people god "
             "spake".split(),
}


def generated_corpus(root, name):
    """A folder of 12 documents of pseudo-random text drawn from a word pool
    per name (plus common words), written once; deterministic."""
    d = os.path.join(root, name)
    if os.path.isfile(os.path.join(d, ".done")):
        return d
    os.makedirs(d, exist_ok=True)
    pool = _POOLS.get(name, _POOLS["base"]) + _POOLS["base"]
    seed = sum(map(ord, name)) * 2654435761 % 2 ** 31 or 1
    for i in range(12):
        words = []
        for _ in range(500):
            seed = (seed * 1103515245 + 12345) % 2 ** 31
            words.append(pool[(seed >> 16) % len(pool)])
        write_text(os.path.join(d, f"doc{i:02d}.txt"), " ".join(words) + ".\n")
    write_text(os.path.join(d, ".done"), name + "\n")
    return d


def main(body):
    """Runs body() and turns an ExperimentError into exit code 1 with its
    message (no traceback: the message is the point)."""
    try:
        body()
    except ExperimentError as e:
        print(f"{os.path.basename(os.path.dirname(sys.argv[0])) or 'experiment'}: error: {e}",
              file=sys.stderr)
        sys.exit(EXIT_FAIL)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
