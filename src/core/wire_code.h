/*
 * wire_code.h — the compact index codes of the sparse wire (formats.md §8,
 * "Index codes"), written once as functions that compile for the host (a C
 * compiler) and for the device (nvcc: __host__ __device__), so the CPU
 * and CUDA data planes pack and unpack with the same arithmetic.
 *
 * A coded run is k strictly increasing indices in [0, u) (a row of a
 * row-wise selection: k = per_row, u = cols; a flat block: k = its
 * entries, u = the tensor's entries), byte-aligned, in one of:
 *   FIXED16 / FIXED32  k little-endian u16 / u32 (today's fixed width)
 *   EF                 Elias–Fano: l = floor(log2(u / k)) low bits of each
 *                      index (k·l bits, entry after entry), then the high
 *                      part of k + (u >> l) bits: entry i sets bit
 *                      (x_i >> l) + i
 *   BITMAP             u bits, bit x set iff x is selected
 * Bits are numbered LSB first within a byte, bytes in order; the unused
 * bits of the last byte are zero. Which code a run takes is
 * igrad__code_choose(k, u, fixed width): the fewest bytes (ties: fixed,
 * then EF, then bitmap), a function of (k, u) alone, so the plan knows
 * every size before any data exists.
 *
 * Decoding never trusts its bytes: igrad__code_next returns an error for
 * an index >= u, a non-increasing index, a high part or bitmap with fewer
 * ones than k, and igrad__code_finish one with more ones than k or a set
 * padding bit. A reader never reads outside the run's bytes.
 *
 * Not here: which runs a block has and where its bytes lie (plan_step.c,
 * route.c), the loops over blocks and ranks (dp_cpu_*.c, dp_cuda_pack.cu).
 */
#ifndef IGRAD_WIRE_CODE_H
#define IGRAD_WIRE_CODE_H

#include <stdint.h>

#ifdef __CUDACC__
#define IGRAD__WC static inline __host__ __device__
#else
#define IGRAD__WC static inline
#endif

enum {
    IGRAD__CODE_NONE = 0,    /* no run (k = 0), or the fixed wire (index_code fixed) */
    IGRAD__CODE_FIXED16 = 1,
    IGRAD__CODE_FIXED32 = 2,
    IGRAD__CODE_EF = 3,
    IGRAD__CODE_BITMAP = 4
};

/* Errors of the reader (0: fine). */
enum {
    IGRAD__CODE_E_RANGE = 1, /* an index >= u */
    IGRAD__CODE_E_ORDER = 2, /* an index not above the one before */
    IGRAD__CODE_E_FEW = 3,   /* fewer than k ones (EF high part, bitmap) */
    IGRAD__CODE_E_MANY = 4   /* more than k ones, or a set padding bit */
};

/* The code's name (formats.md). */
IGRAD__WC const char *igrad__code_name(int code)
{
    return code == IGRAD__CODE_FIXED16   ? "fixed16"
           : code == IGRAD__CODE_FIXED32 ? "fixed32"
           : code == IGRAD__CODE_EF      ? "elias-fano"
           : code == IGRAD__CODE_BITMAP  ? "bitmap"
                                         : "none";
}

/* What each reader error says of the bytes. */
IGRAD__WC const char *igrad__code_error(int err)
{
    return err == IGRAD__CODE_E_RANGE   ? "an index outside the row or tensor"
           : err == IGRAD__CODE_E_ORDER ? "indices not strictly increasing"
           : err == IGRAD__CODE_E_FEW   ? "fewer ones than entries in its code"
           : err == IGRAD__CODE_E_MANY  ? "more ones than entries, or a set padding bit"
                                        : "no error";
}

/* Elias–Fano low bits: the largest l with k * 2^l <= u (0 when u < 2k). */
IGRAD__WC int igrad__ef_low_bits(int64_t k, int64_t u)
{
    int l = 0;
    if (k <= 0) return 0;
    while (l < 62 && (k << (l + 1)) <= u && (k << (l + 1)) > 0) l++;
    return l;
}

