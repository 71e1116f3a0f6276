/*
 * sparse_allreduce_cuda.cu — the CUDA backend of the sparse all-reduce
 * (igrad__sar_cuda, a row of sparse_allreduce.h's igrad__sar_ops_t): the
 * data steps on device memory, on the caller's stream, with the host
 * backend's results bit for bit. The protocol, its exchanges and every
 * message are sparse_allreduce.c's; what comes back to the host is
 * metadata (P counts, a first bad position, the number of distinct
 * indices, P marks).
 *  split: one pass checks the entries (the first bad one by atomicMin),
 *    counts them per owner (a shared-memory histogram per block) and says
 *    whether the owners ever go down; only then are they grouped, by a
 *    stable radix sort on the owner (CUB), else sent as they are (the
 *    engine's buckets are in index order).
 *  reduce: a stable radix sort of the received entries by index keeps the
 *    order received among equal indices; run-length encoding finds the
 *    distinct indices, and one thread per index adds its run from 0.0f in
 *    that order (the host's qsort of (index, position) and its loop); when
 *    more than kout remain, a radix sort of the rank keys (|sum| bits, then
 *    index) gives the kout-th key, and a scan places every sum, in index
 *    order, into the kept block or the remainder.
 *  collect: one thread block per rank checks its block's entries and
 *    copies them to their place in the result.
 * Not here: the protocol (sparse_allreduce.c), the engine's pack and
 * unpack of this wire (dp_cuda_pack.cu).
 */
#include "dp/cuda/dp_cuda.cuh"

#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>

extern "C" {
#include "comm/sparse_allreduce.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

namespace {

/* Scratch slots (sparse_allreduce.h: from IGRAD__SAR_SCRATCH). */
enum {
    S_KEYS = IGRAD__SAR_SCRATCH, /* u32: owners (split), indices (reduce) */
    S_KEYS_OUT,                  /* u32: the same, sorted */
    S_VALS,                      /* f32 values (reduce), then the keep flags */
    S_VALS_OUT,                  /* f32 values sorted by index */
    S_UNIQ,                      /* u32 distinct indices */
    S_RUNS,                      /* u32 run lengths */
    S_OFFS,                      /* u32 run offsets, then the kept positions */
    S_SUMS,                      /* entries: (index, sum) ascending */
    S_RKEYS,                     /* u64 rank keys */
    S_RKEYS_OUT,                 /* u64 rank keys sorted */
    S_MARKS,                     /* u64 per rank: collect's first bad entry */
    S_TEMP,                      /* CUB's temporary storage */
    S_SMALL,                     /* sar_small_t */
    S_END
};
static_assert((int)S_END <= (int)IGRAD__SAR_SLOTS, "igrad__sar_t has a slot per buffer");

/* The few device scalars a call reads back. */
typedef struct sar_small {
    unsigned long long first_bad; /* split: input position; reduce: received position */
    unsigned int descending;      /* split: some owner below the one before it */
    unsigned int nruns;           /* reduce: distinct indices */
    unsigned int hist[IGRAD__SAR_HIST]; /* reduce: received entries per part of the range */
} sar_small_t;

#define NO_POSITION (~0ULL)
#define HIST_MAX 4096 /* owners counted in shared memory (16 KiB) */

const char *const WHAT = "CUDA sparse all-reduce";

igrad_status_t fail(cudaError_t err, const char *step)
{
    char what[128];
    snprintf(what, sizeof what, "%s: %s", WHAT, step);
    return igrad__cuda_fail(err, what);
}

/* ---- kernels ---- */

__device__ bool entry_bad(igrad__sar_entry_t e, uint64_t D)
{
    return e.index >= D || !isfinite(e.value);
}

/* Checks, counts per owner (of the split points `bounds`) and looks for a
 * descending owner. hist: P counters of shared memory when P <= HIST_MAX
 * (dynamic), else the global counts directly. */
__global__ void split_kernel(const igrad__sar_entry_t *in, int64_t k, uint64_t D, int P,
                             const uint64_t *bounds, uint32_t *owners,
                             unsigned long long *counts, sar_small_t *small)
{
    extern __shared__ unsigned int hist[];
    const bool shared = P <= HIST_MAX;
    if (shared)
        for (int o = threadIdx.x; o < P; o += blockDim.x) hist[o] = 0;
    __syncthreads();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < k; i += stride) {
        igrad__sar_entry_t e = in[i];
        if (entry_bad(e, D)) {
            atomicMin(&small->first_bad, (unsigned long long)i);
            continue;
        }
        int o = igrad__sar_owner_of(bounds, P, e.index);
        owners[i] = (uint32_t)o;
        if (shared) atomicAdd(&hist[o], 1u);
        else atomicAdd(&counts[o], 1ULL);
        if (i > 0) {
            igrad__sar_entry_t p = in[i - 1];
            if (!entry_bad(p, D) && igrad__sar_owner_of(bounds, P, p.index) > o)
                small->descending = 1;
        }
    }
    __syncthreads();
    if (shared)
        for (int o = threadIdx.x; o < P; o += blockDim.x)
            if (hist[o]) atomicAdd(&counts[o], (unsigned long long)hist[o]);
}

/* The first received position outside [lo, hi); the indices and values
 * apart, for the sort; the entries inside counted per part of the range
 * (igrad__sar_hist_bin; per block in shared memory, then added). */
__global__ void range_kernel(const igrad__sar_entry_t *recv, int64_t n, uint64_t lo,
                             uint64_t hi, uint32_t *keys, float *vals, sar_small_t *small)
{
    __shared__ unsigned int hist[IGRAD__SAR_HIST];
    for (int j = threadIdx.x; j < IGRAD__SAR_HIST; j += blockDim.x) hist[j] = 0;
    __syncthreads();
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t p = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; p < n; p += stride) {
        igrad__sar_entry_t e = recv[p];
        if (e.index < lo || e.index >= hi) atomicMin(&small->first_bad, (unsigned long long)p);
        else atomicAdd(&hist[igrad__sar_hist_bin(lo, hi, e.index)], 1u);
        keys[p] = e.index;
        vals[p] = e.value;
    }
    __syncthreads();
    for (int j = threadIdx.x; j < IGRAD__SAR_HIST; j += blockDim.x)
        if (hist[j]) atomicAdd(&small->hist[j], hist[j]);
}

