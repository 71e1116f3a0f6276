/*
 * mpi_util.h — what the MPI tests (tests/mpi_*.c) share: the rank and size
 * in MPI_COMM_WORLD, a failure count the test sums over ranks at the end,
 * checks that print the rank and the library's message, and REQUIRE for
 * setup failures, which aborts every rank rather than hang, and the
 * splitmix64 mixer the tests draw their data from, and the small LLaMA-like
 * layout and fixed-rule profile of mpi_engine and mpi_plan, and a model of
 * that layout with exact test gradients (mpi_sar_route). Include after
 * <mpi.h>, <stdio.h>, <stdlib.h> and "igrad.h"; set `me` and `np` after
 * MPI_Init.
 */
#ifndef IGRAD_MPI_UTIL_H
#define IGRAD_MPI_UTIL_H

static int failures;
static int me, np;

#define CHECK(cond, ...)                                                               \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            failures++;                                                                \
            fprintf(stderr, "[rank %d] %s:%d: %s: ", me, __FILE__, __LINE__, #cond);   \
            fprintf(stderr, __VA_ARGS__);                                              \
            fputc('\n', stderr);                                                       \
        }                                                                              \
    } while (0)

#define CHECK_STATUS(call, want)                                                       \
    do {                                                                               \
        igrad_status_t s_ = (call);                                                    \
        CHECK(s_ == (want), "%s returned %d (%s), expected %d; last error: %s", #call, \
              (int)s_, igrad_status_str(s_), (int)(want), igrad_last_error());         \
    } while (0)

#define CHECK_OK(call) CHECK_STATUS(call, IGRAD_OK)

/* Unrecoverable setup failure: abort every rank rather than hang. */
#define REQUIRE(cond)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "[rank %d] %s:%d: required: %s (%s)\n", me, __FILE__, __LINE__, \
                    #cond, igrad_last_error());                                         \
            MPI_Abort(MPI_COMM_WORLD, 2);                                               \
        }                                                                               \
    } while (0)

/* splitmix64: deterministic test data from (rank, step, tensor, index). */
static inline uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* A small LLaMA-like layout: an embedding of `vocab` rows, 3 layers of
 * 24x24 attention projections, a 48x24 up and 24x48 down projection and
 * a norm each, the final norm (mpi_engine: vocab 200; mpi_plan: 3000,
 * so one tensor needs 32-bit indices). */
static inline igrad_layout_t *mpi_llama_layout(int64_t vocab)
{
    igrad_layout_t *L = NULL;
    REQUIRE(igrad_layout_create(&L) == IGRAD_OK);
    int64_t emb[2] = {vocab, 24}, sq[2] = {24, 24}, up[2] = {48, 24}, down[2] = {24, 48};
    int64_t vec[1] = {24};
    char name[128];
    REQUIRE(igrad_layout_add(L, "model.embed_tokens.weight", IGRAD_DTYPE_F32, 2, emb) == IGRAD_OK);
    static const char *const attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int l = 0; l < 3; l++) {
        for (int a = 0; a < 4; a++) {
            snprintf(name, sizeof name, "model.layers.%d.self_attn.%s.weight", l, attn[a]);
            REQUIRE(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, sq) == IGRAD_OK);
        }
        snprintf(name, sizeof name, "model.layers.%d.mlp.up_proj.weight", l);
        REQUIRE(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, up) == IGRAD_OK);
        snprintf(name, sizeof name, "model.layers.%d.mlp.down_proj.weight", l);
        REQUIRE(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 2, down) == IGRAD_OK);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        REQUIRE(igrad_layout_add(L, name, IGRAD_DTYPE_F32, 1, vec) == IGRAD_OK);
    }
    REQUIRE(igrad_layout_add(L, "model.norm.weight", IGRAD_DTYPE_F32, 1, vec) == IGRAD_OK);
    return L;
}

/* A profile of L from a 4-step trace whose activity follows a fixed rule
 * over the component index, partitioned by `method` ("fixed:0.4"). */
