/*
 * mpi_train.c — the training loop (trainer/train.c) under mpirun (CTest
 * runs it with -np 2 and -np 4) on the tiny model and a small generated
 * text corpus:
 *   - data parallel: `dense` over all P ranks equals 1 rank (a "self"
 *     communicator on every rank) with the same global batch, parameters
 *     after 5 steps within a stated tolerance; also with response-only
 *     (masked) alpaca data and micro-batches of 1 row, where target counts
 *     differ between micro-batches and ranks;
 *   - resume: `ig` for 20 steps equals 10 steps (stopped with a
 *     checkpoint) + --resume + 10, bit for bit: model, optimizer and every
 *     rank's engine state (residuals) files, and the per-step losses; the
 *     profile comes from a short adtopk_sync run's trace built here;
 *   - learning: 50 steps lower the training and validation loss by a clear
 *     margin, eval numbers finite;
 *   - the parameter check: one ulp of difference on one rank fails every
 *     rank with a message naming it;
 *   - options agree: one rank with another --data, --save-every, --steps,
 *     --stop-at, --eval-every, --batch or --seq-len fails every rank with
 *     IGRAD_E_MISMATCH naming the option and both values (before: a hang,
 *     MPI_ERR_TRUNCATE, or silently accepted); --threads/--progress may
 *     differ;
 *   - --ef-on update: sparse on P ranks keeps the parameters identical on
 *     every rank (each rank's own hash, and the evaluation's parameter
 *     check) and differs from --ef-on grad; on 1 rank with dense it equals
 *     --ef-on grad to float rounding (old + (new - old) vs new); --resume
 *     with it is refused;
 *   - failures agree: missing data on every rank, a batch P does not divide, iad without a profile, a
 *     profile of another model, a resume with another batch: the same
 *     non-OK status on every rank, no hang, and no checkpoint directory.
 *
 * Every check runs on every rank and only counts failures; the counts are
 * summed at the end and every rank exits nonzero if any check failed.
 */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <math.h>
#include <mpi.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint.h"
#include "igrad.h"
#include "model.h"
#include "train.h"

static int failures;
static int me, np;

#define CHECK(cond, ...)                                                                \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            failures++;                                                                 \
            fprintf(stderr, "[rank %d] %s:%d: %s: ", me, __FILE__, __LINE__, #cond);     \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
        }                                                                               \
    } while (0)

#define CHECK_OK(call)                                                                  \
    do {                                                                                \
        igrad_status_t s_ = (call);                                                     \
        CHECK(s_ == IGRAD_OK, "%s returned %s: %s", #call, igrad_status_str(s_),        \
              trainer_last_error());                                                    \
    } while (0)

static char root[512]; /* shared temporary directory (rank 0 made it) */

static char *pathf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A formatted path that stays valid for the whole test (never freed:
 * options keep pointers to these). */
static char *pathf(const char *fmt, ...)
{
    char *b = malloc(1024);
    if (!b) abort();
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(b, 1024, fmt, ap);
    va_end(ap);
    return b;
}

/* A corpus of `ndocs` files of pseudo-sentences over a small vocabulary, so
 * the tiny model has something learnable. Deterministic. */
static void write_corpus(const char *dir, int ndocs, int words_per_doc)
{
    static const char *words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "dog",
                                  "ran", "to", "red", "house", "in", "sun", "was", "big"};
    uint64_t s = 42;
    mkdir(dir, 0755);
    for (int d = 0; d < ndocs; d++) {
        char name[1100];
        snprintf(name, sizeof name, "%s/doc%02d.txt", dir, d);
        FILE *fp = fopen(name, "w");
        if (!fp) abort();
        for (int w = 0; w < words_per_doc; w++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            fputs(words[(s >> 33) % 16], fp);
            fputs((w + 1) % 9 == 0 ? ".\n" : " ", fp);
        }
        fclose(fp);
    }
}

/* Alpaca-style JSONL whose prompts and responses vary in length, so with
 * --response-only every micro-batch and rank counts a different number of
 * targets. */
