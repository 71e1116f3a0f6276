/*
 * fuzz_trace.c — fuzz target for the trace CSV reader (src/trace.c), run by
 * tests/fuzz_main.c. Invariants: never crash; the same input twice gives
 * the same status; a trace that parses (v1, v2 or the reference method's
 * format), written (v2, exact numbers) and read back, holds the same data,
 * and writing it again gives the same bytes. Every parsed trace is also profiled with each partition
 * method (must succeed: a parsed trace has components and steps).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"
#include "profile/profile_internal.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);

static const char *const SEEDS[] = {
    "# igrad-trace v1 layout_hash=0x0123456789abcdef sparsifier=adtopk density=0.01\n"
    "step,layer,component,raw_activity,d_activity,numel,retained_numel\n"
    "0,0,Q,0.5,0,64,3\n0,0,K,0.25,0,32,2\n0,1,FC1,1e-05,0,256,3\n"
    "1,0,Q,0.125,-0.375,64,3\n1,0,K,0,-0.25,32,0\n1,1,FC1,2.5e-05,1.5e-05,256,3\n",
    "step,layer,component,raw_activity,d_activity,numel,retained_numel\r\n"
    "5,2,V,0.333333333,0,4096,41\r\n5,2,O,0.1,0,4096,41\r\n"
    "7,2,O,0.2,0.1,4096,41\r\n7,2,V,0.3,0,4096,41\r\n",
    ("# a comment\n\nstep,layer,component,raw_activity,d_activity,numel,retained_numel\n"
     "# comment between rows\n3,0,QKV,1,0,12,12\n3,0,FC2,2,0,8,1\n"),
    "# igrad-trace v2 layout_hash=0x1 sparsifier=topk density=0.01\n"
    "step,layer,component,raw_activity,d_activity,numel,retained_numel\n"
    "0,-1,EMB,4,0.5,64,3\n0,0,Q,3,0.375,64,2\n1,-1,EMB,0,0,64,0\n1,0,Q,1.5,0.1875,64,1\n",
    "step,seed,model_name,workload_name,dataset_name,layer,component,raw_activity,d_activity,"
    "numel,retained_numel\r\n"
    "1,42,facebook/opt-125m,pubmed,\"a,\"\"b\"\"\",0,Q,3.0,0.375,64,2\r\n"
    "1,42,facebook/opt-125m,pubmed,\"a,\"\"b\"\"\",0,GATE,0.5,0.0625,64,1\r\n"
    "2,42,facebook/opt-125m,pubmed,\"a,\"\"b\"\"\",0,FC1,1.0,0.125,64,1\r\n"
    "2,42,facebook/opt-125m,pubmed,\"a,\"\"b\"\"\",0,Q,0.0,0.0,64,0\r\n",
};

const char *igrad_fuzz_name(void) { return "trace"; }
size_t igrad_fuzz_seed_count(void) { return sizeof SEEDS / sizeof SEEDS[0]; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = strlen(SEEDS[i]);
    return (const uint8_t *)SEEDS[i];
}

/* The value a reader will see for x once printed with %.9g (the density). */
static double as_printed(double x)
{
    char s[64];
    snprintf(s, sizeof s, "%.9g", x);
    return strtod(s, NULL);
}

/* 0 when b is a holds after a write + read. */
static int same_after_write(const igrad_trace_t *a, const igrad_trace_t *b)
{
    if (a->nsteps != b->nsteps || a->ncomp != b->ncomp) return 1;
    if (a->layout_hash != b->layout_hash || strcmp(a->sparsifier, b->sparsifier) != 0) return 1;
    if (as_printed(a->density) != b->density) return 1;
    for (size_t c = 0; c < a->ncomp; c++) {
        if (a->comp_layer[c] != b->comp_layer[c] || a->comp_kind[c] != b->comp_kind[c] ||
            a->comp_count[c] != b->comp_count[c])
            return 1;
    }
    for (size_t s = 0; s < a->nsteps; s++) {
        if (a->steps[s] != b->steps[s]) return 1;
        for (size_t c = 0; c < a->ncomp; c++) {
            size_t i = s * a->ncomp + c;
            if (a->activity[i] != b->activity[i] || a->raw[i] != b->raw[i]) return 1;
            if (a->retained[i] != b->retained[i]) return 1;
        }
    }
    return 0;
}

static int check_profiles(const igrad_trace_t *t)
{
    static const char *const methods[] = {"knee", "otsu", "kmeans2", "gmm2",
                                          "percentile:50", "fixed:0.25"};
    for (size_t m = 0; m < sizeof methods / sizeof *methods; m++) {
        igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
        opts.method = methods[m];
        igrad_profile_t *p = NULL;
        if (igrad_profile_build(t, &opts, &p) != IGRAD_OK) {
            fprintf(stderr, "profile (%s) of a parsed trace failed: %s\n", methods[m],
                    igrad_last_error());
            return 1;
        }
        /* The profile's own JSON must read back. */
        char *json = NULL;
        int bad = igrad__profile_to_json_text(p, &json) != IGRAD_OK;
        igrad_profile_t *q = NULL;
        if (!bad && igrad__profile_from_json_text(json, strlen(json), "fuzz", NULL, &q) != IGRAD_OK) {
            fprintf(stderr, "profile JSON does not read back: %s\n", igrad_last_error());
            bad = 1;
        }
        free(json);
        igrad_profile_free(q);
        igrad_profile_free(p);
        if (bad) return 1;
    }
    return 0;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    igrad_trace_t *a = NULL, *b = NULL, *c = NULL;
    igrad_status_t s1 = igrad__trace_from_text((const char *)data, size, "fuzz", &a);
    igrad_status_t s2 = igrad__trace_from_text((const char *)data, size, "fuzz", &b);
    int bad = s1 != s2;
    if (bad) fprintf(stderr, "status %d then %d\n", (int)s1, (int)s2);
    if (!bad && s1 == IGRAD_OK) {
        char *t1 = NULL, *t2 = NULL;
        size_t n1 = 0, n2 = 0;
        bad = igrad__trace_to_text(a, &t1, &n1) != IGRAD_OK;
        if (!bad && igrad__trace_from_text(t1, n1, "fuzz-written", &c) != IGRAD_OK) {
            fprintf(stderr, "written trace does not read back: %s\n", igrad_last_error());
            bad = 1;
        }
        if (!bad && same_after_write(a, c)) {
            fprintf(stderr, "written trace reads back different data\n");
            bad = 1;
        }
        if (!bad) bad = igrad__trace_to_text(c, &t2, &n2) != IGRAD_OK;
        if (!bad && (n1 != n2 || memcmp(t1, t2, n1) != 0)) {
            fprintf(stderr, "second write differs:\n%s---\n%s", t1, t2);
            bad = 1;
        }
        if (!bad) bad = check_profiles(a);
        free(t1);
        free(t2);
    }
    igrad_trace_free(a);
    igrad_trace_free(b);
    igrad_trace_free(c);
    return bad;
}
