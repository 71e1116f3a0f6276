/*
 * data.h — training data for the reference trainer: a byte-level tokenizer,
 * corpus loading from a `--data SPEC` string, a deterministic train /
 * validation split and rank-sharded batches.
 *
 * Not here: the model (model.h), the training loop and its command-line
 * handling, anything about gradient synchronization. Nothing here calls
 * exit() or prints: every fallible function returns a DATA_* status (0 is
 * DATA_OK) and, when `err` is not NULL, fills err->message with a sentence
 * that names the spec, file or line at fault.
 *
 * Glossary (as in the model):
 *   T  sequence length (tokens per input row); a row reads T+1 tokens
 *   G  global batch: sequences per optimizer step, summed over ranks
 *   P  number of ranks, r  this rank; B = G/P rows per rank
 *   V  vocabulary = 257: byte values 0..255 and DATA_EOT
 *
 * Tokens: byte b is token b; DATA_EOT (256) ends every document, so a token
 * stream reads "doc0 EOT doc1 EOT ...". Stored as uint16.
 *
 * Sources (SPEC is one source or a comma-separated list, concatenated in
 * order; paths cannot contain commas):
 *   PATH            a regular file (one document) or a directory (every
 *                   regular file under it, sorted by path, one document
 *                   each; hidden names and binary-looking files are skipped
 *                   and counted in nskipped; symlinked directories are not
 *                   followed). A PATH ending in .jsonl is read as JSONL
 *                   (files inside a directory are always plain text).
 *   text:PATH       PATH as plain text even if it ends in .jsonl.
 *   jsonl:PATH      JSONL, one JSON object per line (blank lines ignored);
 *                   the first record decides the kind: a "text" string field
 *                   (the document), else "instruction" + "output" (+ optional
 *                   "input") in the alpaca style below.
 *   alpaca:PATH     JSONL that must be alpaca style.
 *   brown:G[+G...]  Brown corpus genres (brown: or brown:all = all 15);
 *   fortunes:[N+N...]  fortune files by name (fortunes: = all);
 *   kjv:            the King James Bible, one document per book.
 *   lodash:         JavaScript source, npm lodash's one-function modules, one
 *                   document per module file.
 *   task:KINDS[:train=N][:test=N]
 *                   synthetic instruction problems (task.h: arith, sort,
 *                   reverse, copy, recall, or mix for all five), as alpaca
 *                   records; generated from the spec alone. At most one
 *                   task: element per spec. Its training problems always
 *                   train and its held-out problems are always the
 *                   validation split (whatever the validation fraction and
 *                   seed), and are also the exact-match rows of
 *                   dataset_task_batch().
 * The last three read files that scripts/fetch-corpus prepares under the
 * data directory: opts.data_dir, else $IGRAD_DATA_DIR, else data/ in the
 * source tree this file was compiled from. In those files documents are
 * separated by lines that are exactly "%".
 *
 * Alpaca template (the "### Input" block is left out when input is missing
 * or empty):
 *   "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n{output}"
 * The prompt is everything before {output}. With opts.response_only, prompt
 * tokens are masked: a target that is a prompt token is -1, so only the
 * response bytes and the EOT that ends each record count.
 *
 * Split: a document goes to validation when a hash of (seed, document
 * index in SPEC order) falls below val_fraction, so the split depends on the
 * spec and seed only, never on P. If that leaves a split empty, the document
 * with the smallest (largest) hash moves over, so both have one. Task
 * problems are not hashed here: they take the split task.h gives them.
 *
 * Sampling (stateless, resume = the step number): the training stream is cut
 * into C = floor((n-1)/T) windows of T+1 tokens (consecutive windows share
 * one token). Global sequence g = step*G + j lies in epoch e = g / C and
 * takes window perm_e(g mod C), perm_e a seeded pseudo-random permutation of
 * [0, C); every window offset is shifted by a per-epoch amount in
 * [0, n-1-C*T], so boundaries differ between epochs. Every window is used
 * once per epoch. Rank r of P takes j in [r*G/P, (r+1)*G/P), so the
 * union of the ranks' rows is the same global batch whatever P is.
 * Validation: the first Cv = floor((nv-1)/T) non-overlapping windows of the
 * validation stream (spread evenly when capped by val_max_seqs), the same on
 * every rank; data_shard() gives each rank a disjoint share.
 *
 * Exact-match rows (task: specs): held-out problem i is one row of T tokens
 * on its own, starting after an end-of-text as records do in the stream:
 *   inputs   EOT  r[0] ... r[n-1]  EOT ... (padding)
 *   targets  -1 for the prompt, r[np] ... r[n-1] EOT, -1 ... (padding)
 * (r the record's n bytes, np the prompt's length), whatever response_only
 * is: the metric is about the response. Causal attention makes the padding
 * invisible to the counted positions.
 */
#ifndef IGRAD_TRAINER_DATA_H
#define IGRAD_TRAINER_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DATA_VOCAB_SIZE 257
#define DATA_EOT 256
#define DATA_EOT_TEXT "<|endoftext|>" /* how data_decode() renders DATA_EOT */

typedef uint16_t data_token_t;

/* Status codes (stable numbers). */
enum {
    DATA_OK = 0,
    DATA_E_ARG = 1,     /* bad argument or option (spec syntax, T, G % P) */
    DATA_E_IO = 2,      /* file missing or unreadable */
    DATA_E_FORMAT = 3,  /* malformed JSONL, missing fields, binary file */
    DATA_E_EMPTY = 4,   /* no documents, or too few tokens for T / the split */
    DATA_E_NOMEM = 5,
    DATA_E_CORPUS = 6,  /* prepared corpus absent: run scripts/fetch-corpus */
};

