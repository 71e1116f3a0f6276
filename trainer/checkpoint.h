/*
 * checkpoint.h — the reference trainer's files: model weights as
 * safetensors (model.safetensors, tensors in Hugging Face order) next to a
 * Hugging Face style config.json, the optimizer state (optimizer.safetensors:
 * AdamW moments, step and the layout hash) and a general safetensors writer
 * (used for `igrad model eval --dump`).
 *
 * Crash safety: every file is written under a temporary name, fsync'd and
 * renamed; a whole checkpoint directory is assembled as
 * "<dir>.tmp.<pid>@<host>" and renamed to <dir> only when complete
 * (checkpoint_begin / _commit), so nothing half-written ever carries the
 * final name. What a killed save leaves (those folders and the previous
 * checkpoint moved aside as "<dir>.old.<pid>@<host>") is cleaned, and a
 * checkpoint caught between the two renames restored, by checkpoint_tidy
 * at the next start. The training command
 * adds its own per-rank files to the temporary directory between begin and
 * commit.
 *
 * Loading validates everything it reads (header length, JSON, dtype F32,
 * shapes against config.json, offsets contiguous and inside the file,
 * missing or unexpected tensors) and fails with a message naming the file
 * and the tensor or key (trainer_last_error()).
 *
 * Not here: the model itself (model.h), data positions and igrad engine
 * state (the training command).
 */
#ifndef IGRAD_TRAINER_CHECKPOINT_H
#define IGRAD_TRAINER_CHECKPOINT_H

#include <stdint.h>

#include "igrad.h"
#include "model.h"
#include "optim.h"

#define CHECKPOINT_MODEL_FILE "model.safetensors"
#define CHECKPOINT_CONFIG_FILE "config.json"
#define CHECKPOINT_OPTIM_FILE "optimizer.safetensors"

/* One tensor to write. dtype F32, I32 or I64 (any fixed-size dtype works:
 * data is copied as bytes, little-endian host). ndim 0 is a scalar. */
typedef struct checkpoint_tensor {
    const char *name;
    igrad_dtype_t dtype;
    int ndim;                       /* 0..IGRAD_MAX_DIMS */
    int64_t shape[IGRAD_MAX_DIMS];
    const void *data;
} checkpoint_tensor_t;

/* Writes a safetensors file (8-byte little-endian header length, JSON
 * header in the given tensor order with "__metadata__" first, padded with
 * spaces to a multiple of 8, then the data in the same order) crash-safely.
 * `metadata` is NULL or a NULL-terminated list of key, value strings;
 * "format": "pt" is added unless given. */
igrad_status_t checkpoint_write_safetensors(const char *path, const checkpoint_tensor_t *tensors,
                                            int n, const char *const *metadata);

/* config.json <-> model_config_t. Reading requires model_type "llama" (if
 * present), hidden_size, intermediate_size, num_hidden_layers,
 * num_attention_heads, vocab_size and max_position_embeddings; defaults as
 * Hugging Face's LlamaConfig otherwise (num_key_value_heads = heads,
 * rope_theta 10000, rms_norm_eps 1e-6, tie_word_embeddings false).
 * Unsupported options (biases, rope_scaling, another head_dim or
 * hidden_act) are refused. */
/* Refuses a JSON text that cJSON accepted but that holds a NUL byte or a
 * string with a \u0000 escape (cJSON would skip the byte as white space or
 * cut the string there): IGRAD_E_FORMAT naming path, line:column and the
 * string. what names the text ("header", ...). */
igrad_status_t checkpoint_json_refuse_nul(const char *path, const char *what, const char *text,
                                          size_t nbytes);

igrad_status_t checkpoint_write_config(const model_config_t *cfg, const char *path);
igrad_status_t checkpoint_read_config(const char *path, model_config_t *cfg);

/* Writes config.json and model.safetensors into an existing directory
 * (each file crash-safe on its own). */
igrad_status_t checkpoint_save_model(const model_t *m, const char *dir);

/* Reads DIR/config.json, creates the model and fills its parameters from
 * DIR/model.safetensors (gradients zero). */
igrad_status_t checkpoint_load_model(const char *dir, model_t **out);

/* Same into an existing model whose config must equal the file's. */
igrad_status_t checkpoint_load_params(const char *path, model_t *m);

/* Optimizer state file: tensors "exp_avg" and "exp_avg_sq" (F32, [count]);
 * metadata format "igrad-adamw", step, count and the model's igrad layout
 * hash. Loading checks count and hash and sets opt->m, opt->v, opt->step
 * (the hyper-parameters stay those of `opt`). */
igrad_status_t checkpoint_save_optim(const optim_t *opt, const model_t *m, const char *path);
igrad_status_t checkpoint_load_optim(const char *path, const model_t *m, optim_t *opt);

/* Directory assembly. begin creates an empty "<dir>.tmp.<pid>@<host>" (removing a
 * stale one) and returns its path (free() it); commit renames it to dir,
 * replacing a previous checkpoint there only after the new one is
 * complete; abort removes it. commit and abort free tmp_dir. */
igrad_status_t checkpoint_begin(const char *dir, char **tmp_dir);
igrad_status_t checkpoint_commit(char *tmp_dir, const char *dir);
void checkpoint_abort(char *tmp_dir);

/* At a start, before anything reads <dir>: if <dir> is missing and a dead
 * save of this host left "<dir>.old.<pid>@<host>" holding `marker` (a
 * crash between commit's two renames), renames the newest such one back
 * to <dir> (*recovered = 1); then removes every "<dir>.tmp.*" and
 * "<dir>.old.*" whose process is gone. A folder whose pid is alive, or
 * that was made on another host (whose pids this host cannot see), is
 * left alone with a note on stderr; so is each removal. @return
 * IGRAD_E_IO only if the restoring rename fails. */
igrad_status_t checkpoint_tidy(const char *dir, const char *marker, int *recovered);

/* Removes a directory tree (a no-op if absent). */
igrad_status_t checkpoint_remove(const char *dir);

/* The checkpoint checksum and a file's size: FNV-1a 64 (offset basis
 * CHECKPOINT_HASH_SEED, prime 0x100000001b3; h ^= w; h *= prime) over the
 * file's size in bytes, then its little-endian 64-bit words, the last one
 * zero-padded; word-wise is ~8x faster than byte-wise. The size comes
 * first because an engine state file ends with the word-wise FNV-1a of
 * the rest: hashed without it, every such file would come out 0. Any
 * change within one word always changes the hash (each step is a
 * bijection of the state). */
#define CHECKPOINT_HASH_SEED 0xcbf29ce484222325ULL
igrad_status_t checkpoint_file_hash(const char *path, uint64_t *hash, uint64_t *nbytes);

/* begin + model files + optimizer file (if opt is not NULL) + commit; on
 * failure nothing is left under `dir` that was not there before. */
igrad_status_t checkpoint_save(const char *dir, const model_t *m, const optim_t *opt);

#endif /* IGRAD_TRAINER_CHECKPOINT_H */
