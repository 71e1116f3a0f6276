/*
 * dp_cuda_select.cu — the CUDA data plane's select_into stage: error
 * feedback fused with exact selection, the residual write, and the
 * accumulate-or-drop of the tensors not sent, with the same results bit
 * for bit as the CPU backend (dp_cpu_select.c, select.c): the same float
 * operations in the same order, the same k-th largest |a|, the same tie
 * rule (the lower index wins), indices in index order.
 *
 * How one selection runs (the decisions are dp_cuda_logic.h's):
 *  - rows (ADTopk), and flat tensors up to IGRAD__CUDA_ROW_MAX entries as
 *    one row: one thread block per row. Three histogram rounds over the
 *    row's a = g + e (in shared memory; the row stays in L1/L2) find its
 *    k-th largest key and how many ties it keeps; then the row is walked
 *    in tiles, each thread a run of entries, a block scan giving each run
 *    its count of greater and tied keys before it, so each entry knows
 *    whether it is kept and its slot; the same pass writes the selection
 *    (column indices), the residual (a, kept entries 0) and zeroes g.
 *  - larger flat tensors (topk): the same three rounds as grid-wide
 *    histograms (a digit-choosing block between rounds; no host round
 *    trip), then per chunk of 4096 entries the counts of greater and tied
 *    keys, their exclusive scan in one block, and the gather pass like the
 *    row one, chunk bases from the scan.
 *  - dense specs (count = n): values = a, residual 0.
 * Nothing is written before every entry has been read: the check stage
 * proved a finite (the engine stops the step otherwise). With 16-bit or
 * FP8 wire values (config.value_dtype) each staged value is then rounded
 * as the CPU backend rounds it (core/value16.h's igrad__round16; FP8 per
 * block of the step at its power-of-two scale, core/value8.h) and its
 * rounding error becomes that entry's residual. The per-tensor sums of the
 * selected values (and of the rounding errors) come back as one small
 * array. Momentum
 * (DGC's correction and factor masking) runs as elementwise
 * kernels around the selection, in select.c's order.
 */
#include "dp/cuda/dp_cuda.cuh"

#include <cub/block/block_scan.cuh>
#include <string.h>

