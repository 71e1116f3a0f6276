/*
 * value8.h — the FP8 values of the sparse wire (config.value_dtype
 * F8_E4M3, formats.md §8 "Value types"), written once as functions that
 * compile for the host (a C compiler) and for the device (nvcc:
 * __host__ __device__), as wire_code.h is for the index codes.
 *
 * A code is OCP FP8 E4M3: sign, 4 exponent bits (bias 7), 3 mantissa
 * bits; no infinities; S.1111.111 is NaN; the largest finite value is
 * 448 (S.1111.110), the smallest subnormal 2^-9. A block of the wire
 * carries one scale, a power of two 2^k (an F32, normal: k in [-126,
 * 127]), and each value as a code c with value = decode(c) * 2^k.
 *
 * The scale of a block is a function of its values: the smallest k >=
 * -126 with max |v| <= 448 * 2^k (igrad__fp8_scale_exp), so the block's
 * largest value maps into (224, 448] (or below, at the clamp). A value v
 * is sent as q = the E4M3 code of v / 2^k rounded to nearest, ties to
 * even (igrad__fp8_round): v / 2^k and decode(c) * 2^k are exact (powers
 * of two; v / 2^k can only lose bits where it is far below the smallest
 * subnormal, which rounds to 0 anyway), so there is exactly one rounding,
 * q is v rounded onto the grid 2^k * E4M3, and v - q is exact in F32
 * (q = 0, or within a factor 2 of v: Sterbenz). A q that would overflow
 * F32 (|v| within 2^-4 of FLT_MAX) takes the next code towards 0.
 *
 * Why a power of two and not max / 448: E4M3's precision is relative (3
 * bits in every binade), so mapping the maximum to exactly 448 changes
 * no value's relative error in the normal range, only the subnormal floor
 * by at most one binade; in exchange the pack needs nothing but the
 * rounded values (the scale of already rounded values is the sender's k
 * or k - 1, and each rounded value is exactly a code in either), and the
 * receiver's check is simple: a scale that is not a positive normal
 * power of two is a peer's bad byte.
 *
 * Also here, for every value type: a block's value area entry by entry
 * (igrad__value_write16, igrad__value_start, igrad__value_read), what the
 * CPU data plane (dp_cpu_pack.c, dp_cpu_unpack.c) and the CUDA one
 * (dp_cuda_pack.cu) write and read, and igrad__fp8_scales / _head, the
 * block scale both derive from a block's largest magnitude.
 *
 * Not here: where the rounding error goes (each data plane's select puts
 * v - q into the residual), which entries a block holds (plan_step.c).
 */
#ifndef IGRAD_VALUE8_H
#define IGRAD_VALUE8_H

#include "core/value16.h" /* the bit helpers, igrad__shift_rne, the 16-bit codes */

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define IGRAD__V8 static inline __host__ __device__
#else
#define IGRAD__V8 static inline
#endif

#define IGRAD__FP8_MAX 448.0f   /* the largest finite E4M3 value */
#define IGRAD__FP8_CODE_MAX 0x7e /* its code (sign clear) */
#define IGRAD__FP8_SCALE_NBYTES 4 /* the F32 scale at the head of a block's values */
#define IGRAD__FP8_KMIN (-126)   /* the smallest scale exponent (a normal F32) */

/* The bytes a block of n values takes on the wire for value bytes vw per
 * value (4 F32, 2 BF16/F16, 1 FP8: n codes after the 4-byte scale). */
IGRAD__V8 int64_t igrad__value_area_nbytes(int vw, int64_t n)
{
    return n * vw + (vw == 1 && n > 0 ? IGRAD__FP8_SCALE_NBYTES : 0);
}

/* Code c is NaN (S.1111.111). */
IGRAD__V8 int igrad__fp8_is_nan(uint8_t c)
{
    return (c & 0x7f) == 0x7f;
}

