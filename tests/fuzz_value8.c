/*
 * fuzz_value8.c — fuzz target for the FP8 values' reader (src/core/
 * value8.h: what the data planes run on a peer's values area of
 * config.value_dtype F8_E4M3), run by tests/fuzz_main.c.
 *
 * Input: the values area of one block as a peer sent it — bytes 0–3 the
 * block's scale (an F32, little-endian), the rest its codes (at most
 * 4096) — copied into a buffer of exactly that size (ASan sees a read past
 * it). The reader does what dp_cpu_unpack.c does: the scale is refused
 * unless a positive normal power of two, a code whose value is not finite
 * (the NaN codes; a code times a scale beyond F32) is refused.
 * Invariants: never crash; the same bytes read twice give the same
 * result; every accepted value times 2^-k encodes back to its code; the
 * sender's pack of the accepted values (igrad__fp8_pack) reads back to
 * exactly those values, with a scale that is accepted and no NaN code.
 */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/value8.h"

int igrad_fuzz_one(const uint8_t *data, size_t size);
const char *igrad_fuzz_name(void);
size_t igrad_fuzz_seed_count(void);
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size);

/* Seeds: a block at scale 1 (448, -448, 1, a subnormal, 0, -0), one at
 * 2^-126 and one at 2^120 with the largest codes, and a NaN code. */
static const uint8_t SEED_ONE[] = {0x00, 0x00, 0x80, 0x3f, 0x7e, 0xfe, 0x38, 0x01, 0x00, 0x80};
static const uint8_t SEED_LO[] = {0x00, 0x00, 0x80, 0x00, 0x7e, 0x01, 0x08};
static const uint8_t SEED_HI[] = {0x00, 0x00, 0x80, 0x7b, 0x77, 0xf7, 0x40};
static const uint8_t SEED_NAN[] = {0x00, 0x00, 0x80, 0x3f, 0x10, 0x7f};
static const struct {
    const uint8_t *p;
    size_t n;
} SEEDS[] = {{SEED_ONE, sizeof SEED_ONE},
             {SEED_LO, sizeof SEED_LO},
             {SEED_HI, sizeof SEED_HI},
             {SEED_NAN, sizeof SEED_NAN}};

const char *igrad_fuzz_name(void) { return "value8"; }
size_t igrad_fuzz_seed_count(void) { return sizeof SEEDS / sizeof SEEDS[0]; }
const uint8_t *igrad_fuzz_seed(size_t i, size_t *size)
{
    *size = SEEDS[i].n;
    return SEEDS[i].p;
}

/* The block's n values into out as the unpack reads them: 0, 1 for a bad
 * scale, 2 for a non-finite value (its entry in *at). */
static int read_block(const unsigned char *buf, int64_t n, float *out, int64_t *at)
{
    int k = igrad__fp8_scale_read(buf);
    if (k == 0x7fffffff) return 1;
    float s = igrad__fp8_pow2(k);
    for (*at = 0; *at < n; (*at)++) {
        uint8_t c = buf[IGRAD__FP8_SCALE_NBYTES + *at];
        float v = igrad__fp8_decode(c) * s;
        if (!isfinite(v)) return 2;
        out[*at] = v;
    }
    return 0;
}

int igrad_fuzz_one(const uint8_t *data, size_t size)
{
    if (size < IGRAD__FP8_SCALE_NBYTES + 1) return 0;
    int64_t n = (int64_t)(size - IGRAD__FP8_SCALE_NBYTES);
    if (n > 4096) n = 4096;
    size_t nb = (size_t)igrad__value_area_nbytes(1, n);
    unsigned char *buf = malloc(nb), *again = malloc(nb);
    float *v = malloc((size_t)n * sizeof *v), *w = malloc((size_t)n * sizeof *w);
    int bad = !buf || !again || !v || !w;
    if (!bad) {
        memcpy(buf, data, nb);
        int64_t at = 0, at2 = 0;
        int e = read_block(buf, n, v, &at);
        int e2 = read_block(buf, n, w, &at2);
        if (e != e2 || at != at2 || memcmp(v, w, (size_t)at * sizeof *v) != 0) {
            fprintf(stderr, "value8: two reads of the same bytes differ\n");
            bad = 1;
        }
        if (!bad && e == 2 && !igrad__fp8_is_nan(buf[IGRAD__FP8_SCALE_NBYTES + at]) &&
            igrad__fp8_scale_read(buf) <= 119) { /* 448 * 2^119 < FLT_MAX */
            fprintf(stderr, "value8: refused code 0x%02x at a scale no sender overflows\n",
                    buf[IGRAD__FP8_SCALE_NBYTES + at]);
            bad = 1;
        }
        if (!bad && e == 0) {
            int k = igrad__fp8_scale_read(buf); /* in [-126, 127] */
            float inv = k < 127 ? igrad__fp8_pow2(-k) : 0x1p-126f * 0x1p-1f;
            for (int64_t i = 0; i < n && !bad; i++) {
                uint8_t c = buf[IGRAD__FP8_SCALE_NBYTES + i];
                if (igrad__fp8_encode(v[i] * inv) != c) {
                    fprintf(stderr, "value8: value %a of code 0x%02x at 2^%d encodes to 0x%02x\n",
                            (double)v[i], c, k, igrad__fp8_encode(v[i] * inv));
                    bad = 1;
                }
            }
            if (!bad) {
                igrad__fp8_pack(v, n, again);
                int64_t at3 = 0;
                if (read_block(again, n, w, &at3) != 0 ||
                    memcmp(v, w, (size_t)n * sizeof *v) != 0) {
                    fprintf(stderr, "value8: the pack of %lld accepted values reads back other "
                                    "values\n",
                            (long long)n);
                    bad = 1;
                }
            }
        }
    }
    free(buf);
    free(again);
    free(v);
    free(w);
    return bad;
}
