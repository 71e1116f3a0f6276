/*
 * mpi_contract.c — the bucket wire format over real MPI ranks (CTest runs
 * it with -np 2 and -np 4), checked by the decoder of contract_model.h,
 * which is written from docs/formats.md §8, not from src/.
 *
 * Every rank's gradient is a function of (rank, step, tensor, index), so
 * every rank models what each rank selects (a sort of |g + e| per rank,
 * with each rank's residual carried over steps). Per step and bucket, on
 * every rank: the kind follows the documented `auto` rule; a gather
 * bucket's send bytes decode to this rank's selection and recv holds every
 * rank's bytes at r * send_nbytes, each decoding to *that* rank's
 * selection (ranks select different entries, so a wrong slot shows); a
 * reduce bucket's floats before the collective are this rank's selection
 * scattered into its dense segments and after it the sum over ranks;
 * after end the result is the average over ranks and the residuals are
 * this rank's modelled ones, bit for bit.
 *
 * Checks count failures so that every rank reaches every collective; the
 * counts are summed and every rank exits nonzero on any failure.
 * Configs pin dense_below = 0: every tensor takes the sparsifier path, which
 * the references and goldens here model (the default, 64, sends tensors
 * under 64 entries whole: tests/test_engine_dense_below.c, test_target.c).
 */
#include <math.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"

#include "mpi_util.h"

/* contract_model.h's hooks: the MPI side's REQUIRE and a rank-tagged report */
#define CT_REQUIRE(cond) REQUIRE(cond)
#define CT_REPORT(...)                     \
    do {                                   \
        fprintf(stderr, "[rank %d] ", me); \
        fprintf(stderr, __VA_ARGS__);      \
    } while (0)
#include "contract_model.h"

/* u16 rows and flat tensors, a u32 flat tensor (70000) and u32 rows (70000
 * columns). */
static const tdef_t LAYOUT[] = {
    {"model.embed_tokens.weight", 2, {100, 32}},
    {"model.layers.0.self_attn.q_proj.weight", 2, {32, 32}},
    {"model.layers.0.mlp.up_proj.bias", 1, {70000, 1}},
    {"model.layers.0.mlp.down_proj.weight", 2, {2, 70000}},
    {"model.layers.0.input_layernorm.weight", 1, {32, 1}},
    {"model.norm.weight", 1, {4000, 1}},
    {"lm_head.weight", 2, {100, 32}},
};
#define NT (sizeof LAYOUT / sizeof LAYOUT[0])

typedef struct counts {
    int gather, reduce, mixed;
} counts_t;