namespace {

typedef cub::BlockScan<unsigned long long, IGRAD__CUDA_THREADS> scan_t;

/* Exclusive sums over the block of two per-thread counts, and their totals. */
__device__ void scan2(unsigned long long a, unsigned long long b, unsigned long long *ea,
                      unsigned long long *eb, unsigned long long *ta, unsigned long long *tb)
{
    __shared__ typename scan_t::TempStorage tmp;
    scan_t(tmp).ExclusiveSum(a, *ea, *ta);
    __syncthreads();
    scan_t(tmp).ExclusiveSum(b, *eb, *tb);
    __syncthreads();
}

/* Walks entries [j0, j1) of x/r in order: the kept ones (index j) into
 * idx/val at their slots, the residual written, x zeroed with zero_x.
 * gb/tb: greater and tied keys before j0. */
__device__ void gather_run(float *x, float *r, int64_t j0, int64_t j1, uint32_t kth,
                           uint64_t ties, uint64_t gb, uint64_t tb, uint32_t *idx, float *val,
                           int zero_x)
{
    for (int64_t j = j0; j < j1; j++) {
        float a = igrad__fadd(x[j], r[j]);
        uint32_t key = igrad__key(a);
        int keep = igrad__keep(key, kth, tb, ties);
        if (keep) {
            uint64_t slot = igrad__keep_slot(gb, tb, ties);
            idx[slot] = (uint32_t)j;
            val[slot] = a;
        }
        r[j] = keep ? 0.0f : a;
        if (zero_x) x[j] = 0.0f;
        gb += key > kth;
        tb += key == kth;
    }
}

__device__ void count_run(const float *x, const float *r, int64_t j0, int64_t j1, uint32_t kth,
                          unsigned long long *g, unsigned long long *t)
{
    unsigned long long cg = 0, ct = 0;
    for (int64_t j = j0; j < j1; j++) {
        uint32_t key = igrad__key(igrad__fadd(x[j], r[j]));
        cg += key > kth;
        ct += key == kth;
    }
    *g = cg;
    *t = ct;
}

#define ROW_ITEMS 8 /* entries per thread per tile of a row */

/* One block per row of `cols` entries keeping k (see the top). */
__global__ void row_select(float *x, float *r, int64_t cols, int64_t k, uint32_t *idx,
                           float *val, int zero_x)
{
    __shared__ uint32_t hist[IGRAD__RADIX_BINS_MAX];
    __shared__ uint32_t s_prefix;
    __shared__ unsigned long long s_k;
    int64_t row = blockIdx.x;
    float *xr = x + row * cols, *rr = r + row * cols;
    if (threadIdx.x == 0) {
        s_prefix = 0;
        s_k = (unsigned long long)k;
    }
    for (int round = 0; round < IGRAD__RADIX_ROUNDS; round++) {
        for (unsigned b = threadIdx.x; b < IGRAD__RADIX_BINS_MAX; b += blockDim.x) hist[b] = 0;
        __syncthreads();
        uint32_t prefix = s_prefix;
        for (int64_t j = threadIdx.x; j < cols; j += blockDim.x) {
            uint32_t key = igrad__key(igrad__fadd(xr[j], rr[j]));
            if (igrad__radix_matches(key, prefix, round))
                atomicAdd(&hist[igrad__radix_digit(key, round)], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            uint64_t kk = s_k;
            uint32_t d = igrad__radix_choose(hist, round, &kk);
            s_prefix = igrad__radix_extend(prefix, d, round);
            s_k = kk;
        }
        __syncthreads();
    }
    uint32_t kth = s_prefix;
    uint64_t ties = s_k;
    uint32_t *ir = idx + row * k;
    float *vr = val + row * k;
    unsigned long long run_g = 0, run_t = 0;
    const int64_t tile = (int64_t)IGRAD__CUDA_THREADS * ROW_ITEMS;
    for (int64_t t0 = 0; t0 < cols; t0 += tile) {
        int64_t j0 = t0 + (int64_t)threadIdx.x * ROW_ITEMS;
        int64_t j1 = j0 + ROW_ITEMS < cols ? j0 + ROW_ITEMS : cols;
        if (j0 > cols) j0 = cols;
        unsigned long long cg, ct, eg, et, ag, at;
        count_run(xr, rr, j0, j1, kth, &cg, &ct);
        scan2(cg, ct, &eg, &et, &ag, &at);
        gather_run(xr, rr, j0, j1, kth, ties, run_g + eg, run_t + et, ir, vr, zero_x);
        run_g += ag;
        run_t += at;
    }
}

/* ---- flat tensors: grid-wide rounds ---- */

__global__ void radix_init(uint64_t *radix, uint64_t k)
{
    radix[0] = 0;
    radix[1] = k;
}

__global__ void radix_hist(const float *x, const float *r, int64_t n, int round,
                           const uint64_t *radix, uint32_t *hist)
{
    __shared__ uint32_t sh[IGRAD__RADIX_BINS_MAX];
    for (unsigned b = threadIdx.x; b < IGRAD__RADIX_BINS_MAX; b += blockDim.x) sh[b] = 0;
    __syncthreads();
    uint32_t prefix = (uint32_t)radix[0];
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        uint32_t key = igrad__key(igrad__fadd(x[i], r[i]));
        if (igrad__radix_matches(key, prefix, round))
            atomicAdd(&sh[igrad__radix_digit(key, round)], 1u);
    }
    __syncthreads();
    for (unsigned b = threadIdx.x; b < igrad__radix_bins(round); b += blockDim.x)
        if (sh[b]) atomicAdd(&hist[b], sh[b]);
}

/* One block: the digit of this round, and the histogram cleared for the next. */
__global__ void radix_choose_kernel(uint32_t *hist, int round, uint64_t *radix)
{
    __shared__ uint32_t sh[IGRAD__RADIX_BINS_MAX];
    for (unsigned b = threadIdx.x; b < IGRAD__RADIX_BINS_MAX; b += blockDim.x) {
        sh[b] = hist[b];
        hist[b] = 0;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t kk = radix[1];
        uint32_t d = igrad__radix_choose(sh, round, &kk);
        radix[0] = igrad__radix_extend((uint32_t)radix[0], d, round);
        radix[1] = kk;
    }
}

__global__ void chunk_count(const float *x, const float *r, int64_t n, const uint64_t *radix,
                            uint64_t *chunks, int64_t nch)
{
    int64_t c = blockIdx.x;
    int64_t j0 = c * IGRAD__CUDA_CHUNK + (int64_t)threadIdx.x * IGRAD__CUDA_ITEMS;
    int64_t j1 = j0 + IGRAD__CUDA_ITEMS < n ? j0 + IGRAD__CUDA_ITEMS : n;
    if (j0 > n) j0 = n;
    unsigned long long cg, ct, eg, et, ag, at;
    count_run(x, r, j0, j1, (uint32_t)radix[0], &cg, &ct);
    scan2(cg, ct, &eg, &et, &ag, &at);
    if (threadIdx.x == 0) {
        chunks[c] = ag;
        chunks[nch + c] = at;
    }
}

/* One block of 1024 threads: exclusive sums of both count rows in place. */
__global__ void chunk_scan(uint64_t *chunks, int64_t nch)
{
    typedef cub::BlockScan<unsigned long long, 1024> big_scan_t;
    __shared__ typename big_scan_t::TempStorage tmp;
    int64_t per = (nch + 1023) / 1024;
    for (int which = 0; which < 2; which++) {
        uint64_t *v = chunks + which * nch;
        int64_t c0 = (int64_t)threadIdx.x * per, c1 = c0 + per < nch ? c0 + per : nch;
        unsigned long long s = 0, ex, total;
        for (int64_t c = c0; c < c1; c++) s += v[c];
        big_scan_t(tmp).ExclusiveSum(s, ex, total);
        __syncthreads();
        for (int64_t c = c0; c < c1; c++) {
            unsigned long long x = v[c];
            v[c] = ex;
            ex += x;
        }
        __syncthreads();
    }
}

__global__ void chunk_gather(float *x, float *r, int64_t n, const uint64_t *radix,
                             const uint64_t *chunks, int64_t nch, uint32_t *idx, float *val,
                             int zero_x)
{
    int64_t c = blockIdx.x;
    int64_t j0 = c * IGRAD__CUDA_CHUNK + (int64_t)threadIdx.x * IGRAD__CUDA_ITEMS;
    int64_t j1 = j0 + IGRAD__CUDA_ITEMS < n ? j0 + IGRAD__CUDA_ITEMS : n;
    if (j0 > n) j0 = n;
    uint32_t kth = (uint32_t)radix[0];
    unsigned long long cg, ct, eg, et, ag, at;
    count_run(x, r, j0, j1, kth, &cg, &ct);
    scan2(cg, ct, &eg, &et, &ag, &at);
    gather_run(x, r, j0, j1, kth, radix[1], chunks[c] + eg, chunks[nch + c] + et, idx, val,
               zero_x);
}

/* ---- dense specs and the elementwise stages ---- */

__global__ void select_all_kernel(float *x, float *r, int64_t n, int64_t cols, uint32_t *idx,
                                  float *val, int zero_x)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        val[i] = igrad__fadd(x[i], r[i]);
        idx[i] = (uint32_t)(i % cols);
        r[i] = 0.0f;
        if (zero_x) x[i] = 0.0f;
    }
}

