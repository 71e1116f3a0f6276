/*
 * dp_cuda_pack.cu — the CUDA data plane's pack and unpack stages, on the
 * bucket arenas in device memory, with the CPU backend's results bit for
 * bit (dp_cpu_pack.c, dp_cpu_unpack.c; layouts in route.h, formats.md §8).
 *  pack, sparse wire: per block its values (F32 copied; 16-bit codes; FP8
 *    the block's scale and codes: core/value8.h's writers, the CPU's) and
 *    32-bit indices copied, or its indices narrowed to 16 bits (or coded,
 *    below); dense wire: the selected entries
 *    scattered into zeros over the blocks' dense segments (the dense
 *    method: the gradients copied).
 *  unpack, sparse wire: received bytes are not trusted. One kernel checks
 *    every FP8 scale, index and value of every rank's blocks first (the
 *    first bad one per rank and block, in the CPU unpack's reading order,
 *    comes back as a small array; it is reported with the CPU backend's
 *    message, and nothing is written); then one
 *    launch per rank, in rank order, adds its entries times 1/P. A rank's
 *    indices within a bucket are distinct, so the threads of one launch
 *    never touch the same entry, and each entry receives its P adds in
 *    rank order: the CPU backend's order, so the same bits on every rank.
 *  compact index codes (config.index_code): each run (a row, or a flat
 *    block) is coded and decoded by one thread with core/wire_code.h, the
 *    functions the CPU backend runs; the check decodes every run first
 *    (the first bad run per rank and block), then the adds decode again.
 *  unpack, dense wire: the summed segments times 1/P (the dense method
 *    assigns them).
 * The block descriptions travel to the device per bucket (O(blocks)).
 */
#include "dp/cuda/dp_cuda.cuh"
#include "core/sparsifier.h"
#include "core/wire_code.h"

#include <stdlib.h>
#include <string.h>

namespace {

__global__ void narrow_kernel(unsigned char *dst, const uint32_t *idx, int64_t count)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        igrad__write_index16(dst, k, idx[k]);
}

/* Compact: run r of a block (k indices of [0, u)) coded into its bytes,
 * one thread per run (runs are byte-aligned: no two threads share a byte). */
__global__ void encode_kernel(unsigned char *dst, const uint32_t *idx, int64_t runs, int code,
                              int64_t k, int64_t u, int64_t nbytes)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t r = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; r < runs; r += stride)
        igrad__code_encode(code, idx + r * k, k, u, dst + r * nbytes);
}

/* 16-bit values: the staged (already rounded) values' codes of dt. */
__global__ void values16_kernel(unsigned char *dst, const float *val, int64_t count,
                                igrad_dtype_t dt)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        igrad__value_write16(dst, k, igrad__to16(dt, val[k]));
}

/* FP8 values, one thread block: the block's scale from its largest
 * magnitude (a max: any order gives the CPU's igrad__fp8_pack), then each
 * staged (already rounded) value's code. */
__global__ void values8_kernel(unsigned char *dst, const float *val, int64_t count)
{
    float amax = igrad__cuda_block_amax(val, count);
    unsigned char head[IGRAD__FP8_SCALE_NBYTES];
    float sc, inv;
    igrad__fp8_head(head, amax, &sc, &inv);
    if (threadIdx.x < IGRAD__FP8_SCALE_NBYTES) dst[threadIdx.x] = head[threadIdx.x];
    for (int64_t k = threadIdx.x; k < count; k += blockDim.x)
        dst[IGRAD__FP8_SCALE_NBYTES + k] = igrad__fp8_code(val[k], inv, sc);
}

/* ---- the check's events ----
 * The CPU unpack reads a block's scale first, then entry by entry its
 * index and its value, and (compact) a run's trailing bits after its last
 * entry. Numbering those events in that order, the first bad event of a
 * (rank, block) is the error the CPU reports: 0 the scale, 1 + 3k entry
 * k's index, 2 + 3k its value, 3 + 3k the trailing bits of the run ending
 * at entry k. NO_EVENT: none bad. */
#define NO_EVENT 0xffffffffffffffffULL