static void check_step(model_t *M, igrad_engine_t *eng, igrad_comm_t *comm, int64_t step,
                       counts_t *cnt)
{
    char where[160];
    for (int r = 0; r < np; r++) {
        fill_grads(&M[r], r, step);
        model_select(&M[r], step);
    }
    model_t *mine = &M[me];
    float *grads[NT];
    for (size_t t = 0; t < NT; t++) {
        grads[t] = malloc((size_t)mine->t[t].n * sizeof(float));
        CT_REQUIRE(grads[t]);
        memcpy(grads[t], mine->t[t].g, (size_t)mine->t[t].n * sizeof(float));
    }
    const igrad_bucket_t *bk = NULL;
    size_t nbk = 0;
    CT_REQUIRE(igrad_engine_begin(eng, step, grads, &bk, &nbk) == IGRAD_OK);
    igrad_bucket_t *d = calloc(nbk ? nbk : 1, sizeof *d);
    unsigned char **sent = calloc(nbk ? nbk : 1, sizeof *sent), **got = calloc(nbk ? nbk : 1,
                                                                               sizeof *got);
    CT_REQUIRE(d && sent && got);
    for (size_t j = 0; j < nbk; j++) {
        d[j] = bk[j];
        size_t own = bk[j].kind == IGRAD_BUCKET_GATHER ? bk[j].send_nbytes : bk[j].recv_nbytes;
        sent[j] = malloc(own ? own : 1);
        got[j] = malloc(bk[j].recv_nbytes ? bk[j].recv_nbytes : 1);
        CT_REQUIRE(sent[j] && got[j]);
        memcpy(sent[j], bk[j].send, own);
        if (bk[j].kind == IGRAD_BUCKET_GATHER)
            CHECK_OK(igrad_comm_allgather(comm, bk[j].send, bk[j].send_nbytes, bk[j].recv));
        else
            CHECK_OK(igrad_comm_allreduce(comm, bk[j].recv, bk[j].recv, bk[j].count,
                                          IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM));
        memcpy(got[j], bk[j].recv, bk[j].recv_nbytes);
    }
    CT_REQUIRE(igrad_engine_end(eng, step, grads) == IGRAD_OK);
    igrad_step_stats_t st;
    CT_REQUIRE(igrad_engine_last_stats(eng, &st) == IGRAD_OK);

    block_t *b = NULL;
    size_t nb = model_blocks(mine, &b), pos = 0, j = 0;
    for (int q = 0; q < st.bucket_count; q++) {
        size_t first = pos;
        int64_t load = 0;
        while (pos < nb && load < st.bucket_loads[q]) load += b[pos++].wire; /* coded bytes */
        CHECK(load == st.bucket_loads[q], "step %lld bucket %d: planned %lld bytes, blocks give "
              "%lld", (long long)step, q, (long long)st.bucket_loads[q], (long long)load);
        size_t n = pos - first;
        if (n == 0) continue;
        if (j >= nbk) {
            CHECK(j < nbk, "step %lld: more non-empty buckets than descriptors", (long long)step);
            break;
        }
        const block_t *bq = b + first;
        int64_t s = load, dn = run_dense(mine, bq, n);
        int kind = model_kind(mine, s, dn);
        CHECK(d[j].index == q, "descriptor %zu has index %d, planned bucket %d", j, d[j].index, q);
        CHECK((int)d[j].kind == kind, "step %lld bucket %d (P %d, s %lld, d %lld): kind %d, "
              "the documented rule says %d", (long long)step, q, np, (long long)s,
              (long long)dn, (int)d[j].kind, kind);
        if ((int)d[j].kind != kind) {
            j++;
            continue;
        }
        if (kind == IGRAD_BUCKET_GATHER) {
            CHECK(d[j].send_nbytes == (size_t)s && d[j].recv_nbytes == (size_t)np * (size_t)s,
                  "bucket %d: send %zu recv %zu bytes, expected %lld and %lld", q,
                  d[j].send_nbytes, d[j].recv_nbytes, (long long)s, (long long)(np * s));
            if (d[j].send_nbytes == (size_t)s && d[j].recv_nbytes == (size_t)np * (size_t)s) {
                seen_t seen;
                memset(&seen, 0, sizeof seen);
                snprintf(where, sizeof where, "step %lld bucket %d send", (long long)step, q);
                failures += decode_gather(mine, bq, n, sent[j], (size_t)s, where, &seen);
                cnt->mixed += seen.mixed_widths;
                for (int r = 0; r < np; r++) {
                    snprintf(where, sizeof where, "step %lld bucket %d recv slot of rank %d",
                             (long long)step, q, r);
                    failures += decode_gather(&M[r], bq, n, got[j] + (size_t)r * (size_t)s,
                                              (size_t)s, where, NULL);
                }
            }
            cnt->gather++;
        } else {
            CHECK(d[j].count == (size_t)dn, "bucket %d: %zu floats, expected %lld", q,
                  d[j].count, (long long)dn);
            if (d[j].count == (size_t)dn) {
                snprintf(where, sizeof where, "step %lld bucket %d reduce send", (long long)step,
                         q);
                failures += decode_reduce(mine, bq, n, (const float *)(void *)sent[j],
                                          (size_t)dn, where);
                float *sum = calloc((size_t)dn ? (size_t)dn : 1, sizeof *sum);
                CT_REQUIRE(sum);
                for (int r = 0; r < np; r++) reduce_scatter_add(&M[r], bq, n, sum, (size_t)dn);
                const float *out = (const float *)(void *)got[j];
                int bad = 0;
                for (int64_t i = 0; i < dn && !bad; i++)
                    if (!(fabsf(out[i] - sum[i]) <= 1e-5f * (1.0f + fabsf(sum[i])))) {
                        CHECK(0, "step %lld bucket %d: reduced float %lld is %.9g, sum over "
                              "ranks %.9g", (long long)step, q, (long long)i, (double)out[i],
                              (double)sum[i]);
                        bad = 1;
                    }
                free(sum);
            }
            cnt->reduce++;
        }
        j++;
    }
    CHECK(pos == nb && j == nbk, "step %lld: %zu of %zu blocks, %zu of %zu descriptors",
          (long long)step, pos, nb, j, nbk);

    /* average over ranks; residuals */
    for (size_t t = 0; t < NT; t++) {
        const tensor_t *x = &mine->t[t];
        float *want = calloc((size_t)x->n, sizeof *want);
        CT_REQUIRE(want);
        for (int r = 0; r < np; r++) {
            const tensor_t *y = &M[r].t[t];
            for (int64_t e = 0; e < y->count; e++)
                want[(e / y->per_row) * y->cols + y->idx[e]] += y->val[e];
        }
        int bad = 0;
        for (int64_t i = 0; i < x->n && !bad; i++) {
            float w = want[i] / (float)np;
            if (!(fabsf(grads[t][i] - w) <= 1e-5f * (1.0f + fabsf(w)))) {
                CHECK(0, "step %lld tensor %zu entry %lld: %.9g, the average %.9g",
                      (long long)step, t, (long long)i, (double)grads[t][i], (double)w);
                bad = 1;
            }
        }
        const float *res = igrad_engine_residual(eng, t);
        CT_REQUIRE(res);
        for (int64_t i = 0; i < x->n; i++)
            if (!same_bits(res[i], x->e[i])) {
                CHECK(0, "step %lld tensor %zu residual %lld: %.9g, modelled %.9g",
                      (long long)step, t, (long long)i, (double)res[i], (double)x->e[i]);
                break;
            }
        free(want);
    }
    for (size_t k = 0; k < nbk; k++) {
        free(sent[k]);
        free(got[k]);
    }
    free(sent);
    free(got);
    free(d);
    free(b);
    for (size_t t = 0; t < NT; t++) free(grads[t]);
}