/* u = m*u + g (g zeroed with zero_g) */
__global__ void momentum_kernel(float *u, float *g, int64_t n, float m, int zero_g)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u[i] = igrad__momentum(m, u[i], g[i]);
        if (zero_g) g[i] = 0.0f;
    }
}

/* r = g + r (g zeroed with zero_g) */
__global__ void accumulate_kernel(float *g, float *r, int64_t n, int zero_g)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        r[i] = igrad__fadd(g[i], r[i]);
        if (zero_g) g[i] = 0.0f;
    }
}

/* not sent, with momentum: u = m*u + g, r = u + r */
__global__ void accumulate_momentum_kernel(float *u, const float *g, float *r, int64_t n,
                                           float m)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        u[i] = igrad__momentum(m, u[i], g[i]);
        r[i] = igrad__fadd(u[i], r[i]);
    }
}

/* momentum factor masking: the velocity of the sent entries cleared */
__global__ void mask_kernel(float *u, const uint32_t *idx, int64_t count, int row_wise,
                            int64_t per_row, int64_t cols)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < count; j += stride)
        u[row_wise ? (j / per_row) * cols + idx[j] : (int64_t)idx[j]] = 0.0f;
}

struct val_of {
    const float *v;
    __device__ float operator()(int64_t i) const { return v[i]; }
};

/* ---- 16-bit and FP8 wire values: the staged values rounded, the
 * rounding errors into the residual (select.c's keep_entry, dp_cpu_select.c's
 * igrad__dp_cpu_round8), with core/value16.h's and value8.h's functions ---- */

/* Where staged entry j of a selection lies in its tensor (dp_cpu.h's
 * igrad__dp_cpu_sel_pos). */
struct sel_at {
    const uint32_t *idx;
    int all, row_wise; /* all: the dense spec (count = n) */
    int64_t per_row, cols;
    __device__ int64_t operator()(int64_t j) const
    {
        return all ? j : row_wise ? j / per_row * cols + (int64_t)idx[j] : (int64_t)idx[j];
    }
};

