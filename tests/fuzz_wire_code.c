/*
 * fuzz_wire_code.c — fuzz target for the compact index codes' reader
 * (src/core/wire_code.h: what the data planes run on peers' bytes), run by
 * tests/fuzz_main.c.
 *
 * Input: byte 0 picks the code (FIXED16, FIXED32, EF, BITMAP: 1 + b % 4),
 * bytes 1–4 k and bytes 5–8 u (little-endian, u in [1, 2^20], k in [1, u];
 * FIXED16 needs u <= 65536), the rest the run's bytes, cut or padded with
 * zeros to the code's exact size into a buffer of exactly that size (ASan
 * sees a read past it). Invariants: never crash; k indices or an error;
 * what decodes without error is strictly increasing, below u, and encodes
 * back to the same bytes (the reader accepts exactly the encoder's
 * output); the same input twice gives the same result.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/wire_code.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);

/* Seeds (code byte c: 1 + c % 4; k, u fields: k = 1 + k % u, u = 1 + u):
 * an EF run {1, 34, 99} of u 100 (l 5: 15 low bits, then high bits 15,
 * 17, 20), a bitmap {0, 5, 9} of u 10, fixed16 and fixed32 runs. */
static const uint8_t SEED_EF[] = {2, 2, 0, 0, 0, 99, 0, 0, 0, 0x41, 0x8c, 0x12};
static const uint8_t SEED_BM[] = {3, 2, 0, 0, 0, 9, 0, 0, 0, 0x21, 0x02};
static const uint8_t SEED_F16[] = {0, 1, 0, 0, 0, 0, 1, 0, 0, 5, 0, 0xff, 0x00};
static const uint8_t SEED_F32[] = {1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1, 0};
static const struct {
    const uint8_t *p;
    size_t n;
} SEEDS[] = {{SEED_EF, sizeof SEED_EF},
             {SEED_BM, sizeof SEED_BM},
             {SEED_F16, sizeof SEED_F16},
             {SEED_F32, sizeof SEED_F32}};

const char *igrad_fuzz_name(void) { return "wire_code"; }
size_t igrad_fuzz_seed_count(void) { return sizeof SEEDS / sizeof SEEDS[0]; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = SEEDS[i].n;
    return SEEDS[i].p;
}

static uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* 0 and the indices, or the first error (and how many came before it). */
static int decode(int code, const unsigned char *buf, int64_t k, int64_t u, uint32_t *out,
                  int64_t *got)
{
    igrad__code_rd_t rd;
    igrad__code_start(&rd, code, buf, k, u);
    for (*got = 0; *got < k; (*got)++) {
        int e = igrad__code_next(&rd, &out[*got]);
        if (e) return e;
    }
    return igrad__code_finish(&rd);
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    if (size < 9) return 0;
    int code = 1 + data[0] % 4;
    int64_t u = 1 + (int64_t)(rd32(data + 5) % (1u << 20));
    int64_t k = 1 + (int64_t)(rd32(data + 1) % (uint32_t)u);
    if (code == IGRAD__CODE_FIXED16 && u > 65536) u = 65536, k = k > u ? u : k;
    int64_t nb = igrad__code_nbytes(code, k, u);
    if (nb <= 0) return 1; /* every code of k >= 1 has bytes */
    unsigned char *buf = malloc((size_t)nb);
    uint32_t *idx = malloc((size_t)k * sizeof *idx), *again = malloc((size_t)k * sizeof *again);
    unsigned char *enc = malloc((size_t)nb);
    int bad = !buf || !idx || !again || !enc;
    if (!bad) {
        size_t have = size - 9 < (size_t)nb ? size - 9 : (size_t)nb;
        memset(buf, 0, (size_t)nb);
        memcpy(buf, data + 9, have);
        int64_t got = 0, got2 = 0;
        int e = decode(code, buf, k, u, idx, &got);
        int e2 = decode(code, buf, k, u, again, &got2);
        if (e != e2 || got != got2 || memcmp(idx, again, (size_t)got * sizeof *idx) != 0) {
            fprintf(stderr, "wire_code: two decodes of the same bytes differ\n");
            bad = 1;
        }
        if (!bad && e == 0) {
            for (int64_t i = 0; i < k && !bad; i++)
                if ((int64_t)idx[i] >= u || (i > 0 && idx[i] <= idx[i - 1])) {
                    fprintf(stderr, "wire_code: accepted index %u at %lld of %lld (u %lld)\n",
                            idx[i], (long long)i, (long long)k, (long long)u);
                    bad = 1;
                }
            if (!bad) {
                igrad__code_encode(code, idx, k, u, enc);
                if (memcmp(enc, buf, (size_t)nb) != 0) {
                    fprintf(stderr, "wire_code: %s run (k %lld, u %lld) decoded and encoded "
                                    "again gives other bytes\n",
                            igrad__code_name(code), (long long)k, (long long)u);
                    bad = 1;
                }
            }
        }
        if (!bad && e != 0 && (e < IGRAD__CODE_E_RANGE || e > IGRAD__CODE_E_MANY)) bad = 1;
    }
    free(buf);
    free(idx);
    free(again);
    free(enc);
    return bad;
}
