/*
 * dp_cuda_sar.cu — the CUDA data plane's pack and unpack of the sparse
 * all-reduce's wire (route.h IGRAD__WIRE_SAR), with the CPU backend's
 * results bit for bit (dp_cpu_pack.c, dp_cpu_unpack.c).
 *  pack: per block its staged selection as (bucket index, value) entries,
 *    the bucket index being the block's dense offset plus the entry's
 *    place in its segment (row-wise: row * cols + column).
 *  unpack: the reduced result (igrad__sar_cuda left it on the device, in
 *    step->sar[j]) times 1/P into the gradients, and this rank's remainder
 *    into its residuals (or, under residual = drop, only counted). One
 *    thread block per dense segment finds its entries in the two arrays
 *    (both ascending by index) by binary search; the segments tile the
 *    bucket's index space, and the module has checked every index against
 *    it, so each entry has one place. Entries of one segment are distinct
 *    elements of one tensor, and two segments of a bucket never share a
 *    tensor's elements (a tensor's flat blocks in a bucket are adjacent and
 *    share one segment; row-wise ones cover other rows), so no two threads
 *    write one element. The change of each segment's residual sum of
 *    squares (or the dropped sum) is summed in a fixed order on the
 *    device, and the host adds the segments' sums per tensor in segment
 *    order: the same bits every run, not the CPU's entry-by-entry order
 *    (norms may differ in the last bits, as the other CUDA stages' do).
 */
#include "dp/cuda/dp_cuda.cuh"

extern "C" {
#include "comm/sparse_allreduce.h"
}

#include <stdlib.h>

namespace {

__global__ void pack_kernel(igrad__sar_entry_t *out, const uint32_t *idx, const float *val,
                            int64_t count, uint32_t base, int row_wise, int64_t per_row,
                            int64_t cols)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; k < count; k += stride) {
        uint32_t at = row_wise ? (uint32_t)((k / per_row) * cols) + idx[k] : idx[k];
        out[k].index = base + at;
        out[k].value = val[k];
    }
}

/* The first position of a[0..n) whose index is >= x. */
__device__ size_t lower_bound(const igrad__sar_entry_t *a, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (a[mid].index < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* Block s: segment s's result entries into g (times inv), its remainder
 * entries into the residual (drop: only their squares summed); sums[s] =
 * the residual's change of sum of squares, or the dropped squares. */
__global__ void unpack_kernel(const igrad__cuda_seg_t *segs, const igrad__sar_entry_t *result,
                              size_t nresult, const igrad__sar_entry_t *rem, size_t nrem,
                              float inv, int drop, double *sums)
{
    const igrad__cuda_seg_t sg = segs[blockIdx.x];
    __shared__ size_t range[4];
    if (threadIdx.x == 0) {
        range[0] = lower_bound(result, nresult, sg.dense_off);
        range[1] = lower_bound(result, nresult, sg.dense_off + (uint64_t)sg.count);
        range[2] = lower_bound(rem, nrem, sg.dense_off);
        range[3] = lower_bound(rem, nrem, sg.dense_off + (uint64_t)sg.count);
    }
    __syncthreads();
    for (size_t q = range[0] + threadIdx.x; q < range[1]; q += blockDim.x) {
        int64_t i = sg.begin + (int64_t)(result[q].index - sg.dense_off);
        sg.g[i] = igrad__unpack_add(sg.g[i], result[q].value, inv);
    }
    double acc = 0.0;
    for (size_t q = range[2] + threadIdx.x; q < range[3]; q += blockDim.x) {
        int64_t i = sg.begin + (int64_t)(rem[q].index - sg.dense_off);
        double v = rem[q].value;
        if (drop) {
            acc += v * v;
            continue;
        }
        float old = sg.residual[i];
        float now = igrad__fadd(old, rem[q].value);
        sg.residual[i] = now;
        acc += (double)now * (double)now - (double)old * (double)old;
    }
    double total = igrad__cuda_block_sum(acc);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

/* Room for n segments. */
igrad_status_t reserve_segments(igrad__cuda_state_t *st, size_t n)
{
    if (n <= st->seg_cap) return IGRAD_OK;
    cudaFree(st->d_seg);
    cudaFree(st->d_segsum);
    free(st->h_seg);
    free(st->h_segsum);
    st->d_seg = NULL;
    st->d_segsum = NULL;
    st->seg_cap = 0;
    st->h_seg = (igrad__cuda_seg_t *)malloc(n * sizeof *st->h_seg);
    st->h_segsum = (double *)malloc(n * sizeof *st->h_segsum);
    IGRAD_FAIL_IF(!st->h_seg || !st->h_segsum, IGRAD_E_NOMEM,
                  "CUDA sparse all-reduce unpack: out of memory for %zu segments", n);
    cudaError_t err = cudaMalloc(&st->d_seg, n * sizeof *st->d_seg);
    if (err == cudaSuccess) err = cudaMalloc(&st->d_segsum, n * sizeof *st->d_segsum);
    if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA sparse all-reduce unpack");
    st->seg_cap = n;
    return IGRAD_OK;
}

} // namespace

void igrad__dp_cuda_pack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    (void)grads;
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const igrad__step_bucket_t *bk = &step->bk[j];
    int par = igrad__plan_parity(plan, step->cur_step);
    igrad__sar_entry_t *out = (igrad__sar_entry_t *)(void *)(mem->send_arena + bk->send_off);
    size_t n = 0;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        const igrad_select_spec_t *sp = &plan->t[bi->tensor].spec[step->rel[bi->tensor]][par];
        int64_t src = step->stage_off[bi->tensor] + bi->first;
        /* the module refuses an index space above 2^32 before it reads one */
        pack_kernel<<<igrad__cuda_grid(bi->count), IGRAD__CUDA_THREADS, 0, s>>>(
            out + n, step->stage_idx + src, step->stage_val + src, bi->count,
            (uint32_t)bi->dense_off, bi->row_wise, sp->per_row, sp->cols);
        n += (size_t)bi->count;
    }
}