/* One thread per distinct index: its run added from 0.0f in the order
 * received (the stable sort kept it), as the host adds. */
__global__ void sum_kernel(const uint32_t *uniq, const uint32_t *runs, const uint32_t *offs,
                           const float *vals, int64_t m, igrad__sar_entry_t *sums,
                           uint64_t *rkeys)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < m; q += stride) {
        float s = 0.0f;
        for (uint32_t p = offs[q], end = offs[q] + runs[q]; p < end; p++)
            s = igrad__fadd(s, vals[p]);
        sums[q].index = uniq[q];
        sums[q].value = s;
        if (rkeys) rkeys[q] = igrad__sar_rank_key(uniq[q], __float_as_uint(s));
    }
}

/* keep[q]: sum q is among the kout kept (its rank key at most the
 * kout-th smallest; all when `threshold` is NULL). */
__global__ void flag_kernel(const uint64_t *rkeys, const uint64_t *threshold, int64_t m,
                            uint32_t *keep)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < m; q += stride)
        keep[q] = !threshold || rkeys[q] <= *threshold;
}

/* Every sum, in index order, to the kept block or the remainder. */
__global__ void place_kernel(const igrad__sar_entry_t *sums, const uint32_t *keep,
                             const uint32_t *pos, int64_t m, igrad__sar_entry_t *kept,
                             igrad__sar_entry_t *rem)
{
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; q < m; q += stride) {
        if (keep[q]) kept[pos[q]] = sums[q];
        else rem[q - (int64_t)pos[q]] = sums[q];
    }
}

/* Block r: rank r's nkept entries checked (ascending inside r's range;
 * the first that is not into marks[r]) and copied to result + off[r]. */