/* Bytes of a run of k indices in [0, u) coded as `code`; 0 for k <= 0. */
IGRAD__WC int64_t igrad__code_nbytes(int code, int64_t k, int64_t u)
{
    if (k <= 0) return 0;
    switch (code) {
    case IGRAD__CODE_FIXED16: return 2 * k;
    case IGRAD__CODE_FIXED32: return 4 * k;
    case IGRAD__CODE_EF: {
        int l = igrad__ef_low_bits(k, u);
        return (k * l + k + (u >> l) + 7) / 8;
    }
    case IGRAD__CODE_BITMAP: return (u + 7) / 8;
    default: return 0;
    }
}

/* The code of a run of k indices in [0, u), 1 <= k <= u: the fewest bytes
 * among the fixed width (fixed_nbytes 2 or 4, the index_dtype's), EF and
 * the bitmap; ties in that order. NONE for k <= 0. */
IGRAD__WC int igrad__code_choose(int64_t k, int64_t u, int fixed_nbytes)
{
    if (k <= 0) return IGRAD__CODE_NONE;
    int best = fixed_nbytes == 2 ? IGRAD__CODE_FIXED16 : IGRAD__CODE_FIXED32;
    int64_t nb = igrad__code_nbytes(best, k, u);
    if (igrad__code_nbytes(IGRAD__CODE_EF, k, u) < nb) {
        best = IGRAD__CODE_EF;
        nb = igrad__code_nbytes(best, k, u);
    }
    if (igrad__code_nbytes(IGRAD__CODE_BITMAP, k, u) < nb) best = IGRAD__CODE_BITMAP;
    return best;
}

/* Bits [bit, bit + n) of p (n <= 57), LSB first. */
IGRAD__WC uint64_t igrad__bits_get(const unsigned char *p, uint64_t bit, int n)
{
    uint64_t v = 0;
    int got = 0;
    while (got < n) {
        unsigned sh = (unsigned)(bit & 7u);
        int take = 8 - (int)sh;
        if (take > n - got) take = n - got;
        uint64_t b = (uint64_t)(p[bit >> 3] >> sh) & ((1u << take) - 1u);
        v |= b << got;
        got += take;
        bit += (uint64_t)take;
    }
    return v;
}

/* ORs the n low bits of v into p at bit (the bits there are zero). */
IGRAD__WC void igrad__bits_put(unsigned char *p, uint64_t bit, uint64_t v, int n)
{
    int put = 0;
    while (put < n) {
        unsigned sh = (unsigned)(bit & 7u);
        int take = 8 - (int)sh;
        if (take > n - put) take = n - put;
        p[bit >> 3] |= (unsigned char)(((v >> put) & ((1u << take) - 1u)) << sh);
        put += take;
        bit += (uint64_t)take;
    }
}

/* Writes the run idx[0..k) (strictly increasing, < u: the selection's own
 * indices) coded as `code` into out[0 .. igrad__code_nbytes(code, k, u)),
 * padding bits zero. */
IGRAD__WC void igrad__code_encode(int code, const uint32_t *idx, int64_t k, int64_t u,
                                  unsigned char *out)
{
    int64_t nb = igrad__code_nbytes(code, k, u);
    for (int64_t b = 0; b < nb; b++) out[b] = 0;
    if (code == IGRAD__CODE_FIXED16 || code == IGRAD__CODE_FIXED32) {
        int w = code == IGRAD__CODE_FIXED16 ? 2 : 4;
        for (int64_t i = 0; i < k; i++)
            for (int b = 0; b < w; b++) out[i * w + b] = (unsigned char)(idx[i] >> (8 * b));
    } else if (code == IGRAD__CODE_EF) {
        int l = igrad__ef_low_bits(k, u);
        uint64_t hi0 = (uint64_t)k * (uint64_t)l;
        for (int64_t i = 0; i < k; i++) {
            if (l > 0) igrad__bits_put(out, (uint64_t)i * (uint64_t)l, idx[i], l);
            uint64_t pos = hi0 + ((uint64_t)idx[i] >> l) + (uint64_t)i;
            out[pos >> 3] |= (unsigned char)(1u << (pos & 7u));
        }
    } else if (code == IGRAD__CODE_BITMAP) {
        for (int64_t i = 0; i < k; i++) out[idx[i] >> 3] |= (unsigned char)(1u << (idx[i] & 7u));
    }
}

