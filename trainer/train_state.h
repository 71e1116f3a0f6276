/*
 * train_state.h — train_state.json, the last file of a trainer checkpoint
 * (docs/formats.md §10): where the run is, what a resume must keep, and
 * every other file's size and checksum. Reading validates the whole file
 * on its own (format, version, every number range-checked before it is
 * converted, 16-digit hex checksums, no \u0000 escape or NUL byte,
 * which cJSON would cut a string at, at most TRAIN_STATE_MAX_NBYTES) and fails with IGRAD_E_FORMAT and a message in
 * trainer_last_error() that names the file and the field. Writing is
 * crash-safe (metrics_write_json) and reads back to the same fields.
 *
 * Not here: whether a run may continue a state (same ranks, data, batch,
 * seq_len, seed and method) and the checks of the files against it; the
 * training command (train.c) does both. Run-independent, so the reader is
 * fuzzed on its own (tests/fuzz_checkpoint.c).
 */
#ifndef IGRAD_TRAINER_TRAIN_STATE_H
#define IGRAD_TRAINER_TRAIN_STATE_H

#include <stddef.h>
#include <stdint.h>

#include "igrad.h"

#define TRAIN_STATE_FORMAT "igrad-train-state"
#define TRAIN_STATE_VERSION 2 /* 1: written before files had checksums */
/* About 100 bytes per rank's engine file entry: 16 MiB is 160k ranks. */
#define TRAIN_STATE_MAX_NBYTES (16 << 20)
#define TRAIN_STATE_EXACT_MAX 9007199254740992.0 /* 2^53: integers a JSON number holds exactly */
#define TRAIN_STATE_NAME_CAP 64 /* file names are shorter than this */

/* One entry of "files": a file of the checkpoint directory. */
typedef struct train_state_file {
    char name[TRAIN_STATE_NAME_CAP]; /* NUL-terminated */
    uint64_t nbytes;                 /* [0, 2^53] */
    uint64_t hash;                   /* "fnv1a64" (checkpoint_file_hash) */
} train_state_file_t;

/* Every field of the file. Integers are in the ranges the reader checks;
 * the four informational ones are never refused (older or edited files
 * may lack them): has_<x> is 1 when <x> is present as an integer in its
 * range, else 0 and <x> is 0. */
typedef struct train_state {
    int version;              /* 1 or 2 (TRAIN_STATE_VERSION) */
    int64_t step;             /* [0, 2^53]: the next step to run */
    int ranks;                /* [1, 2^31 - 1]: P the engine states are for */
    int batch;                /* [1, 2^31 - 1]: global batch G */
    int seq_len;              /* [1, 2^31 - 1] */
    uint64_t seed;            /* a number in [0, 2^53] or a decimal string */
    char *data;               /* --data as given (owned) */
    char *method;             /* --method name (owned) */
    uint64_t param_hash;      /* train_hash_floats of the parameters */
    int ef_on_update;         /* 1: the run synced AdamW's update (--ef-on update;
                                 "ef_on": "update", written only then); its moments
                                 are per rank and not in the checkpoint */
    int has_sequences_consumed, has_steps, has_optimizer_step, has_engine_step;
    int64_t sequences_consumed; /* [0, 2^53] */
    int64_t steps;            /* [0, 2^53]: the planned total */
    int64_t optimizer_step;   /* [0, 2^53] */
    int64_t engine_step;      /* [-1, 2^53] */
    int nfiles;               /* 0 for version 1 (its "files" is not read) */
    train_state_file_t *files; /* (nfiles) in the file's order (owned) */
} train_state_t;

/* Parses the nbytes of `text` (need not be NUL-terminated) into *out;
 * `path` only names the file in messages ("PATH: \"step\" is ..."). On
 * failure *out is left empty (train_state_free is still safe).
 * @return IGRAD_OK, IGRAD_E_FORMAT or IGRAD_E_NOMEM. */
igrad_status_t train_state_parse(const char *path, const char *text, size_t nbytes,
                                 train_state_t *out);

/* Reads and parses the file at `path`. @return as train_state_parse, or
 * IGRAD_E_IO when it cannot be opened. */
igrad_status_t train_state_read(const char *path, train_state_t *out);

/* Writes `s` crash-safely as the trainer does (format and fields in the
 * order of docs/formats.md §10; "seed" as a string above 2^53; "files"
 * last, only for version 2; absent informational fields left out), so
 * that train_state_read gives back the same fields. */
igrad_status_t train_state_write(const char *path, const train_state_t *s);

/* The text train_state_write writes (cJSON_Print and a newline), to
 * free(); NULL when out of memory. */
char *train_state_print(const train_state_t *s);

/* Frees what *s owns and empties it; a no-op on an empty state or NULL. */
void train_state_free(train_state_t *s);

#endif /* IGRAD_TRAINER_TRAIN_STATE_H */
