/*
 * wire_code_ref.h — the compact index codes' sizes and choice, written from
 * docs/formats.md §8 ("Index codes") alone, for the tests' oracles
 * (test_wire_code.c, test_engine.c, contract_model.h): never from src/.
 * Codes: 1 fixed16, 2 fixed32, 3 Elias–Fano, 4 bitmap.
 */
#ifndef IGRAD_WIRE_CODE_REF_H
#define IGRAD_WIRE_CODE_REF_H

#include <stdint.h>

/* l = floor(log2(u / k)): the largest l >= 0 with k * 2^l <= u. */
static inline int ref_l(int64_t k, int64_t u)
{
    int l = 0;
    while (k * ((int64_t)1 << (l + 1)) <= u) l++;
    return l;
}

static inline int64_t ref_nbytes(int code, int64_t k, int64_t u)
{
    switch (code) {
    case 1: return 2 * k;
    case 2: return 4 * k;
    case 3: return (k * ref_l(k, u) + k + (u >> ref_l(k, u)) + 7) / 8;
    case 4: return (u + 7) / 8;
    }
    return -1;
}

/* fixed (16 bits if u <= 65536 and U16 asked, else 32), EF, bitmap: the
 * fewest bytes, ties in that order. */
static inline int ref_choose(int64_t k, int64_t u, int u16)
{
    int best = u16 && u <= 65536 ? 1 : 2;
    if (ref_nbytes(3, k, u) < ref_nbytes(best, k, u)) best = 3;
    if (ref_nbytes(4, k, u) < ref_nbytes(best, k, u)) best = 4;
    return best;
}

/* Bytes of the indices of a block of `count` entries under the compact
 * code: rows of per_row entries of `cols` columns (row-wise), or one run
 * of count indices of the tensor's n (flat); fixed_nbytes 2 or 4 is the
 * width index_dtype gives the block. */
static inline int64_t ref_block_idx_nbytes(int row_wise, int64_t count, int64_t per_row,
                                           int64_t cols, int64_t n, int fixed_nbytes)
{
    int64_t k = row_wise ? per_row : count, u = row_wise ? cols : n;
    int code = ref_choose(k, u, fixed_nbytes == 2);
    return (count / k) * ref_nbytes(code, k, u);
}

static inline int ref_bit(const unsigned char *p, int64_t b) { return (p[b >> 3] >> (b & 7)) & 1; }

/* Decodes a run bit by bit; -1 when the bytes are not a valid run of k
 * indices (wrong count of ones, a set padding bit, an index >= u, not
 * increasing). */
static inline int ref_decode(int code, const unsigned char *p, int64_t k, int64_t u, uint32_t *out)
{
    int64_t nb = ref_nbytes(code, k, u), n = 0;
    if (code == 1 || code == 2) {
        int w = code == 1 ? 2 : 4;
        for (int64_t i = 0; i < k; i++) {
            uint64_t v = 0;
            for (int b = 0; b < w; b++) v |= (uint64_t)p[i * w + b] << (8 * b);
            out[i] = (uint32_t)v;
        }
        n = k;
    } else if (code == 3) {
        int l = ref_l(k, u);
        int64_t hi = k * l, hbits = k + (u >> l);
        for (int64_t b = 0; b < hbits; b++) {
            if (!ref_bit(p, hi + b)) continue;
            if (n == k) return -1;
            uint64_t low = 0;
            for (int j = 0; j < l; j++) low |= (uint64_t)ref_bit(p, n * l + j) << j;
            out[n] = (uint32_t)((uint64_t)(b - n) << l | low);
            n++;
        }
        for (int64_t b = hi + hbits; b < 8 * nb; b++)
            if (ref_bit(p, b)) return -1;
    } else {
        for (int64_t b = 0; b < 8 * nb; b++) {
            if (!ref_bit(p, b)) continue;
            if (n == k || b >= u) return -1;
            out[n++] = (uint32_t)b;
        }
    }
    if (n != k) return -1;
    for (int64_t i = 0; i < k; i++)
        if (out[i] >= u || (i > 0 && out[i] <= out[i - 1])) return -1;
    return 0;
}

#endif /* IGRAD_WIRE_CODE_REF_H */
