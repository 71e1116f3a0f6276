/*
 * names.c — the enums' name tables (names.h) and the public
 * igrad_<enum>_name / igrad_<enum>_from_name built on them.
 */
#include "core/names.h"
#include "core/sparsifier.h"

#include <stdio.h>
#include <string.h>

#define TABLE(id, what, ...)                                                                   \
    static const char *const id##_list[] = {__VA_ARGS__};                                     \
    const igrad__names_t igrad__##id##_names = {                                               \
        what, id##_list, (int)(sizeof id##_list / sizeof id##_list[0]), sizeof id##_list[0]}

/* Indexed by the enum's values (igrad.h). */
TABLE(method, "method", "dense", "topk_sync", "adtopk_sync", "iad", "ig");
TABLE(schedule, "schedule", "aligned", "staggered");
TABLE(residual, "residual policy", "on", "drop");
TABLE(pack, "packing policy", "direct", "sequential", "greedy", "risk", "contiguous");
TABLE(collective, "collective", "auto", "gather", "reduce", "sparse_reduce");
TABLE(topology, "topology", "flat", "hier");
TABLE(index_code, "index code", "fixed", "compact");

/* The sparsifiers' names are their rows' (sparsifier.c). */
const igrad__names_t igrad__sparsifier_names = {"sparsifier", &igrad__sparsifiers[0].name,
                                                IGRAD__NSPARSIFIERS, sizeof igrad__sparsifiers[0]};

static const char *name_at(const igrad__names_t *t, int v)
{
    return *(const char *const *)(const void *)((const char *)t->names + (size_t)v * t->stride);
}

const char *igrad__names_of(const igrad__names_t *t, int v)
{
    return v >= 0 && v < t->count ? name_at(t, v) : "unknown";
}

const char *igrad__names_list(const igrad__names_t *t, const char *sep, char *buf,
                              size_t nbytes)
{
    size_t at = 0;
    if (nbytes) buf[0] = '\0';
    for (int i = 0; i < t->count && at < nbytes; i++) {
        int n = snprintf(buf + at, nbytes - at, "%s%s", i ? sep : "", name_at(t, i));
        if (n < 0) break;
        at += (size_t)n;
    }
    return buf;
}

igrad_status_t igrad__names_parse(const igrad__names_t *t, const char *name, int *v)
{
    IGRAD_FAIL_IF(!name || !v, IGRAD_E_INVALID, "%s name: NULL argument", t->what);
    for (int i = 0; i < t->count; i++) {
        if (igrad__name_equal(name, name_at(t, i))) {
            *v = i;
            return IGRAD_OK;
        }
    }
    char list[256];
    return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__, "unknown %s \"%s\" (%s)", t->what,
                       name, igrad__names_list(t, ", ", list, sizeof list));
}

/* The public lookups (igrad.h): igrad_<fn>_name, igrad_<fn>_from_name on
 * table <table>. */
#define PUBLIC(fn, table, type)                                                                \
    const char *igrad_##fn##_name(type v)                                                      \
    {                                                                                          \
        return igrad__names_of(&igrad__##table##_names, (int)v);                               \
    }                                                                                          \
    igrad_status_t igrad_##fn##_from_name(const char *name, type *out)                         \
    {                                                                                          \
        int v = 0;                                                                             \
        IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "%s name: NULL argument",                         \
                      igrad__##table##_names.what);                                            \
        IGRAD_CHECK(igrad__names_parse(&igrad__##table##_names, name, &v));                    \
        *out = (type)v;                                                                        \
        return IGRAD_OK;                                                                       \
    }

PUBLIC(method, method, igrad_method_t)
PUBLIC(sparsifier, sparsifier, igrad_sparsifier_t)
PUBLIC(schedule, schedule, igrad_schedule_t)
PUBLIC(residual_policy, residual, igrad_residual_policy_t)
PUBLIC(pack_policy, pack, igrad_pack_policy_t)
PUBLIC(collective, collective, igrad_collective_t)
PUBLIC(topology, topology, igrad_topology_t)
PUBLIC(index_code, index_code, igrad_index_code_t)