__device__ unsigned long long event(int64_t k, int what)
{
    return 1ULL + 3ULL * (unsigned long long)k + (unsigned long long)what;
}

/* Compact: the first bad event of run `run` of block b (indices at ip,
 * values from v0 at scale sc), or NO_EVENT. */
__device__ unsigned long long run_check(const igrad__cuda_blk_t &b, const unsigned char *ip,
                                        const unsigned char *v0, float sc, int64_t run)
{
    igrad__code_rd_t rd;
    igrad__code_start(&rd, b.code, ip + run * b.code_nbytes, b.code_k, b.code_u);
    int64_t k0 = run * b.code_k;
    for (int64_t j = 0; j < b.code_k; j++) {
        uint32_t i = 0;
        if (igrad__code_next(&rd, &i)) return event(k0 + j, 0);
        if (!igrad__finite(igrad__value_read(v0, b.vw, b.dt, sc, k0 + j))) return event(k0 + j, 1);
    }
    return igrad__code_finish(&rd) ? event(k0 + b.code_k - 1, 2) : NO_EVENT;
}

/* Compact: run `run` of block b (checked) added times inv into its row
 * (or the flat tensor). */
__device__ void run_add(const igrad__cuda_blk_t &b, const unsigned char *ip,
                        const unsigned char *v0, float sc, int64_t run, float inv)
{
    igrad__code_rd_t rd;
    igrad__code_start(&rd, b.code, ip + run * b.code_nbytes, b.code_k, b.code_u);
    float *g = b.row_wise ? b.g + (b.row0 + run) * b.cols : b.g;
    for (int64_t j = 0; j < b.code_k; j++) {
        uint32_t i = 0;
        (void)igrad__code_next(&rd, &i);
        g[i] = igrad__unpack_add(g[i], igrad__value_read(v0, b.vw, b.dt, sc, run * b.code_k + j),
                                 inv);
    }
}

__global__ void scatter_kernel(float *d, const uint32_t *idx, const float *val, int64_t count,
                               int row_wise, int64_t per_row, int64_t cols)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        d[row_wise ? (k / per_row) * cols + idx[k] : (int64_t)idx[k]] = val[k];
}

/* bad[r * nb + q] = the first bad event (above) of rank r's block q
 * (NO_EVENT-initialized; atomicMin). grid: (blocks, ranks). */
__global__ void check_kernel(const igrad__cuda_blk_t *blk, const unsigned char *recv,
                             size_t rank_nbytes, unsigned long long *bad, int64_t nb)
{
    int64_t q = blockIdx.x;
    int r = (int)blockIdx.y;
    const igrad__cuda_blk_t b = blk[q];
    const unsigned char *base = recv + (size_t)r * rank_nbytes, *ip = base + b.idx_off, *v0;
    unsigned long long *mark = &bad[(int64_t)r * nb + q];
    float sc;
    if (igrad__value_start(base + b.val_off, b.vw, &v0, &sc)) {
        if (threadIdx.x == 0) atomicMin(mark, 0ULL); /* the scale */
        return;
    }
    if (b.code) { /* compact: each run's first bad event */
        for (int64_t run = threadIdx.x; run < b.count / b.code_k; run += blockDim.x) {
            unsigned long long e = run_check(b, ip, v0, sc, run);
            if (e != NO_EVENT) atomicMin(mark, e);
        }
        return;
    }
    for (int64_t k = threadIdx.x; k < b.count; k += blockDim.x) {
        if ((int64_t)igrad__read_index(ip, b.width, k) >= b.bound) atomicMin(mark, event(k, 0));
        else if (!igrad__finite(igrad__value_read(v0, b.vw, b.dt, sc, k)))
            atomicMin(mark, event(k, 1));
    }
}