igrad_status_t igrad__dp_cuda_unpack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads)
{
    igrad__cuda_state_t *st = igrad__cuda_state(plan, step, mem);
    IGRAD_FAIL_IF(!st, IGRAD_E_STATE, "CUDA unpack: the data plane has no state");
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const igrad__step_bucket_t *bk = &step->bk[j];
    const igrad__sar_t *w = &step->sar[j];
    size_t nseg = 0;
    for (size_t q = 0; q < bk->nblocks; q++)
        nseg += step->binfo[step->order[bk->first + q]].seg_owner != 0;
    if (nseg == 0 || (w->result_count == 0 && w->remainder_count == 0)) return IGRAD_OK;
    IGRAD_CHECK(reserve_segments(st, nseg));
    size_t ns = 0;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        if (!bi->seg_owner) continue;
        igrad__cuda_seg_t *sg = &st->h_seg[ns++];
        sg->g = grads[bi->tensor];
        sg->residual = mem->residual[bi->tensor];
        sg->dense_off = bi->dense_off;
        sg->begin = bi->seg_begin;
        sg->count = bi->seg_count;
    }
    const float inv = 1.0f / (float)plan->avg_ranks; /* as in the sparse wire */
    int drop = plan->kargs.residual_drop;
    cudaError_t err = cudaMemcpyAsync(st->d_seg, st->h_seg, nseg * sizeof *st->h_seg,
                                      cudaMemcpyHostToDevice, s);
    if (err == cudaSuccess) {
        unpack_kernel<<<(unsigned)nseg, IGRAD__CUDA_THREADS, 0, s>>>(
            st->d_seg, w->result, w->result_count, w->remainder, w->remainder_count, inv, drop,
            st->d_segsum);
        err = cudaGetLastError();
    }
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(st->h_segsum, st->d_segsum, nseg * sizeof *st->h_segsum,
                              cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) return igrad__cuda_fail(err, "CUDA sparse all-reduce unpack");
    ns = 0;
    for (size_t q = 0; q < bk->nblocks; q++) {
        const igrad__step_block_t *bi = &step->binfo[step->order[bk->first + q]];
        if (!bi->seg_owner) continue;
        if (drop)
            step->tdropped[bi->tensor] += st->h_segsum[ns++];
        else
            step->tnorm[bi->tensor] += st->h_segsum[ns++];
    }
    return IGRAD_OK;
}