static inline igrad_profile_t *mpi_fixed_profile(const igrad_layout_t *L,
                                                 const char *method)
{
    igrad_trace_t *tr = NULL;
    REQUIRE(igrad_trace_create(L, &tr) == IGRAD_OK);
    for (int64_t s = 0; s < 4; s++)
        for (size_t t = 0; t < igrad_layout_count(L); t++) {
            igrad_tensor_info_t ti;
            REQUIRE(igrad_layout_tensor(L, t, &ti) == IGRAD_OK);
            if (ti.component < 0) continue;
            double act = (double)((ti.component * 7) % 5 + 1) + 0.1 * (double)s;
            REQUIRE(igrad_trace_record(tr, s, t, act * act, 1) == IGRAD_OK);
        }
    igrad_profile_options_t opts = IGRAD_PROFILE_OPTIONS_INIT;
    opts.method = method;
    igrad_profile_t *p = NULL;
    REQUIRE(igrad_profile_build(tr, &opts, &p) == IGRAD_OK);
    igrad_trace_free(tr);
    return p;
}

/* A multiple of 2^-10 in [-4, 4] from (rank, step, tensor, index): the
 * sums of a few ranks' values and residuals are exact in any order, so a
 * reference may sum them in another order than the engine's collectives. */
static inline float mpi_value_2p10(int r, int64_t step, size_t t, int64_t i)
{
    uint64_t h = mix64(((uint64_t)r << 48) ^ ((uint64_t)step << 32) ^ ((uint64_t)t << 24) ^
                       (uint64_t)i);
    return (float)((int64_t)(h % 8193) - 4096) / 1024.0f;
}

/* mpi_llama_layout(200) with its fixed profile ("fixed:0.4"), its tensors'
 * sizes and infos; gradients as one buffer per tensor. */
typedef struct mpi_model {
    igrad_layout_t *L;
    igrad_profile_t *prof;
    size_t T;
    int64_t *n;
    igrad_tensor_info_t *info;
} mpi_model_t;

/* mpi_llama_layout(vocab): 200 is the model of most tests; a large vocab
 * makes the embedding dominate (900: 61 % of the entries). */
static inline void mpi_model_init_vocab(mpi_model_t *m, int64_t vocab)
{
    m->L = mpi_llama_layout(vocab);
    m->prof = mpi_fixed_profile(m->L, "fixed:0.4");
    m->T = igrad_layout_count(m->L);
    m->n = calloc(m->T, sizeof *m->n);
    m->info = calloc(m->T, sizeof *m->info);
    REQUIRE(m->n && m->info);
    for (size_t t = 0; t < m->T; t++) {
        REQUIRE(igrad_layout_tensor(m->L, t, &m->info[t]) == IGRAD_OK);
        m->n[t] = m->info[t].count;
    }
}

static inline void mpi_model_init(mpi_model_t *m) { mpi_model_init_vocab(m, 200); }

static inline void mpi_model_free(mpi_model_t *m)
{
    igrad_profile_free(m->prof);
    igrad_layout_free(m->L);
    free(m->n);
    free(m->info);
}

static inline float **mpi_grads_alloc(const mpi_model_t *m)
{
    float **g = calloc(m->T, sizeof *g);
    REQUIRE(g);
    for (size_t t = 0; t < m->T; t++) REQUIRE((g[t] = calloc((size_t)m->n[t], sizeof(float))));
    return g;
}

static inline void mpi_grads_free(const mpi_model_t *m, float **g)
{
    for (size_t t = 0; t < m->T && g; t++) free(g[t]);
    free(g);
}

/* Rank r's gradients of `step` (mpi_value_2p10). */
static inline void mpi_grads_fill(const mpi_model_t *m, float **g, int r, int64_t step)
{
    for (size_t t = 0; t < m->T; t++)
        for (int64_t i = 0; i < m->n[t]; i++) g[t][i] = mpi_value_2p10(r, step, t, i);
}

#endif /* IGRAD_MPI_UTIL_H */