/* Rank r's entries of every block of the bucket, times inv, into the grads. */
__global__ void add_kernel(const igrad__cuda_blk_t *blk, const unsigned char *base, float inv)
{
    const igrad__cuda_blk_t b = blk[blockIdx.x];
    const unsigned char *v0, *ip = base + b.idx_off;
    float sc;
    (void)igrad__value_start(base + b.val_off, b.vw, &v0, &sc); /* checked */
    if (b.code) { /* compact: a thread per run (checked already) */
        for (int64_t run = threadIdx.x; run < b.count / b.code_k; run += blockDim.x)
            run_add(b, ip, v0, sc, run, inv);
        return;
    }
    for (int64_t k = threadIdx.x; k < b.count; k += blockDim.x) {
        uint32_t i = igrad__read_index(ip, b.width, k);
        float *g = b.row_wise ? b.g + (b.row0 + k / b.per_row) * b.cols : b.g;
        g[i] = igrad__unpack_add(g[i], igrad__value_read(v0, b.vw, b.dt, sc, k), inv);
    }
}

__global__ void dense_kernel(float *g, const float *s, int64_t count, float inv, int assign)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        g[k] = assign ? igrad__fmul(s[k], inv) : igrad__unpack_add(g[k], s[k], inv);
}

/* Room for nb block descriptions and P * nb bad marks. */
igrad_status_t reserve(igrad__cuda_state_t *st, size_t nb, size_t P)
{
    if (nb > st->blk_cap) {
        cudaFree(st->d_blk);
        free(st->h_blk);
        st->d_blk = NULL;
        st->h_blk = (igrad__cuda_blk_t *)malloc(nb * sizeof *st->h_blk);
        st->blk_cap = 0;
        IGRAD_FAIL_IF(!st->h_blk, IGRAD_E_NOMEM, "CUDA unpack: out of memory for %zu blocks",
                      nb);
        cudaError_t err = cudaMalloc(&st->d_blk, nb * sizeof *st->d_blk);
        if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA unpack: block descriptions");
        st->blk_cap = nb;
    }
    if (nb * P > st->bad_cap) {
        cudaFree(st->d_bad);
        free(st->h_bad);
        st->d_bad = NULL;
        st->h_bad = (unsigned long long *)malloc(nb * P * sizeof *st->h_bad);
        st->bad_cap = 0;
        IGRAD_FAIL_IF(!st->h_bad, IGRAD_E_NOMEM, "CUDA unpack: out of memory for %zu marks",
                      nb * P);
        cudaError_t err = cudaMalloc(&st->d_bad, nb * P * sizeof *st->d_bad);
        if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA unpack: marks");
        st->bad_cap = nb * P;
    }
    return IGRAD_OK;
}

/* n bytes of device memory at src into dst (the bytes of a bad entry). */
void bytes_back(void *dst, const unsigned char *src, size_t n)
{
    memset(dst, 0, n);
    (void)cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost);
}

/* The error of rank r's block b (bi; the rank's bytes at base, on the
 * device) whose first bad event is e, reported as the CPU backend
 * reports it (dp_cpu_unpack.c's messages), from its bytes read back. */
igrad_status_t report(IGRAD__DP_CARGS, const igrad__step_bucket_t *bk,
                      const igrad__step_block_t *bi, const igrad__cuda_blk_t *b, int r,
                      const unsigned char *base, unsigned long long e)
{
    unsigned char head[8];
    if (e == 0) { /* the FP8 scale */
        bytes_back(head, base + b->val_off, IGRAD__FP8_SCALE_NBYTES);
        return igrad__dp_bad_scale(plan, step, mem, bk, bi, r, head);
    }
    int64_t k = (int64_t)((e - 1) / 3);
    int what = (int)((e - 1) % 3);
    if (what == 1) { /* a value: the scale's bytes (FP8), then the value's */
        int sb = b->vw == 1 ? IGRAD__FP8_SCALE_NBYTES : 0;
        bytes_back(head, base + b->val_off, (size_t)sb);
        bytes_back(head + sb, base + b->val_off + sb + (size_t)b->vw * k, (size_t)b->vw);
        const unsigned char *v0 = head;
        float sc = 1.0f;
        (void)igrad__value_start(head, b->vw, &v0, &sc); /* the check read it */
        return igrad__dp_bad_value(plan, step, mem, bk, bi, r, k,
                                   igrad__value_read(v0, b->vw, b->dt, sc, 0));
    }
    if (b->code) { /* the bad run's bytes, decoded here for its error */
        int64_t run = k / b->code_k;
        unsigned char *bytes = (unsigned char *)malloc((size_t)b->code_nbytes);
        IGRAD_FAIL_IF(!bytes, IGRAD_E_NOMEM, "CUDA unpack: out of memory");
        bytes_back(bytes, base + b->idx_off + (size_t)run * b->code_nbytes,
                   (size_t)b->code_nbytes);
        igrad__code_rd_t rd;
        igrad__code_start(&rd, b->code, bytes, b->code_k, b->code_u);
        int err = 0;
        uint32_t x = 0;
        for (int64_t n = 0; n < b->code_k && !err; n++) err = igrad__code_next(&rd, &x);
        if (!err) err = igrad__code_finish(&rd);
        free(bytes);
        return igrad__dp_bad_code(plan, step, mem, bk, bi, r, run, err ? err : IGRAD__CODE_E_FEW);
    }
    bytes_back(head, base + b->idx_off + (size_t)b->width * k, (size_t)b->width);
    return igrad__dp_bad_index(plan, step, mem, bk, bi, r, k, igrad__read_index(head, b->width, 0),
                               b->bound);
}

} // namespace