/* The value of code c (exact in F32; NaN for the NaN codes). */
IGRAD__V8 float igrad__fp8_decode(uint8_t c)
{
    uint32_t sign = (uint32_t)(c & 0x80u) << 24, e = (c >> 3) & 0xfu, m = c & 7u;
    if (e == 0xf && m == 7) return igrad__f32_from_bits(sign | 0x7fc00000u);
    if (e) return igrad__f32_from_bits(sign | ((e + 120u) << 23) | (m << 20));
    float v = (float)m * 0x1p-9f; /* subnormal or zero */
    return sign ? -v : v;
}

/* The E4M3 code of x rounded to nearest, ties to even; |x| > 448 (and
 * Inf) saturates to +-448; NaN gives the NaN code (no sender makes one). */
IGRAD__V8 uint8_t igrad__fp8_encode(float x)
{
    uint32_t u = igrad__f32_bits(x);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);           /* NaN */
    if (a > 0x43e00000u) return (uint8_t)(sign | IGRAD__FP8_CODE_MAX); /* > 448 */
    if (a >= 0x3c800000u)                                         /* >= 2^-6: normal */
        return (uint8_t)(sign | igrad__shift_rne(a - (120u << 23), 20));
    int e = (int)(a >> 23) - 127; /* below 2^-6: units of 2^-9 */
    if (e < -10) return sign;     /* < 2^-10 (half the smallest subnormal): 0 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u; /* x = m * 2^(e-23) = (m >> (14-e)) 2^-9 */
    return (uint8_t)(sign | igrad__shift_rne(m, (unsigned)(14 - e)));
}

/* The exponent k of a block's scale from its largest magnitude amax (>= 0,
 * finite): the smallest k >= -126 with amax <= 448 * 2^k. */
IGRAD__V8 int igrad__fp8_scale_exp(float amax)
{
    uint32_t a = igrad__f32_bits(amax) & 0x7fffffffu;
    if ((a >> 23) == 0) return IGRAD__FP8_KMIN; /* zero or subnormal */
    /* amax = M 2^E, M in [1, 2); 448 = 1.75 * 2^8 */
    int k = (int)(a >> 23) - 127 - 8 + ((a & 0x7fffffu) > 0x600000u);
    return k < IGRAD__FP8_KMIN ? IGRAD__FP8_KMIN : k;
}

/* 2^k as an F32, k in [-126, 127] (a scale's k is at most 120: FLT_MAX
 * <= 448 * 2^120, so its inverse is one too) */
IGRAD__V8 float igrad__fp8_pow2(int k)
{
    return igrad__f32_from_bits((uint32_t)(k + 127) << 23);
}

/* A received scale's exponent k, or 0x7fffffff when its bits are not a
 * positive normal power of two (a peer's bad bytes). */
IGRAD__V8 int igrad__fp8_scale_read(const unsigned char *p)
{
    uint32_t u;
    memcpy(&u, p, 4);
    uint32_t e = u >> 23;
    if ((u & 0x7fffffu) || e == 0 || e >= 0xff) return 0x7fffffff; /* also any sign */
    return (int)e - 127;
}

/* v's code at scale 2^k (inv = 2^-k, s = 2^k): round to nearest even; a
 * code whose value would overflow F32 steps one towards 0. */
IGRAD__V8 uint8_t igrad__fp8_code(float v, float inv, float s)
{
    uint8_t c = igrad__fp8_encode(v * inv);
    float q = igrad__fp8_decode(c) * s;
    if (q - q != 0.0f) c = (uint8_t)(c - 1); /* Inf: |c| > 0, so c - 1 keeps the sign */
    return c;
}

/* The value the wire carries for v at scale 2^k. */
IGRAD__V8 float igrad__fp8_round(float v, float inv, float s)
{
    return igrad__fp8_decode(igrad__fp8_code(v, inv, s)) * s;
}

/* The largest magnitude of n values (0 when n = 0). */
IGRAD__V8 float igrad__fp8_block_amax(const float *v, int64_t n)
{
    float amax = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        float a = v[i] < 0.0f ? -v[i] : v[i];
        if (a > amax) amax = a;
    }
    return amax;
}

