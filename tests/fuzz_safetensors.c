/*
 * fuzz_safetensors.c — fuzz target for the safetensors header reader (and,
 * on the same random text, the name-list reader). Each input is tried
 * three ways: as a whole file (8-byte length, JSON, data), as a bare JSON
 * header that gets a correct length prefix and a 4 KiB data region (so
 * mutations reach the JSON validation instead of dying at the length),
 * and as a name list. Every parse runs twice and must give the same
 * status, message and hash; a layout that parses must pass
 * igrad_fuzz_check_layout() (consistency and round trips).
 * The driver is tests/fuzz_main.c.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/layout_internal.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);
int igrad_fuzz_check_layout(const igrad_layout_t *layout);

static const char *const seeds[] = {
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"model.layers.0.self_attn.q_proj.weight\":{\"dtype\":\"F32\",\"shape\":[4,4],"
    "\"data_offsets\":[0,64]},"
    "\"model.layers.0.self_attn.q_proj.bias\":{\"dtype\":\"F32\",\"shape\":[4],"
    "\"data_offsets\":[64,80]},"
    "\"model.norm.weight\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[80,88]}}",

    "{\"transformer.h.1.attn.c_attn.weight\":{\"dtype\":\"F16\",\"shape\":[8,24],"
    "\"data_offsets\":[400,784]},"
    "\"transformer.h.0.attn.c_attn.weight\":{\"dtype\":\"F16\",\"shape\":[8,24],"
    "\"data_offsets\":[0,384]},"
    "\"transformer.h.0.mlp.c_proj.bias\":{\"dtype\":\"F16\",\"shape\":[8],"
    "\"data_offsets\":[384,400]},"
    "\"transformer.wte.weight\":{\"dtype\":\"F16\",\"shape\":[10,8],"
    "\"data_offsets\":[784,944]}}    ",

    "{\"model.layers.3.block_sparse_moe.experts.5.w1.weight\":{\"dtype\":\"BF16\","
    "\"shape\":[2,3,4,5],\"data_offsets\":[0,240]},"
    "\"model.layers.3.block_sparse_moe.gate.weight\":{\"dtype\":\"F8_E4M3\",\"shape\":[],"
    "\"data_offsets\":[240,241]},"
    "\"empty\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[241,241]},"
    "\"flag\":{\"dtype\":\"BOOL\",\"shape\":[7],\"data_offsets\":[241,248]},"
    "\"__metadata__\":{}}",

    ("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]},"
     "\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[8,16]}}"),

    "model.layers.0.mlp.up_proj.weight 8 4\n# comment\nx [2, 3]\n  y (5,)  # t\nz []\n",
};

/* A complete small file: 8-byte length, JSON, data. */
static uint8_t raw_seed[256];
static size_t raw_seed_size;

const char *igrad_fuzz_name(void) { return "safetensors"; }

size_t igrad_fuzz_seed_count(void) { return sizeof seeds / sizeof seeds[0] + 1; }

const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    if (i < sizeof seeds / sizeof seeds[0]) {
        *size = strlen(seeds[i]);
        return (const uint8_t *)seeds[i];
    }
    const char *j = "{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}";
    size_t n = strlen(j);
    for (int b = 0; b < 8; b++) raw_seed[b] = (uint8_t)((uint64_t)n >> (8 * b));
    memcpy(raw_seed + 8, j, n);
    memset(raw_seed + 8 + n, 0, 16);
    raw_seed_size = 8 + n + 16;
    *size = raw_seed_size;
    return raw_seed;
}

typedef igrad_status_t (*parse_fn)(const uint8_t *data, size_t size, uint64_t file_size,
                                   igrad_layout_t **out);

static igrad_status_t parse_st(const uint8_t *data, size_t size, uint64_t file_size,
                               igrad_layout_t **out)
{
    return igrad_layout_from_safetensors_bytes(data, size, file_size, "fuzz", out);
}

static igrad_status_t parse_names(const uint8_t *data, size_t size, uint64_t file_size,
                                  igrad_layout_t **out)
{
    (void)file_size;
    return igrad__layout_from_name_list_text((const char *)data, size, "fuzz", out);
}

static int run_twice(parse_fn parse, const uint8_t *data, size_t size, uint64_t file_size)
{
    igrad_layout_t *a = NULL, *b = NULL;
    char msg[1024];
    igrad_status_t sa = parse(data, size, file_size, &a);
    snprintf(msg, sizeof msg, "%s", sa == IGRAD_OK ? "" : igrad_last_error());
    igrad_status_t sb = parse(data, size, file_size, &b);
    int bad = 0;
    if (sa != sb || (sa != IGRAD_OK && strcmp(msg, igrad_last_error()) != 0)) {
        fprintf(stderr, "not deterministic: %d '%s' vs %d '%s'\n", (int)sa, msg, (int)sb,
                igrad_last_error());
        bad = 1;
    } else if (sa == IGRAD_OK) {
        if (igrad_layout_hash(a) != igrad_layout_hash(b)) {
            fprintf(stderr, "not deterministic: hashes differ\n");
            bad = 1;
        } else {
            bad = igrad_fuzz_check_layout(a);
        }
    } else if (a || b) {
        fprintf(stderr, "failed parse left a layout behind\n");
        bad = 1;
    } else if (sa != IGRAD_E_FORMAT && sa != IGRAD_E_NOMEM) {
        fprintf(stderr, "unexpected status %d: %s\n", (int)sa, msg);
        bad = 1;
    }
    igrad_layout_free(a);
    igrad_layout_free(b);
    return bad;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    if (run_twice(parse_st, data, size, size)) return 1;
    uint8_t *w = malloc(8 + size);
    if (!w) return 0;
    for (int b = 0; b < 8; b++) w[b] = (uint8_t)((uint64_t)size >> (8 * b));
    if (size) memcpy(w + 8, data, size);
    int bad = run_twice(parse_st, w, 8 + size, 8 + (uint64_t)size + 4096);
    free(w);
    if (bad) return 1;
    return run_twice(parse_names, data, size, 0);
}