static void write_alpaca(const char *path, int nrecords)
{
    static const char *words[] = {"alpha", "beta", "gamma", "delta", "eps", "zeta", "eta",
                                  "theta"};
    uint64_t s = 99;
    FILE *fp = fopen(path, "w");
    if (!fp) abort();
    for (int r = 0; r < nrecords; r++) {
        fputs("{\"instruction\": \"", fp);
        for (int i = 0, n = 2 + r * 7 % 23; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            fprintf(fp, "%s%s", i ? " " : "", words[(s >> 33) % 8]);
        }
        fputs("\", \"input\": \"\", \"output\": \"", fp);
        for (int i = 0, n = 1 + r * 5 % 17; i < n; i++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            fprintf(fp, "%s%s", i ? " " : "", words[(s >> 33) % 8]);
        }
        fputs("\"}\n", fp);
    }
    fclose(fp);
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)flag;
    (void)f;
    return remove(p);
}

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return NULL;
    fseek(fp, 0, SEEK_END);
    long len = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    unsigned char *buf = malloc(len > 0 ? (size_t)len : 1);
    *n = buf ? fread(buf, 1, (size_t)len, fp) : 0;
    fclose(fp);
    return buf;
}

/* Files equal byte for byte (reports the first difference). */
static void check_same_file(const char *a, const char *b)
{
    size_t na = 0, nb = 0;
    unsigned char *x = read_all(a, &na), *y = read_all(b, &nb);
    CHECK(x && y, "cannot read %s or %s", a, b);
    if (x && y) {
        CHECK(na == nb, "%s has %zu bytes, %s has %zu", a, na, b, nb);
        if (na == nb) {
            for (size_t i = 0; i < na; i++)
                if (x[i] != y[i]) {
                    CHECK(x[i] == y[i], "%s and %s differ first at byte %zu (%u vs %u)", a, b, i,
                          x[i], y[i]);
                    break;
                }
        }
    }
    free(x);
    free(y);
}

static void base_options(train_options_t *o, const char *out)
{
    train_options_default(o);
    o->data = pathf("%s/corpus", root);
    o->out = out;
    o->seq_len = 32;
    o->batch = 8;
    o->steps = 5;
    o->eval_every = 0;
    o->eval_batches = 2;
    o->val_fraction = 0.2;
    o->threads = 1; /* bitwise comparisons need a fixed thread count */
    o->progress = TRAIN_PROGRESS_QUIET;
    o->seed = 7;
}

/* ------------------------------------------------------------------------ */

/* Tolerance: the two runs add the same per-token gradients in a different
 * order (one mean over 8 rows vs the average of P means over 8/P rows), so
 * gradients differ by float rounding (~1e-7 relative). AdamW normalises
 * each update by sqrt(v), which keeps those differences at rounding level
 * unless a gradient entry is itself at rounding level; 5 steps at lr 1e-3
 * move parameters by up to ~5e-3, and we allow 2e-5 absolute (0.4 % of the
 * largest possible move) per entry. */
#define DP_TOL 2e-5

