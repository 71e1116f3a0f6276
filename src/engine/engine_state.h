/*
 * engine_state.h — the engine state loader's in-memory entry point, shared
 * by engine_state.c and the fuzz target (tests/fuzz_engine_state.c), which
 * feeds it bytes without a file. The file format and the public calls are
 * in igrad.h (igrad_engine_save_state / igrad_engine_load_state) and
 * docs/formats.md §7.
 *
 * Not here: the engine (engine_internal.h).
 */
#ifndef IGRAD_ENGINE_STATE_H
#define IGRAD_ENGINE_STATE_H

#include "engine/engine_internal.h"

/* Everything igrad_engine_load_state() does after reading the file:
 * verifies the `nbytes` bytes at `bytes` against the engine (sizes,
 * checksum, items, duplicated header fields, padding, history), agrees
 * with the other ranks (collective), and only then copies residuals,
 * history, step and call count in. On any failure, local or on another
 * rank, the engine is unchanged. `name` is used in messages. */
igrad_status_t igrad__engine_state_load_bytes(igrad_engine_t *e, const unsigned char *bytes,
                                              size_t nbytes, const char *name);

/* A two-level engine's (nranks ranks, N nodes of L) shard failed to load
 * `path` with status st: when the file's header says it was saved with
 * another number of shards (nodes), IGRAD_E_MISMATCH naming the topology
 * with both values (ranks per node and nodes), the shard's message
 * appended; else st with the shard's message as it was. */
igrad_status_t igrad__engine_state_topology(const char *path, int nranks, int L, int N,
                                            igrad_status_t st);

/* @return the size in bytes of a state file for this engine. */
uint64_t igrad__engine_state_nbytes(const igrad_engine_t *e);

#endif /* IGRAD_ENGINE_STATE_H */