typedef struct data_error {
    int status;          /* the status last returned, DATA_OK if none */
    char message[1024];  /* "" when status is DATA_OK */
} data_error_t;

typedef struct data_options {
    int seq_len;          /* T >= 1 */
    double val_fraction;  /* share of documents in validation, in [0, 1);
                             0 puts everything in train, no validation */
    uint64_t seed;        /* split and sampling */
    int response_only;    /* alpaca records: mask prompt targets with -1 */
    size_t val_max_seqs;  /* cap on validation sequences, 0 = all windows */
    const char *data_dir; /* NULL: $IGRAD_DATA_DIR or the source tree's data/ */
} data_options_t;

#define DATA_OPTIONS_INIT {256, 0.05, 1337, 0, 0, NULL}

/* One split's token stream. */
typedef struct data_split {
    data_token_t *tokens; /* (count,) */
    uint8_t *counts;      /* (count,) 1 if the token may be a target, 0 if it
                             is masked; NULL when every token counts */
    size_t count;         /* tokens */
    size_t ndocs;         /* documents */
} data_split_t;

/* A loaded dataset. Fields are read-only for callers; dataset_free()
 * releases them. Batch functions only read it, so threads may share one. */
typedef struct dataset {
    data_split_t train;
    data_split_t val;
    size_t ndocs;         /* documents in both splits */
    size_t nskipped;      /* files skipped in directories (hidden, binary) */
    int seq_len;          /* T */
    uint64_t seed;
    size_t nwindows;      /* C: training windows per epoch */
    size_t nval_seqs;     /* validation sequences (0 without validation) */
    size_t *val_starts;   /* (nval_seqs,) offsets into val.tokens */
    char *spec;           /* copy of the spec it was loaded from */
    /* Held-out task problems (0 without a task: source). */
    size_t ntask;              /* problems */
    int task_seq_len;          /* tokens the longest problem's row needs */
    data_token_t *task_tokens; /* the records' bytes, concatenated */
    size_t *task_offsets;      /* (ntask + 1,) record i is [offsets[i], offsets[i+1]) */
    size_t *task_prompts;      /* (ntask,) prompt bytes of each record */
} dataset_t;

/* Byte-level encoding: out[i] = bytes[i]. `out` holds nbytes tokens. */
void data_encode(const void *bytes, size_t nbytes, data_token_t *out);

/* Decodes tokens to bytes: DATA_EOT becomes DATA_EOT_TEXT, an id above
 * DATA_EOT becomes "?". Writes at most `cap` bytes to `out` (no NUL) and
 * returns the number of bytes the whole decoding needs, like snprintf. */
size_t data_decode(const data_token_t *tokens, size_t count, char *out, size_t cap);

/* Loads every document of `spec`, tokenizes and splits it (see the top of
 * this file). `opts` NULL means DATA_OPTIONS_INIT. On failure *ds is left
 * zeroed (dataset_free() on it is harmless).
 * @return DATA_OK; DATA_E_IO (missing/unreadable file), DATA_E_FORMAT
 *         (malformed JSONL with its line number, missing fields, a named file
 *         that looks binary), DATA_E_EMPTY (no documents, a split with fewer
 *         than T+1 tokens, one document and val_fraction > 0), DATA_E_CORPUS
 *         (corpus not prepared, with the command that prepares it), DATA_E_ARG
 *         (bad spec or options; an unknown genre lists the valid ones). */
int dataset_load(dataset_t *ds, const char *spec, const data_options_t *opts,
                 data_error_t *err);

/* Releases what dataset_load() allocated and zeroes *ds; NULL is a no-op. */
void dataset_free(dataset_t *ds);

/* Rank `rank`'s rows of the global batch of `step` (>= 0): B = G/P rows
 * of T inputs and T next-token targets, row-major (B, T). Targets are -1
 * where masked. A pure function of (dataset, step, G, rank, P).
 * @return DATA_OK; DATA_E_ARG when G is not a positive multiple of P, rank is
 *         outside [0, P) or step < 0. */
int dataset_train_batch(const dataset_t *ds, int64_t step, int global_batch,
                        int rank, int nranks, int *inputs, int *targets,
                        data_error_t *err);

/* Validation sequences [first, first + count) of ds->nval_seqs, as (count, T)
 * inputs and targets (-1 where masked). The set is fixed by the dataset, so
 * every call and every rank sees the same sequences.
 * @return DATA_OK; DATA_E_ARG when the range is outside [0, nval_seqs). */
int dataset_val_batch(const dataset_t *ds, size_t first, size_t count,
                      int *inputs, int *targets, data_error_t *err);

/* Exact-match rows [first, first + count) of ds->ntask, as (count, T)
 * inputs and targets laid out as at the top of this file (T may be less
 * than the dataset's sequence length, down to ds->task_seq_len).
 * @return DATA_OK; DATA_E_ARG when the range is outside [0, ntask) or T is
 *         shorter than task_seq_len. */
int dataset_task_batch(const dataset_t *ds, size_t first, size_t count, int T, int *inputs,
                       int *targets, data_error_t *err);

/* splitmix64's finalizer (bijective, platform-stable): the split's and
 * the sampler's hash, and the task generators'. */
uint64_t data_mix64(uint64_t x);

/* Rank r's share [*begin, *end) of n items split over P ranks: contiguous,
 * disjoint, covering [0, n), sizes differing by at most one. */
void data_shard(size_t n, int rank, int nranks, size_t *begin, size_t *end);

/* The data directory that corpus specs read: opts_dir if not NULL, else
 * $IGRAD_DATA_DIR if set and not empty, else data/ in the source tree.
 * Writes a NUL-terminated path into buf (truncated to cap). */
void data_dir_resolve(const char *opts_dir, char *buf, size_t cap);

#endif /* IGRAD_TRAINER_DATA_H */
