/*
 * metrics.c — per-step and evaluation CSV files of a training run, their
 * statistics for summary.json and crash-safe text writing (see metrics.h).
 *
 * Not here: measuring anything (train.c does), MPI (only rank 0 calls
 * this).
 */
#define _POSIX_C_SOURCE 200809L
#include "metrics.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/internal.h" /* igrad__atomic_* */
#include "model.h"         /* trainer_fail */

static char *join(const char *dir, const char *file)
{
    size_t n = strlen(dir) + strlen(file) + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, file);
    return p;
}

igrad_status_t metrics_write_text(const char *path, const char *text)
{
    igrad__atomic_file_t af;
    igrad_status_t st = igrad__atomic_open(&af, path);
    if (st == IGRAD_OK) {
        size_t len = strlen(text);
        if (fwrite(text, 1, len, af.fp) != len) {
            igrad__atomic_abort(&af);
            return trainer_fail(IGRAD_E_IO, "%s: cannot write: %s", path, strerror(errno));
        }
        st = igrad__atomic_commit(&af);
    }
    return st == IGRAD_OK ? st : trainer_fail(st, "%s", igrad_last_error());
}

igrad_status_t metrics_write_json(const char *path, const cJSON *root)
{
    char *text = cJSON_Print(root);
    if (!text) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    size_t n = strlen(text);
    char *withnl = malloc(n + 2);
    if (!withnl) {
        cJSON_free(text);
        return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    }
    memcpy(withnl, text, n);
    withnl[n] = '\n';
    withnl[n + 1] = '\0';
    cJSON_free(text);
    igrad_status_t st = metrics_write_text(path, withnl);
    free(withnl);
    return st;
}

cJSON *metrics_json_number(cJSON *obj, const char *key, double v)
{
    return isfinite(v) ? cJSON_AddNumberToObject(obj, key, v) : cJSON_AddNullToObject(obj, key);
}

/* ------------------------------------------------------------------------ */
/* CSV rows                                                                 */
/* ------------------------------------------------------------------------ */

static void format_double(char *buf, size_t cap, double v)
{
    if (isnan(v)) snprintf(buf, cap, "nan");
    else if (isinf(v)) snprintf(buf, cap, v > 0 ? "inf" : "-inf");
    else snprintf(buf, cap, "%.9g", v);
}

static int write_row(FILE *fp, const char *method, const metrics_row_t *r)
{
    char loss[40], imb[40], cv[40];
    format_double(loss, sizeof loss, r->loss);
    format_double(imb, sizeof imb, r->imbalance);
    format_double(cv, sizeof cv, r->cv);
    int n = fprintf(fp, "%lld,%s,%s,%.0f,%.0f,%.0f,%.4f,%.4f,%.4f,%.4f,%.4f,%.3f,%.1f,%d,%s,%s,%d\n",
                    (long long)r->step, method, loss, r->payload_bytes, r->wire_bytes,
                    r->sent_entries, r->select_ms, r->pack_ms, r->comm_ms, r->unpack_ms,
                    r->sync_ms, r->step_ms, r->tokens_per_s, r->buckets, imb, cv, r->overflow);
    return n > 0 && fflush(fp) == 0;
}

static int write_eval(FILE *fp, const metrics_eval_t *e)
{
    char l[40], p[40], a[40], t[40];
    format_double(l, sizeof l, e->val_loss);
    format_double(p, sizeof p, e->val_ppl);
    format_double(a, sizeof a, e->val_acc);
    format_double(t, sizeof t, e->task_accuracy);
    int n = fprintf(fp, "%lld,%s,%s,%s,%s,%lld\n", (long long)e->step, l, p, a, t,
                    (long long)e->task_problems);
    return n > 0 && fflush(fp) == 0;
}

/* Splits a CSV line in place into at most `max` fields. @return the count. */
static int split_fields(char *line, char **fields, int max)
{
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == max) return max + 1;
        fields[n++] = p;
        char *c = strchr(p, ',');
        if (!c) break;
        *c = '\0';
        p = c + 1;
    }
    return n;
}

