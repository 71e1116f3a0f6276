/*
 * value16.h — float32 <-> bfloat16 / IEEE binary16 conversions with
 * round-to-nearest-even, as static inline functions for the data plane's
 * loops (the 16-bit values of the sparse wire, formats.md §8) and for
 * igrad_convert() (value16.c). NaN becomes the quiet NaN PyTorch writes
 * (bf16 0x7FC0; f16 sign | 0x7E00); a finite float beyond the f16 range
 * (|x| >= 65520) becomes +-Inf, as in PyTorch. tests/python/
 * test_value16.py checks both against torch's .to(bfloat16) and .half().
 *
 * igrad__round16 is the value the engine sends (the clamp of f16
 * overflow); where the rounding error goes is select.c's (pass 2 writes
 * it into the residual).
 */
#ifndef IGRAD_VALUE16_H
#define IGRAD_VALUE16_H

#include "igrad.h"

#include <stdint.h>
#include <string.h>

/* The scalar conversions compile for the host (a C compiler) and for the
 * device (nvcc: __host__ __device__), as core/wire_code.h does for the
 * index codes, so the CUDA data plane (dp_cuda_select.cu, dp_cuda_pack.cu)
 * rounds, writes and reads the wire's values with the very arithmetic the
 * CPU backend and tests/test_value16.c run. */
#ifdef __CUDACC__
#define IGRAD__V16 static inline __host__ __device__
#else
#define IGRAD__V16 static inline
#endif

IGRAD__V16 uint32_t igrad__f32_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

IGRAD__V16 float igrad__f32_from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

IGRAD__V16 uint16_t igrad__f32_to_bf16(float f)
{
    uint32_t u = igrad__f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0; /* NaN */
    u += 0x7fffu + ((u >> 16) & 1u);                   /* ties to even; Inf stays Inf */
    return (uint16_t)(u >> 16);
}

IGRAD__V16 float igrad__bf16_to_f32(uint16_t h)
{
    return igrad__f32_from_bits((uint32_t)h << 16);
}

/* Shifts m right by s in [1, 31] rounding to nearest, ties to even. */
IGRAD__V16 uint32_t igrad__shift_rne(uint32_t m, unsigned s)
{
    uint32_t q = m >> s, rem = m & ((1u << s) - 1u), half = 1u << (s - 1u);
    return q + (rem > half || (rem == half && (q & 1u)));
}

IGRAD__V16 uint16_t igrad__f32_to_f16(float f)
{
    uint32_t u = igrad__f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;      /* NaN */
    if (a >= 0x477ff000u) return sign | 0x7c00;     /* >= 65520 (or Inf): Inf */
    if (a >= 0x38800000u)                            /* >= 2^-14: normal */
        return sign | (uint16_t)igrad__shift_rne(a - 0x38000000u, 13);
    if (a < 0x33000000u) return sign;               /* < 2^-25: zero */
    /* subnormal: m * 2^(E-23) in units of 2^-24 is m >> -(E+1) */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;
    int e = (int)(a >> 23) - 127; /* in [-25, -15] */
    return sign | (uint16_t)igrad__shift_rne(m, (unsigned)(-(e + 1)));
}

IGRAD__V16 float igrad__f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return igrad__f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e) return igrad__f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
    float v = (float)m * 0x1p-24f; /* subnormal or zero: exact */
    return sign ? -v : v;
}

/* The value dtype's 16-bit code of f, and back (F16 or BF16). */
IGRAD__V16 uint16_t igrad__to16(igrad_dtype_t dt, float f)
{
    return dt == IGRAD_DTYPE_BF16 ? igrad__f32_to_bf16(f) : igrad__f32_to_f16(f);
}

IGRAD__V16 float igrad__from16(igrad_dtype_t dt, uint16_t h)
{
    return dt == IGRAD_DTYPE_BF16 ? igrad__bf16_to_f32(h) : igrad__f16_to_f32(h);
}

/* The largest finite value of the 16-bit dtype: F16 65504, BF16 (1 - 2^-8) 2^128. */
IGRAD__V16 float igrad__max16(igrad_dtype_t dt)
{
    return dt == IGRAD_DTYPE_BF16 ? 0x1.fep127f : 65504.0f;
}

/* One value v as the 16-bit wire carries it: round-to-nearest-even, and a
 * finite value that would round to Inf (F16: |v| >= 65520; BF16: within
 * half a step of FLT_MAX) clamped to the largest finite value (65504;
 * 0x1.fep127). Returns the rounded value (exactly representable in dt). */
IGRAD__V16 float igrad__round16(igrad_dtype_t dt, float v)
{
    float q = igrad__from16(dt, igrad__to16(dt, v));
    if ((igrad__f32_bits(q) & 0x7fffffffu) == 0x7f800000u) /* Inf */
        q = v > 0.0f ? igrad__max16(dt) : -igrad__max16(dt);
    return q;
}

#ifndef __cplusplus /* the buffer loops: C only (restrict) */
/* n 16-bit codes of dt (F16 or BF16) as floats (exact), and n floats
 * rounded to nearest even into codes of dt (beyond the F16 range: Inf, as
 * PyTorch's .half()): how the data plane reads and writes 16-bit
 * gradients (config.grad_dtype). The dtype is tested once, not per entry. */
static inline void igrad__from16_n(igrad_dtype_t dt, const uint16_t *restrict src,
                                   float *restrict dst, int64_t n)
{
    if (dt == IGRAD_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = igrad__bf16_to_f32(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = igrad__f16_to_f32(src[i]);
}

static inline void igrad__to16_n(igrad_dtype_t dt, const float *restrict src,
                                 uint16_t *restrict dst, int64_t n)
{
    if (dt == IGRAD_DTYPE_BF16)
        for (int64_t i = 0; i < n; i++) dst[i] = igrad__f32_to_bf16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) dst[i] = igrad__f32_to_f16(src[i]);
}

#endif /* !__cplusplus */

#endif /* IGRAD_VALUE16_H */