/* The scale exponent of n values (max |v|). */
IGRAD__V8 int igrad__fp8_block_exp(const float *v, int64_t n)
{
    return igrad__fp8_scale_exp(igrad__fp8_block_amax(v, n));
}

/* The scale 2^k and its inverse 2^-k of a block whose largest magnitude
 * is amax (k = igrad__fp8_scale_exp(amax), in [-126, 120]). */
IGRAD__V8 void igrad__fp8_scales(float amax, float *s, float *inv)
{
    int k = igrad__fp8_scale_exp(amax);
    *s = igrad__fp8_pow2(k);
    *inv = igrad__fp8_pow2(-k);
}

/* The head of a block's value area (its scale, 4 bytes little-endian at
 * out) from the block's largest magnitude amax; *s and *inv as
 * igrad__fp8_scales. */
IGRAD__V8 void igrad__fp8_head(unsigned char *out, float amax, float *s, float *inv)
{
    igrad__fp8_scales(amax, s, inv);
    uint32_t u = igrad__f32_bits(*s);
    for (int b = 0; b < IGRAD__FP8_SCALE_NBYTES; b++) out[b] = (unsigned char)(u >> (8 * b));
}

/* A block's value area from n already rounded values (each exactly
 * representable at the scale their maximum gives): the scale, then the
 * n codes. */
IGRAD__V8 void igrad__fp8_pack(const float *v, int64_t n, unsigned char *out)
{
    float s, inv;
    igrad__fp8_head(out, igrad__fp8_block_amax(v, n), &s, &inv);
    for (int64_t i = 0; i < n; i++)
        out[IGRAD__FP8_SCALE_NBYTES + i] = igrad__fp8_code(v[i], inv, s);
}

/* ---- a block's value area, entry by entry: what the CPU and CUDA packs
 * write and their unpacks read (formats.md §8; vw = value bytes: 4 F32, 2
 * the 16-bit codes of dt, 1 FP8; little-endian at any alignment) ---- */

/* Entry k's 16-bit code h into the area at p. */
IGRAD__V8 void igrad__value_write16(unsigned char *p, int64_t k, uint16_t h)
{
    p[2 * k] = (unsigned char)(h & 0xffu);
    p[2 * k + 1] = (unsigned char)(h >> 8);
}

/* Starts reading a block's value area at p: *v0 = its first value's
 * bytes, *s = the scale each value is multiplied by (FP8: the head's
 * 2^k; else 1). 0, or -1 when an FP8 head is not a positive normal power
 * of two (a peer's bad bytes; *v0 is then p and *s 1). */
IGRAD__V8 int igrad__value_start(const unsigned char *p, int vw, const unsigned char **v0,
                                 float *s)
{
    *v0 = p;
    *s = 1.0f;
    if (vw != 1) return 0;
    int k = igrad__fp8_scale_read(p);
    if (k == 0x7fffffff) return -1;
    *v0 = p + IGRAD__FP8_SCALE_NBYTES;
    *s = igrad__fp8_pow2(k);
    return 0;
}

/* Value k of an area whose first value's bytes are v0 (igrad__value_start)
 * as F32: exact; FP8 gives NaN for a NaN code and Inf where code times s
 * overflows (a receiver refuses both as non-finite). */
IGRAD__V8 float igrad__value_read(const unsigned char *v0, int vw, igrad_dtype_t dt, float s,
                                  int64_t k)
{
    if (vw == 1) return igrad__fp8_decode(v0[k]) * s;
    if (vw == 2)
        return igrad__from16(dt, (uint16_t)(v0[2 * k] | (unsigned)v0[2 * k + 1] << 8));
    const unsigned char *q = v0 + 4 * k;
    return igrad__f32_from_bits((uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                                (uint32_t)q[3] << 24);
}

#endif /* IGRAD_VALUE8_H */