static int parse_num(const char *s, double *v)
{
    char *end = NULL;
    errno = 0;
    *v = strtod(s, &end);
    return end != s && *end == '\0';
}

/* An integer in [lo, hi], checked before the conversion (a double out of
 * the target type's range is undefined behaviour). */
static int integral_in(double v, double lo, double hi)
{
    return v >= lo && v <= hi && floor(v) == v;
}

#define STEP_MAX 9007199254740992.0 /* 2^53 */

static int parse_row(char *line, metrics_row_t *r)
{
    char *f[17];
    if (split_fields(line, f, 17) != 17) return 0;
    double v[17];
    for (int i = 0; i < 17; i++)
        if (i != 1 && !parse_num(f[i], &v[i])) return 0;
    if (!integral_in(v[0], 0, STEP_MAX) || !integral_in(v[13], 0, 2147483647.0) ||
        !integral_in(v[16], 0, 2147483647.0))
        return 0;
    memset(r, 0, sizeof *r);
    r->step = (int64_t)v[0];
    r->loss = v[2];
    r->payload_bytes = v[3];
    r->wire_bytes = v[4];
    r->sent_entries = v[5];
    r->select_ms = v[6];
    r->pack_ms = v[7];
    r->comm_ms = v[8];
    r->unpack_ms = v[9];
    r->sync_ms = v[10];
    r->step_ms = v[11];
    r->tokens_per_s = v[12];
    r->buckets = (int)v[13];
    r->imbalance = v[14];
    r->cv = v[15];
    r->overflow = (int)v[16];
    return 1;
}

/* A row of `nfields` fields: 6, or 4 in the older header's files. */
static int parse_eval(char *line, int nfields, metrics_eval_t *e)
{
    char *f[6];
    double v[6] = {0, 0, 0, 0, NAN, 0};
    if (split_fields(line, f, nfields) != nfields) return 0;
    for (int i = 0; i < nfields; i++)
        if (!parse_num(f[i], &v[i])) return 0;
    if (!integral_in(v[0], 0, STEP_MAX) || !integral_in(v[5], 0, STEP_MAX)) return 0;
    e->step = (int64_t)v[0];
    e->val_loss = v[1];
    e->val_ppl = v[2];
    e->val_acc = v[3];
    e->task_accuracy = v[4];
    e->task_problems = (int64_t)v[5];
    return 1;
}

static igrad_status_t push_row(metrics_t *mt, const metrics_row_t *r)
{
    if (mt->nrows == mt->rows_cap) {
        size_t cap = mt->rows_cap ? 2 * mt->rows_cap : 256;
        metrics_row_t *p = realloc(mt->rows, cap * sizeof *p);
        if (!p) return trainer_fail(IGRAD_E_NOMEM, "metrics: out of memory");
        mt->rows = p;
        mt->rows_cap = cap;
    }
    mt->rows[mt->nrows++] = *r;
    return IGRAD_OK;
}

static igrad_status_t push_eval(metrics_t *mt, const metrics_eval_t *e)
{
    if (mt->nevals == mt->evals_cap) {
        size_t cap = mt->evals_cap ? 2 * mt->evals_cap : 32;
        metrics_eval_t *p = realloc(mt->evals, cap * sizeof *p);
        if (!p) return trainer_fail(IGRAD_E_NOMEM, "metrics: out of memory");
        mt->evals = p;
        mt->evals_cap = cap;
    }
    mt->evals[mt->nevals++] = *e;
    return IGRAD_OK;
}

/* Reads the kept rows of an existing file, rewrites it with only those
 * (crash-safely) and reopens it for appending. `eval` selects the file
 * kind. A missing file is created with just the header. */
