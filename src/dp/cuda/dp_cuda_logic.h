/*
 * dp_cuda_logic.h — the numeric decisions of the CUDA data plane
 * (dp_cuda*.cu), written once as functions that compile both for the
 * device (nvcc: __host__ __device__) and for the host (a C compiler), so
 * that tests/test_cuda_logic.c drives exactly this code on the CPU against
 * a sort and against the CPU backend's selection (select.c):
 *  - the key of |a|: the float's bits without the sign, which order like
 *    the values for every finite a (|-0| and 0 share key 0);
 *  - exact k-th largest key by most-significant-digit radix select in three
 *    rounds of 11 + 10 + 10 bits (the 31 bits that matter): per round a
 *    histogram of the digit over the entries that match the prefix chosen
 *    so far, then the digit holding the k-th largest and the rank left
 *    inside it. After the last round the prefix is the k-th largest key
 *    and the rank left is how many entries equal to it are kept;
 *  - the tie rule (select.c's): every key above the k-th is kept, and of
 *    the keys equal to it the `ties` of lowest index, so an entry's place
 *    in the selection is (greater before it) + min(ties before it, ties);
 *  - the wire's little-endian reads and writes at any byte offset (a
 *    rank's bytes need not be aligned), 16-bit column indices;
 *  - the float operations whose rounding must match the CPU's one by one
 *    (g + e, m*u + g, d*(u + r), g + v/P as v * (1/P)): explicit
 *    round-to-nearest on the device so that no multiply-add is fused.
 * Not here: kernels, launches, memory (dp_cuda*.cu).
 */
#ifndef IGRAD_DP_CUDA_LOGIC_H
#define IGRAD_DP_CUDA_LOGIC_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define IGRAD_HD static inline __host__ __device__
#else
#define IGRAD_HD static inline
#endif

#define IGRAD__RADIX_ROUNDS 3
#define IGRAD__RADIX_BINS_MAX 2048 /* 11 bits in the first round */
#define IGRAD__KEY_INF 0x7f800000u /* keys at or above it are Inf or NaN */

/* |v| as an orderable integer (finite v). */
IGRAD_HD uint32_t igrad__key(float v)
{
#ifdef __CUDA_ARCH__
    return __float_as_uint(v) & 0x7fffffffu;
#else
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
#endif
}

/* Round r's digit: bits [shift, shift + bits) of the key. */
IGRAD_HD int igrad__radix_shift(int round) { return round == 0 ? 20 : round == 1 ? 10 : 0; }
IGRAD_HD uint32_t igrad__radix_bins(int round) { return round == 0 ? 2048u : 1024u; }

IGRAD_HD uint32_t igrad__radix_digit(uint32_t key, int round)
{
    return (key >> igrad__radix_shift(round)) & (igrad__radix_bins(round) - 1u);
}

/* Does key agree with the prefix chosen in the rounds before `round`? */
IGRAD_HD int igrad__radix_matches(uint32_t key, uint32_t prefix, int round)
{
    if (round == 0) return 1;
    int above = igrad__radix_shift(round - 1); /* the lowest bit already chosen */
    return (key >> above) == (prefix >> above);
}

/* The digit of round `round` holding the *k-th largest (1-based) of the
 * entries counted in hist[0..bins), scanning from the largest digit;
 * *k becomes the rank inside that digit. Requires 1 <= *k <= the total. */
IGRAD_HD uint32_t igrad__radix_choose(const uint32_t *hist, int round, uint64_t *k)
{
    uint32_t d = igrad__radix_bins(round) - 1u;
    uint64_t above = 0;
    while (d > 0 && above + hist[d] < *k) above += hist[d--];
    *k -= above;
    return d;
}

/* The prefix after choosing digit d in round `round`. */
IGRAD_HD uint32_t igrad__radix_extend(uint32_t prefix, uint32_t d, int round)
{
    return prefix | d << igrad__radix_shift(round);
}

/* The tie rule: is an entry with this key, `ties_before` entries equal to
 * kth before it, kept when `ties` of the equal ones are? */
IGRAD_HD int igrad__keep(uint32_t key, uint32_t kth, uint64_t ties_before, uint64_t ties)
{
    return key > kth || (key == kth && ties_before < ties);
}

/* Place of a kept entry in the selection (index order). */
IGRAD_HD uint64_t igrad__keep_slot(uint64_t greater_before, uint64_t ties_before, uint64_t ties)
{
    return greater_before + (ties_before < ties ? ties_before : ties);
}

/* ---- wire bytes (little-endian, any alignment) ---- */

IGRAD_HD uint32_t igrad__read_index(const unsigned char *p, int width, int64_t k)
{
    const unsigned char *q = p + (int64_t)width * k;
    uint32_t v = (uint32_t)q[0] | (uint32_t)q[1] << 8;
    if (width == 4) v |= (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    return v;
}

IGRAD_HD void igrad__write_index16(unsigned char *p, int64_t k, uint32_t column)
{
    p[2 * k] = (unsigned char)(column & 0xffu);
    p[2 * k + 1] = (unsigned char)((column >> 8) & 0xffu);
}

IGRAD_HD float igrad__read_value(const unsigned char *p, int64_t k)
{
    const unsigned char *q = p + 4 * k;
    uint32_t u = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                 (uint32_t)q[3] << 24;
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
#endif
}

/* ---- float operations in the CPU's rounding ---- */

IGRAD_HD float igrad__fadd(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

IGRAD_HD float igrad__fmul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

/* m*u + g (momentum correction), two roundings */
IGRAD_HD float igrad__momentum(float m, float u, float g)
{
    return igrad__fadd(igrad__fmul(m, u), g);
}

/* g + v * inv (unpack: inv = 1/P), two roundings */
IGRAD_HD float igrad__unpack_add(float g, float v, float inv)
{
    return igrad__fadd(g, igrad__fmul(v, inv));
}

/* Is a finite (select.c's test: |a| <= FLT_MAX)? */
IGRAD_HD int igrad__finite(float a) { return igrad__key(a) < IGRAD__KEY_INF; }

#endif /* IGRAD_DP_CUDA_LOGIC_H */
