/*
 * dp_cuda.cuh — what the CUDA data-plane files (dp_cuda*.cu) share: the
 * per-engine device state (mem->dp_state: the small device arrays of the
 * per-tensor results and the kernels' scratch, sized at create from the
 * plan, never O(parameters) on the host), the launch helpers, and the
 * stage functions the table row in dp_cuda.cu points at. The numeric
 * decisions are in dp_cuda_logic.h; the table itself is dp.h.
 */
#ifndef IGRAD_DP_CUDA_CUH
#define IGRAD_DP_CUDA_CUH

#include <cuda_runtime.h>

extern "C" {
#include "dp/dp.h"
}
#include "dp/cuda/dp_cuda_logic.h"
#include "core/value8.h" /* the wire's values: host-device, as the CPU backend's */

#define IGRAD__CUDA_THREADS 256   /* threads of the streaming kernels */
#define IGRAD__CUDA_CHUNK 4096    /* entries per block of the flat gather */
#define IGRAD__CUDA_ITEMS (IGRAD__CUDA_CHUNK / IGRAD__CUDA_THREADS) /* per thread */
#define IGRAD__CUDA_SUM_BLOCKS 1024 /* most blocks of a sum (fixed order) */
#define IGRAD__CUDA_ROW_MAX 65536 /* flat tensors up to this size: one block */

/* One block of a bucket as the unpack kernels see it. */
typedef struct igrad__cuda_blk {
    float *g;               /* the tensor's gradient */
    size_t val_off, idx_off; /* in a rank's bytes */
    int64_t count;          /* entries */
    int64_t bound;          /* indices below it: cols (row-wise) or n */
    int64_t per_row, row0, cols; /* row-wise */
    int width;              /* index bytes: 2 or 4 */
    int vw;                 /* value bytes: 4 F32, 2 (dt's 16-bit codes), 1 FP8 */
    igrad_dtype_t dt;       /* the value dtype */
    int row_wise;
    int code;               /* compact: each run's code (core/wire_code.h); 0: width */
    int64_t code_k, code_u, code_nbytes; /* compact: entries, range, bytes of a run */
} igrad__cuda_blk_t;

/* One dense segment of a sparse all-reduce bucket (a block that opens its
 * segment): bucket indices [dense_off, +count) are the tensor's entries
 * [begin, +count). */
typedef struct igrad__cuda_seg {
    float *g;               /* the tensor's gradient */
    float *residual;        /* its residual */
    uint64_t dense_off;
    int64_t begin, count;
} igrad__cuda_seg_t;

typedef struct igrad__cuda_state {
    int device;
    size_t ntensors;
    double *d_tnorm;        /* (ntensors) check's sums */
    double *d_tsumsq;       /* (2 ntensors) selections' sums, then (16-bit and FP8
                               values) their rounding errors' */
    double *d_part;         /* (IGRAD__CUDA_SUM_BLOCKS) partial sums */
    uint32_t *d_hist;       /* (IGRAD__RADIX_BINS_MAX) flat radix histogram */
    uint64_t *d_radix;      /* [prefix, rank left] of the flat radix select */
    uint64_t *d_chunks;     /* (2 * max_chunks) greater / tied per chunk, scanned */
    size_t max_chunks;
    unsigned long long *d_first; /* first_bad's index */
    unsigned long long *d_bad; /* (bad_cap) unpack: first bad event per (rank, block) */
    size_t bad_cap;
    igrad__cuda_blk_t *d_blk, *h_blk; /* (blk_cap) a bucket's blocks */
    unsigned long long *h_bad;
    size_t blk_cap;
    igrad__cuda_seg_t *d_seg, *h_seg; /* (seg_cap) a sparse all-reduce bucket's segments */
    double *d_segsum, *h_segsum;      /* (seg_cap) their residual sums */
    size_t seg_cap;
    double *h_sums;         /* (2 ntensors) host copy of d_tsumsq */
} igrad__cuda_state_t;

/* The engine's queue. */
static inline cudaStream_t igrad__cuda_stream(IGRAD__DP_CARGS)
{
    return (cudaStream_t)mem->dp_stream;
}

/* Launch geometry of a grid-stride pass over n entries. */
static inline unsigned igrad__cuda_grid(int64_t n)
{
    int64_t b = (n + IGRAD__CUDA_THREADS * 4 - 1) / (IGRAD__CUDA_THREADS * 4);
    if (b < 1) b = 1;
    return (unsigned)(b > 65535 * 16 ? 65535 * 16 : b);
}