static igrad_status_t reopen_file(metrics_t *mt, const char *path, int eval, int64_t resume_step,
                                  FILE **fp_out)
{
    const char *header = eval ? METRICS_EVAL_HEADER : METRICS_CSV_HEADER;
    igrad_status_t st = IGRAD_OK;
    char *line = NULL;
    size_t cap = 0;
    char *kept = NULL;
    size_t kept_len = 0, kept_cap = 0;
    FILE *in = NULL;
    int legacy = 0; /* a four-column eval.csv: rows get ",nan,0" */

    kept_cap = strlen(header) + 2;
    kept = malloc(kept_cap);
    if (!kept) return trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
    kept_len = (size_t)snprintf(kept, kept_cap, "%s\n", header);

    if (resume_step >= 0 && (in = fopen(path, "rb")) != NULL) {
        ssize_t len;
        size_t lineno = 0;
        while ((len = getline(&line, &cap, in)) >= 0) {
            lineno++;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
            if (lineno == 1) {
                if (eval && strcmp(line, METRICS_EVAL_HEADER_V1) == 0) {
                    legacy = 1;
                    continue;
                }
                if (strcmp(line, header) != 0) {
                    st = trainer_fail(IGRAD_E_FORMAT, "%s: unexpected header (expected '%s')",
                                      path, header);
                    goto cleanup;
                }
                continue;
            }
            if (len == 0) continue;
            char *copy = malloc((size_t)len + 2);
            if (!copy) {
                st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
                goto cleanup;
            }
            memcpy(copy, line, (size_t)len + 1);
            int keep, ok;
            if (eval) {
                metrics_eval_t e;
                ok = parse_eval(copy, legacy ? 4 : 6, &e);
                keep = ok && e.step <= resume_step;
                if (keep) st = push_eval(mt, &e);
            } else {
                metrics_row_t r;
                ok = parse_row(copy, &r);
                keep = ok && r.step < resume_step;
                if (keep) st = push_row(mt, &r);
            }
            free(copy);
            if (!ok) {
                st = trainer_fail(IGRAD_E_FORMAT, "%s:%zu: malformed row (wrong field count, "
                                  "a non-number, or step, buckets or overflow not an integer "
                                  "in range)", path, lineno);
                goto cleanup;
            }
            if (st != IGRAD_OK) goto cleanup;
            if (!keep) continue;
            if (legacy) {
                static const char tail[] = ",nan,0";
                if ((size_t)len + sizeof tail > cap) {
                    char *p = realloc(line, (size_t)len + sizeof tail);
                    if (!p) {
                        st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
                        goto cleanup;
                    }
                    line = p;
                    cap = (size_t)len + sizeof tail;
                }
                memcpy(line + len, tail, sizeof tail);
                len += (ssize_t)(sizeof tail - 1);
            }
            if (kept_len + (size_t)len + 2 > kept_cap) {
                size_t ncap = 2 * (kept_len + (size_t)len + 2);
                char *p = realloc(kept, ncap);
                if (!p) {
                    st = trainer_fail(IGRAD_E_NOMEM, "%s: out of memory", path);
                    goto cleanup;
                }
                kept = p;
                kept_cap = ncap;
            }
            memcpy(kept + kept_len, line, (size_t)len);
            kept_len += (size_t)len;
            kept[kept_len++] = '\n';
            kept[kept_len] = '\0';
        }
        fclose(in);
        in = NULL;
    }
    st = metrics_write_text(path, kept);
    if (st != IGRAD_OK) goto cleanup;
    /* O_NOFOLLOW: the file was just renamed into place; a link put there
     * since is refused, never appended through. */
    int fd = open(path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
    *fp_out = fd >= 0 ? fdopen(fd, "ab") : NULL;
    if (!*fp_out) {
        st = trainer_fail(IGRAD_E_IO, "%s: cannot open: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
    }
cleanup:
    if (in) fclose(in);
    free(line);
    free(kept);
    return st;
}

igrad_status_t metrics_open(const char *dir, const char *method, int64_t resume_step,
                            metrics_t **out)
{
    *out = NULL;
    igrad_status_t st = IGRAD_OK;
    metrics_t *mt = calloc(1, sizeof *mt);
    if (!mt) return trainer_fail(IGRAD_E_NOMEM, "metrics: out of memory");
    mt->method = malloc(strlen(method) + 1);
    mt->csv_path = join(dir, METRICS_CSV_FILE);
    mt->eval_path = join(dir, METRICS_EVAL_FILE);
    if (!mt->method || !mt->csv_path || !mt->eval_path) {
        st = trainer_fail(IGRAD_E_NOMEM, "metrics: out of memory");
        goto cleanup;
    }
    strcpy(mt->method, method);
    st = reopen_file(mt, mt->csv_path, 0, resume_step, &mt->csv);
    if (st == IGRAD_OK) st = reopen_file(mt, mt->eval_path, 1, resume_step, &mt->eval);
cleanup:
    if (st != IGRAD_OK) {
        metrics_close(mt);
        return st;
    }
    *out = mt;
    return IGRAD_OK;
}

igrad_status_t metrics_add_step(metrics_t *mt, const metrics_row_t *row)
{
    if (!write_row(mt->csv, mt->method, row))
        return trainer_fail(IGRAD_E_IO, "%s: cannot write: %s", mt->csv_path, strerror(errno));
    return push_row(mt, row);
}

igrad_status_t metrics_add_eval(metrics_t *mt, const metrics_eval_t *ev)
{
    if (!write_eval(mt->eval, ev))
        return trainer_fail(IGRAD_E_IO, "%s: cannot write: %s", mt->eval_path, strerror(errno));
    return push_eval(mt, ev);
}

void metrics_close(metrics_t *mt)
{
    if (!mt) return;
    if (mt->csv) fclose(mt->csv);
    if (mt->eval) fclose(mt->eval);
    free(mt->method);
    free(mt->csv_path);
    free(mt->eval_path);
    free(mt->rows);
    free(mt->evals);
    free(mt);
}

/* ------------------------------------------------------------------------ */
/* statistics and summary                                                   */
/* ------------------------------------------------------------------------ */

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

metrics_stat_t metrics_stat_of(const metrics_t *mt, size_t field)
{
    metrics_stat_t s = {0, 0, 0, 0, 0};
    if (!mt || mt->nrows == 0) return s;
    double *v = malloc(mt->nrows * sizeof *v);
    if (!v) return s;
    double sum = 0.0;
    for (size_t i = 0; i < mt->nrows; i++) {
        double x;
        memcpy(&x, (const char *)&mt->rows[i] + field, sizeof x);
        if (!isfinite(x)) continue;
        v[s.n++] = x;
        sum += x;
    }
    if (s.n) {
        qsort(v, s.n, sizeof *v, cmp_double);
        s.median = s.n % 2 ? v[s.n / 2] : 0.5 * (v[s.n / 2 - 1] + v[s.n / 2]);
        s.mean = sum / (double)s.n;
        s.min = v[0];
        s.max = v[s.n - 1];
    }
    free(v);
    return s;
}

static cJSON *eval_object(cJSON *parent, const char *key, const metrics_eval_t *e)
{
    if (!e) return cJSON_AddNullToObject(parent, key);
    cJSON *o = cJSON_AddObjectToObject(parent, key);
    if (!o) return NULL;
    cJSON_AddNumberToObject(o, "step", (double)e->step);
    metrics_json_number(o, "val_loss", e->val_loss);
    metrics_json_number(o, "val_ppl", e->val_ppl);
    metrics_json_number(o, "val_acc", e->val_acc);
    metrics_json_number(o, "task_accuracy", e->task_accuracy);
    cJSON_AddNumberToObject(o, "task_problems", (double)e->task_problems);
    return o;
}

igrad_status_t metrics_summary_add(const metrics_t *mt, int64_t tokens_per_step, cJSON *root)
{
    static const struct {
        const char *name;
        size_t offset;
    } fields[] = {
        {"payload_bytes", offsetof(metrics_row_t, payload_bytes)},
        {"wire_bytes", offsetof(metrics_row_t, wire_bytes)},
        {"sent_entries", offsetof(metrics_row_t, sent_entries)},
        {"select_ms", offsetof(metrics_row_t, select_ms)},
        {"pack_ms", offsetof(metrics_row_t, pack_ms)},
        {"comm_ms", offsetof(metrics_row_t, comm_ms)},
        {"unpack_ms", offsetof(metrics_row_t, unpack_ms)},
        {"sync_ms", offsetof(metrics_row_t, sync_ms)},
        {"step_ms", offsetof(metrics_row_t, step_ms)},
        {"tokens_per_s", offsetof(metrics_row_t, tokens_per_s)},
        {"imbalance", offsetof(metrics_row_t, imbalance)},
        {"cv", offsetof(metrics_row_t, cv)},
    };
    cJSON_AddNumberToObject(root, "steps_recorded", (double)mt->nrows);
    cJSON *loss = cJSON_AddObjectToObject(root, "loss");
    cJSON *per = cJSON_AddObjectToObject(root, "per_step");
    if (!loss || !per) return trainer_fail(IGRAD_E_NOMEM, "summary: out of memory");
    if (mt->nrows) {
        metrics_json_number(loss, "first", mt->rows[0].loss);
        metrics_json_number(loss, "last", mt->rows[mt->nrows - 1].loss);
    } else {
        cJSON_AddNullToObject(loss, "first");
        cJSON_AddNullToObject(loss, "last");
    }
    for (size_t f = 0; f < sizeof fields / sizeof fields[0]; f++) {
        metrics_stat_t s = metrics_stat_of(mt, fields[f].offset);
        cJSON *o = cJSON_AddObjectToObject(per, fields[f].name);
        if (!o) return trainer_fail(IGRAD_E_NOMEM, "summary: out of memory");
        if (s.n == 0) {
            cJSON_AddNullToObject(o, "median");
            cJSON_AddNullToObject(o, "mean");
            cJSON_AddNullToObject(o, "min");
            cJSON_AddNullToObject(o, "max");
            continue;
        }
        metrics_json_number(o, "median", s.median);
        metrics_json_number(o, "mean", s.mean);
        metrics_json_number(o, "min", s.min);
        metrics_json_number(o, "max", s.max);
    }
    /* Throughput of the whole run rather than a per-step median: slow
     * steps (evaluation is not in step_ms, but page faults and the first
     * step's allocations are) should count. */
    double total_ms = 0.0;
    for (size_t i = 0; i < mt->nrows; i++) total_ms += mt->rows[i].step_ms;
    metrics_json_number(root, "tokens_per_s",
                        total_ms > 0 ? (double)tokens_per_step * (double)mt->nrows /
                                           (total_ms / 1000.0)
                                     : NAN);

    const metrics_eval_t *best = NULL;
    for (size_t i = 0; i < mt->nevals; i++)
        if (isfinite(mt->evals[i].val_loss) && (!best || mt->evals[i].val_loss < best->val_loss))
            best = &mt->evals[i];
    if (!eval_object(root, "final", mt->nevals ? &mt->evals[mt->nevals - 1] : NULL) ||
        !eval_object(root, "best", best))
        return trainer_fail(IGRAD_E_NOMEM, "summary: out of memory");
    const metrics_eval_t *fin = mt->nevals ? &mt->evals[mt->nevals - 1] : NULL;
    metrics_json_number(root, "task_accuracy", fin ? fin->task_accuracy : NAN);
    cJSON_AddNumberToObject(root, "task_problems", fin ? (double)fin->task_problems : 0.0);
    cJSON *ev = cJSON_AddArrayToObject(root, "eval");
    if (!ev) return trainer_fail(IGRAD_E_NOMEM, "summary: out of memory");
    for (size_t i = 0; i < mt->nevals; i++) {
        const metrics_eval_t *e = &mt->evals[i];
        cJSON *row = cJSON_CreateArray();
        if (!row) return trainer_fail(IGRAD_E_NOMEM, "summary: out of memory");
        cJSON_AddItemToArray(ev, row);
        double vals[6] = {(double)e->step, e->val_loss, e->val_ppl, e->val_acc,
                          e->task_accuracy, (double)e->task_problems};
        for (int k = 0; k < 6; k++)
            cJSON_AddItemToArray(row, isfinite(vals[k]) ? cJSON_CreateNumber(vals[k])
                                                        : cJSON_CreateNull());
    }
    return IGRAD_OK;
}
