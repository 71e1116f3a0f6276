/*
 * cuda_engine.c — the CUDA data plane on a real GPU against the CPU one:
 * the same layout, config and gradients through a CPU engine (self comm,
 * host memory) and a CUDA engine (self_cuda comm, and NCCL on one rank),
 * step after step; after every step the gradients and residuals must be
 * equal bit for bit. The configs reach every kernel: flat top-k in one
 * block and grid-wide (tensors above 65536 entries), row-wise ADTopk with
 * rows around the block sizes, k = 1 (tiny density), k = n (density 1: the
 * dense spec), interleave, 32- and 16-bit indices, the dense wire (reduce
 * collective, the dense method), the sparse all-reduce (collective
 * sparse_reduce, flat and inside hier), momentum correction with masking and
 * residual decay, the warm-up engine (start_iter), deferral with
 * accumulation and the residual-drop ablation (ig with online profiling,
 * whose re-plan builds a new engine on the same data plane), and BF16, F16
 * and FP8 E4M3 wire values over those paths (run_value_configs). Gradients
 * mix ties (five values), normals and exact zeros; one step carries a NaN
 * and must fail on both with the same message, and corrupt received bytes
 * (begin/end, the caller's own copy: an index, a value of each dtype, an
 * FP8 scale and code) must be refused by both with the same message, the
 * packed bytes being the same on both. State files: a CUDA engine's file is the CPU engine's, byte
 * for byte, and each loads into the other kind (test_state_files). Plus
 * the API's refusals (a streamed step among them).
 * Without a CUDA device it prints "SKIP: ..." and exits 77 (CTest:
 * Skipped).
 */
#include "igrad.h"
#include "igrad_cuda.h"
#include "core/internal.h" /* igrad__read_file; tests link the static library */

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef IGRAD_HAVE_NCCL
#include <nccl.h>
#endif

static int failures = 0;

#define CHECK(cond, ...)                                                   \
    do {                                                                   \
        if (!(cond)) {                                                     \
            fprintf(stderr, "%s:%d: FAIL: ", __FILE__, __LINE__);          \
            fprintf(stderr, __VA_ARGS__);                                  \
            fprintf(stderr, "\n");                                         \
            failures++;                                                    \
        }                                                                  \
    } while (0)

#define OK(expr)                                                                \
    do {                                                                        \
        igrad_status_t st_ = (expr);                                            \
        if (st_ != IGRAD_OK) {                                                  \
            fprintf(stderr, "%s:%d: FAIL: %s: %s: %s\n", __FILE__, __LINE__, #expr, \
                    igrad_status_str(st_), igrad_last_error());                 \
            failures++;                                                         \
            return;                                                             \
        }                                                                       \
    } while (0)