void igrad__dp_cuda_pack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    (void)grads;
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const igrad__step_bucket_t *bk = &step->bk[j];
    unsigned char *dst = mem->send_arena + bk->send_off;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        int64_t src = step->stage_off[bi->tensor] + bi->first;
        if (plan->value_nbytes == 4)
            cudaMemcpyAsync(dst + bi->val_off, step->stage_val + src,
                            (size_t)bi->count * sizeof(float), cudaMemcpyDeviceToDevice, s);
        else if (plan->value_nbytes == 1) /* FP8: the scale, then the codes (exact) */
            values8_kernel<<<1, IGRAD__CUDA_THREADS, 0, s>>>(dst + bi->val_off,
                                                             step->stage_val + src, bi->count);
        else
            values16_kernel<<<igrad__cuda_grid(bi->count), IGRAD__CUDA_THREADS, 0, s>>>(
                dst + bi->val_off, step->stage_val + src, bi->count, plan->kargs.value_dtype);
        if (bi->idx_code) {
            int64_t runs = bi->count / bi->code_k;
            encode_kernel<<<igrad__cuda_grid(runs), IGRAD__CUDA_THREADS, 0, s>>>(
                dst + bi->idx_off, step->stage_idx + src, runs, bi->idx_code, bi->code_k,
                bi->code_u, bi->code_nbytes);
        } else if (bi->idx_nbytes == 4)
            cudaMemcpyAsync(dst + bi->idx_off, step->stage_idx + src, (size_t)bi->count * 4,
                            cudaMemcpyDeviceToDevice, s);
        else
            narrow_kernel<<<igrad__cuda_grid(bi->count), IGRAD__CUDA_THREADS, 0, s>>>(
                dst + bi->idx_off, step->stage_idx + src, bi->count);
    }
}

void igrad__dp_cuda_pack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const igrad__step_bucket_t *bk = &step->bk[j];
    int par = igrad__plan_parity(plan, step->cur_step);
    float *buf = (float *)(void *)(mem->recv_arena + bk->recv_off);
    if (igrad__sparsifier_dense(plan->sp)) {
        for (size_t q = 0; q < bk->nblocks; q++) {
            const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
            cudaMemcpyAsync(buf + bi->dense_off, grads[bi->tensor] + bi->first,
                            (size_t)bi->count * sizeof(float), cudaMemcpyDeviceToDevice, s);
        }
        return;
    }
    cudaMemsetAsync(buf, 0, bk->dense_count * sizeof(float), s);
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        const igrad__plan_tensor_t *tp = &plan->t[bi->tensor];
        int64_t src = step->stage_off[bi->tensor] + bi->first;
        const igrad_select_spec_t *sp = &tp->spec[step->rel[bi->tensor]][par];
        scatter_kernel<<<igrad__cuda_grid(bi->count), IGRAD__CUDA_THREADS, 0, s>>>(
            buf + bi->dense_off, step->stage_idx + src, step->stage_val + src, bi->count,
            bi->row_wise, sp->per_row, sp->cols);
    }
}

