/*
 * cuda_bench.c — timings of the CUDA data plane on one GPU (built as
 * build/bench_cuda in CUDA builds; run by scripts/gpu-check):
 *  - EF + exact top-k (topk_sync) and ADTopk (adtopk_sync) at density 1 %
 *    on single tensors shaped like OPT-125M's and LLaMA-7B's matrices: the
 *    engine's select_ms (finiteness check + error feedback + selection +
 *    residual write, per-tensor results back on the host), median of
 *    reps, and the bandwidth of one pass over g and e (8 bytes per entry)
 *    against the H200's ~4.8 TB/s;
 *  - a whole engine step (sync) on an OPT-125M-shaped layout, self_cuda
 *    communicator: total_ms, also with the sparse all-reduce's route
 *    (collective sparse_reduce: at one rank its split, reduction and
 *    gather run whole, nothing is re-sparsified);
 *  - the sparse all-reduce's reduction at an owner (the CUDA row's reduce
 *    of sparse_allreduce.h against the host row's, side by side on the
 *    same received entries): 8 senders' 2^19 entries each over a range of
 *    2^24 indices, kout = 2^19, median ms and the ratio.
 * Gradients are standard-normal-like floats (a fixed hash), copied from a
 * device master before each rep. Prints a table; asserts nothing.
 * Usage: bench_cuda [reps]   (exit 77 without a CUDA device)
 */
#include "igrad.h"
#include "igrad_cuda.h"
#include "comm/sparse_allreduce.h"
#include "../tools/bench_stats.h"

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HBM_GBPS 4800.0

typedef struct shape {
    const char *model, *what, *name;
    int64_t rows, cols;
} shape_t;

static const shape_t shapes[] = {
    {"OPT-125M", "q_proj 768x768", "model.layers.0.self_attn.q_proj.weight", 768, 768},
    {"OPT-125M", "fc1 3072x768", "model.layers.0.mlp.up_proj.weight", 3072, 768},
    {"OPT-125M", "fc2 768x3072", "model.layers.0.mlp.down_proj.weight", 768, 3072},
    {"OPT-125M", "embed 50272x768", "model.embed_tokens.weight", 50272, 768},
    {"LLaMA-7B", "q_proj 4096x4096", "model.layers.0.self_attn.q_proj.weight", 4096, 4096},
    {"LLaMA-7B", "up 11008x4096", "model.layers.0.mlp.up_proj.weight", 11008, 4096},
    {"LLaMA-7B", "down 4096x11008", "model.layers.0.mlp.down_proj.weight", 4096, 11008},
    {"LLaMA-7B", "embed 32000x4096", "model.embed_tokens.weight", 32000, 4096},
};

static void fill_normalish(float *x, int64_t n, uint64_t seed)
{
    uint64_t s = seed * 0x9e3779b97f4a7c15ULL + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        /* sum of 4 uniforms, centred and scaled: close enough to normal */
        uint64_t u = s;
        double a = (double)(u & 0xffff) + (double)(u >> 16 & 0xffff) +
                   (double)(u >> 32 & 0xffff) + (double)(u >> 48);
        x[i] = (float)((a / 65536.0 - 2.0) * 1.7320508);
    }
}

static int fail(const char *what)
{
    fprintf(stderr, "bench_cuda: %s: %s\n", what, igrad_last_error());
    return 1;
}

/* One engine over `layout` (tensors' device grads in g, masters in m):
 * median select_ms and total_ms over reps (after one warm-up step). */
static int time_engine(const igrad_layout_t *L, const igrad_config_t *c, igrad_comm_t *comm,
                       cudaStream_t s, float **g, float **m, const int64_t *n, size_t T,
                       int reps, double *select_ms, double *total_ms)
{
    igrad_engine_t *e = NULL;
    if (igrad_engine_create_cuda(L, NULL, c, comm, 0, s, &e) != IGRAD_OK)
        return fail("igrad_engine_create_cuda");
    double sel[64], tot[64];
    for (int r = 0; r <= reps; r++) {
        for (size_t t = 0; t < T; t++)
            cudaMemcpyAsync(g[t], m[t], (size_t)n[t] * 4, cudaMemcpyDeviceToDevice, s);
        cudaStreamSynchronize(s);
        if (igrad_engine_sync(e, r, g) != IGRAD_OK) {
            igrad_engine_free(e);
            return fail("igrad_engine_sync");
        }
        cudaStreamSynchronize(s);
        igrad_step_stats_t st;
        igrad_engine_last_stats(e, &st);
        if (r > 0) {
            sel[r - 1] = st.select_ms;
            tot[r - 1] = st.total_ms;
        }
    }
    *select_ms = bench_median(sel, reps);
    *total_ms = bench_median(tot, reps);
    igrad_engine_free(e);
    return 0;
}

