/*
 * dp_cpu_unpack.c — the CPU data plane's unpack stage: a bucket's
 * received bytes into the caller's gradients, times 1/P (a product: exact
 * for P a power of 2), in a fixed order (bucket, then rank) so that every
 * rank ends with bit-identical gradients. Received bytes are not trusted:
 * every index is checked against its tensor or row first, and every value
 * for being finite (a rank sends only values its check found finite), and
 * a bad one names the rank that sent it; compact index codes are decoded
 * and checked run by run (core/wire_code.h: range, strict order, the
 * code's ones and padding), a bad one naming the bucket, rank, tensor and
 * row. 16-bit values (BF16, F16) are decoded to
 * F32 (exact) and added in the same order; FP8 values (core/value8.h) are
 * a block's scale, refused unless a positive normal power of two, and its
 * codes, each code times the scale (exact; a NaN code is refused). 16-bit gradients
 * (config.grad_dtype) are unpacked all at once after the last bucket,
 * tensor by tensor through an F32 copy, and rounded once (unpack16).
 * The sparse all-reduce's result is the same on every rank and sorted by
 * its bucket's dense index: each entry is mapped through the bucket's
 * segments to its tensor element and added times 1/P; this rank's
 * remainder (the partial sums of its own range that were not kept) goes
 * into its residuals there, so that nothing is lost.
 */
#include "dp/cpu/dp_cpu.h"
#include "core/sparsifier.h"
#include "comm/sparse_allreduce.h"
#include "core/value16.h"
#include "core/value8.h"
#include "core/wire_code.h"

#include <math.h>
#include <string.h>

/* A block's values area as received: F32, the 16-bit codes of dt (width
 * 2), or FP8 (width 1: the block's scale, then its codes), read with
 * core/value8.h's functions, as the CUDA unpack reads it. */
typedef struct val_rd {
    const unsigned char *p; /* value 0 */
    int width;
    igrad_dtype_t dt;
    float scale; /* FP8: the block's 2^k */
} val_rd_t;

/* Starts reading the values area at p: 0, or (FP8) -1 when the block's
 * scale is not a positive normal power of two (a peer's bad bytes). */
static inline int val_start(val_rd_t *v, const unsigned char *p, int width, igrad_dtype_t dt)
{
    v->width = width;
    v->dt = dt;
    return igrad__value_start(p, width, &v->p, &v->scale);
}

/* Value k (FP8: NaN for a NaN code, Inf where code times scale overflows;
 * the callers refuse both as non-finite). */
static inline float read_value(const val_rd_t *v, int64_t k)
{
    return igrad__value_read(v->p, v->width, v->dt, v->scale, k);
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

/* The indices of one block of a rank's received bytes, entry by entry:
 * fixed widths as they are, or compact runs decoded and checked (range,
 * order, the code's ones and padding; core/wire_code.h). */
typedef struct idx_iter {
    const igrad__step_block_t *bi;
    const unsigned char *ip;
    int64_t k;
    igrad__code_rd_t rd;
} idx_iter_t;

static inline void iter_start(idx_iter_t *it, const igrad__step_block_t *bi,
                              const unsigned char *ip)
{
    it->bi = bi;
    it->ip = ip;
    it->k = 0;
}

/* Entry it->k's index into *x (then k + 1): 0, or a wire_code.h error of
 * the run holding it (a fixed width: never an error here). */
static inline int iter_next(idx_iter_t *it, uint32_t *x)
{
    const igrad__step_block_t *bi = it->bi;
    if (!bi->idx_code) {
        *x = read_index(it->ip, bi->idx_nbytes, it->k++);
        return 0;
    }
    int64_t run = it->k / bi->code_k;
    if (it->k % bi->code_k == 0) {
        if (it->k > 0) {
            int e = igrad__code_finish(&it->rd);
            if (e) return e;
        }
        igrad__code_start(&it->rd, bi->idx_code, it->ip + run * bi->code_nbytes, bi->code_k,
                          bi->code_u);
    }
    it->k++;
    return igrad__code_next(&it->rd, x);
}

/* The run the last iter_next or iter_end looked at. */
static inline int64_t iter_run(const idx_iter_t *it)
{
    return (it->k > 0 ? it->k - 1 : 0) / it->bi->code_k;
}

/* After the block's last entry: the last run's trailing bits. */
static inline int iter_end(const idx_iter_t *it)
{
    return it->bi->idx_code && it->k > 0 ? igrad__code_finish(&it->rd) : 0;
}

igrad_status_t igrad__dp_bad_code(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                  const igrad__step_block_t *bi, int r, int64_t run, int err)
{
    (void)mem;
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       "step %lld: bucket %d: rank %d sent a bad %s index code for tensor %s "
                       "(%s %lld: %lld indices in [0, %lld)): %s; its bytes are bad (a "
                       "corrupt transport, or ranks out of step); nothing more is unpacked "
                       "and the engine is unusable",
                       (long long)step->cur_step, bk->index, r, igrad__code_name(bi->idx_code),
                       plan->t[bi->tensor].name, bi->row_wise ? "row" : "block entry",
                       bi->row_wise ? (long long)(bi->row0 + run) : (long long)bi->first,
                       (long long)bi->code_k, (long long)bi->code_u, igrad__code_error(err));
}