/* Entry j's residual (after the rounding: its rounding error). */
struct resid_of {
    const float *r;
    sel_at at;
    __device__ float operator()(int64_t j) const { return r[at(j)]; }
};

/* 16-bit: v becomes q = igrad__round16(dt, v), its residual v - q. */
__global__ void round16_kernel(float *val, float *r, sel_at at, int64_t count, igrad_dtype_t dt)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; j < count; j += stride) {
        float v = val[j], q = igrad__round16(dt, v);
        val[j] = q;
        r[at(j)] = v - q;
    }
}

/* FP8: thread block b rounds the step's block b (staged entries [b*blk,
 * +blk)) at the scale of its largest magnitude (a max: any order gives
 * the CPU's), each v to q = igrad__fp8_round(v), its residual v - q. */
__global__ void round8_kernel(float *val, float *r, sel_at at, int64_t count, int64_t blk)
{
    int64_t f = (int64_t)blockIdx.x * blk, n = count - f < blk ? count - f : blk;
    float *v = val + f;
    float sc, inv;
    igrad__fp8_scales(igrad__cuda_block_amax(v, n), &sc, &inv);
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        float a = v[j], q = igrad__fp8_round(a, inv, sc);
        v[j] = q;
        r[at(f + j)] = a - q;
    }
}

/* Tensor t's staged values (selection sp at idx/val, residual r)
 * rounded for the wire's value dtype, and the sum of the squared errors
 * into *rsum (fixed order). */
void round_values(const igrad__plan_t *plan, const igrad__step_t *step, size_t t,
                  const igrad_select_spec_t *sp, const uint32_t *idx, float *val, float *r,
                  double *part, double *rsum, cudaStream_t s)
{
    const igrad__plan_tensor_t *tp = &plan->t[t];
    sel_at at = {idx, sp->count == sp->n, sp->row_wise, sp->per_row, sp->cols};
    if (sp->count == 0) {
        /* nothing to round; the sum below is 0 */
    } else if (plan->value_nbytes == 1) {
        int par = igrad__plan_parity(plan, step->cur_step);
        int64_t blk = tp->blk_entries[step->rel[t]][par];
        if (blk <= 0) blk = sp->count;
        int64_t nblk = (sp->count + blk - 1) / blk;
        round8_kernel<<<(unsigned)nblk, IGRAD__CUDA_THREADS, 0, s>>>(val, r, at, sp->count, blk);
    } else {
        round16_kernel<<<igrad__cuda_grid(sp->count), IGRAD__CUDA_THREADS, 0, s>>>(
            val, r, at, sp->count, plan->kargs.value_dtype);
    }
    resid_of f = {r, at};
    igrad__cuda_sum_launch(f, sp->count, part, rsum, s);
}

/* Selection of one sent tensor into idx/val, from x (g, or u with
 * momentum) and r; x zeroed with zero_x. */
void select_one(igrad__cuda_state_t *st, float *x, float *r, const igrad_select_spec_t *sp,
                uint32_t *idx, float *val, int zero_x, cudaStream_t s)
{
    int64_t n = sp->n;
    const unsigned T = IGRAD__CUDA_THREADS;
    if (sp->count == n) {
        int64_t cols = sp->row_wise ? n / sp->rows : n;
        select_all_kernel<<<igrad__cuda_grid(n), T, 0, s>>>(x, r, n, cols, idx, val, zero_x);
    } else if (sp->row_wise) {
        row_select<<<(unsigned)sp->rows, T, 0, s>>>(x, r, sp->cols, sp->per_row, idx, val,
                                                    zero_x);
    } else if (n <= IGRAD__CUDA_ROW_MAX) {
        row_select<<<1, T, 0, s>>>(x, r, n, sp->count, idx, val, zero_x);
    } else {
        int64_t nch = (n + IGRAD__CUDA_CHUNK - 1) / IGRAD__CUDA_CHUNK;
        cudaMemsetAsync(st->d_hist, 0, IGRAD__RADIX_BINS_MAX * sizeof(uint32_t), s);
        radix_init<<<1, 1, 0, s>>>(st->d_radix, (uint64_t)sp->count);
        /* a grid-stride histogram: more blocks would only add flushes */
        unsigned hgrid = igrad__cuda_grid(n) < 1024 ? igrad__cuda_grid(n) : 1024;
        for (int round = 0; round < IGRAD__RADIX_ROUNDS; round++) {
            radix_hist<<<hgrid, T, 0, s>>>(x, r, n, round, st->d_radix, st->d_hist);
            radix_choose_kernel<<<1, 1024, 0, s>>>(st->d_hist, round, st->d_radix);
        }
        chunk_count<<<(unsigned)nch, T, 0, s>>>(x, r, n, st->d_radix, st->d_chunks, nch);
        chunk_scan<<<1, 1024, 0, s>>>(st->d_chunks, nch);
        chunk_gather<<<(unsigned)nch, T, 0, s>>>(x, r, n, st->d_radix, st->d_chunks, nch, idx,
                                                 val, zero_x);
    }
}

} // namespace

