/*
 * dp_cpu_unpack.c — the CPU data plane's unpack stage: a bucket's
 * received bytes into the caller's gradients, times 1/P (a product: exact
 * for P a power of 2), in a fixed order (bucket, then rank) so that every
 * rank ends with bit-identical gradients. Received bytes are not trusted:
 * every index is checked against its tensor or row first, and a bad one
 * names the rank that sent it. 16-bit values (BF16, F16) are decoded to
 * F32 (exact) and added in the same order. 16-bit gradients
 * (config.grad_dtype) are unpacked all at once after the last bucket,
 * tensor by tensor through an F32 copy, and rounded once (unpack16).
 */
#include "dp_cpu.h"
#include "value16.h"

#include <string.h>

/* Value k of a values area: F32, or the 16-bit code of dt (width 2). */
static inline float read_value(const unsigned char *p, int width, igrad_dtype_t dt, int64_t k)
{
    if (width == 4) {
        float v;
        memcpy(&v, p + 4 * k, 4);
        return v;
    }
    uint16_t h;
    memcpy(&h, p + 2 * k, 2);
    return igrad__from16(dt, h);
}

static inline uint32_t read_index(const unsigned char *p, int width, int64_t k)
{
    if (width == 4) {
        uint32_t i;
        memcpy(&i, p + 4 * k, 4);
        return i;
    }
    uint16_t s;
    memcpy(&s, p + 2 * k, 2);
    return s;
}

igrad_status_t igrad__dp_bad_index(const igrad_engine_t *e, const igrad__engine_bucket_t *bk,
                                   const igrad__engine_block_t *bi, int r, int64_t k,
                                   uint32_t v, int64_t bound)
{
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       "step %lld: bucket %d: rank %d sent index %lu for tensor %s (entry %lld "
                       "of a block of %lld), outside [0, %lld) %s; its bytes are bad (a "
                       "corrupt transport, or ranks out of step); nothing more is unpacked "
                       "and the engine is unusable",
                       (long long)e->cur_step, bk->index, r, (unsigned long)v,
                       e->t[bi->tensor].name, (long long)(bi->first + k), (long long)bi->count,
                       (long long)bound, bi->row_wise ? "(a column of its row)" : "");
}

/* The first received index of a block outside [0, bound), reported. */
static igrad_status_t bad_index(const igrad_engine_t *e, const igrad__engine_bucket_t *bk,
                                const igrad__engine_block_t *bi, int r,
                                const unsigned char *ip, int64_t bound)
{
    int64_t k = 0;
    uint32_t v = 0;
    for (; k < bi->count; k++) {
        v = read_index(ip, bi->idx_nbytes, k);
        if ((int64_t)v >= bound) break;
    }
    return igrad__dp_bad_index(e, bk, bi, r, k, v, bound);
}

/* Sparse wire: adds every rank's entries, in rank order, times 1/P into
 * grads. Received indices are checked against their tensor (flat) or row
 * (row-wise) before use; on a bad one the gradients are partly written. */
static igrad_status_t unpack_sparse(igrad_engine_t *e, size_t j, float *const *grads,
                                    int64_t only, int *hit)
{
    const igrad__engine_bucket_t *bk = &e->bk[j];
    int par = igrad__step_parity(e, e->cur_step);
    /* multiplying by 1/P: exact division for powers of two, and a loop
     * that vectorizes */
    const float inv = 1.0f / (float)e->nranks;
    const int vw = e->value_nbytes;
    const igrad_dtype_t vt = e->cfg.value_dtype;
    for (int r = 0; r < e->nranks; r++) {
        const unsigned char *base = e->recv_arena + bk->recv_off + (size_t)r * bk->send_nbytes;
        for (size_t q = 0; q < bk->nblocks; q++) {
            const igrad__engine_block_t *bi = &e->binfo[e->order[bk->first + q]];
            if (only >= 0 && bi->tensor != (size_t)only) continue;
            *hit = 1;
            const igrad__engine_tensor_t *tp = &e->t[bi->tensor];
            float *g = grads[bi->tensor];
            const unsigned char *vp = base + bi->val_off, *ip = base + bi->idx_off;
            /* A rank's bytes start at r * send_nbytes, which need not be
             * 4-aligned: read through memcpy. */
            if (bi->row_wise) {
                const igrad_select_spec_t *sp = &tp->spec[e->rel[bi->tensor]][par];
                const uint32_t cols = (uint32_t)sp->cols;
                int64_t rows = bi->count / sp->per_row, k = 0;
                for (int64_t rr = 0; rr < rows; rr++) {
                    float *grow = g + (bi->row0 + rr) * sp->cols;
                    for (int64_t c = 0; c < sp->per_row; c++, k++) {
                        uint32_t i = read_index(ip, bi->idx_nbytes, k);
                        if (i >= cols) return bad_index(e, bk, bi, r, ip, sp->cols);
                        grow[i] += read_value(vp, vw, vt, k) * inv;
                    }
                }
            } else {
                const uint64_t n = (uint64_t)tp->n;
                for (int64_t k = 0; k < bi->count; k++) {
                    uint32_t i = read_index(ip, bi->idx_nbytes, k);
                    if (i >= n) return bad_index(e, bk, bi, r, ip, tp->n);
                    g[i] += read_value(vp, vw, vt, k) * inv;
                }
            }
        }
    }
    return IGRAD_OK;
}

