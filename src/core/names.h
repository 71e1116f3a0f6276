/*
 * names.h — the names of the library's enums, one table each, in one
 * place: igrad_<enum>_name() and igrad_<enum>_from_name() (igrad.h) are
 * lookups in these tables, and the CLI prints the choices from them
 * (igrad__names_list) rather than listing kinds itself. A new method,
 * policy or collective is one more name in its table; the sparsifiers'
 * names are the rows of their table (core/sparsifier.c).
 *
 * Not here: the component kinds and dtypes (model/component.c,
 * model/layout.c: they have aliases and sizes).
 */
#ifndef IGRAD_NAMES_H
#define IGRAD_NAMES_H

#include "core/internal.h"

/* An enum's names, indexed by value (values 0 .. count-1): value v's name
 * is the const char * `stride` bytes * v after `names`, so that a table
 * of rows whose first member is the name (the sparsifier table,
 * sparsifier.h) is its own name table. */
typedef struct igrad__names {
    const char *what;          /* "method", "collective": for messages */
    const char *const *names;
    int count;
    size_t stride;             /* bytes from one name to the next */
} igrad__names_t;

extern const igrad__names_t igrad__method_names;
extern const igrad__names_t igrad__sparsifier_names;
extern const igrad__names_t igrad__schedule_names;
extern const igrad__names_t igrad__residual_names;
extern const igrad__names_t igrad__pack_names;
extern const igrad__names_t igrad__collective_names;
extern const igrad__names_t igrad__topology_names;
extern const igrad__names_t igrad__index_code_names;

/* The name of value v, "unknown" outside the table. */
const char *igrad__names_of(const igrad__names_t *t, int v);
/* The value named `name` (ASCII case ignored) into *v; IGRAD_E_INVALID
 * "unknown <what> \"name\" (a, b, c)" when there is none. */
igrad_status_t igrad__names_parse(const igrad__names_t *t, const char *name, int *v);
/* "a, b, c" (sep ", ") or "a|b|c" (sep "|") into buf; returns buf. */
const char *igrad__names_list(const igrad__names_t *t, const char *sep, char *buf,
                              size_t nbytes);

#endif /* IGRAD_NAMES_H */
