/*
 * cli.h — what the igrad CLI's subcommand files share: their entry points
 * and small argument-parsing and printing helpers. The CLI uses only the
 * public header (include/igrad.h) and the trainer.
 */
#ifndef IGRAD_CLI_H
#define IGRAD_CLI_H

#include <stdint.h>

#include "igrad.h"

/* Subcommands: each returns the process exit code (0 ok, 1 failure, 2 usage). */
int cmd_layout(int argc, char **argv);
int cmd_profile(int argc, char **argv);
int cmd_bench(int argc, char **argv);   /* dispatches to bench_* */
int bench_select(int argc, char **argv); /* tools/bench_select.c */
int bench_sync(int argc, char **argv);   /* tools/bench_sync.c */
int bench_comm(int argc, char **argv);   /* tools/bench_comm.c */
int cmd_train(int argc, char **argv);
int cmd_model(int argc, char **argv);   /* tools/cmd_model.c */
int cmd_plan(int argc, char **argv);    /* tools/cmd_plan.c */

/* Argument helpers. An option is "--name VALUE" or "--name=VALUE".
 * cli_opt: if argv[*i] is option `name`, stores its value (advancing *i past
 * a separate value) and returns 1; returns -1 if the value is missing
 * (after printing an error), 0 if argv[*i] is another argument. */
int cli_opt(int argc, char **argv, int *i, const char *name, const char **value);
/* Parses a whole decimal/float value or prints "igrad: --name: ..." and
 * returns -1. */
int cli_parse_i64(const char *name, const char *text, int64_t *out);
int cli_parse_f64(const char *name, const char *text, double *out);
/* "on" -> 1, "off" -> 0; anything else prints "igrad: --name is 'X' (on or
 * off)" and returns -1. */
int cli_parse_onoff(const char *name, const char *text, int *out);
/* "f32", "bf16", "fp16" (also "f16") or "fp8" (also "f8_e4m3": E4M3 with
 * a scale per block; any case) -> the value dtype; anything else prints
 * "igrad: --name is 'X' (f32, bf16, fp16 or fp8)" and returns -1. */
int cli_parse_value_dtype(const char *name, const char *text, igrad_dtype_t *out);
/* Prints "igrad: <what>: <igrad_last_error()>" to stderr and returns 1. */
int cli_fail(const char *what, igrad_status_t st);
/* igrad_layout_load(path), then with map_path (may be NULL) remapped by the
 * name rules of that map file (tools/cmd_layout.c). */
igrad_status_t cli_load_layout(const char *path, const char *map_path, igrad_layout_t **out);
/* --map FILE: *layout replaced by its copy remapped by the name rules of
 * map_path (nothing when map_path is NULL; *layout kept on failure). */
igrad_status_t cli_apply_map(const char *map_path, igrad_layout_t **layout);
/* Formats a byte count as "123.4 KiB" into buf (returns buf). */
const char *cli_human_bytes(double nbytes, char *buf, int size);

#endif /* IGRAD_CLI_H */