/* Dense wire: the summed segments times 1/P added into grads (the dense
 * method assigns: its segments tile every tensor). Dense floats only: the
 * offsets and counts are this rank's own plan, nothing to check. */
static igrad_status_t unpack_dense(igrad_engine_t *e, size_t j, float *const *grads,
                                   int64_t only, int *hit)
{
    const igrad__engine_bucket_t *bk = &e->bk[j];
    const float inv = 1.0f / (float)e->nranks; /* as in the sparse wire */
    const float *buf = (const float *)(const void *)(e->recv_arena + bk->recv_off);
    int dense = e->sp == IGRAD_SPARSIFIER_NONE;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__engine_block_t *bi = &e->binfo[e->order[bk->first + q]];
        if (!bi->seg_owner || (only >= 0 && bi->tensor != (size_t)only)) continue;
        *hit = 1;
        float *restrict g = grads[bi->tensor] + bi->seg_begin;
        const float *restrict s = buf + bi->dense_off;
        int64_t cnt = bi->seg_count;
        if (dense) {
            SIMD
            for (int64_t k = 0; k < cnt; k++) g[k] = s[k] * inv;
        } else {
            SIMD
            for (int64_t k = 0; k < cnt; k++) g[k] += s[k] * inv;
        }
    }
    return IGRAD_OK;
}

igrad_status_t igrad__dp_cpu_unpack_sparse(igrad_engine_t *e, size_t j, float *const *grads)
{
    int hit = 0;
    return unpack_sparse(e, j, grads, -1, &hit);
}

igrad_status_t igrad__dp_cpu_unpack_dense(igrad_engine_t *e, size_t j, float *const *grads)
{
    int hit = 0;
    return unpack_dense(e, j, grads, -1, &hit);
}

/* 16-bit gradients: tensor by tensor, g upcast into an F32 copy, every
 * bucket's blocks of that tensor added into the copy (buckets ascending,
 * then ranks: each entry's sum in the order the F32 unpack adds it), then
 * the copy rounded once to nearest even into g. A tensor no block touches
 * keeps its g (the round trip would be the identity). */
igrad_status_t igrad__dp_cpu_unpack16(igrad_engine_t *e, float *const *grads)
{
    const igrad__dp_cpu_state_t *cs = e->dp_state; /* made by the check */
    float *acc = cs->g32[0];
    for (size_t t = 0; t < e->ntensors; t++) {
        int hit = 0;
        igrad__dp_cpu_grad(e, cs, grads, t, 0);
        for (size_t j = 0; j < e->nbk; j++) {
            igrad_status_t st = e->bk[j].route->wire == IGRAD__WIRE_SPARSE
                                    ? unpack_sparse(e, j, cs->alias, (int64_t)t, &hit)
                                    : unpack_dense(e, j, cs->alias, (int64_t)t, &hit);
            if (st != IGRAD_OK) return st;
        }
        if (hit) igrad__to16_n(e->cfg.grad_dtype, acc, (uint16_t *)(void *)grads[t], e->t[t].n);
    }
    return IGRAD_OK;
}