/* ---- sums of squares in a fixed order ----
 * part: IGRAD__CUDA_SUM_BLOCKS blocks stride over the n entries (how many
 * depends on n alone), each sums its entries' a^2 in double and reduces
 * its threads in a fixed tree; final: one block reduces the partial sums
 * the same way. Same n, same bits, on every rank and every run. */
static inline unsigned igrad__cuda_sum_blocks(int64_t n)
{
    int64_t b = (n + 1023) / 1024;
    return (unsigned)(b < 1 ? 1 : b > IGRAD__CUDA_SUM_BLOCKS ? IGRAD__CUDA_SUM_BLOCKS : b);
}

static __device__ double igrad__cuda_block_sum(double v)
{
    __shared__ double sh[IGRAD__CUDA_THREADS];
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int w = IGRAD__CUDA_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) sh[threadIdx.x] += sh[threadIdx.x + w];
        __syncthreads();
    }
    return sh[0];
}

/* The largest |v[j]| of v[0, n), called by every thread of one block (a
 * max of igrad__key: any order gives the CPU's igrad__fp8_block_amax). */
static __device__ float igrad__cuda_block_amax(const float *v, int64_t n)
{
    __shared__ unsigned int s_key;
    if (threadIdx.x == 0) s_key = 0;
    __syncthreads();
    unsigned int key = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
        uint32_t kj = igrad__key(v[j]);
        key = kj > key ? kj : key;
    }
    atomicMax(&s_key, key);
    __syncthreads();
    return igrad__f32_from_bits(s_key);
}

/* f(i) gives entry i's a (a float). */
template <class F>
__global__ void igrad__cuda_sum_part(F f, int64_t n, double *part)
{
    double s = 0.0;
    int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        double a = (double)f(i);
        s += a * a;
    }
    double b = igrad__cuda_block_sum(s);
    if (threadIdx.x == 0) part[blockIdx.x] = b;
}

template <class F>
__global__ void igrad__cuda_sum_final(F f, const double *part, unsigned nb, double *out)
{
    (void)f;
    double s = 0.0;
    for (unsigned i = threadIdx.x; i < nb; i += blockDim.x) s += part[i];
    double b = igrad__cuda_block_sum(s);
    if (threadIdx.x == 0) *out = b;
}

template <class F>
static void igrad__cuda_sum_launch(F f, int64_t n, double *part, double *out, cudaStream_t s)
{
    unsigned nb = igrad__cuda_sum_blocks(n);
    igrad__cuda_sum_part<F><<<nb, IGRAD__CUDA_THREADS, 0, s>>>(f, n, part);
    igrad__cuda_sum_final<F><<<1, IGRAD__CUDA_THREADS, 0, s>>>(f, part, nb, out);
}

/* dp_cuda.cu */
igrad_status_t igrad__cuda_fail(cudaError_t err, const char *what);
igrad_status_t igrad__cuda_state_create(IGRAD__DP_ARGS);
/* The engine's state (created on first use; NULL, the error recorded, when
 * that failed). Selects its device. */
igrad__cuda_state_t *igrad__cuda_state(IGRAD__DP_ARGS);

/* dp_cuda_check.cu */
void igrad__dp_cuda_check(IGRAD__DP_ARGS, float *const *grads);
int64_t igrad__dp_cuda_first_bad(IGRAD__DP_CARGS, float *const *grads, size_t t, float *g, float *u,
                                 float *r);
/* dp_cuda_select.cu */
void igrad__dp_cuda_select_into(IGRAD__DP_ARGS, float *const *grads, int zero);
/* dp_cuda_pack.cu */
void igrad__dp_cuda_pack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads);
void igrad__dp_cuda_pack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads);
igrad_status_t igrad__dp_cuda_unpack_sparse(IGRAD__DP_ARGS, size_t j, float *const *grads);
igrad_status_t igrad__dp_cuda_unpack_dense(IGRAD__DP_ARGS, size_t j, float *const *grads);
void igrad__dp_cuda_pack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads);
igrad_status_t igrad__dp_cuda_unpack_sar(IGRAD__DP_ARGS, size_t j, float *const *grads);

#endif /* IGRAD_DP_CUDA_CUH */
