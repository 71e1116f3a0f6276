/*
 * task.h — synthetic instruction tasks for post-training (the `task:` data
 * source of data.h) and their exact-match metric.
 *
 * A problem is an alpaca record (instruction, input, output) of one kind;
 * S is the size option (default 3, the examples are S = 3):
 *   arith    "Calculate." / "47+38" -> "85"  (a, b in [0, 10^S); + or -,
 *            a >= b for -)
 *   sort     "Sort the letters." / "qdmx" -> "dmqx"  (S..S+2 lowercase letters)
 *   reverse  "Reverse the letters." / "kfwb" -> "bwfk"  (S..S+2 letters)
 *   copy     "Repeat the letters." / "zpoeh" -> "zpoeh"  (S..S+3 letters)
 *   recall   "Give the value of k." / "c=4 k=9 a=1 w=0" -> "9"  (S+1 pairs of
 *            distinct letter keys and digit values)
 * Formatted with data.h's alpaca template a record is at most 90 bytes at
 * S = 4, so a problem fits a 128-token row.
 *
 * Spec (the part after "task:"; no spaces, no commas):
 *   KINDS[:train=N][:test=N][:size=S]
 *   KINDS  mix (all five) or KIND[+KIND...], each kind at most once
 *   train  training problems (default 20000, 1..10000000)
 *   test   held-out problems (default 500, 1..100000)
 *   size   difficulty S (default 3, 1..4)
 * Generation is deterministic and depends on the spec only (not on --seed,
 * the rank count or anything else), so every seed of a comparison is scored
 * on the same problems. Instance i (i = 0, 1, ...) is of kind KINDS[i mod K]
 * and its numbers and letters come from a hash of (kind, i).
 *
 * Held-out split by identity: a problem is held out when a hash of its
 * kind and input (its identity: the output is a function of the input)
 * falls below 1/8. Held-out problems never train, whatever the counts, so
 * no test problem can appear in training; duplicates among them are
 * dropped, so the test set is `test` distinct problems. The training set
 * is the first `train` instances that are not held out (repeats allowed).
 * Both are prefixes: a larger count extends them.
 *
 * Exact match: a held-out problem is solved when greedy decoding from its
 * prompt produces exactly the reference output followed by end-of-text.
 * Since each greedy step sees the same prefix as teacher forcing as long as
 * the earlier steps were right, that holds iff the argmax (lowest index on
 * ties) of the teacher-forced logits equals the target at EVERY response
 * position, the final end-of-text included; task_row_exact() computes it
 * from one forward pass.
 *
 * Not here: turning records into tokens and splits (data.c), the forward
 * pass (model.c), evaluation across ranks (train.c).
 */
#ifndef IGRAD_TRAINER_TASK_H
#define IGRAD_TRAINER_TASK_H

#include <stddef.h>
#include <stdint.h>

typedef enum task_kind {
    TASK_ARITH = 0,
    TASK_SORT,
    TASK_REVERSE,
    TASK_COPY,
    TASK_RECALL,
    TASK_NKINDS
} task_kind_t;

#define TASK_DEFAULT_TRAIN 20000
#define TASK_DEFAULT_TEST 500
#define TASK_DEFAULT_SIZE 3
#define TASK_HOLDOUT_FRACTION 0.125

typedef struct task_spec {
    int nkinds;                     /* K */
    task_kind_t kinds[TASK_NKINDS]; /* in spec order */
    size_t ntrain, ntest;
    int size;                       /* S in [1, 4] */
} task_spec_t;

/* One problem; strings are NUL-terminated. */
typedef struct task_problem {
    task_kind_t kind;
    char instruction[32];
    char input[32];
    char output[16];
} task_problem_t;

/* Parses the part of a spec after "task:". On failure writes a sentence
 * naming what is wrong (and the valid kinds or range) into msg.
 * @return 0, or -1. */
int task_spec_parse(const char *arg, task_spec_t *spec, char *msg, size_t cap);

/* Name of a kind ("arith", ...), NULL outside [0, TASK_NKINDS). */
const char *task_kind_name(task_kind_t kind);

/* Instance `index` of `kind` (a pure function of both). */
void task_generate(task_kind_t kind, int size, uint64_t index, task_problem_t *p);

/* The identity hash of a problem (kind and input) and whether it is held
 * out (identity hash below TASK_HOLDOUT_FRACTION of the range). */
uint64_t task_problem_id(const task_problem_t *p);
int task_is_held_out(const task_problem_t *p);

/* The training and held-out problems of a spec, in generation order:
 * (*train)[ntrain], (*test)[ntest], malloc'd (caller frees). *ninstances
 * gets how many instances were generated. @return 0; -1 with a message
 * when memory runs out or the kinds' problem space cannot give `test`
 * distinct held-out problems within 1000 * (train + test) instances. */
int task_build(const task_spec_t *spec, task_problem_t **train, task_problem_t **test,
               uint64_t *ninstances, char *msg, size_t cap);

/* Index of the largest of `n` values, the lowest such index on ties. */
int task_argmax(const float *x, int n);

/* Exact match of one row: 1 when every position t with targets[t] >= 0 has
 * task_argmax(logits + t*V, V) == targets[t] (and at least one does),
 * else 0. logits (T, V), targets (T,). */
int task_row_exact(const float *logits, const int *targets, int T, int V);

#endif /* IGRAD_TRAINER_TASK_H */