igrad_status_t igrad__dp_bad_index(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                   const igrad__step_block_t *bi, int r, int64_t k, uint32_t v,
                                   int64_t bound)
{
    (void)mem;
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       "step %lld: bucket %d: rank %d sent index %lu for tensor %s (entry %lld "
                       "of a block of %lld), outside [0, %lld) %s; its bytes are bad (a "
                       "corrupt transport, or ranks out of step); nothing more is unpacked "
                       "and the engine is unusable",
                       (long long)step->cur_step, bk->index, r, (unsigned long)v,
                       plan->t[bi->tensor].name, (long long)(bi->first + k), (long long)bi->count,
                       (long long)bound, bi->row_wise ? "(a column of its row)" : "");
}

/* The first received index of a block outside [0, bound), reported. */
static igrad_status_t bad_index(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                const igrad__step_block_t *bi, int r, const unsigned char *ip,
                                int64_t bound)
{
    int64_t k = 0;
    uint32_t v = 0;
    for (; k < bi->count; k++) {
        v = read_index(ip, bi->idx_nbytes, k);
        if ((int64_t)v >= bound) break;
    }
    return igrad__dp_bad_index(plan, step, mem, bk, bi, r, k, v, bound);
}

/* count received entries (indices of width iw at ip, values read by vr
 * from entry v0 on) added times inv into g, each index checked against
 * bound and each value for being finite first: -1, or the first bad
 * entry. */
static int64_t add_entries(float *g, const unsigned char *ip, int iw, const val_rd_t *vr,
                           int64_t v0, int64_t count, uint64_t bound, float inv)
{
    for (int64_t k = 0; k < count; k++) {
        uint32_t i = read_index(ip, iw, k);
        if (i >= bound) return k;
        float v = read_value(vr, v0 + k);
        if (!isfinite(v)) return k;
        g[i] += v * inv;
    }
    return -1;
}

/* Received value k of a block is not finite: no rank sends one (each
 * checked its values before the step was agreed, and an FP8 sender's
 * codes are never NaN and times its scale never overflow), so its bytes
 * are bad. */
igrad_status_t igrad__dp_bad_value(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                   const igrad__step_block_t *bi, int r, int64_t k, float v)
{
    (void)mem;
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       "step %lld: bucket %d: rank %d sent the non-finite value %g%s for tensor "
                       "%s (entry %lld of a block of %lld), which no rank sends (each checked "
                       "its values finite); its bytes are bad (a corrupt transport, or ranks "
                       "out of step); nothing more is unpacked and the engine is unusable",
                       (long long)step->cur_step, bk->index, r, (double)v,
                       plan->value_nbytes == 1 ? " (an FP8 NaN code, or a code times the "
                                                 "block's scale beyond F32)"
                                               : "",
                       plan->t[bi->tensor].name, (long long)(bi->first + k), (long long)bi->count);
}

