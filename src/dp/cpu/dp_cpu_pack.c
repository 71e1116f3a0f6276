/*
 * dp_cpu_pack.c — the CPU data plane's pack stage: a bucket's staged
 * selections into its wire layout (route.h). Sparse: per block its values
 * into the values area, its indices (32-bit, or 16-bit narrowed) into the
 * index areas, at the offsets the route laid out (formats.md §8). Dense:
 * the selected entries scattered into zeros over the blocks' dense
 * segments, or for the dense method the gradients copied. With
 * config.index_code compact a block's indices are its runs (rows, or the
 * flat block) each coded as the plan chose (core/wire_code.h): the staged
 * indices of a run are ascending already (the selection's order). Which blocks a
 * bucket holds is the control plane's (pack.c, engine.c). 16-bit wire
 * values (value_nbytes 2) are the staged values' 16-bit codes: the
 * selection already rounded them (dp_cpu_select.c), so this is exact; FP8
 * values (value_nbytes 1) are a block's power-of-two scale and its codes
 * (core/value8.h), exact too (the selection rounded each block at the
 * scale its values give); the CUDA pack (dp_cuda_pack.cu) writes the same
 * bytes with the same functions. The
 * dense wire carries F32 whatever the value dtype (formats.md §8).
 * Sparse all-reduce: (dense index, F32 value) entries, the index the one
 * the dense wire would put the value at, the value the staged (rounded)
 * one, as the dense wire carries it.
 */
#include "dp/cpu/dp_cpu.h"
#include "core/sparsifier.h"
#include "comm/sparse_allreduce.h"
#include "core/value16.h"
#include "core/value8.h"
#include "core/wire_code.h"

#include <string.h>

/* n values as 16-bit codes of dt into o (2 bytes each, any alignment;
 * core/value8.h's writer, as the CUDA pack) */
static void put_values16(unsigned char *o, const float *in, int64_t n, igrad_dtype_t dt)
{
    for (int64_t k = 0; k < n; k++) igrad__value_write16(o, k, igrad__to16(dt, in[k]));
}

/* n indices narrowed to 16 bits into o (each < 2^16: the plan's width) */
static void put_index16(unsigned char *o, const uint32_t *in, int64_t n)
{
    for (int64_t k = 0; k < n; k++) {
        uint16_t s = (uint16_t)in[k];
        memcpy(o + 2 * k, &s, 2);
    }
}

/* count selected (idx, val) into the zeroed dense segment d: flat, or
 * row-wise per_row of each cols-wide row (per_row 0: flat) */
static void scatter(float *d, const uint32_t *idx, const float *val, int64_t count,
                    int64_t per_row, int64_t cols)
{
    if (per_row) {
        int64_t rows = count / per_row;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t k = 0; k < per_row; k++)
                d[r * cols + idx[r * per_row + k]] = val[r * per_row + k];
    } else {
        for (int64_t k = 0; k < count; k++) d[idx[k]] = val[k];
    }
}

void igrad__dp_cpu_pack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    (void)grads;
    const igrad__step_bucket_t *bk = &step->bk[j];
    unsigned char *dst = mem->send_arena + bk->send_off;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        int64_t src = step->stage_off[bi->tensor] + bi->first;
        if (plan->value_nbytes == 4)
            memcpy(dst + bi->val_off, step->stage_val + src, (size_t)bi->count * sizeof(float));
        else if (plan->value_nbytes == 1) /* FP8: the scale, then the codes (exact) */
            igrad__fp8_pack(step->stage_val + src, bi->count, dst + bi->val_off);
        else
            put_values16(dst + bi->val_off, step->stage_val + src, bi->count,
                         plan->kargs.value_dtype);
        if (bi->idx_code) { /* compact: each run coded (core/wire_code.h) */
            const uint32_t *in = step->stage_idx + src;
            unsigned char *o = dst + bi->idx_off;
            for (int64_t r = 0; r < bi->count / bi->code_k; r++)
                igrad__code_encode(bi->idx_code, in + r * bi->code_k, bi->code_k, bi->code_u,
                                   o + r * bi->code_nbytes);
        } else if (bi->idx_nbytes == 4)
            memcpy(dst + bi->idx_off, step->stage_idx + src, (size_t)bi->count * 4);
        else
            put_index16(dst + bi->idx_off, step->stage_idx + src, bi->count);
    }
}

void igrad__dp_cpu_pack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    const igrad__step_bucket_t *bk = &step->bk[j];
    int par = igrad__plan_parity(plan, step->cur_step);
    float *buf = (float *)(void *)(mem->recv_arena + bk->recv_off);
    if (igrad__sparsifier_dense(plan->sp)) {
        for (size_t q = 0; q < bk->nblocks; q++) {
            const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
            if (plan->kargs.grad_dtype == IGRAD_DTYPE_F32)
                memcpy(buf + bi->dense_off, grads[bi->tensor] + bi->first,
                       (size_t)bi->count * sizeof(float));
            else /* 16-bit gradients: upcast (exact) */
                igrad__from16_n(plan->kargs.grad_dtype,
                                (const uint16_t *)(const void *)grads[bi->tensor] + bi->first,
                                buf + bi->dense_off, bi->count);
        }
        return;
    }
    memset(buf, 0, bk->dense_count * sizeof(float));
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        const igrad_select_spec_t *sp = &plan->t[bi->tensor].spec[step->rel[bi->tensor]][par];
        int64_t src = step->stage_off[bi->tensor] + bi->first;
        scatter(buf + bi->dense_off, step->stage_idx + src, step->stage_val + src, bi->count,
                bi->row_wise ? sp->per_row : 0, sp->cols);
    }
}

void igrad__dp_cpu_pack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    (void)grads;
    const igrad__step_bucket_t *bk = &step->bk[j];
    int par = igrad__plan_parity(plan, step->cur_step);
    igrad__sar_entry_t *out = (igrad__sar_entry_t *)(void *)(mem->send_arena + bk->send_off);
    size_t n = 0;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        int64_t src = step->stage_off[bi->tensor] + bi->first;
        const uint32_t *idx = step->stage_idx + src;
        const float *val = step->stage_val + src;
        /* the module refuses an index space above 2^32 before it reads one */
        const uint32_t base = (uint32_t)bi->dense_off;
        if (bi->row_wise) {
            const igrad_select_spec_t *sp = &plan->t[bi->tensor].spec[step->rel[bi->tensor]][par];
            int64_t rows = bi->count / sp->per_row;
            for (int64_t r = 0; r < rows; r++)
                for (int64_t k = 0; k < sp->per_row; k++, n++) {
                    out[n].index = base + (uint32_t)(r * sp->cols) + idx[r * sp->per_row + k];
                    out[n].value = val[r * sp->per_row + k];
                }
        } else {
            for (int64_t k = 0; k < bi->count; k++, n++) {
                out[n].index = base + idx[k];
                out[n].value = val[k];
            }
        }
    }
}