igrad_status_t igrad__dp_cuda_unpack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    igrad__cuda_state_t *st = igrad__cuda_state(plan, step, mem);
    IGRAD_FAIL_IF(!st, IGRAD_E_STATE, "CUDA unpack: the data plane has no state");
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const igrad__step_bucket_t *bk = &step->bk[j];
    int par = igrad__plan_parity(plan, step->cur_step);
    size_t nb = bk->nblocks, P = (size_t)plan->nranks;
    if (nb == 0) return IGRAD_OK;
    IGRAD_CHECK(reserve(st, nb, P));
    for (size_t q = 0; q < nb; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        const igrad__plan_tensor_t *tp = &plan->t[bi->tensor];
        const igrad_select_spec_t *sp = &tp->spec[step->rel[bi->tensor]][par];
        igrad__cuda_blk_t *b = &st->h_blk[q];
        b->g = grads[bi->tensor];
        b->val_off = bi->val_off;
        b->idx_off = bi->idx_off;
        b->count = bi->count;
        b->bound = bi->row_wise ? sp->cols : tp->n;
        b->per_row = sp->per_row;
        b->row0 = bi->row0;
        b->cols = sp->cols;
        b->width = bi->idx_nbytes;
        b->vw = plan->value_nbytes;
        b->dt = plan->kargs.value_dtype;
        b->row_wise = bi->row_wise;
        b->code = bi->idx_code;
        b->code_k = bi->code_k;
        b->code_u = bi->code_u;
        b->code_nbytes = bi->code_nbytes;
    }
    const unsigned char *recv = mem->recv_arena + bk->recv_off;
    cudaError_t err = cudaMemcpyAsync(st->d_blk, st->h_blk, nb * sizeof *st->h_blk,
                                      cudaMemcpyHostToDevice, s);
    if (err == cudaSuccess)
        err = cudaMemsetAsync(st->d_bad, 0xff, nb * P * sizeof *st->d_bad, s);
    if (err == cudaSuccess) {
        check_kernel<<<dim3((unsigned)nb, (unsigned)P), IGRAD__CUDA_THREADS, 0, s>>>(
            st->d_blk, recv, bk->send_nbytes, st->d_bad, (int64_t)nb);
        err = cudaMemcpyAsync(st->h_bad, st->d_bad, nb * P * sizeof *st->h_bad,
                              cudaMemcpyDeviceToHost, s);
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA unpack");
    for (size_t r = 0; r < P; r++)
        for (size_t q = 0; q < nb; q++) {
            unsigned long long e = st->h_bad[r * nb + q];
            if (e != NO_EVENT)
                return report(plan, step, mem, bk, &step->binfo[step->order[bk->first + q]],
                              &st->h_blk[q], (int)r, recv + r * bk->send_nbytes, e);
        }
    const float inv = 1.0f / (float)plan->avg_ranks; /* as the CPU backend */
    for (size_t r = 0; r < P; r++)
        add_kernel<<<(unsigned)nb, IGRAD__CUDA_THREADS, 0, s>>>(
            st->d_blk, recv + r * bk->send_nbytes, inv);
    err = cudaGetLastError();
    return err == cudaSuccess ? IGRAD_OK : igrad__cuda_fail(err, "CUDA unpack");
}

igrad_status_t igrad__dp_cuda_unpack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const igrad__step_bucket_t *bk = &step->bk[j];
    const float inv = 1.0f / (float)plan->avg_ranks;
    const float *buf = (const float *)(const void *)(mem->recv_arena + bk->recv_off);
    int dense = igrad__sparsifier_dense(plan->sp);
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        if (!bi->seg_owner) continue;
        dense_kernel<<<igrad__cuda_grid(bi->seg_count), IGRAD__CUDA_THREADS, 0, s>>>(
            grads[bi->tensor] + bi->seg_begin, buf + bi->dense_off, bi->seg_count, inv, dense);
    }
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? IGRAD_OK : igrad__cuda_fail(err, "CUDA unpack");
}