__global__ void collect_kernel(const unsigned char *blocks, size_t block_nbytes, int P,
                               const uint64_t *bounds, const unsigned long long *nkept_off,
                               igrad__sar_entry_t *result, unsigned long long *marks)
{
    int r = (int)blockIdx.x;
    const uint64_t lo = bounds[r], hi = bounds[r + 1];
    const igrad__sar_entry_t *b = (const igrad__sar_entry_t *)(const void *)(
        blocks + (size_t)r * block_nbytes + sizeof(igrad__sar_header_t));
    unsigned long long n = nkept_off[r], off = nkept_off[P + r];
    for (unsigned long long q = threadIdx.x; q < n; q += blockDim.x) {
        igrad__sar_entry_t e = b[q];
        if (e.index < lo || e.index >= hi || (q > 0 && e.index <= b[q - 1].index))
            atomicMin(&marks[r], q);
        result[off + q] = e;
    }
}

/* ---- memory ---- */

void *dev_alloc(size_t nbytes)
{
    void *p = NULL;
    return cudaMalloc(&p, nbytes ? nbytes : 1) == cudaSuccess ? p : NULL;
}

void dev_free(void *p)
{
    if (p) cudaFree(p);
}

igrad_status_t dev_copy_in(void *stream, void *dst, const void *src, size_t nbytes)
{
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = nbytes ? cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, s)
                             : cudaSuccess;
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    return err == cudaSuccess ? IGRAD_OK : fail(err, "copying to the device");
}

igrad_status_t dev_copy_out(void *stream, void *dst, size_t dpitch, const void *src,
                            size_t spitch, size_t width, size_t height)
{
    cudaStream_t s = (cudaStream_t)stream;
    cudaError_t err = cudaSuccess;
    if (width && height == 1)
        err = cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToHost, s);
    else if (width && height)
        err = cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDeviceToHost,
                                s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    return err == cudaSuccess ? IGRAD_OK : fail(err, "copying from the device");
}

/* A CUB call f(temp, temp_nbytes): asked for its storage first, which is
 * grown in the slot S_TEMP (contents not kept). */
template <class F>
cudaError_t cub_run(igrad__sar_t *w, F f)
{
    size_t nbytes = 0;
    cudaError_t err = f((void *)NULL, nbytes);
    if (err != cudaSuccess) return err;
    void *tmp = igrad__sar_workspace(w, S_TEMP, nbytes, 1);
    return tmp ? f(tmp, nbytes) : cudaErrorMemoryAllocation;
}

unsigned bits_for(int P)
{
    unsigned b = 0;
    while (b < 32 && (1ull << b) < (unsigned long long)P) b++;
    return b;
}

/* ---- the data steps ---- */