/* An FP8 block's received scale is not a positive normal power of two. */
igrad_status_t igrad__dp_bad_scale(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                                   const igrad__step_block_t *bi, int r, const unsigned char *vp)
{
    (void)mem;
    uint32_t u;
    memcpy(&u, vp, 4);
    float f;
    memcpy(&f, vp, 4);
    return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                       "step %lld: bucket %d: rank %d sent the FP8 block scale %g (bits 0x%08lx) "
                       "for tensor %s (the block of %lld entries from entry %lld), which is not "
                       "a positive normal power of two as every sender's is; its bytes are bad "
                       "(a corrupt transport, or ranks out of step); nothing more is unpacked "
                       "and the engine is unusable",
                       (long long)step->cur_step, bk->index, r, (double)f, (unsigned long)u,
                       plan->t[bi->tensor].name, (long long)bi->count, (long long)bi->first);
}

/* Sparse wire: adds every rank's entries, in rank order, times 1/P into
 * grads. Received indices are checked against their tensor (flat) or row
 * (row-wise) and values for being finite before use; on a bad one the
 * gradients are partly written. */
static igrad_status_t unpack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads, int64_t only,
                                    int *hit)
{
    const igrad__step_bucket_t *bk = &step->bk[j];
    int par = igrad__plan_parity(plan, step->cur_step);
    /* multiplying by 1/P: exact division for powers of two, and a loop
     * that vectorizes */
    const float inv = 1.0f / (float)plan->avg_ranks;
    const int vw = plan->value_nbytes;
    const igrad_dtype_t vt = plan->kargs.value_dtype;
    for (int r = 0; r < plan->nranks; r++) {
        const unsigned char *base = mem->recv_arena + bk->recv_off + (size_t)r * bk->send_nbytes;
        for (size_t q = 0; q < bk->nblocks; q++) {
            const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
            if (only >= 0 && bi->tensor != (size_t)only) continue;
            *hit = 1;
            const igrad__plan_tensor_t *tp = &plan->t[bi->tensor];
            float *g = grads[bi->tensor];
            const unsigned char *vp = base + bi->val_off, *ip = base + bi->idx_off;
            /* A rank's bytes start at r * send_nbytes, which need not be
             * 4-aligned: read through memcpy. */
            const int iw = bi->idx_nbytes;
            val_rd_t vr;
            if (val_start(&vr, vp, vw, vt))
                return igrad__dp_bad_scale(plan, step, mem, bk, bi, r, vp);
            if (bi->idx_code) { /* compact: the decoder checks every index */
                const igrad_select_spec_t *sp = &tp->spec[step->rel[bi->tensor]][par];
                idx_iter_t it;
                iter_start(&it, bi, ip);
                for (int64_t k = 0; k < bi->count; k++) {
                    uint32_t i = 0;
                    int e = iter_next(&it, &i);
                    if (e) return igrad__dp_bad_code(plan, step, mem, bk, bi, r, iter_run(&it), e);
                    float *gr = bi->row_wise ? g + (bi->row0 + k / sp->per_row) * sp->cols : g;
                    float v = read_value(&vr, k);
                    if (!isfinite(v))
                        return igrad__dp_bad_value(plan, step, mem, bk, bi, r, k, v);
                    gr[i] += v * inv;
                }
                int e = iter_end(&it);
                if (e) return igrad__dp_bad_code(plan, step, mem, bk, bi, r, iter_run(&it), e);
            } else if (bi->row_wise) {
                const igrad_select_spec_t *sp = &tp->spec[step->rel[bi->tensor]][par];
                int64_t rows = bi->count / sp->per_row, per = sp->per_row;
                for (int64_t rr = 0; rr < rows; rr++) {
                    const unsigned char *rip = ip + rr * per * iw;
                    int64_t k = add_entries(g + (bi->row0 + rr) * sp->cols, rip, iw, &vr, rr * per,
                                            per, (uint64_t)sp->cols, inv);
                    if (k < 0) continue;
                    if (read_index(rip, iw, k) >= (uint32_t)sp->cols)
                        return bad_index(plan, step, mem, bk, bi, r, ip, sp->cols);
                    return igrad__dp_bad_value(plan, step, mem, bk, bi, r, rr * per + k,
                                     read_value(&vr, rr * per + k));
                }
            } else {
                int64_t k = add_entries(g, ip, iw, &vr, 0, bi->count, (uint64_t)tp->n, inv);
                if (k >= 0 && read_index(ip, iw, k) >= (uint64_t)tp->n)
                    return bad_index(plan, step, mem, bk, bi, r, ip, tp->n);
                if (k >= 0)
                    return igrad__dp_bad_value(plan, step, mem, bk, bi, r, k, read_value(&vr, k));
            }
        }
    }
    return IGRAD_OK;
}

