/*
 * value16.c — igrad_convert(): buffers between F32 and the 16-bit float
 * dtypes (F16, BF16), with the converters of value16.h that the data plane
 * uses for the wire's 16-bit values.
 */
#include "core/value16.h"
#include "core/internal.h"

static int is16(igrad_dtype_t d) { return d == IGRAD_DTYPE_F16 || d == IGRAD_DTYPE_BF16; }

igrad_status_t igrad_convert(const void *src, igrad_dtype_t src_dtype, void *dst,
                             igrad_dtype_t dst_dtype, size_t count)
{
    IGRAD_FAIL_IF(count > 0 && (!src || !dst), IGRAD_E_INVALID, "igrad_convert: NULL buffer");
    int ok = src_dtype == dst_dtype ? src_dtype == IGRAD_DTYPE_F32 || is16(src_dtype)
                                    : (src_dtype == IGRAD_DTYPE_F32 && is16(dst_dtype)) ||
                                          (is16(src_dtype) && dst_dtype == IGRAD_DTYPE_F32);
    IGRAD_FAIL_IF(!ok, IGRAD_E_INVALID,
                  "igrad_convert: %s to %s is not supported (F32 to or from F16 or BF16)",
                  igrad_dtype_name(src_dtype), igrad_dtype_name(dst_dtype));
    if (count == 0) return IGRAD_OK;
    if (src_dtype == dst_dtype) {
        if (src != dst) memmove(dst, src, count * igrad_dtype_nbytes(src_dtype));
        return IGRAD_OK;
    }
    if (src_dtype == IGRAD_DTYPE_F32) {
        const float *s = src;
        uint16_t *d = dst;
        for (size_t i = 0; i < count; i++) d[i] = igrad__to16(dst_dtype, s[i]);
    } else {
        const uint16_t *s = src;
        float *d = dst;
        for (size_t i = 0; i < count; i++) d[i] = igrad__from16(src_dtype, s[i]);
    }
    return IGRAD_OK;
}