static void test_data_parallel(igrad_comm_t *world)
{
    igrad_comm_t *self = NULL;
    CHECK_OK(igrad_comm_create_self(&self));
    train_options_t o;
    train_result_t r1, rp;

    base_options(&o, pathf("%s/dp1.rank%d", root, me)); /* each rank its own 1-rank run */
    CHECK_OK(train_run(&o, self, &r1));
    model_t *m1 = NULL, *mp = NULL;
    CHECK_OK(checkpoint_load_model(pathf("%s/dp1.rank%d/checkpoint", root, me), &m1));

    base_options(&o, pathf("%s/dpP", root));
    CHECK_OK(train_run(&o, world, &rp));
    CHECK_OK(checkpoint_load_model(pathf("%s/dpP/checkpoint", root), &mp));

    if (m1 && mp) {
        double maxdiff = 0, maxmove = 0;
        int64_t worst = 0;
        for (int64_t i = 0; i < m1->num_params; i++) {
            double d = fabs((double)m1->params[i] - (double)mp->params[i]);
            if (d > maxdiff) maxdiff = d, worst = i;
        }
        model_t *m0 = NULL; /* initial weights: how far training moved them */
        if (model_create(&m1->config, &m0) == IGRAD_OK) {
            model_init_random(m0, o.seed, o.init_std);
            for (int64_t i = 0; i < m1->num_params; i++) {
                double d = fabs((double)m1->params[i] - (double)m0->params[i]);
                if (d > maxmove) maxmove = d;
            }
            model_free(m0);
        }
        CHECK(maxdiff <= DP_TOL,
              "dense on %d ranks vs 1 rank: max |param difference| %.3g at entry %lld "
              "(1 rank %.9g, %d ranks %.9g), tolerance %.1g", np, maxdiff, (long long)worst,
              m1->params[worst], np, mp->params[worst], DP_TOL);
        CHECK(maxmove > 1e-3, "training moved parameters by only %.3g: the comparison is void",
              maxmove);
        if (me == 0)
            printf("data parallel: %d ranks vs 1: max |diff| %.3g (moved up to %.3g)\n", np,
                   maxdiff, maxmove);
        CHECK(fabs(r1.last_loss - rp.last_loss) < 1e-4, "last loss %.9g (1 rank) vs %.9g",
              r1.last_loss, rp.last_loss);
    }
    model_free(m1);
    model_free(mp);
    igrad_comm_free(self);
}

/* Gradient accumulation and masked targets: with --response-only the
 * ranks' and micro-batches' target counts differ, and the step must still
 * be the gradient of the global mean loss. P ranks accumulating over
 * micro-batches of 1 row must equal 1 rank taking all 8 rows at once (same
 * tolerance and reason as above); weighting each micro-batch or rank
 * equally instead would miss by far more. */
static void test_masked_accumulation(igrad_comm_t *world)
{
    igrad_comm_t *self = NULL;
    CHECK_OK(igrad_comm_create_self(&self));
    train_options_t o;
    train_result_t r1, rp;
    model_t *m1 = NULL, *mp = NULL;

    base_options(&o, pathf("%s/acc1.rank%d", root, me));
    o.data = pathf("alpaca:%s/alpaca.jsonl", root);
    o.response_only = 1;
    o.seq_len = 24;
    CHECK_OK(train_run(&o, self, &r1));
    CHECK_OK(checkpoint_load_model(pathf("%s/acc1.rank%d/checkpoint", root, me), &m1));

    base_options(&o, pathf("%s/accP", root));
    o.data = pathf("alpaca:%s/alpaca.jsonl", root);
    o.response_only = 1;
    o.seq_len = 24;
    o.micro_batch = 1;
    CHECK_OK(train_run(&o, world, &rp));
    CHECK_OK(checkpoint_load_model(pathf("%s/accP/checkpoint", root), &mp));
    if (m1 && mp) {
        double maxdiff = 0;
        for (int64_t i = 0; i < m1->num_params; i++) {
            double d = fabs((double)m1->params[i] - (double)mp->params[i]);
            if (d > maxdiff) maxdiff = d;
        }
        CHECK(maxdiff <= DP_TOL, "response-only, %d ranks x micro-batch 1 vs 1 rank: max "
              "|param difference| %.3g, tolerance %.1g", np, maxdiff, DP_TOL);
        CHECK(fabs(r1.first_loss - rp.first_loss) < 1e-5, "first loss %.9g (1 rank) vs %.9g",
              r1.first_loss, rp.first_loss);
        if (me == 0)
            printf("masked accumulation: %d ranks x micro-batch 1 vs 1 rank: max |diff| %.3g\n",
                   np, maxdiff);
    }
    model_free(m1);
    model_free(mp);
    igrad_comm_free(self);
}