static counts_t run_case(const char *what, igrad_config_t cfg, int steps)
{
    igrad_comm_t *comm = NULL;
    CT_REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_layout_t *L = NULL;
    CT_REQUIRE(igrad_layout_create(&L) == IGRAD_OK);
    for (size_t t = 0; t < NT; t++)
        CT_REQUIRE(igrad_layout_add(L, LAYOUT[t].name, IGRAD_DTYPE_F32, LAYOUT[t].ndim,
                                    LAYOUT[t].shape) == IGRAD_OK);
    igrad_engine_t *eng = NULL;
    CT_REQUIRE(igrad_engine_create(L, NULL, &cfg, comm, &eng) == IGRAD_OK);
    model_t *M = calloc((size_t)np, sizeof *M);
    CT_REQUIRE(M);
    for (int r = 0; r < np; r++) model_init(&M[r], LAYOUT, NT, &cfg, np);
    counts_t cnt = {0, 0, 0};
    int before = failures;
    for (int64_t s = 0; s < steps; s++) check_step(M, eng, comm, s, &cnt);
    if (me == 0)
        printf("%s: %d gather and %d reduce buckets decoded (%d with u32 and u16 indices)%s\n",
               what, cnt.gather, cnt.reduce, cnt.mixed, failures > before ? ", FAILED" : "");
    for (int r = 0; r < np; r++) model_free(&M[r]);
    free(M);
    igrad_engine_free(eng);
    igrad_layout_free(L);
    igrad_comm_free(comm);
    return cnt;
}

static igrad_config_t config(igrad_method_t method, int buckets, int64_t block_entries,
                             double density)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = method;
    c.buckets = buckets;
    c.block_entries = block_entries;
    c.density = density;
    c.verify_every = 0;
    return c;
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);

    counts_t c = run_case("topk_sync, 3 buckets", config(IGRAD_METHOD_TOPK_SYNC, 3, 300, 0.01),
                          2);
    CHECK(c.gather >= 6 && c.reduce == 0, "%d gather, %d reduce", c.gather, c.reduce);
    c = run_case("topk_sync, 1 bucket", config(IGRAD_METHOD_TOPK_SYNC, 1, 16384, 0.01), 2);
    CHECK(c.mixed == 2, "%d buckets with both index widths", c.mixed);
    c = run_case("adtopk_sync, 4 buckets", config(IGRAD_METHOD_ADTOPK_SYNC, 4, 200, 0.01), 2);
    CHECK(c.gather >= 8, "%d gather buckets", c.gather);
    igrad_config_t r = config(IGRAD_METHOD_ADTOPK_SYNC, 3, 200, 0.01);
    r.collective = IGRAD_COLLECTIVE_REDUCE;
    c = run_case("adtopk_sync, reduce", r, 2);
    CHECK(c.reduce >= 4 && c.gather == 0, "%d gather, %d reduce", c.gather, c.reduce);
    r = config(IGRAD_METHOD_TOPK_SYNC, 3, 500, 0.01);
    r.collective = IGRAD_COLLECTIVE_REDUCE;
    r.index_dtype = IGRAD_DTYPE_U32;
    c = run_case("topk_sync, reduce, u32", r, 2);
    CHECK(c.reduce >= 4, "%d reduce", c.reduce);
    /* auto at density 0.3: per tensor P·s/(8·d) = P·0.3·(4 + index bytes)/8,
     * so at P = 4 u32-only buckets reduce (1.2) and u16-only ones gather
     * (0.9); at P = 2 everything gathers */
    r = config(IGRAD_METHOD_TOPK_SYNC, 8, 1 << 20, 0.3);
    r.index_code = IGRAD_INDEX_CODE_FIXED; /* the widths counted above */
    c = run_case("topk_sync, auto, rho 0.3", r, 2);
    if (np == 4) CHECK(c.reduce > 0 && c.gather > 0, "%d gather, %d reduce", c.gather, c.reduce);
    if (np == 2) CHECK(c.reduce == 0, "%d reduce", c.reduce);

    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_contract: %d failure(s) over %d ranks\n", total, np);
    MPI_Finalize();
    return total ? 1 : 0;
}