/* Dense wire: the summed segments times 1/P added into grads (the dense
 * method assigns: its segments tile every tensor). Dense floats only: the
 * offsets and counts are this rank's own plan, nothing to check. */
static igrad_status_t unpack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads, int64_t only,
                                   int *hit)
{
    const igrad__step_bucket_t *bk = &step->bk[j];
    const float inv = 1.0f / (float)plan->avg_ranks; /* as in the sparse wire */
    const float *buf = (const float *)(const void *)(mem->recv_arena + bk->recv_off);
    int dense = igrad__sparsifier_dense(plan->sp);
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
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

igrad_status_t igrad__dp_cpu_unpack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    int hit = 0;
    return unpack_sparse(plan, step, mem, j, grads, -1, &hit);
}

igrad_status_t igrad__dp_cpu_unpack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    int hit = 0;
    return unpack_dense(plan, step, mem, j, grads, -1, &hit);
}

/* The block whose dense segment holds dense index x of bucket bk, and x's
 * element in its tensor: blocks are in dense order and a segment's sharers
 * have its offset, so the last block at or below x. IGRAD_E_COMM for an
 * index past the segments (the module checked its ranges already). */
static igrad_status_t sar_element(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk, uint32_t x,
                                  const igrad__step_block_t **out, int64_t *elem)
{
    (void)plan;
    (void)mem;
    size_t lo = 0, hi = bk->nblocks; /* the answer is in [lo, hi) */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (step->binfo[step->order[bk->first + mid]].dense_off <= x)
            lo = mid;
        else hi = mid;
    }
    const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + lo]];
    int64_t off = (int64_t)x - (int64_t)bi->dense_off;
    if (off < 0 || off >= bi->seg_count)
        return igrad__fail(IGRAD_E_COMM, __FILE__, __LINE__,
                           "step %lld: bucket %d: the sparse all-reduce returned index %lu, "
                           "outside the bucket's %zu dense entries (corrupt bytes); nothing "
                           "more is unpacked and the engine is unusable",
                           (long long)step->cur_step, bk->index, (unsigned long)x, bk->dense_count);
    *out = bi;
    *elem = bi->seg_begin + off;
    return IGRAD_OK;
}

igrad_status_t igrad__dp_cpu_unpack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    const igrad__step_bucket_t *bk = &step->bk[j];
    const igrad__sar_t *w = &step->sar[j];
    const float inv = 1.0f / (float)plan->avg_ranks; /* as in the sparse wire */
    const igrad__step_block_t *bi;
    int64_t i;
    for (size_t q = 0; q < w->result_count; q++) {
        IGRAD_CHECK(sar_element(plan, step, mem, bk, w->result[q].index, &bi, &i));
        grads[bi->tensor][i] += w->result[q].value * inv;
    }
    int drop = plan->kargs.residual_drop;
    for (size_t q = 0; q < w->remainder_count; q++) {
        IGRAD_CHECK(sar_element(plan, step, mem, bk, w->remainder[q].index, &bi, &i));
        double v = w->remainder[q].value;
        if (drop) { /* the ablation: what is not sent is discarded, and counted */
            step->tdropped[bi->tensor] += v * v;
            continue;
        }
        float *r = &mem->residual[bi->tensor][i];
        double old = *r;
        *r += w->remainder[q].value;
        step->tnorm[bi->tensor] += (double)*r * (double)*r - old * old;
    }
    return IGRAD_OK;
}

/* Does a dense-wire bucket write into tensor t (a reduce bucket's segment,
 * or the dense method)? */
static int dense_touches(IGRAD__DP_CARGS, size_t t)
{
    (void)plan;
    (void)mem;
    for (size_t j = 0; j < step->nbk; j++) {
        const igrad__step_bucket_t *bk = &step->bk[j];
        if (bk->route->wire != IGRAD__WIRE_DENSE) continue;
        for (size_t q = 0; q < bk->nblocks; q++) {
            const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
            if (bi->seg_owner && bi->tensor == t) return 1;
        }
    }
    return 0;
}