igrad_status_t dev_split(igrad__sar_t *w, void *stream, uint64_t D, int P,
                         const uint64_t *bounds, size_t k, const igrad__sar_entry_t *in,
                         uint64_t *send_counts, igrad__sar_report_t *rep,
                         igrad__sar_entry_t **send)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t Pz = (size_t)P;
    uint32_t *owners = (uint32_t *)igrad__sar_workspace(w, S_KEYS, k, sizeof(uint32_t));
    unsigned long long *counts = (unsigned long long *)igrad__sar_workspace(
        w, IGRAD__SAR_WS_DCOUNTS, 2 * Pz, sizeof(uint64_t));
    sar_small_t *small = (sar_small_t *)igrad__sar_workspace(w, S_SMALL, 1, sizeof(sar_small_t));
    if (!owners || !counts || !small) {
        rep->reason = IGRAD__SAR_NOMEM;
        rep->value = (uint64_t)k * 4 + 16 * Pz + sizeof(sar_small_t);
        return IGRAD_OK;
    }
    sar_small_t h;
    memset(&h, 0, sizeof h);
    h.first_bad = NO_POSITION;
    cudaError_t err = cudaMemcpyAsync(small, &h, sizeof h, cudaMemcpyHostToDevice, s);
    if (err == cudaSuccess) err = cudaMemsetAsync(counts, 0, Pz * sizeof *counts, s);
    if (err != cudaSuccess) return fail(err, "split");
    size_t shmem = P <= HIST_MAX ? Pz * sizeof(unsigned int) : 0;
    split_kernel<<<igrad__cuda_grid((int64_t)k), IGRAD__CUDA_THREADS, shmem, s>>>(
        in, (int64_t)k, D, P, bounds, owners, counts, small);
    err = cudaGetLastError();
    if (err == cudaSuccess) err = cudaMemcpyAsync(&h, small, sizeof h, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(send_counts, counts, Pz * sizeof *counts, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) return fail(err, "split");
    if (h.first_bad != NO_POSITION) {
        igrad__sar_entry_t e;
        err = cudaMemcpyAsync(&e, in + h.first_bad, sizeof e, cudaMemcpyDeviceToHost, s);
        if (err == cudaSuccess) err = cudaStreamSynchronize(s);
        if (err != cudaSuccess) return fail(err, "split");
        int bad_index = e.index >= D;
        rep->reason = bad_index ? IGRAD__SAR_INPUT_INDEX : IGRAD__SAR_INPUT_VALUE;
        rep->where = h.first_bad;
        uint32_t bits;
        memcpy(&bits, &e.value, sizeof bits);
        rep->value = bad_index ? e.index : bits;
        return IGRAD_OK;
    }
    if (!h.descending) { /* already grouped: sent as it is (only read) */
        *send = (igrad__sar_entry_t *)in;
        return IGRAD_OK;
    }
    igrad__sar_entry_t *out = (igrad__sar_entry_t *)igrad__sar_workspace(
        w, IGRAD__SAR_WS_SEND, k, sizeof *out);
    uint32_t *owners_out = (uint32_t *)igrad__sar_workspace(w, S_KEYS_OUT, k, sizeof(uint32_t));
    if (!out || !owners_out) {
        rep->reason = IGRAD__SAR_NOMEM;
        rep->value = (uint64_t)k * 12;
        return IGRAD_OK;
    }
    const int end_bit = (int)bits_for(P);
    err = cub_run(w, [&](void *tmp, size_t &nbytes) {
        return cub::DeviceRadixSort::SortPairs(tmp, nbytes, owners, owners_out, in, out,
                                               (int64_t)k, 0, end_bit, s);
    });
    if (err != cudaSuccess) return fail(err, "grouping by owner");
    *send = out;
    return IGRAD_OK;
}

/* The arrays reduce needs for n received entries (CUB's storage is grown
 * by each call, cub_run). */
uint64_t dev_reserve(igrad__sar_t *w, size_t n)
{
    static const size_t item[] = {4, 4, 4, 4, 4, 4, 4, 8, 8, 8}; /* S_KEYS .. S_RKEYS_OUT */
    uint64_t missing = 0;
    for (int i = 0; i < (int)(sizeof item / sizeof item[0]); i++)
        if (!igrad__sar_workspace(w, S_KEYS + i, n, item[i])) missing += (uint64_t)n * item[i];
    if (!igrad__sar_workspace(w, S_SMALL, 1, sizeof(sar_small_t))) missing += sizeof(sar_small_t);
    return missing;
}