/* A reader of one coded run: igrad__code_start, then k calls of
 * igrad__code_next, then igrad__code_finish. */
typedef struct igrad__code_rd {
    const unsigned char *p;
    int code, l;
    int64_t k, u, i, prev;
    uint64_t hi0;   /* EF: first bit of the high part */
    uint64_t end;   /* bits of the run's bytes */
    uint64_t pos;   /* EF, bitmap: the next bit to look at (absolute) */
} igrad__code_rd_t;

IGRAD__WC void igrad__code_start(igrad__code_rd_t *rd, int code, const unsigned char *p,
                                 int64_t k, int64_t u)
{
    rd->p = p;
    rd->code = code;
    rd->k = k;
    rd->u = u;
    rd->i = 0;
    rd->prev = -1;
    rd->l = code == IGRAD__CODE_EF ? igrad__ef_low_bits(k, u) : 0;
    rd->hi0 = code == IGRAD__CODE_EF ? (uint64_t)k * (uint64_t)rd->l : 0;
    rd->pos = rd->hi0;
    rd->end = 8u * (uint64_t)igrad__code_nbytes(code, k, u);
}

/* The first set bit at or after `from`, below `end`; `end` if none. */
IGRAD__WC uint64_t igrad__code_scan(const unsigned char *p, uint64_t from, uint64_t end)
{
    while (from < end) {
        unsigned byte = (unsigned)p[from >> 3] >> (from & 7u);
        if (byte == 0) {
            from = (from | 7u) + 1u; /* the rest of this byte is zero */
            continue;
        }
        while (!(byte & 1u)) {
            byte >>= 1;
            from++;
        }
        return from < end ? from : end;
    }
    return end;
}

/* The next index of the run into *x; 0 or an IGRAD__CODE_E_* error. */
IGRAD__WC int igrad__code_next(igrad__code_rd_t *rd, uint32_t *x)
{
    int64_t v;
    const unsigned char *p = rd->p;
    if (rd->code == IGRAD__CODE_FIXED16) {
        v = (int64_t)p[2 * rd->i] | (int64_t)p[2 * rd->i + 1] << 8;
    } else if (rd->code == IGRAD__CODE_FIXED32) {
        const unsigned char *q = p + 4 * rd->i;
        v = (int64_t)((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                      (uint32_t)q[3] << 24);
    } else if (rd->code == IGRAD__CODE_EF) {
        uint64_t hi_end = rd->hi0 + (uint64_t)rd->k + ((uint64_t)rd->u >> rd->l);
        uint64_t at = igrad__code_scan(p, rd->pos, hi_end);
        if (at >= hi_end) return IGRAD__CODE_E_FEW;
        rd->pos = at + 1u;
        uint64_t high = at - rd->hi0 - (uint64_t)rd->i; /* >= 0: ones before it are i */
        uint64_t low =
            rd->l > 0 ? igrad__bits_get(p, (uint64_t)rd->i * (uint64_t)rd->l, rd->l) : 0;
        v = (int64_t)((high << rd->l) | low);
    } else if (rd->code == IGRAD__CODE_BITMAP) {
        uint64_t at = igrad__code_scan(p, rd->pos, rd->end);
        if (at >= rd->end) return IGRAD__CODE_E_FEW;
        rd->pos = at + 1u;
        v = (int64_t)at;
    } else {
        return IGRAD__CODE_E_FEW;
    }
    rd->i++;
    if (v >= rd->u) return IGRAD__CODE_E_RANGE;
    if (v <= rd->prev) return IGRAD__CODE_E_ORDER;
    rd->prev = v;
    *x = (uint32_t)v;
    return 0;
}

/* After k indices: 0, or IGRAD__CODE_E_MANY when a bit after the last one
 * is set (another one in the high part or bitmap, or padding). */
IGRAD__WC int igrad__code_finish(const igrad__code_rd_t *rd)
{
    if (rd->code != IGRAD__CODE_EF && rd->code != IGRAD__CODE_BITMAP) return 0;
    return igrad__code_scan(rd->p, rd->pos, rd->end) < rd->end ? IGRAD__CODE_E_MANY : 0;
}

#endif /* IGRAD_WIRE_CODE_H */
