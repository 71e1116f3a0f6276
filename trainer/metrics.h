/*
 * metrics.h — what a training run records (DESIGN.md §5 "Run metrics"):
 * one CSV row per step (metrics.csv), one row per evaluation (eval.csv),
 * the statistics of those rows for summary.json, and a crash-safe JSON/text
 * writer.
 *
 *   metrics.csv  step,method,loss,payload_bytes,wire_bytes,sent_entries,
 *                select_ms,pack_ms,comm_ms,unpack_ms,sync_ms,step_ms,
 *                tokens_per_s,buckets,imbalance,cv,overflow
 *   eval.csv     step,val_loss,val_ppl,val_acc,task_accuracy,task_problems
 *
 * task_accuracy is the exact-match share of the held-out task problems
 * (task.h; nan without a task: workload) and task_problems their number
 * (0 without). An eval.csv of an older run with the four-column header
 * "step,val_loss,val_ppl,val_acc" is accepted on resume; its kept rows are
 * rewritten with task_accuracy nan and task_problems 0.
 *
 * `step` in metrics.csv is the 0-based step that produced the row; in
 * eval.csv it is the number of optimizer steps taken before the evaluation
 * (so "step 0" is the model before training). Only one process (rank 0)
 * writes these files; rows are flushed as they are added, so a crashed run
 * keeps what it measured. On resume, rows of steps at or after the resume
 * step are dropped (they are about to be measured again) and the kept rows
 * are read back, so the summary covers the whole run.
 *
 * Not here: how the numbers are measured (train.c), the config part of the
 * summary (train.c adds it).
 */
#ifndef IGRAD_TRAINER_METRICS_H
#define IGRAD_TRAINER_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cjson/cJSON.h>

#include "igrad.h"

#define METRICS_CSV_HEADER                                                      \
    "step,method,loss,payload_bytes,wire_bytes,sent_entries,select_ms,pack_ms," \
    "comm_ms,unpack_ms,sync_ms,step_ms,tokens_per_s,buckets,imbalance,cv,overflow"
#define METRICS_EVAL_HEADER "step,val_loss,val_ppl,val_acc,task_accuracy,task_problems"
#define METRICS_EVAL_HEADER_V1 "step,val_loss,val_ppl,val_acc"
#define METRICS_CSV_FILE "metrics.csv"
#define METRICS_EVAL_FILE "eval.csv"

/* One step. Byte counts are this rank's payload and the modelled wire bytes
 * of the step's collectives; times are wall-clock milliseconds; imbalance
 * may be +inf (an empty bucket next to a full one). */
typedef struct metrics_row {
    int64_t step;
    double loss;           /* global mean cross-entropy over the step's targets */
    double payload_bytes;
    double wire_bytes;
    double sent_entries;
    double select_ms, pack_ms, comm_ms, unpack_ms, sync_ms;
    double step_ms;        /* the whole step: data, forward/backward, sync, update */
    double tokens_per_s;   /* global tokens of the step / step time */
    int buckets;
    double imbalance, cv;
    int overflow;
} metrics_row_t;

typedef struct metrics_eval {
    int64_t step;          /* optimizer steps taken before this evaluation */
    double val_loss, val_ppl, val_acc;
    double task_accuracy;  /* exact-match share of the task problems, NaN if none */
    int64_t task_problems; /* 0 without a task workload */
} metrics_eval_t;

typedef struct metrics {
    char *method;
    char *csv_path, *eval_path;
    FILE *csv, *eval;
    metrics_row_t *rows;   /* every row of this run (kept ones first on resume) */
    size_t nrows, rows_cap;
    metrics_eval_t *evals;
    size_t nevals, evals_cap;
} metrics_t;

/* Opens DIR/metrics.csv and DIR/eval.csv (DIR must exist). resume_step < 0
 * starts both files afresh; otherwise rows with step < resume_step are
 * kept (for eval.csv: step <= resume_step, since the evaluation at the
 * resume step describes the checkpointed model) and read back, the rest
 * dropped; a missing file is started afresh. @return IGRAD_E_IO,
 * IGRAD_E_FORMAT (a kept file with another header or a malformed row). */
igrad_status_t metrics_open(const char *dir, const char *method, int64_t resume_step,
                            metrics_t **out);

/* Appends a row to the file (flushed) and to memory. */
igrad_status_t metrics_add_step(metrics_t *mt, const metrics_row_t *row);
igrad_status_t metrics_add_eval(metrics_t *mt, const metrics_eval_t *ev);

/* Closes the files and frees everything; NULL is a no-op. */
void metrics_close(metrics_t *mt);

/* Median, mean, min and max of the finite values of one field over the
 * rows (n = how many were finite; all 0 when n is 0). `field` is
 * offsetof(metrics_row_t, <double field>). */
typedef struct metrics_stat {
    double median, mean, min, max;
    size_t n;
} metrics_stat_t;
metrics_stat_t metrics_stat_of(const metrics_t *mt, size_t field);

/* The measured part of summary.json:
 *   "steps_recorded", "loss": {"first","last"},
 *   "per_step": {"<field>": {"median","mean","min","max"}} for payload_bytes,
 *       wire_bytes, sent_entries, select_ms, pack_ms, comm_ms, unpack_ms,
 *       sync_ms, step_ms, tokens_per_s, imbalance, cv,
 *   "tokens_per_s": global tokens / summed step time,
 *   "final": the last eval row, "best": the eval row of least val_loss
 *       ({"step","val_loss","val_ppl","val_acc","task_accuracy",
 *       "task_problems"}; null without evals),
 *   "task_accuracy", "task_problems": the final row's (null, 0 without
 *       evals or without a task),
 *   "eval": [[step, val_loss, val_ppl, val_acc, task_accuracy,
 *       task_problems], ...].
 * Non-finite numbers become null. Added to `root`; @return IGRAD_E_NOMEM. */
igrad_status_t metrics_summary_add(const metrics_t *mt, int64_t tokens_per_step,
                                   cJSON *root);

/* Adds a number, or null when it is not finite (JSON has no inf/NaN). */
cJSON *metrics_json_number(cJSON *obj, const char *key, double v);

/* Writes `text` to `path` crash-safely (temporary name, fsync, rename). */
igrad_status_t metrics_write_text(const char *path, const char *text);

/* Renders `root` (indented) and writes it with metrics_write_text(). */
igrad_status_t metrics_write_json(const char *path, const cJSON *root);

#endif /* IGRAD_TRAINER_METRICS_H */