/* A profile of the tiny model from a short adtopk_sync run's trace. */
static void make_profile(igrad_comm_t *world, const char *profile_path)
{
    train_options_t o;
    train_result_t res;
    base_options(&o, pathf("%s/prof", root));
    o.method = "adtopk_sync";
    o.steps = 8;
    o.trace = pathf("%s/trace.csv", root);
    CHECK_OK(train_run(&o, world, &res));
    int ok = 1;
    if (me == 0) {
        igrad_trace_t *tr = NULL;
        igrad_profile_t *pf = NULL;
        igrad_profile_options_t po = IGRAD_PROFILE_OPTIONS_INIT;
        ok = igrad_trace_load(o.trace, &tr) == IGRAD_OK &&
             igrad_trace_step_count(tr) == 8 &&
             igrad_profile_build(tr, &po, &pf) == IGRAD_OK &&
             igrad_profile_save_json(pf, profile_path) == IGRAD_OK;
        CHECK(ok, "profile from %s: %s", o.trace, igrad_last_error());
        igrad_profile_free(pf);
        igrad_trace_free(tr);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
}

/* Losses of metrics.csv, in step order (at most cap). */
static int read_losses(const char *path, double *loss, int cap)
{
    FILE *fp = fopen(path, "r");
    char line[1024];
    int n = 0;
    if (!fp) return -1;
    if (!fgets(line, sizeof line, fp)) n = -1;
    while (n >= 0 && n < cap && fgets(line, sizeof line, fp)) {
        char *c = strchr(line, ',');
        c = c ? strchr(c + 1, ',') : NULL;
        loss[n++] = c ? strtod(c + 1, NULL) : NAN;
    }
    fclose(fp);
    return n;
}

static void test_resume(igrad_comm_t *world, const char *profile_path)
{
    train_options_t o;
    train_result_t a, b1, b2;
    base_options(&o, pathf("%s/resA", root));
    o.method = "ig";
    o.profile = profile_path;
    o.steps = 20;
    o.eval_every = 10;
    o.verify_every = 5;
    CHECK_OK(train_run(&o, world, &a));

    base_options(&o, pathf("%s/resB", root));
    o.method = "ig";
    o.profile = profile_path;
    o.steps = 20;
    o.eval_every = 10;
    o.verify_every = 5;
    o.stop_at = 10;
    CHECK_OK(train_run(&o, world, &b1));
    CHECK(b1.steps_done == 10, "stop_at 10 ran %lld steps", (long long)b1.steps_done);
    o.stop_at = 0;
    o.resume = 1;
    CHECK_OK(train_run(&o, world, &b2));
    CHECK(b2.start_step == 10 && b2.steps_done == 20, "resume ran steps %lld..%lld",
          (long long)b2.start_step, (long long)b2.steps_done);
    CHECK(a.param_hash == b2.param_hash, "parameter hash %016llx (20 steps) vs %016llx (10 + "
          "resume + 10)", (unsigned long long)a.param_hash, (unsigned long long)b2.param_hash);

    MPI_Barrier(MPI_COMM_WORLD); /* rank 0's files are complete */
    const char *A = pathf("%s/resA/checkpoint", root), *B = pathf("%s/resB/checkpoint", root);
    check_same_file(pathf("%s/model.safetensors", A), pathf("%s/model.safetensors", B));
    check_same_file(pathf("%s/optimizer.safetensors", A), pathf("%s/optimizer.safetensors", B));
    /* Each rank checks its own residuals. */
    check_same_file(pathf("%s/engine.rank%d.bin", A, me), pathf("%s/engine.rank%d.bin", B, me));

    double la[32], lb[32];
    int na = read_losses(pathf("%s/resA/metrics.csv", root), la, 32);
    int nb = read_losses(pathf("%s/resB/metrics.csv", root), lb, 32);
    CHECK(na == 20 && nb == 20, "metrics.csv rows: %d uninterrupted, %d resumed (want 20)", na,
          nb);
    for (int i = 0; i < na && i < nb; i++)
        if (la[i] != lb[i]) {
            CHECK(la[i] == lb[i], "step %d loss %.9g uninterrupted vs %.9g resumed", i, la[i],
                  lb[i]);
            break;
        }

    /* A resume that would change the data stream is refused everywhere. */
    o.batch = 16;
    o.steps = 30;
    igrad_status_t st = train_run(&o, world, &b2);
    CHECK(st == IGRAD_E_MISMATCH, "resume with another --batch: %s (%s)", igrad_status_str(st),
          trainer_last_error());
}

static void test_learning(igrad_comm_t *world)
{
    train_options_t o;
    train_result_t res;
    base_options(&o, pathf("%s/learn", root));
    o.steps = 50;
    o.eval_every = 25;
    o.optim.lr = 3e-3;
    o.optim.min_lr = 3e-4;
    o.optim.warmup_steps = 5;
    CHECK_OK(train_run(&o, world, &res));
    CHECK(isfinite(res.first_loss) && isfinite(res.last_loss) &&
              res.last_loss < res.first_loss - 1.0,
          "training loss %.4f -> %.4f over 50 steps (want a drop of more than 1 nat)",
          res.first_loss, res.last_loss);
    CHECK(isfinite(res.val_loss) && isfinite(res.val_ppl) && isfinite(res.val_acc),
          "eval numbers not finite: loss %g ppl %g acc %g", res.val_loss, res.val_ppl,
          res.val_acc);
    CHECK(res.val_acc > 0.2 && res.val_acc <= 1.0, "val_acc %.4f", res.val_acc);
    CHECK(fabs(res.val_ppl - exp(res.val_loss)) < 1e-9 * res.val_ppl, "ppl %.9g vs exp(loss) %.9g",
          res.val_ppl, exp(res.val_loss));
    /* The byte model starts near ln(257) = 5.55 nats. */
    CHECK(res.val_loss < 3.5, "val_loss %.4f after 50 steps", res.val_loss);
}

/* The evaluation's parameter check: equal buffers pass; one entry changed
 * on the last rank fails on every rank, naming that rank. */
static void test_param_check(igrad_comm_t *world)
{
    float p[1000];
    for (int i = 0; i < 1000; i++) p[i] = (float)i * 0.25f - 7.0f;
    CHECK_OK(train_check_same_params(world, p, 1000, 3));
    if (me == np - 1) p[517] = nextafterf(p[517], 1e9f); /* one ulp */
    igrad_status_t st = train_check_same_params(world, p, 1000, 3);
    char needle[32];
    snprintf(needle, sizeof needle, "rank %d differ", np - 1);
    CHECK(st == IGRAD_E_MISMATCH && strstr(trainer_last_error(), needle),
          "one ulp on rank %d: %s (%s)", np - 1, igrad_status_str(st), trainer_last_error());
}

/* A failure expected on every rank: the same status, and no checkpoint. */
static void expect_failure(igrad_comm_t *world, train_options_t *o, igrad_status_t want,
                           const char *what, const char *needle)
{
    train_result_t res;
    igrad_status_t st = train_run(o, world, &res);
    CHECK(st == want, "%s: status %s, expected %s (%s)", what, igrad_status_str(st),
          igrad_status_str(want), trainer_last_error());
    CHECK(!needle || strstr(trainer_last_error(), needle), "%s: message '%s' lacks '%s'", what,
          trainer_last_error(), needle);
    int got = (int)st, lo = 0, hi = 0;
    MPI_Allreduce(&got, &lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&got, &hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lo == hi, "%s: ranks disagree on the status (%d..%d)", what, lo, hi);
    struct stat sb;
    CHECK(stat(pathf("%s/checkpoint", o->out), &sb) != 0, "%s: a checkpoint was left in %s",
          what, o->out);
}

/* --ef-on update: every rank takes its own AdamW step on its local
 * gradient and the engine syncs the update, so the parameters must still
 * be identical on every rank; on one rank with dense the synced update is
 * the local one and the run equals --ef-on grad up to the rounding of
 * old + (new - old), one ulp per entry and step (5 steps: 1e-6 allowed
 * where parameters are below 1 in magnitude). */
static void test_ef_on_update(igrad_comm_t *world)
{
    train_options_t o;
    train_result_t upd, grad;
    base_options(&o, pathf("%s/efu", root));
    o.method = "adtopk_sync";
    o.ef_on_update = 1;
    o.steps = 6;
    o.eval_every = 3; /* each evaluation checks the parameters agree */
    CHECK_OK(train_run(&o, world, &upd));
    uint64_t *hashes = calloc((size_t)np, sizeof *hashes);
    MPI_Allgather(&upd.param_hash, 1, MPI_UINT64_T, hashes, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int q = 1; q < np; q++)
        CHECK(hashes[q] == hashes[0], "--ef-on update: rank %d's parameters hash to %016llx, "
              "rank 0's to %016llx", q, (unsigned long long)hashes[q],
              (unsigned long long)hashes[0]);
    free(hashes);
    CHECK(isfinite(upd.last_loss) && isfinite(upd.val_loss), "--ef-on update: loss %g, val %g",
          upd.last_loss, upd.val_loss);
    base_options(&o, pathf("%s/efg", root));
    o.method = "adtopk_sync";
    o.steps = 6;
    o.eval_every = 3;
    CHECK_OK(train_run(&o, world, &grad));
    CHECK(grad.param_hash != upd.param_hash, "--ef-on update changed nothing");

    igrad_comm_t *self = NULL;
    CHECK_OK(igrad_comm_create_self(&self));
    model_t *mu = NULL, *mg = NULL;
    base_options(&o, pathf("%s/efu1.rank%d", root, me));
    o.ef_on_update = 1;
    CHECK_OK(train_run(&o, self, &upd));
    CHECK_OK(checkpoint_load_model(pathf("%s/efu1.rank%d/checkpoint", root, me), &mu));
    base_options(&o, pathf("%s/efg1.rank%d", root, me));
    CHECK_OK(train_run(&o, self, &grad));
    CHECK_OK(checkpoint_load_model(pathf("%s/efg1.rank%d/checkpoint", root, me), &mg));
    if (mu && mg) {
        double maxdiff = 0;
        for (int64_t i = 0; i < mu->num_params; i++) {
            double d = fabs((double)mu->params[i] - (double)mg->params[i]);
            if (d > maxdiff) maxdiff = d;
        }
        CHECK(maxdiff <= 1e-6, "dense on 1 rank: --ef-on update vs grad: max |diff| %.3g", maxdiff);
        if (me == 0) printf("ef on update, dense, 1 rank vs --ef-on grad: max |diff| %.3g\n", maxdiff);
    }
    model_free(mu);
    model_free(mg);
    igrad_comm_free(self);

    base_options(&o, pathf("%s/efu_resume", root));
    o.ef_on_update = 1;
    o.resume = 1;
    expect_failure(world, &o, IGRAD_E_INVALID, "--resume with --ef-on update", "--ef-on update");
}

static void test_failures(igrad_comm_t *world, const char *profile_path)
{
    train_options_t o;

    base_options(&o, pathf("%s/fail1", root));
    o.data = pathf("%s/no-such-corpus", root);
    expect_failure(world, &o, IGRAD_E_IO, "missing data", "no-such-corpus");

    /* Another --data on one rank (here: one that does not exist) is
     * caught by the option agreement before anything is read, naming both
     * values on every rank. */
    base_options(&o, pathf("%s/fail2", root));
    if (me == np - 1) o.data = pathf("%s/missing-on-one-rank", root);
    char needle[1200];
    snprintf(needle, sizeof needle, "--data differs: rank 0 has %s/corpus, rank %d has "
             "%s/missing-on-one-rank", root, np - 1, root);
    expect_failure(world, &o, IGRAD_E_MISMATCH, "data differs on the last rank", needle);

    /* Options that change the sequence of collectives (a hang or an MPI
     * error before they were compared) or the run: one rank differs. */
    static const struct {
        const char *flag;
        size_t offset;
        int64_t value, other;
    } differ[] = {
        {"--save-every", offsetof(train_options_t, save_every), 2, 3},
        {"--steps", offsetof(train_options_t, steps), 6, 5},
        {"--stop-at", offsetof(train_options_t, stop_at), 0, 2},
        {"--eval-every", offsetof(train_options_t, eval_every), 2, 0},
    };
    for (size_t i = 0; i < sizeof differ / sizeof differ[0]; i++) {
        base_options(&o, pathf("%s/fail_opt%zu", root, i));
        int64_t v = me == np - 1 ? differ[i].other : differ[i].value;
        memcpy((char *)&o + differ[i].offset, &v, sizeof v);
        snprintf(needle, sizeof needle, "%s differs: rank 0 has %lld, rank %d has %lld",
                 differ[i].flag, (long long)differ[i].value, np - 1, (long long)differ[i].other);
        expect_failure(world, &o, IGRAD_E_MISMATCH, differ[i].flag, needle);
    }
    base_options(&o, pathf("%s/fail_batch", root));
    int b0 = o.batch;
    if (me == np - 1) o.batch = 2 * b0;
    snprintf(needle, sizeof needle, "--batch differs: rank 0 has %d, rank %d has %d", b0, np - 1,
             2 * b0);
    expect_failure(world, &o, IGRAD_E_MISMATCH, "--batch", needle);
    base_options(&o, pathf("%s/fail_seq", root));
    int t0 = o.seq_len;
    if (me == np - 1) o.seq_len = t0 / 2;
    snprintf(needle, sizeof needle, "--seq-len differs: rank 0 has %d, rank %d has %d", t0, np - 1,
             t0 / 2);
    expect_failure(world, &o, IGRAD_E_MISMATCH, "--seq-len", needle);
    /* Legitimately per rank: threads and progress do not fail the run. */
    base_options(&o, pathf("%s/per_rank", root));
    o.steps = 2;
    if (me == np - 1) {
        o.threads = 2;
        o.progress = TRAIN_PROGRESS_PLAIN;
        o.log_every = 1;
    }
    train_result_t pr;
    CHECK_OK(train_run(&o, world, &pr));

    base_options(&o, pathf("%s/fail3", root));
    o.batch = np == 2 ? 5 : 6;
    expect_failure(world, &o, IGRAD_E_INVALID, "batch not divisible", "not divisible");

    base_options(&o, pathf("%s/fail4", root));
    o.method = "iad";
    expect_failure(world, &o, IGRAD_E_INVALID, "iad without a profile", "--profile");

    base_options(&o, pathf("%s/fail5", root));
    o.method = "ig";
    o.profile = profile_path;
    o.model.n_layer = 3; /* another model than the profile's */
    expect_failure(world, &o, IGRAD_E_MISMATCH, "profile of another model", "another model");
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    if (me == 0) {
        const char *tmp = getenv("TMPDIR");
        snprintf(root, sizeof root, "%s/igrad-mpi-train-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        if (!mkdtemp(root)) {
            perror("mkdtemp");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
        write_corpus(pathf("%s/corpus", root), 12, 600);
        write_alpaca(pathf("%s/alpaca.jsonl", root), 60);
    }
    MPI_Bcast(root, sizeof root, MPI_CHAR, 0, MPI_COMM_WORLD);

    igrad_comm_t *world = NULL;
    if (igrad_comm_create_mpi(NULL, &world) != IGRAD_OK) {
        fprintf(stderr, "[rank %d] igrad_comm_create_mpi: %s\n", me, igrad_last_error());
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *profile = pathf("%s/profile.json", root);
    char profile_path[1024];
    snprintf(profile_path, sizeof profile_path, "%s", profile);

    test_data_parallel(world);
    test_masked_accumulation(world);
    make_profile(world, profile_path);
    test_resume(world, profile_path);
    test_learning(world);
    test_failures(world, profile_path);
    test_ef_on_update(world);
    test_param_check(world);

    igrad_comm_free(world);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) {
        if (total == 0) nftw(root, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        else fprintf(stderr, "mpi_train: %d failed checks; files kept in %s\n", total, root);
        printf("mpi_train (np %d): %s\n", np, total ? "FAILED" : "ok");
    }
    MPI_Finalize();
    return total ? 1 : 0;
}