void igrad__dp_cuda_select_into(IGRAD__DP_ARGS, float *const *grads, int zero)
{
    igrad__cuda_state_t *st = igrad__cuda_state(plan, step, mem);
    if (!st) {
        for (size_t t = 0; t < plan->ntensors; t++) step->tstatus[t] = IGRAD_E_STATE;
        return;
    }
    cudaStream_t s = igrad__cuda_stream(plan, step, mem);
    const unsigned T = IGRAD__CUDA_THREADS;
    int drop = plan->kargs.residual_drop;
    float m = plan->kargs.momentum;
    int par = igrad__plan_parity(plan, step->cur_step);
    const size_t nt = plan->ntensors;
    const int rounds = plan->kargs.value_dtype != IGRAD_DTYPE_F32;
    for (size_t t = 0; t < plan->ntensors; t++) {
        igrad__plan_tensor_t *tp = &plan->t[t];
        float *g = grads[t], *r = mem->residual[t], *u = mem->velocity[t];
        int64_t n = tp->n;
        unsigned grid = igrad__cuda_grid(n);
        if (step->sent[t]) {
            const igrad_select_spec_t *sp = &tp->spec[step->rel[t]][par];
            uint32_t *idx = step->stage_idx + step->stage_off[t];
            float *val = step->stage_val + step->stage_off[t];
            if (u) {
                momentum_kernel<<<grid, T, 0, s>>>(u, g, n, m, zero);
                select_one(st, u, r, sp, idx, val, 0, s);
            } else {
                select_one(st, g, r, sp, idx, val, zero, s);
            }
            if (u) { /* DGC's factor masking */
                if (sp->count == n) cudaMemsetAsync(u, 0, (size_t)n * sizeof *u, s);
                else mask_kernel<<<igrad__cuda_grid(sp->count), T, 0, s>>>(
                         u, idx, sp->count, sp->row_wise, sp->per_row, sp->cols);
            }
            val_of f = {val};
            igrad__cuda_sum_launch(f, sp->count, st->d_part, st->d_tsumsq + t, s);
            if (rounds) /* after the sum: sumsq is the unrounded values' */
                round_values(plan, step, t, sp, idx, val, r, st->d_part, st->d_tsumsq + nt + t,
                             s);
        } else if (!drop && !u) {
            accumulate_kernel<<<grid, T, 0, s>>>(g, r, n, zero);
        } else if (!drop) {
            accumulate_momentum_kernel<<<grid, T, 0, s>>>(u, g, r, n, m);
            if (zero) cudaMemsetAsync(g, 0, (size_t)n * sizeof *g, s);
        } else {
            if (u) cudaMemsetAsync(u, 0, (size_t)n * sizeof *u, s);
            cudaMemsetAsync(r, 0, (size_t)n * sizeof *r, s);
            if (zero) cudaMemsetAsync(g, 0, (size_t)n * sizeof *g, s);
        }
    }
    /* the selections' sums: one small array back */
    double *sums = st->h_sums;
    cudaError_t err = cudaGetLastError();
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(sums, st->d_tsumsq, (rounds ? 2 : 1) * nt * sizeof(double),
                              cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) igrad__cuda_fail(err, "CUDA selection");
    for (size_t t = 0; t < plan->ntensors; t++) {
        double a2 = step->tnorm[t]; /* sum of a^2 from the check */
        double sumsq = step->sent[t] ? sums[t] : 0.0;
        step->tdropped[t] = 0.0;
        if (err != cudaSuccess) {
            step->tstatus[t] = step->sent[t] ? IGRAD_E_STATE : IGRAD_OK;
        } else if (step->sent[t]) {
            step->tsumsq[t] = sumsq;
            /* the residual is a with the selected entries zeroed (plus their
             * rounding errors) */
            double kept = a2 - sumsq > 0.0 ? a2 - sumsq : 0.0;
            step->tnorm[t] = kept + (rounds ? sums[nt + t] : 0.0);
        } else if (drop) {
            step->tdropped[t] = a2;
            step->tnorm[t] = 0.0;
        }
    }
}
