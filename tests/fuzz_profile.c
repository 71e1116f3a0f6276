/*
 * fuzz_profile.c — fuzz target for the profile JSON reader (src/profile.c),
 * run by tests/fuzz_main.c. Invariants: never crash; the same input twice
 * gives the same status; a profile that parses, written and read back, is
 * identical (every number exactly), and writing it again gives the same
 * text.
 */
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
    "{\"schema\": \"igrad-profile\", \"version\": 1, \"layout_hash\": \"0x00000000deadbeef\",\n"
    " \"sparsifier\": \"adtopk\", \"density\": 0.01, \"alpha\": 0.7, \"method\": \"knee\",\n"
    " \"tau\": 0.355, \"window\": [0, 4], \"steps\": 4, \"components\": [\n"
    "  {\"layer\": 0, \"kind\": \"Q\", \"numel\": 64, \"mean_activity\": 0.4, \"magnitude\": 1,\n"
    "   \"persistence\": 1, \"score\": 1, \"important\": true},\n"
    "  {\"layer\": 0, \"kind\": \"K\", \"numel\": 32, \"mean_activity\": 0.15, \"magnitude\": 0,\n"
    "   \"persistence\": 0.25, \"score\": 0.075, \"important\": false},\n"
    "  {\"layer\": 0, \"kind\": \"V\", \"numel\": 32, \"mean_activity\": 0.25,\n"
    "   \"magnitude\": 0.39999999999999991, \"persistence\": 0.25, \"score\": 0.355,\n"
    "   \"important\": true},\n"
    "  {\"layer\": 1, \"kind\": \"O\", \"numel\": 64, \"mean_activity\": 0.2,\n"
    "   \"magnitude\": 0.19999999999999996, \"persistence\": 0.25, \"score\": 0.215,\n"
    "   \"important\": false}]}\n",
    "{\"schema\":\"igrad-profile\",\"version\":1,\"layout_hash\":\"0x0000000000000000\","
    "\"note\":\"unknown\",\"sparsifier\":\"unknown\",\"density\":0,\"alpha\":0.5,"
    "\"method\":\"percentile:62.5\",\"tau\":0.25,\"window\":[100,1600],\"steps\":1500,"
    "\"components\":[{\"layer\":3,\"kind\":\"fc2\",\"numel\":9007199254740992,"
    "\"mean_activity\":1e-300,\"magnitude\":0,\"persistence\":0.5,\"score\":0.25,"
    "\"important\":true}]}",
};

const char *igrad_fuzz_name(void) { return "profile"; }
size_t igrad_fuzz_seed_count(void) { return sizeof SEEDS / sizeof SEEDS[0]; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = strlen(SEEDS[i]);
    return (const uint8_t *)SEEDS[i];
}

static int same_profile(const igrad_profile_t *a, const igrad_profile_t *b)
{
    size_t n = igrad_profile_count(a);
    if (n != igrad_profile_count(b)) return 0;
    if (igrad_profile_layout_hash(a) != igrad_profile_layout_hash(b)) return 0;
    if (igrad_profile_threshold(a) != igrad_profile_threshold(b)) return 0;
    if (igrad_profile_alpha(a) != igrad_profile_alpha(b)) return 0;
    if (igrad_profile_density(a) != igrad_profile_density(b)) return 0;
    if (strcmp(igrad_profile_method(a), igrad_profile_method(b)) != 0) return 0;
    if (strcmp(igrad_profile_sparsifier(a), igrad_profile_sparsifier(b)) != 0) return 0;
    int64_t b0, e0, b1, e1;
    size_t s0, s1;
    igrad_profile_window(a, &b0, &e0, &s0);
    igrad_profile_window(b, &b1, &e1, &s1);
    if (b0 != b1 || e0 != e1 || s0 != s1) return 0;
    for (size_t i = 0; i < n; i++) {
        igrad_profile_entry_t x, y;
        if (igrad_profile_entry(a, i, &x) != IGRAD_OK || igrad_profile_entry(b, i, &y) != IGRAD_OK)
            return 0;
        if (x.layer != y.layer || x.kind != y.kind || x.count != y.count ||
            x.mean_activity != y.mean_activity || x.magnitude != y.magnitude ||
            x.persistence != y.persistence || x.score != y.score || x.important != y.important)
            return 0;
    }
    return 1;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    igrad_profile_t *a = NULL, *b = NULL, *c = NULL;
    igrad_status_t s1 = igrad__profile_from_json_text((const char *)data, size, "fuzz", NULL, &a);
    igrad_status_t s2 = igrad__profile_from_json_text((const char *)data, size, "fuzz", NULL, &b);
    int bad = s1 != s2;
    if (bad) fprintf(stderr, "status %d then %d\n", (int)s1, (int)s2);
    if (!bad && s1 == IGRAD_OK) {
        char *t1 = NULL, *t2 = NULL;
        bad = igrad__profile_to_json_text(a, &t1) != IGRAD_OK;
        if (!bad && igrad__profile_from_json_text(t1, strlen(t1), "fuzz-written", NULL, &c) !=
                        IGRAD_OK) {
            fprintf(stderr, "written profile does not read back: %s\n", igrad_last_error());
            bad = 1;
        }
        if (!bad && !same_profile(a, c)) {
            fprintf(stderr, "written profile reads back different data\n");
            bad = 1;
        }
        if (!bad) bad = igrad__profile_to_json_text(c, &t2) != IGRAD_OK;
        if (!bad && strcmp(t1, t2) != 0) {
            fprintf(stderr, "second write differs:\n%s---\n%s", t1, t2);
            bad = 1;
        }
        free(t1);
        free(t2);
    }
    igrad_profile_free(a);
    igrad_profile_free(b);
    igrad_profile_free(c);
    return bad;
}