/* One owner's reduction, the CUDA row against the host row on the same
 * received entries: median ms of each and their ratio. */
static int time_sar_reduce(int reps)
{
    const size_t senders = 8, per = (size_t)1 << 19, n = senders * per, kout = per;
    const uint64_t lo = 0, hi = (uint64_t)1 << 24;
    igrad__sar_entry_t *recv = malloc(n * sizeof *recv);
    float *vals = malloc(n * sizeof *vals);
    fill_normalish(vals, (int64_t)n, 7);
    uint64_t x = 12345;
    for (size_t p = 0; p < n; p++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        recv[p].index = (uint32_t)(x % hi);
        recv[p].value = vals[p];
    }
    const igrad__sar_ops_t *rows[2] = {&igrad__sar_cuda, &igrad__sar_host};
    double med[2];
    for (int b = 0; b < 2; b++) {
        const igrad__sar_ops_t *ops = rows[b];
        igrad__sar_t w = {0};
        w.ops = ops;
        void *d_recv = ops->alloc(n * sizeof *recv), *d_kept = ops->alloc(kout * sizeof *recv);
        void *d_rem = ops->alloc(n * sizeof *recv);
        if (!d_recv || !d_kept || !d_rem || ops->copy_in(NULL, d_recv, recv, n * sizeof *recv) ||
            ops->reserve(&w, n))
            return fail("sparse all-reduce bench: memory");
        double t[64];
        for (int r = 0; r <= reps; r++) {
            size_t nk, nr, bad;
            uint32_t hist[IGRAD__SAR_HIST];
            double t0 = igrad__now_ms();
            if (ops->reduce(&w, NULL, d_recv, n, lo, hi, kout, d_kept, &nk, d_rem, &nr, &bad,
                            hist))
                return fail("sparse all-reduce bench: reduce");
            if (b == 0) cudaDeviceSynchronize();
            if (r > 0) t[r - 1] = igrad__now_ms() - t0;
        }
        med[b] = bench_median(t, reps);
        ops->free(d_recv), ops->free(d_kept), ops->free(d_rem);
        igrad__sar_clear(&w);
    }
    printf("\nsparse all-reduce, one owner's reduction (%zu entries from %zu senders over "
           "[0, 2^24), kout %zu):\n%-12s %10s\n%-12s %10.3f\n%-12s %10.3f\n"
           "host / cuda  %10.1fx\n", n, senders, kout, "row", "reduce_ms", "cuda", med[0],
           "host", med[1], med[1] / med[0]);
    free(recv);
    free(vals);
    return 0;
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    int ndev = 0;
    cudaError_t err = cudaGetDeviceCount(&ndev);
    if (err != cudaSuccess || ndev == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    struct cudaDeviceProp prop;
    cudaGetDeviceProperties(&prop, 0);
    printf("device: %s, %.0f GiB; HBM reference %.0f GB/s; density 1%%, median of %d\n",
           prop.name, (double)prop.totalGlobalMem / (1 << 30), HBM_GBPS, reps);
    cudaStream_t s;
    cudaStreamCreate(&s);
    igrad_comm_t *comm = NULL;
    if (igrad_comm_create_self_cuda(s, &comm) != IGRAD_OK) return fail("self_cuda comm");

    printf("\n%-9s %-18s %-7s %10s %10s %8s\n", "model", "tensor", "method", "select_ms",
           "GB/s", "of HBM");
    for (size_t q = 0; q < sizeof shapes / sizeof *shapes; q++) {
        const shape_t *sh = &shapes[q];
        int64_t n = sh->rows * sh->cols, dims[2] = {sh->rows, sh->cols};
        float *host = malloc((size_t)n * 4), *g = NULL, *m = NULL;
        if (!host) return fail("out of host memory");
        fill_normalish(host, n, q + 1);
        if (cudaMalloc((void **)&g, (size_t)n * 4) != cudaSuccess ||
            cudaMalloc((void **)&m, (size_t)n * 4) != cudaSuccess)
            return fail("cudaMalloc");
        cudaMemcpy(m, host, (size_t)n * 4, cudaMemcpyHostToDevice);
        free(host);
        igrad_layout_t *L = NULL;
        igrad_layout_create(&L);
        igrad_layout_add(L, sh->name, IGRAD_DTYPE_F32, 2, dims);
        for (int method = 0; method < 2; method++) {
            igrad_config_t c = IGRAD_CONFIG_INIT;
            c.method = method == 0 ? IGRAD_METHOD_TOPK_SYNC : IGRAD_METHOD_ADTOPK_SYNC;
            c.buckets = 1;
            double sel_ms, tot_ms;
            if (time_engine(L, &c, comm, s, &g, &m, &n, 1, reps, &sel_ms, &tot_ms)) return 1;
            double gbps = 8.0 * (double)n / (sel_ms * 1e6);
            printf("%-9s %-18s %-7s %10.3f %10.1f %7.1f%%\n", sh->model, sh->what,
                   method == 0 ? "topk" : "adtopk", sel_ms, gbps, 100.0 * gbps / HBM_GBPS);
        }
        igrad_layout_free(L);
        cudaFree(g);
        cudaFree(m);
    }

    /* a whole step on an OPT-125M-shaped layout */
    igrad_layout_t *L = NULL;
    igrad_layout_create(&L);
    int64_t emb[2] = {50272, 768}, sq[2] = {768, 768}, up[2] = {3072, 768}, dn[2] = {768, 3072},
            vec[1] = {768};
    igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb);
    char name[128];
    static const char *proj[4] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int l = 0; l < 12; l++) {
        for (int p = 0; p < 4; p++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, proj[p]);
            igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, dn);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, vec);
    }
    size_t T = igrad_layout_count(L);
    float **g = calloc(T, sizeof *g), **m = calloc(T, sizeof *m);
    int64_t *n = calloc(T, sizeof *n), total = 0;
    for (size_t t = 0; t < T; t++) {
        igrad_tensor_info_t ti;
        igrad_layout_tensor(L, t, &ti);
        n[t] = ti.count;
        total += n[t];
        float *host = malloc((size_t)n[t] * 4);
        fill_normalish(host, n[t], 100 + t);
        cudaMalloc((void **)&g[t], (size_t)n[t] * 4);
        cudaMalloc((void **)&m[t], (size_t)n[t] * 4);
        cudaMemcpy(m[t], host, (size_t)n[t] * 4, cudaMemcpyHostToDevice);
        free(host);
    }
    printf("\nengine step, OPT-125M-shaped layout (%zu tensors, %.1f M entries), one GPU, "
           "self_cuda comm:\n%-16s %10s %10s\n", T, (double)total / 1e6, "method",
           "select_ms", "total_ms");
    static const igrad_method_t methods[3] = {IGRAD_METHOD_DENSE, IGRAD_METHOD_TOPK_SYNC,
                                              IGRAD_METHOD_ADTOPK_SYNC};
    for (int k = 0; k < 4; k++) {
        igrad_config_t c = IGRAD_CONFIG_INIT;
        c.method = methods[k < 3 ? k : 1];
        if (k == 3) c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
        double sel_ms, tot_ms;
        if (time_engine(L, &c, comm, s, g, m, n, T, reps, &sel_ms, &tot_ms)) return 1;
        printf("%-12s%s %10.3f %10.3f\n", igrad_method_name(c.method), k == 3 ? " sar" : "    ",
               sel_ms, tot_ms);
    }
    if (time_sar_reduce(reps)) return 1;
    for (size_t t = 0; t < T; t++) {
        cudaFree(g[t]);
        cudaFree(m[t]);
    }
    free(g), free(m), free(n);
    igrad_layout_free(L);
    igrad_comm_free(comm);
    cudaStreamDestroy(s);
    return 0;
}