#define CUDA(expr)                                                                   \
    do {                                                                             \
        cudaError_t e_ = (expr);                                                     \
        if (e_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d: FAIL: %s: %s\n", __FILE__, __LINE__, #expr,      \
                    cudaGetErrorString(e_));                                         \
            failures++;                                                              \
            return;                                                                  \
        }                                                                            \
    } while (0)

static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

typedef struct shape {
    const char *name;
    int ndim;
    int64_t dims[2];
} shape_t;

static const shape_t shapes[] = {
    {"model.embed_tokens.weight", 2, {300, 64}},
    {"model.layers.0.self_attn.q_proj.weight", 2, {257, 256}},
    {"model.layers.0.input_layernorm.weight", 1, {1, 0}},
    {"model.layers.0.mlp.up_proj.weight", 2, {64, 1025}},
    {"model.layers.0.mlp.down_proj.weight", 2, {1025, 64}},
    {"model.layers.0.post_attention_layernorm.weight", 1, {255, 0}},
    {"model.norm.weight", 1, {70000, 0}},
    {"lm_head.weight", 2, {600, 700}},
};
#define NT (sizeof shapes / sizeof *shapes)

static int64_t count_of(size_t t)
{
    return shapes[t].ndim == 1 ? shapes[t].dims[0] : shapes[t].dims[0] * shapes[t].dims[1];
}

/* Gradient entry i of tensor t at `step`: ties, normals-ish and zeros. */
static float grad_at(int64_t step, size_t t, int64_t i)
{
    uint64_t r = mix64((uint64_t)step * 1000003u + t * 7919u + (uint64_t)i * 2654435761u);
    switch ((t + (size_t)step) % 3) {
    case 0: return (float)((int)(r % 5) - 2) * 0.5f;
    case 1: return (r % 11 == 0) ? 0.0f : (float)((double)(int64_t)(r >> 11) * 0x1.0p-52 - 1.0);
    default: return (float)tan(3.14159 * ((double)(r >> 11) * 0x1.0p-53 - 0.5)) * 1e-3f;
    }
}

static igrad_layout_t *make_layout(void)
{
    igrad_layout_t *L = NULL;
    if (igrad_layout_create(&L) != IGRAD_OK) return NULL;
    for (size_t t = 0; t < NT; t++)
        if (igrad_layout_add(L, shapes[t].name, IGRAD_DTYPE_F32, shapes[t].ndim, shapes[t].dims) !=
            IGRAD_OK) {
            igrad_layout_free(L);
            return NULL;
        }
    return L;
}

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

/* Compares n host floats with n device floats bit for bit; @return 0 if equal. */
static int same_bits(const float *host, const float *dev, int64_t n, float *scratch,
                     const char *what, const char *cfg, int64_t step, size_t t)
{
    if (cudaMemcpy(scratch, dev, (size_t)n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        CHECK(0, "%s: copying %s back failed", cfg, what);
        return 1;
    }
    for (int64_t i = 0; i < n; i++)
        if (bits_of(host[i]) != bits_of(scratch[i])) {
            CHECK(0, "%s: step %lld: %s of %s differs at %lld: cpu %a, cuda %a", cfg,
                  (long long)step, what, shapes[t].name, (long long)i, (double)host[i],
                  (double)scratch[i]);
            return 1;
        }
    return 0;
}

/* Runs `steps` steps of cfg (with `profile` given at create, or NULL) on
 * a CPU engine and a CUDA engine over dcomm, comparing after each; step
 * nan_step carries a NaN. */
static void compare_with(const char *name, const igrad_config_t *cfg,
                         const igrad_profile_t *profile, igrad_comm_t *dcomm, cudaStream_t s,
                         int steps, int nan_step)
{
    int failures_before = failures;
    igrad_layout_t *L = make_layout();
    CHECK(L, "layout");
    if (!L) return;
    igrad_comm_t *hcomm = NULL;
    igrad_engine_t *ce = NULL, *ge = NULL;
    float *hg[NT] = {0}, *dg[NT] = {0}, *scratch = NULL;
    int64_t most = 0;
    for (size_t t = 0; t < NT; t++) most = count_of(t) > most ? count_of(t) : most;
    scratch = malloc((size_t)most * 4);
    OK(igrad_comm_create_self(&hcomm));
    OK(igrad_engine_create(L, profile, cfg, hcomm, &ce));
    OK(igrad_engine_create_cuda(L, profile, cfg, dcomm, 0, s, &ge));
    for (size_t t = 0; t < NT; t++) {
        hg[t] = malloc((size_t)count_of(t) * 4);
        CUDA(cudaMalloc((void **)&dg[t], (size_t)count_of(t) * 4));
    }
    for (int step = 0; step < steps; step++) {
        for (size_t t = 0; t < NT; t++) {
            for (int64_t i = 0; i < count_of(t); i++) hg[t][i] = grad_at(step, t, i);
            if (step == nan_step && t == 3) hg[t][77] = NAN;
            CUDA(cudaMemcpy(dg[t], hg[t], (size_t)count_of(t) * 4, cudaMemcpyHostToDevice));
        }
        igrad_status_t sc = igrad_engine_sync(ce, step, hg);
        char cmsg[1024];
        snprintf(cmsg, sizeof cmsg, "%s", igrad_last_error());
        igrad_status_t sg = igrad_engine_sync(ge, step, dg);
        CUDA(cudaStreamSynchronize(s));
        CHECK(sc == sg, "%s: step %d: cpu %s, cuda %s (%s)", name, step, igrad_status_str(sc),
              igrad_status_str(sg), igrad_last_error());
        if (step == nan_step) {
            CHECK(sc == IGRAD_E_NONFINITE, "%s: the NaN step returned %s", name,
                  igrad_status_str(sc));
            CHECK(strcmp(cmsg, igrad_last_error()) == 0, "%s: messages differ:\n cpu  %s\n cuda %s",
                  name, cmsg, igrad_last_error());
        } else if (sc != IGRAD_OK) {
            CHECK(0, "%s: step %d failed: %s", name, step, cmsg);
            break;
        }
        int bad = 0;
        for (size_t t = 0; t < NT && !bad; t++) {
            bad |= same_bits(hg[t], dg[t], count_of(t), scratch, "gradient", name, step, t);
            const float *cr = igrad_engine_residual(ce, t), *gr = igrad_engine_residual(ge, t);
            CHECK(!cr == !gr, "%s: residual of %s on one engine only", name, shapes[t].name);
            if (cr && gr)
                bad |= same_bits(cr, gr, count_of(t), scratch, "residual", name, step, t);
            const float *cu = igrad_engine_velocity(ce, t), *gu = igrad_engine_velocity(ge, t);
            if (cu && gu)
                bad |= same_bits(cu, gu, count_of(t), scratch, "velocity", name, step, t);
        }
        if (bad) break;
        igrad_step_stats_t a, b;
        if (sc == IGRAD_OK && igrad_engine_last_stats(ce, &a) == IGRAD_OK &&
            igrad_engine_last_stats(ge, &b) == IGRAD_OK)
            CHECK(a.entries_sent == b.entries_sent, "%s: step %d: sent %lld vs %lld", name, step,
                  (long long)a.entries_sent, (long long)b.entries_sent);
    }
    printf("%-32s %s\n", name, failures > failures_before ? "DIFFERS" : "same bits");
    for (size_t t = 0; t < NT; t++) {
        free(hg[t]);
        cudaFree(dg[t]);
    }
    free(scratch);
    igrad_engine_free(ce);
    igrad_engine_free(ge);
    igrad_comm_free(hcomm);
    igrad_layout_free(L);
}

/* 16-bit and FP8 wire values (config.value_dtype): the staged values
 * rounded (round to nearest even; FP8 per block at its power-of-two
 * scale), the rounding error kept in the residual, the codes and scales
 * packed and unpacked, over the kernels' shapes: row-wise and flat (one
 * block and grid-wide), many FP8 blocks per tensor, k = n (the dense
 * spec), momentum, the dense wire (reduce), the sparse all-reduce, fixed
 * 16/32-bit and compact indices, the two-level sync and ig's deferral.
 * grad_at's tan() entries reach beyond F16's range (its clamp to 65504). */
static void compare(const char *name, const igrad_config_t *cfg, igrad_comm_t *dcomm,
                    cudaStream_t s, int steps, int nan_step)
{
    compare_with(name, cfg, NULL, dcomm, s, steps, nan_step);
}

/* ig's profile from 3 steps of grad_at on a flat CPU engine profiling
 * online over its first 2 (a two-level engine needs its profile at
 * create); the engine, which owns it, and its comm into *owner and *comm
 * (to free, in that order, once the profile is no longer used). */
static const igrad_profile_t *online_profile(igrad_engine_t **owner, igrad_comm_t **comm)
{
    *owner = NULL;
    *comm = NULL;
    igrad_layout_t *L = make_layout();
    igrad_comm_t *hcomm = NULL;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.profile_steps = 2;
    c.release_period = 2;
    float *hg[NT] = {0};
    const igrad_profile_t *p = NULL;
    if (L && igrad_comm_create_self(&hcomm) == IGRAD_OK &&
        igrad_engine_create(L, NULL, &c, hcomm, owner) == IGRAD_OK) {
        int ok = 1;
        for (int64_t step = 0; step < 3 && ok; step++) {
            for (size_t t = 0; t < NT; t++) {
                if (!hg[t]) hg[t] = malloc((size_t)count_of(t) * 4);
                for (int64_t i = 0; i < count_of(t); i++) hg[t][i] = grad_at(step, t, i);
            }
            ok = igrad_engine_sync(*owner, step, hg) == IGRAD_OK;
        }
        p = ok ? igrad_engine_profile(*owner) : NULL;
    }
    CHECK(p, "online profile: %s", igrad_last_error());
    for (size_t t = 0; t < NT; t++) free(hg[t]);
    *comm = hcomm;
    igrad_layout_free(L);
    return p;
}

static void run_value_configs(igrad_comm_t *dcomm, cudaStream_t s, const char *tag)
{
    char name[64];
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_BF16;
    snprintf(name, sizeof name, "%s adtopk bf16", tag);
    compare(name, &c, dcomm, s, 5, 3);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F16;
    c.density = 0.05;
    c.index_code = IGRAD_INDEX_CODE_FIXED;
    snprintf(name, sizeof name, "%s topk f16 fixed", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    snprintf(name, sizeof name, "%s topk fp8", tag);
    compare(name, &c, dcomm, s, 5, 3);

    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.density = 0.05;
    c.block_entries = 700; /* many FP8 blocks (scales) per tensor */
    snprintf(name, sizeof name, "%s adtopk fp8 small blocks", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c.block_entries = 1000;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.index_code = IGRAD_INDEX_CODE_FIXED;
    c.index_dtype = IGRAD_DTYPE_U32;
    snprintf(name, sizeof name, "%s topk fp8 fixed u32", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    c.density = 1.0;
    snprintf(name, sizeof name, "%s adtopk fp8 k=n", tag);
    compare(name, &c, dcomm, s, 3, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    c.momentum = 0.9;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    snprintf(name, sizeof name, "%s adtopk fp8 momentum reduce", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_BF16;
    c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
    snprintf(name, sizeof name, "%s sar topk bf16", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.ranks_per_node = 1;
    snprintf(name, sizeof name, "%s hier adtopk fp8", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT; /* ig, online profile, deferral */
    c.value_dtype = IGRAD_DTYPE_F8_E4M3;
    c.profile_steps = 2;
    c.release_period = 2;
    snprintf(name, sizeof name, "%s ig online fp8", tag);
    compare(name, &c, dcomm, s, 7, -1);

    c.value_dtype = IGRAD_DTYPE_BF16;
    snprintf(name, sizeof name, "%s ig online bf16", tag);
    compare(name, &c, dcomm, s, 7, -1);
}

static void run_configs(igrad_comm_t *dcomm, cudaStream_t s, const char *tag, int all)
{
    char name[64];
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    snprintf(name, sizeof name, "%s topk 1%%", tag);
    compare(name, &c, dcomm, s, 5, 3);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.momentum = 0.9;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    snprintf(name, sizeof name, "%s topk remedies reduce", tag);
    compare(name, &c, dcomm, s, 4, -1);

    /* The two-level sync on one rank (a node of one): split, node reduce
     * into the device shard, shard engine, broadcast and the copy back. */
    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.ranks_per_node = 1;
    snprintf(name, sizeof name, "%s hier topk 1%%", tag);
    compare(name, &c, dcomm, s, 5, 3);

    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    c.momentum = 0.9;
    snprintf(name, sizeof name, "%s hier adtopk reduce momentum", tag);
    compare(name, &c, dcomm, s, 4, -1);

    /* The sparse all-reduce on one rank: the split, the owner's reduce
     * (kout = k, so every sum is kept), the gather and the unpack; flat
     * and row-wise selections over three buckets, then inside the
     * two-level sync with deferral (ig). */
    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
    snprintf(name, sizeof name, "%s sar topk 1%%", tag);
    compare(name, &c, dcomm, s, 5, 3);

    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.buckets = 3;
    c.density = 0.05;
    snprintf(name, sizeof name, "%s sar adtopk 3 buckets", tag);
    compare(name, &c, dcomm, s, 4, -1);

    /* a two-level engine needs its profile at create: one made online by
     * a flat CPU engine */
    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.collective = IGRAD_COLLECTIVE_SPARSE_REDUCE;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.ranks_per_node = 1;
    c.release_period = 2;
    igrad_engine_t *owner = NULL;
    igrad_comm_t *owner_comm = NULL;
    const igrad_profile_t *prof = online_profile(&owner, &owner_comm);
    snprintf(name, sizeof name, "%s hier sar ig profile", tag);
    if (prof) compare_with(name, &c, prof, dcomm, s, 6, -1);
    igrad_engine_free(owner);
    igrad_comm_free(owner_comm);

    run_value_configs(dcomm, s, tag);
    if (!all) return;

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.start_iter = 1;
    snprintf(name, sizeof name, "%s adtopk 1%% warm-up", tag);
    compare(name, &c, dcomm, s, 4, 2);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.interleave = 1;
    c.density = 0.05;
    c.index_dtype = IGRAD_DTYPE_U32;
    snprintf(name, sizeof name, "%s adtopk interleave u32", tag);
    compare(name, &c, dcomm, s, 4, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    c.density = 1e-7;
    snprintf(name, sizeof name, "%s topk k=1", tag);
    compare(name, &c, dcomm, s, 3, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.density = 1.0;
    snprintf(name, sizeof name, "%s adtopk k=n", tag);
    compare(name, &c, dcomm, s, 3, -1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_DENSE;
    snprintf(name, sizeof name, "%s dense", tag);
    compare(name, &c, dcomm, s, 3, 1);

    c = (igrad_config_t)IGRAD_CONFIG_INIT; /* ig, online profile, deferral */
    c.profile_steps = 2;
    c.release_period = 2;
    snprintf(name, sizeof name, "%s ig online", tag);
    compare(name, &c, dcomm, s, 7, -1);

    c.residual = IGRAD_RESIDUAL_DROP;
    snprintf(name, sizeof name, "%s ig online drop", tag);
    compare(name, &c, dcomm, s, 7, -1);
}

/* Corrupt received bytes: begin, the caller's own copy of each bucket
 * (one rank: recv = send), n bytes of the first gather bucket set to
 * `byte` (at offset off, or the last n bytes with off < 0), end. The CPU
 * and CUDA engines must refuse it alike, with the same message, which
 * must contain `expect`. A gather bucket's bytes start with its first
 * block's values (formats.md §8): an FP8 scale, or a value; its last
 * bytes are index bytes. */
static void test_bad_bytes(igrad_comm_t *dcomm, cudaStream_t s, const char *label,
                           igrad_dtype_t vt, long off, size_t n, unsigned char byte,
                           const char *expect)
{
    igrad_layout_t *L = make_layout();
    igrad_comm_t *hcomm = NULL;
    igrad_engine_t *ce = NULL, *ge = NULL;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    c.value_dtype = vt;
    float *hg[NT] = {0}, *dg[NT] = {0};
    OK(igrad_comm_create_self(&hcomm));
    OK(igrad_engine_create(L, NULL, &c, hcomm, &ce));
    OK(igrad_engine_create_cuda(L, NULL, &c, dcomm, 0, s, &ge));
    for (size_t t = 0; t < NT; t++) {
        hg[t] = malloc((size_t)count_of(t) * 4);
        for (int64_t i = 0; i < count_of(t); i++) hg[t][i] = grad_at(9, t, i);
        CUDA(cudaMalloc((void **)&dg[t], (size_t)count_of(t) * 4));
        CUDA(cudaMemcpy(dg[t], hg[t], (size_t)count_of(t) * 4, cudaMemcpyHostToDevice));
    }
    const igrad_bucket_t *cb = NULL, *gb = NULL;
    size_t cn = 0, gn = 0;
    OK(igrad_engine_begin(ce, 0, hg, &cb, &cn));
    OK(igrad_engine_begin(ge, 0, dg, &gb, &gn));
    CUDA(cudaStreamSynchronize(s));
    CHECK(cn == gn && cn > 0, "%s: buckets: cpu %zu, cuda %zu", label, cn, gn);
    int corrupted = 0;
    for (size_t j = 0; j < cn && j < gn; j++) {
        CHECK(cb[j].send_nbytes == gb[j].send_nbytes, "%s: bucket %zu: %zu vs %zu bytes", label,
              j, cb[j].send_nbytes, gb[j].send_nbytes);
        if (cb[j].kind != IGRAD_BUCKET_GATHER) continue;
        memcpy(cb[j].recv, cb[j].send, cb[j].send_nbytes);
        CUDA(cudaMemcpy(gb[j].recv, gb[j].send, gb[j].send_nbytes, cudaMemcpyDeviceToDevice));
        /* the CPU's and CUDA's sent bytes are the same (bit-identical packs) */
        unsigned char *gsend = malloc(gb[j].send_nbytes);
        CUDA(cudaMemcpy(gsend, gb[j].send, gb[j].send_nbytes, cudaMemcpyDeviceToHost));
        CHECK(memcmp(gsend, cb[j].send, cb[j].send_nbytes) == 0,
              "%s: bucket %zu: the CPU and CUDA engines packed different bytes", label, j);
        free(gsend);
        if (!corrupted && cb[j].send_nbytes >= n + (off > 0 ? (size_t)off : 0)) {
            size_t at = off < 0 ? cb[j].send_nbytes - n : (size_t)off;
            memset((unsigned char *)cb[j].recv + at, byte, n);
            CUDA(cudaMemset((unsigned char *)gb[j].recv + at, byte, n));
            corrupted = 1;
        }
    }
    CHECK(corrupted, "%s: no gather bucket to corrupt", label);
    igrad_status_t sc = igrad_engine_end(ce, 0, hg);
    char cmsg[1024];
    snprintf(cmsg, sizeof cmsg, "%s", igrad_last_error());
    igrad_status_t sg = igrad_engine_end(ge, 0, dg);
    CHECK(sc == IGRAD_E_COMM, "%s: cpu end: %s (%s)", label, igrad_status_str(sc), cmsg);
    CHECK(strstr(cmsg, expect), "%s: the CPU's message lacks \"%s\": %s", label, expect, cmsg);
    CHECK(sg == sc, "%s: cuda end: %s, cpu %s", label, igrad_status_str(sg),
          igrad_status_str(sc));
    int same = strcmp(cmsg, igrad_last_error()) == 0;
    CHECK(same, "%s: messages differ:\n cpu  %s\n cuda %s", label, cmsg, igrad_last_error());
    printf("%-32s %s\n", label, sg == sc && same ? "same refusal" : "DIFFERS");
    for (size_t t = 0; t < NT; t++) {
        free(hg[t]);
        cudaFree(dg[t]);
    }
    igrad_engine_free(ce);
    igrad_engine_free(ge);
    igrad_comm_free(hcomm);
    igrad_layout_free(L);
}

static void test_bad_bytes_all(igrad_comm_t *dcomm, cudaStream_t s)
{
    /* the last 4 bytes: an index area's last entry (compact: a run's end) */
    test_bad_bytes(dcomm, s, "bad index", IGRAD_DTYPE_F32, -1, 4, 0xff, "index");
    /* the first value of the first block */
    test_bad_bytes(dcomm, s, "bad f32 value (NaN)", IGRAD_DTYPE_F32, 0, 4, 0xff,
                   "non-finite value");
    test_bad_bytes(dcomm, s, "bad bf16 value (NaN)", IGRAD_DTYPE_BF16, 0, 2, 0xff,
                   "non-finite value");
    test_bad_bytes(dcomm, s, "bad f16 value (NaN)", IGRAD_DTYPE_F16, 0, 2, 0x7c,
                   "non-finite value");
    /* FP8: the first block's scale, then its third code */
    test_bad_bytes(dcomm, s, "bad fp8 scale", IGRAD_DTYPE_F8_E4M3, 0, 4, 0xff,
                   "FP8 block scale");
    test_bad_bytes(dcomm, s, "bad fp8 scale (not 2^k)", IGRAD_DTYPE_F8_E4M3, 1, 1, 0x01,
                   "FP8 block scale");
    test_bad_bytes(dcomm, s, "bad fp8 code (NaN)", IGRAD_DTYPE_F8_E4M3, 6, 1, 0x7f,
                   "non-finite value");
    test_bad_bytes(dcomm, s, "bad fp8 index", IGRAD_DTYPE_F8_E4M3, -1, 4, 0xff, "index");
}

/* Step `step` of grad_at on a CPU engine (hg) and a CUDA engine (dg;
 * untouched when ge is NULL); @return 0 when both succeed. */
static int step_both(igrad_engine_t *ce, igrad_engine_t *ge, int64_t step, float **hg,
                     float **dg, cudaStream_t s)
{
    for (size_t t = 0; t < NT; t++) {
        for (int64_t i = 0; i < count_of(t); i++) hg[t][i] = grad_at(step, t, i);
        if (ge && cudaMemcpy(dg[t], hg[t], (size_t)count_of(t) * 4, cudaMemcpyHostToDevice) !=
                      cudaSuccess)
            return 1;
    }
    igrad_status_t sc = ce ? igrad_engine_sync(ce, step, hg) : IGRAD_OK;
    CHECK(sc == IGRAD_OK, "state: cpu step %lld: %s", (long long)step, igrad_last_error());
    igrad_status_t sg = ge ? igrad_engine_sync(ge, step, dg) : IGRAD_OK;
    CHECK(sg == IGRAD_OK, "state: cuda step %lld: %s", (long long)step, igrad_last_error());
    cudaStreamSynchronize(s);
    return sc != IGRAD_OK || sg != IGRAD_OK;
}

/* State files of a device engine: a CPU and a CUDA engine run the same
 * steps and save; the two files must be the same bytes (the residuals and
 * velocities bit for bit, through the CUDA copy_out's chunks). The CUDA
 * engine's file is loaded into a fresh CPU engine and the CPU engine's
 * into a fresh CUDA engine; two more steps on each must give the
 * uninterrupted CPU engine's gradients and residuals bit for bit. */
static void test_state_files(igrad_comm_t *dcomm, cudaStream_t s)
{
    const char *cpath = "/tmp/igrad_cuda_state_cpu.bin", *gpath = "/tmp/igrad_cuda_state_gpu.bin";
    igrad_layout_t *L = make_layout();
    igrad_comm_t *hcomm = NULL;
    igrad_engine_t *ce = NULL, *ge = NULL, *ce2 = NULL, *ge2 = NULL;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_ADTOPK_SYNC;
    c.momentum = 0.5;
    c.pack = IGRAD_PACK_RISK;
    float *hg[NT] = {0}, *hg2[NT] = {0}, *dg[NT] = {0}, *scratch = NULL;
    int64_t most = 0;
    for (size_t t = 0; t < NT; t++) most = count_of(t) > most ? count_of(t) : most;
    scratch = malloc((size_t)most * 4);
    for (size_t t = 0; t < NT; t++) {
        hg[t] = malloc((size_t)count_of(t) * 4);
        hg2[t] = malloc((size_t)count_of(t) * 4);
        CUDA(cudaMalloc((void **)&dg[t], (size_t)count_of(t) * 4));
    }
    OK(igrad_comm_create_self(&hcomm));
    OK(igrad_engine_create(L, NULL, &c, hcomm, &ce));
    OK(igrad_engine_create_cuda(L, NULL, &c, dcomm, 0, s, &ge));
    for (int64_t step = 0; step < 3; step++)
        if (step_both(ce, ge, step, hg, dg, s)) return;
    OK(igrad_engine_save_state(ce, cpath));
    OK(igrad_engine_save_state(ge, gpath));
    size_t cn = 0, gn = 0;
    char *cb = NULL, *gb = NULL;
    OK(igrad__read_file(cpath, (size_t)1 << 30, &cb, &cn));
    OK(igrad__read_file(gpath, (size_t)1 << 30, &gb, &gn));
    CHECK(cn == gn && memcmp(cb, gb, cn) == 0,
          "state files of the CPU and CUDA engines differ (%zu and %zu bytes)", cn, gn);
    free(cb);
    free(gb);
    OK(igrad_engine_create(L, NULL, &c, hcomm, &ce2));
    OK(igrad_engine_load_state(ce2, gpath));
    OK(igrad_engine_create_cuda(L, NULL, &c, dcomm, 0, s, &ge2));
    OK(igrad_engine_load_state(ge2, cpath));
    for (int64_t step = 3; step < 5; step++) {
        if (step_both(ce, ge2, step, hg, dg, s)) break;
        if (step_both(ce2, NULL, step, hg2, dg, s)) break;
        for (size_t t = 0; t < NT; t++) {
            const char *why = "a CUDA state file loaded into a CPU engine";
            for (int64_t i = 0; i < count_of(t); i++)
                if (bits_of(hg[t][i]) != bits_of(hg2[t][i])) {
                    CHECK(0, "%s: step %lld: gradient of %s differs at %lld", why,
                          (long long)step, shapes[t].name, (long long)i);
                    break;
                }
            const float *r = igrad_engine_residual(ce, t), *r2 = igrad_engine_residual(ce2, t);
            CHECK(r && r2 && memcmp(r, r2, (size_t)count_of(t) * 4) == 0,
                  "%s: step %lld: residual of %s differs", why, (long long)step, shapes[t].name);
            why = "a CPU state file loaded into a CUDA engine";
            same_bits(hg[t], dg[t], count_of(t), scratch, "gradient", why, step, t);
            same_bits(r, igrad_engine_residual(ge2, t), count_of(t), scratch, "residual", why,
                      step, t);
            same_bits(igrad_engine_velocity(ce, t), igrad_engine_velocity(ge2, t), count_of(t),
                      scratch, "velocity", why, step, t);
        }
    }
    printf("%-32s %s\n", "state files cpu <-> cuda", "checked");
    for (size_t t = 0; t < NT; t++) {
        free(hg[t]);
        free(hg2[t]);
        cudaFree(dg[t]);
    }
    free(scratch);
    igrad_engine_free(ce);
    igrad_engine_free(ge);
    igrad_engine_free(ce2);
    igrad_engine_free(ge2);
    igrad_comm_free(hcomm);
    igrad_layout_free(L);
    remove(cpath);
    remove(gpath);
}

static void test_refusals(cudaStream_t s)
{
    igrad_layout_t *L = make_layout();
    igrad_comm_t *host = NULL;
    igrad_engine_t *e = NULL;
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.method = IGRAD_METHOD_TOPK_SYNC;
    OK(igrad_comm_create_self(&host));
    CHECK(igrad_engine_create_cuda(L, NULL, &c, host, 0, s, &e) == IGRAD_E_UNSUPPORTED,
          "a host-only comm was taken: %s", igrad_last_error());
    CHECK(igrad_engine_create_cuda(L, NULL, &c, host, -1, s, &e) == IGRAD_E_INVALID,
          "device -1 was taken");
    OK(igrad_engine_create(L, NULL, &c, host, &e));
    CHECK(igrad_engine_set_stream_cuda(e, s) == IGRAD_E_INVALID, "a CPU engine took a stream");
    igrad_engine_free(e);
    igrad_comm_t *dev = NULL;
    OK(igrad_comm_create_self_cuda(s, &dev));
    OK(igrad_engine_create_cuda(L, NULL, &c, dev, 0, s, &e));
    CHECK(igrad_engine_open(e, 0) == IGRAD_E_UNSUPPORTED &&
              strstr(igrad_last_error(), "no streamed step"),
          "a streamed step on a device engine: %s", igrad_last_error());
    OK(igrad_engine_set_stream_cuda(e, NULL));
    igrad_engine_free(e);
    /* a two-level engine forwards the stream to its shard engine (the
     * engine table's set_stream): refused on the CPU one, taken on the
     * device one */
    igrad_config_t hc = c;
    hc.topology = IGRAD_TOPOLOGY_HIER;
    OK(igrad_engine_create(L, NULL, &hc, host, &e));
    CHECK(igrad_engine_set_stream_cuda(e, s) == IGRAD_E_INVALID &&
              strstr(igrad_last_error(), "'cpu', not cuda"),
          "a CPU two-level engine took a stream: %s", igrad_last_error());
    igrad_engine_free(e);
    OK(igrad_engine_create_cuda(L, NULL, &hc, dev, 0, s, &e));
    OK(igrad_engine_set_stream_cuda(e, NULL));
    OK(igrad_engine_set_stream_cuda(e, s));
    igrad_engine_free(e);
    igrad_comm_free(dev);
    igrad_comm_free(host);
    igrad_layout_free(L);
}

int main(void)
{
    int n = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess || n == 0) {
        printf("SKIP: no CUDA device (cudaGetDeviceCount: %s)\n",
               err != cudaSuccess ? cudaGetErrorString(err) : "0 devices");
        return 77;
    }
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) {
        printf("FAIL: cudaStreamCreate\n");
        return 1;
    }
    test_refusals(s);
    igrad_comm_t *self = NULL;
    if (igrad_comm_create_self_cuda(s, &self) != IGRAD_OK) {
        printf("FAIL: %s\n", igrad_last_error());
        return 1;
    }
    run_configs(self, s, "self_cuda", 1);
    test_bad_bytes_all(self, s);
    test_state_files(self, s);
    igrad_comm_free(self);
#ifdef IGRAD_HAVE_NCCL
    ncclComm_t nc;
    int devs[1] = {0};
    ncclResult_t r = ncclCommInitAll(&nc, 1, devs);
    CHECK(r == ncclSuccess, "ncclCommInitAll: %s", ncclGetErrorString(r));
    if (r == ncclSuccess) {
        igrad_comm_t *nccl = NULL;
        if (igrad_comm_create_nccl(nc, s, &nccl) == IGRAD_OK) {
            run_configs(nccl, s, "nccl", 0);
            igrad_comm_free(nccl);
        } else {
            CHECK(0, "igrad_comm_create_nccl: %s", igrad_last_error());
        }
        ncclCommDestroy(nc);
    }
#else
    printf("nccl: not built, its engine test not run\n");
#endif
    cudaStreamDestroy(s);
    if (failures) {
        printf("FAIL: %d check(s) failed\n", failures);
        return 1;
    }
    printf("PASS\n");
    return 0;
}