igrad_status_t dev_reduce(igrad__sar_t *w, void *stream, const igrad__sar_entry_t *recv,
                          size_t n, uint64_t lo, uint64_t hi, size_t kout,
                          igrad__sar_entry_t *kept, size_t *nkept, igrad__sar_entry_t *rem,
                          size_t *nrem, size_t *bad, uint32_t *hist)
{
    cudaStream_t s = (cudaStream_t)stream;
    *nkept = *nrem = 0;
    *bad = SIZE_MAX;
    memset(hist, 0, IGRAD__SAR_HIST * sizeof *hist);
    cudaError_t err = cudaMemsetAsync(kept, 0, kout * sizeof *kept, s); /* the padding */
    if (err != cudaSuccess) return fail(err, "reduce");
    if (n == 0) return IGRAD_OK;
    uint32_t *keys = (uint32_t *)w->buf[S_KEYS], *keys_out = (uint32_t *)w->buf[S_KEYS_OUT];
    float *vals = (float *)w->buf[S_VALS], *vals_out = (float *)w->buf[S_VALS_OUT];
    uint32_t *uniq = (uint32_t *)w->buf[S_UNIQ], *runs = (uint32_t *)w->buf[S_RUNS];
    uint32_t *offs = (uint32_t *)w->buf[S_OFFS];
    igrad__sar_entry_t *sums = (igrad__sar_entry_t *)w->buf[S_SUMS];
    uint64_t *rkeys = (uint64_t *)w->buf[S_RKEYS], *rkeys_out = (uint64_t *)w->buf[S_RKEYS_OUT];
    sar_small_t *small = (sar_small_t *)w->buf[S_SMALL];
    const int64_t nn = (int64_t)n;
    const unsigned grid = igrad__cuda_grid(nn);

    sar_small_t h;
    memset(&h, 0, sizeof h);
    h.first_bad = NO_POSITION;
    err = cudaMemcpyAsync(small, &h, sizeof h, cudaMemcpyHostToDevice, s);
    if (err != cudaSuccess) return fail(err, "reduce");
    range_kernel<<<grid, IGRAD__CUDA_THREADS, 0, s>>>(recv, nn, lo, hi, keys, vals, small);
    /* equal indices keep the order received: the radix sort is stable */
    err = cudaGetLastError();
    if (err == cudaSuccess)
        err = cub_run(w, [&](void *tmp, size_t &nbytes) {
            return cub::DeviceRadixSort::SortPairs(tmp, nbytes, keys, keys_out, vals, vals_out,
                                                   nn, 0, 32, s);
        });
    if (err == cudaSuccess)
        err = cub_run(w, [&](void *tmp, size_t &nbytes) {
            return cub::DeviceRunLengthEncode::Encode(tmp, nbytes, keys_out, uniq, runs,
                                                      &small->nruns, nn, s);
        });
    if (err == cudaSuccess) err = cudaMemcpyAsync(&h, small, sizeof h, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    if (err != cudaSuccess) return fail(err, "reduce");
    if (h.first_bad != NO_POSITION) { /* nothing is reduced; the protocol reports it */
        *bad = (size_t)h.first_bad;
        return IGRAD_OK;
    }
    memcpy(hist, h.hist, IGRAD__SAR_HIST * sizeof *hist);
    const int64_t m = (int64_t)h.nruns;
    const unsigned mgrid = igrad__cuda_grid(m);
    const bool select = (size_t)m > kout; /* kout >= 1 here: n > 0 means k > 0 */
    err = cub_run(w, [&](void *tmp, size_t &nbytes) {
        return cub::DeviceScan::ExclusiveSum(tmp, nbytes, runs, offs, m, s);
    });
    if (err == cudaSuccess) {
        sum_kernel<<<mgrid, IGRAD__CUDA_THREADS, 0, s>>>(uniq, runs, offs, vals_out, m, sums,
                                                         select ? rkeys : NULL);
        err = cudaGetLastError();
    }
    if (err == cudaSuccess && select)
        err = cub_run(w, [&](void *tmp, size_t &nbytes) {
            return cub::DeviceRadixSort::SortKeys(tmp, nbytes, rkeys, rkeys_out, m, 0, 64, s);
        });
    uint32_t *keep = (uint32_t *)vals; /* the unsorted values are spent */
    if (err == cudaSuccess) {
        flag_kernel<<<mgrid, IGRAD__CUDA_THREADS, 0, s>>>(rkeys, select ? rkeys_out + kout - 1
                                                                        : NULL,
                                                          m, keep);
        err = cudaGetLastError();
    }
    if (err == cudaSuccess)
        err = cub_run(w, [&](void *tmp, size_t &nbytes) {
            return cub::DeviceScan::ExclusiveSum(tmp, nbytes, keep, offs, m, s);
        });
    if (err == cudaSuccess) {
        place_kernel<<<mgrid, IGRAD__CUDA_THREADS, 0, s>>>(sums, keep, offs, m, kept, rem);
        err = cudaGetLastError();
    }
    if (err != cudaSuccess) return fail(err, "reduce");
    *nkept = select ? kout : (size_t)m;
    *nrem = (size_t)m - *nkept;
    return IGRAD_OK;
}

igrad_status_t dev_collect(igrad__sar_t *w, void *stream, const unsigned char *blocks,
                           size_t block_nbytes, int P, const uint64_t *nkept,
                           const uint64_t *bounds, igrad__sar_entry_t *result, int *bad_rank,
                           uint64_t *bad_entry,
                           uint32_t *bad_index)
{
    cudaStream_t s = (cudaStream_t)stream;
    const size_t Pz = (size_t)P;
    *bad_rank = P;
    /* [nkept | offsets] on the device, in the counts' slot (spent by now) */
    unsigned long long *d_meta = (unsigned long long *)igrad__sar_workspace(
        w, IGRAD__SAR_WS_DCOUNTS, 2 * Pz, sizeof(uint64_t));
    unsigned long long *marks =
        (unsigned long long *)igrad__sar_workspace(w, S_MARKS, Pz, sizeof(uint64_t));
    uint64_t *meta = (uint64_t *)malloc(2 * Pz * sizeof *meta);
    IGRAD_FAIL_IF(!d_meta || !marks || !meta, IGRAD_E_NOMEM,
                  "%s: out of memory for the marks of %d ranks", WHAT, P);
    uint64_t off = 0;
    for (size_t r = 0; r < Pz; r++) {
        meta[r] = nkept[r];
        meta[Pz + r] = off;
        off += nkept[r];
    }
    cudaError_t err = cudaMemcpyAsync(d_meta, meta, 2 * Pz * sizeof *meta,
                                      cudaMemcpyHostToDevice, s);
    if (err == cudaSuccess) err = cudaMemsetAsync(marks, 0xff, Pz * sizeof *marks, s);
    if (err == cudaSuccess) {
        collect_kernel<<<(unsigned)P, IGRAD__CUDA_THREADS, 0, s>>>(blocks, block_nbytes, P,
                                                                   bounds, d_meta, result,
                                                                   marks);
        err = cudaGetLastError();
    }
    uint64_t *h_marks = meta; /* the host copy is spent once the copy above is queued */
    if (err == cudaSuccess)
        err = cudaMemcpyAsync(h_marks, marks, Pz * sizeof *marks, cudaMemcpyDeviceToHost, s);
    if (err == cudaSuccess) err = cudaStreamSynchronize(s);
    for (int r = 0; err == cudaSuccess && r < P; r++) {
        if (h_marks[r] == NO_POSITION) continue;
        igrad__sar_entry_t e;
        const unsigned char *at = blocks + (size_t)r * block_nbytes +
                                  sizeof(igrad__sar_header_t) + h_marks[r] * sizeof e;
        err = cudaMemcpyAsync(&e, at, sizeof e, cudaMemcpyDeviceToHost, s);
        if (err == cudaSuccess) err = cudaStreamSynchronize(s);
        *bad_rank = r;
        *bad_entry = h_marks[r];
        *bad_index = e.index;
        break;
    }
    free(meta);
    return err == cudaSuccess ? IGRAD_OK : fail(err, "collect");
}

} // namespace

extern "C" const igrad__sar_ops_t igrad__sar_cuda = {
    /* .name = */ "cuda",
    /* .space = */ IGRAD__MEM_DEVICE,
    /* .alloc = */ dev_alloc,
    /* .free = */ dev_free,
    /* .copy_in = */ dev_copy_in,
    /* .copy_out = */ dev_copy_out,
    /* .split = */ dev_split,
    /* .reserve = */ dev_reserve,
    /* .reduce = */ dev_reduce,
    /* .collect = */ dev_collect,
};