/* Over every entry the sparse buckets received for tensor t (indices
 * already checked by unpack_sparse): with g16, g16[i] = acc[i] rounded;
 * without, acc[i] = 0 (the copy clean again for the next tensor). */
static void sweep_received(IGRAD__DP_CARGS, size_t t, float *acc, uint16_t *g16)
{
    int par = igrad__plan_parity(plan, step->cur_step);
    const igrad_dtype_t gt = plan->kargs.grad_dtype;
    for (size_t j = 0; j < step->nbk; j++) {
        const igrad__step_bucket_t *bk = &step->bk[j];
        if (bk->route->wire != IGRAD__WIRE_SPARSE) continue;
        for (int r = 0; r < plan->nranks; r++) {
            const unsigned char *base =
                mem->recv_arena + bk->recv_off + (size_t)r * bk->send_nbytes;
            for (size_t q = 0; q < bk->nblocks; q++) {
                const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
                if (bi->tensor != t) continue;
                const unsigned char *ip = base + bi->idx_off;
                const igrad_select_spec_t *sp = &plan->t[t].spec[step->rel[t]][par];
                int64_t per = bi->row_wise ? sp->per_row : bi->count;
                idx_iter_t it;
                iter_start(&it, bi, ip);
                for (int64_t k = 0; k < bi->count; k++) {
                    uint32_t x = 0;
                    (void)iter_next(&it, &x); /* checked by unpack_sparse */
                    int64_t i = x;
                    if (bi->row_wise) i += (bi->row0 + k / per) * sp->cols;
                    if (g16) g16[i] = igrad__to16(gt, acc[i]);
                    else acc[i] = 0.0f;
                }
            }
        }
    }
}

/* 16-bit gradients: tensor by tensor into an F32 copy (the check's thread
 * 0 copy, zeroed first), every bucket's blocks of that tensor added in
 * (buckets ascending, then ranks: each entry's sum in the order the F32
 * unpack adds it), then rounded once to nearest even into g. The sparse
 * methods' g is 0 here (zeroed by the selection or the zero stage), so a
 * tensor only gather buckets touch needs only its received entries
 * rounded, and zeroed again in the copy; one a dense-wire bucket writes
 * is rounded whole (for the dense method from its upcast g). A tensor no
 * block touches keeps its g. */
igrad_status_t igrad__dp_cpu_unpack16(IGRAD__DP_ARGS, float *const *grads)
{
    const igrad__dp_cpu_state_t *cs = mem->dp_state; /* made by the check */
    float *acc = cs->g32[0];
    int64_t most = 0;
    for (size_t t = 0; t < plan->ntensors; t++)
        if (plan->t[t].n > most) most = plan->t[t].n;
    memset(acc, 0, (size_t)most * sizeof *acc);
    int dense_method = igrad__sparsifier_dense(plan->sp);
    for (size_t t = 0; t < plan->ntensors; t++) {
        int hit = 0, whole = dense_method || dense_touches(plan, step, mem, t);
        int64_t n = plan->t[t].n;
        uint16_t *g16 = (uint16_t *)(void *)grads[t];
        if (dense_method) igrad__dp_cpu_grad(plan, step, mem, cs, grads, t, 0);
        for (size_t j = 0; j < step->nbk; j++) {
            igrad_status_t st = step->bk[j].route->wire == IGRAD__WIRE_SPARSE
                                    ? unpack_sparse(plan, step, mem, j, cs->alias, (int64_t)t, &hit)
                                    : unpack_dense(plan, step, mem, j, cs->alias, (int64_t)t, &hit);
            if (st != IGRAD_OK) return st;
        }
        if (!hit) continue;
        if (whole) {
            igrad__to16_n(plan->kargs.grad_dtype, acc, g16, n);
            memset(acc, 0, (size_t)n * sizeof *acc);
        } else {
            sweep_received(plan, step, mem, t, acc, g16);
            sweep_received(plan, step, mem, t, acc, NULL);
        }
    }
    return IGRAD_OK;
}
