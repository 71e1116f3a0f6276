/*
 * dp_cuda_pack.cu — the CUDA data plane's pack and unpack stages, on the
 * bucket arenas in device memory, with the CPU backend's results bit for
 * bit (dp_cpu_pack.c, dp_cpu_unpack.c; layouts in route.h, formats.md §8).
 *  pack, sparse wire: per block its values and 32-bit indices copied, or
 *    its indices narrowed to 16 bits; dense wire: the selected entries
 *    scattered into zeros over the blocks' dense segments (the dense
 *    method: the gradients copied).
 *  unpack, sparse wire: received bytes are not trusted. One kernel checks
 *    every index of every rank's blocks first (the first bad entry per
 *    rank and block comes back as a small array; a bad one is reported
 *    like the CPU backend reports it, and nothing is written); then one
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

/* Compact: 0 when run `run` of block b at ip decodes (range, order, the
 * code's ones and padding), else the reader's error; with add, each entry
 * added times inv into its row (or the flat tensor). */
__device__ int run_decode(const igrad__cuda_blk_t &b, const unsigned char *ip,
                          const unsigned char *vp, int64_t run, int add, float inv)
{
    igrad__code_rd_t rd;
    igrad__code_start(&rd, b.code, ip + run * b.code_nbytes, b.code_k, b.code_u);
    float *g = b.row_wise ? b.g + (b.row0 + run) * b.cols : b.g;
    for (int64_t j = 0; j < b.code_k; j++) {
        uint32_t i = 0;
        int e = igrad__code_next(&rd, &i);
        if (e) return e;
        if (add) g[i] = igrad__unpack_add(g[i], igrad__read_value(vp, run * b.code_k + j), inv);
    }
    return igrad__code_finish(&rd);
}

__global__ void scatter_kernel(float *d, const uint32_t *idx, const float *val, int64_t count,
                               int row_wise, int64_t per_row, int64_t cols)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride)
        d[row_wise ? (k / per_row) * cols + idx[k] : (int64_t)idx[k]] = val[k];
}

/* bad[r * nb + q] = the first entry of rank r's block q whose index is out
 * of bounds (UINT32_MAX-initialized; atomicMin). grid: (blocks, ranks). */
__global__ void check_kernel(const igrad__cuda_blk_t *blk, const unsigned char *recv,
                             size_t rank_nbytes, uint32_t *bad, int64_t nb)
{
    int64_t q = blockIdx.x;
    int r = (int)blockIdx.y;
    const igrad__cuda_blk_t b = blk[q];
    const unsigned char *ip = recv + (size_t)r * rank_nbytes + b.idx_off;
    if (b.code) { /* compact: the first bad run */
        for (int64_t run = threadIdx.x; run < b.count / b.code_k; run += blockDim.x)
            if (run_decode(b, ip, NULL, run, 0, 0.0f))
                atomicMin(&bad[(int64_t)r * nb + q], (uint32_t)run);
        return;
    }
    for (int64_t k = threadIdx.x; k < b.count; k += blockDim.x)
        if ((int64_t)igrad__read_index(ip, b.width, k) >= b.bound)
            atomicMin(&bad[(int64_t)r * nb + q], (uint32_t)k);
}

/* Rank r's entries of every block of the bucket, times inv, into the grads. */
__global__ void add_kernel(const igrad__cuda_blk_t *blk, const unsigned char *base, float inv)
{
    const igrad__cuda_blk_t b = blk[blockIdx.x];
    const unsigned char *vp = base + b.val_off, *ip = base + b.idx_off;
    if (b.code) { /* compact: a thread per run (checked already) */
        for (int64_t run = threadIdx.x; run < b.count / b.code_k; run += blockDim.x)
            (void)run_decode(b, ip, vp, run, 1, inv);
        return;
    }
    for (int64_t k = threadIdx.x; k < b.count; k += blockDim.x) {
        uint32_t i = igrad__read_index(ip, b.width, k);
        float *g = b.row_wise ? b.g + (b.row0 + k / b.per_row) * b.cols : b.g;
        g[i] = igrad__unpack_add(g[i], igrad__read_value(vp, k), inv);
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
        st->h_bad = (uint32_t *)malloc(nb * P * sizeof *st->h_bad);
        st->bad_cap = 0;
        IGRAD_FAIL_IF(!st->h_bad, IGRAD_E_NOMEM, "CUDA unpack: out of memory for %zu marks",
                      nb * P);
        cudaError_t err = cudaMalloc(&st->d_bad, nb * P * sizeof *st->d_bad);
        if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA unpack: marks");
        st->bad_cap = nb * P;
    }
    return IGRAD_OK;
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
        cudaMemcpyAsync(dst + bi->val_off, step->stage_val + src, (size_t)bi->count * sizeof(float),
                        cudaMemcpyDeviceToDevice, s);
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
        b->row_wise = bi->row_wise;
        b->code = bi->idx_code;
        b->code_k = bi->code_k;
        b->code_u = bi->code_u;
        b->code_nbytes = bi->code_nbytes;
    }
    const unsigned char *recv = mem->recv_arena + bk->recv_off;
    cudaError_t err = cudaMemcpyAsync(st->d_blk, st->h_blk, nb * sizeof *st->h_blk,
                                      cudaMemcpyHostToDevice, s);
    if (err == cudaSuccess) err = cudaMemsetAsync(st->d_bad, 0xff, nb * P * sizeof(uint32_t), s);
    if (err == cudaSuccess) {
        check_kernel<<<dim3((unsigned)nb, (unsigned)P), IGRAD__CUDA_THREADS, 0, s>>>(
            st->d_blk, recv, bk->send_nbytes, st->d_bad, (int64_t)nb);
        err = cudaMemcpyAsync(st->h_bad, st->d_bad, nb * P * sizeof(uint32_t),
                              cudaMemcpyDeviceToHost, s);
    }
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA unpack");
    for (size_t r = 0; r < P; r++)
        for (size_t q = 0; q < nb; q++) {
            uint32_t k = st->h_bad[r * nb + q];
            if (k == UINT32_MAX) continue;
            const igrad__cuda_blk_t *b = &st->h_blk[q];
            const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
            if (b->code) { /* the bad run's bytes, decoded here for its error */
                unsigned char *run = (unsigned char *)malloc((size_t)b->code_nbytes);
                IGRAD_FAIL_IF(!run, IGRAD_E_NOMEM, "CUDA unpack: out of memory");
                cudaMemcpy(run, recv + r * bk->send_nbytes + b->idx_off + (size_t)k * b->code_nbytes,
                           (size_t)b->code_nbytes, cudaMemcpyDeviceToHost);
                igrad__code_rd_t rd;
                igrad__code_start(&rd, b->code, run, b->code_k, b->code_u);
                int e = 0;
                uint32_t x = 0;
                for (int64_t n = 0; n < b->code_k && !e; n++) e = igrad__code_next(&rd, &x);
                if (!e) e = igrad__code_finish(&rd);
                free(run);
                return igrad__dp_bad_code(plan, step, mem, bk, bi, (int)r, (int64_t)k,
                                          e ? e : IGRAD__CODE_E_FEW);
            }
            unsigned char bytes[4] = {0, 0, 0, 0};
            cudaMemcpy(bytes, recv + r * bk->send_nbytes + b->idx_off + (size_t)b->width * k,
                       (size_t)b->width, cudaMemcpyDeviceToHost);
            return igrad__dp_bad_index(plan, step, mem, bk,
                                       &step->binfo[step->order[bk->first + q]], (int)r, k,
                                       igrad__read_index(bytes, b->width, 0), b->bound);
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
