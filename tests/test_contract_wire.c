/*
 * test_contract_wire.c — contract tests of the bucket wire format and of
 * the `auto` gather/reduce rule, written from docs/formats.md §8 and
 * docs/architecture.md §5.1, §5.6, §5.7 only (not from src/):
 *
 *  - an independent model of what a step sends: budgets and select specs
 *    (§5.1), selection as a sort of |g + e| (ties: lower index), blocks
 *    and readiness order (§5.6), index widths (formats.md §8), the `auto`
 *    rule (§5.7);
 *  - a decoder of the bytes igrad_engine_begin exposes: per gather bucket
 *    [values f32 of every block][u32 indices][u16 indices] (index_code
 *    fixed) or [values][each block's coded runs] (compact: Elias–Fano,
 *    bitmap or fixed per run, decoded bit by bit), every rank's
 *    copy in recv at offset r * send_nbytes; per reduce bucket the dense
 *    segments (rows of row-wise blocks, the whole tensor for flat blocks,
 *    consecutive flat blocks of one tensor sharing one segment);
 *  - pinned `auto` decisions just below, at and just above the boundary
 *    8·d < P·s, computed by hand in the comments.
 *
 * The model and the decoder live in contract_model.h, shared with
 * mpi_contract.c (real ranks with different gradients, so each rank's
 * slot of recv decodes to that rank's selection).
 *
 * Several ranks are modelled here with a replicating communicator: a custom
 * backend (igrad_comm_create_custom) that reports `size` ranks and whose
 * peers contribute exactly this rank's bytes (allgather copies our block
 * into every slot, allreduce SUM multiplies by P). The point is the plan
 * and the bytes, not the transport; real multi-rank runs are mpi_*.c.
 *
 * Which blocks form which bucket is the packing policy's business
 * (test_pack.c). Here buckets are consecutive runs of the readiness order
 * (the contiguous and sequential policies keep it), split at the planned
 * loads the step stats report; for `sequential` the split is also
 * recomputed from its documented rule.
 * Configs pin dense_below = 0: every tensor takes the sparsifier path, which
 * the references and goldens here model (the default, 64, sends tensors
 * under 64 entries whole: tests/test_engine_dense_below.c, test_target.c).
 */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "igrad.h"
#include "test_util.h"

#define CT_REQUIRE(cond) assert_true(cond)
#define CT_REPORT(...) print_error(__VA_ARGS__)
#include "contract_model.h"

/* ---- a replicating communicator ------------------------------------------ */

typedef struct replica {
    int size;
} replica_t;

static igrad_status_t rep_allgather(void *user, const void *send, size_t nbytes, void *recv)
{
    const replica_t *r = user;
    unsigned char *out = recv;
    if ((const void *)out != send) memmove(out, send, nbytes); /* we are rank 0 */
    for (int k = 1; k < r->size; k++) memcpy(out + (size_t)k * nbytes, out, nbytes);
    return IGRAD_OK;
}

static igrad_status_t rep_allreduce(void *user, const void *send, void *recv, size_t count,
                                    igrad_dtype_t dtype, igrad_reduce_op_t op)
{
    const replica_t *r = user;
    size_t esize = dtype == IGRAD_DTYPE_F32 ? 4 : 8;
    if (recv != send) memmove(recv, send, count * esize);
    if (op != IGRAD_REDUCE_SUM) return IGRAD_OK; /* MAX/MIN of equal values */
    for (size_t i = 0; i < count; i++) {
        if (dtype == IGRAD_DTYPE_F32)
            ((float *)recv)[i] *= (float)r->size;
        else if (dtype == IGRAD_DTYPE_F64)
            ((double *)recv)[i] *= (double)r->size;
        else
            ((int64_t *)recv)[i] *= r->size;
    }
    return IGRAD_OK;
}

static igrad_status_t rep_bcast(void *user, void *buf, size_t nbytes, int root)
{
    (void)user, (void)buf, (void)nbytes, (void)root;
    return IGRAD_OK;
}

static igrad_status_t rep_barrier(void *user)
{
    (void)user;
    return IGRAD_OK;
}

/* P = 1 is the library's own self communicator; P > 1 the replica. */
static igrad_comm_t *comm_new(replica_t *r, int P)
{
    igrad_comm_t *comm = NULL;
    if (P == 1) {
        assert_ok(igrad_comm_create_self(&comm));
        return comm;
    }
    r->size = P;
    igrad_comm_ops_t ops;
    memset(&ops, 0, sizeof ops);
    ops.size = sizeof ops;
    ops.allgather = rep_allgather;
    ops.allreduce = rep_allreduce;
    ops.bcast = rep_bcast;
    ops.barrier = rep_barrier;
    assert_ok(igrad_comm_create_custom(&ops, r, 0, P, &comm));
    return comm;
}

/* ---- one checked step ------------------------------------------------------ */

typedef struct copy {
    igrad_bucket_t d;
    unsigned char *send; /* send bytes before the collective */
    unsigned char *recv; /* gather: recv bytes after it */
} copy_t;

static void run_step(model_t *M, igrad_engine_t *eng, igrad_comm_t *comm, int64_t step,
                     seen_t *seen)
{
    char where[160];
    fill_grads(M, 0, step);
    float **grads = malloc(M->T * sizeof *grads);
    assert_non_null(grads);
    for (size_t t = 0; t < M->T; t++) {
        grads[t] = malloc((size_t)M->t[t].n * sizeof(float));
        assert_non_null(grads[t]);
        memcpy(grads[t], M->t[t].g, (size_t)M->t[t].n * sizeof(float));
    }
    model_select(M, step);

    const igrad_bucket_t *bk = NULL;
    size_t nbk = 0;
    assert_ok(igrad_engine_begin(eng, step, grads, &bk, &nbk));
    copy_t *cp = calloc(nbk ? nbk : 1, sizeof *cp);
    assert_non_null(cp);
    for (size_t j = 0; j < nbk; j++) {
        cp[j].d = bk[j];
        size_t nbytes = bk[j].kind == IGRAD_BUCKET_GATHER ? bk[j].send_nbytes : bk[j].recv_nbytes;
        cp[j].send = malloc(nbytes ? nbytes : 1);
        assert_non_null(cp[j].send);
        memcpy(cp[j].send, bk[j].send, nbytes);
        if (bk[j].kind == IGRAD_BUCKET_GATHER) {
            assert_ok(igrad_comm_allgather(comm, bk[j].send, bk[j].send_nbytes, bk[j].recv));
            cp[j].recv = malloc(bk[j].recv_nbytes ? bk[j].recv_nbytes : 1);
            assert_non_null(cp[j].recv);
            memcpy(cp[j].recv, bk[j].recv, bk[j].recv_nbytes);
        } else {
            assert_ptr_equal(bk[j].send, bk[j].recv);
            assert_ok(igrad_comm_allreduce(comm, bk[j].recv, bk[j].recv, bk[j].count,
                                           IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM));
        }
    }
    assert_ok(igrad_engine_end(eng, step, grads));
    igrad_step_stats_t st;
    assert_ok(igrad_engine_last_stats(eng, &st));

    /* blocks → planned buckets by their loads (consecutive runs) */
    block_t *b = NULL;
    size_t nb = model_blocks(M, &b);
    size_t *start = calloc((size_t)st.bucket_count + 1, sizeof *start);
    assert_non_null(start);
    size_t pos = 0;
    int64_t total = 0;
    for (size_t i = 0; i < nb; i++) total += b[i].cost;
    for (int q = 0; q < st.bucket_count; q++) {
        start[q] = pos;
        int64_t load = 0;
        while (pos < nb && load < st.bucket_loads[q]) load += b[pos++].wire;
        if (load != st.bucket_loads[q]) {
            print_error("step %lld: planned bucket %d has %lld bytes; the readiness order "
                        "of the model's blocks gives %lld at that cut\n",
                        (long long)step, q, (long long)st.bucket_loads[q], (long long)load);
            fail();
        }
    }
    start[st.bucket_count] = pos;
    assert_int_equal(pos, nb); /* every block is in a bucket */

    if (M->cfg.pack == IGRAD_PACK_SEQUENTIAL) { /* §5.6, recomputed */
        int B = M->cfg.buckets, q = 0;
        int64_t load = 0;
        size_t *want = calloc((size_t)B + 1, sizeof *want);
        assert_non_null(want);
        for (size_t i = 0; i < nb; i++) {
            if (load > 0 && load * B >= total && q < B - 1) {
                want[++q] = i;
                load = 0;
            }
            load += b[i].cost;
        }
        for (int r = q + 1; r <= B; r++) want[r] = nb;
        assert_int_equal(st.bucket_count, B);
        for (int r = 0; r <= B; r++) assert_int_equal(start[r], want[r]);
        free(want);
    }

    /* descriptors ↔ non-empty planned buckets, in order */
    size_t j = 0;
    int64_t payload = 0;
    double wire = 0;
    int ngather = 0, nreduce = 0;
    for (int q = 0; q < st.bucket_count; q++) {
        size_t nbq = start[q + 1] - start[q];
        if (nbq == 0) continue;
        assert_true(j < nbk);
        const igrad_bucket_t *d = &cp[j].d;
        const block_t *bq = b + start[q];
        int64_t s = st.bucket_loads[q], dn = run_dense(M, bq, nbq);
        assert_int_equal(d->index, q);
        int kind = model_kind(M, s, dn);
        if ((int)d->kind != kind) {
            print_error("step %lld bucket %d (P %d, s %lld bytes, d %lld floats, 8d %lld, "
                        "P*s %lld): kind %s, the documented rule says %s\n",
                        (long long)step, q, M->P, (long long)s, (long long)dn,
                        (long long)(8 * dn), (long long)(M->P * s),
                        d->kind == IGRAD_BUCKET_GATHER ? "gather" : "reduce",
                        kind == IGRAD_BUCKET_GATHER ? "gather" : "reduce");
            fail();
        }
        if (d->kind == IGRAD_BUCKET_GATHER) {
            assert_int_equal(d->dtype, IGRAD_DTYPE_U8);
            assert_int_equal(d->send_nbytes, (size_t)s);
            assert_int_equal(d->count, (size_t)s);
            assert_int_equal(d->recv_nbytes, (size_t)M->P * (size_t)s);
            snprintf(where, sizeof where, "step %lld bucket %d send", (long long)step, q);
            if (decode_gather(M, bq, nbq, cp[j].send, d->send_nbytes, where, seen)) fail();
            for (int r = 0; r < M->P; r++) {
                snprintf(where, sizeof where, "step %lld bucket %d recv rank %d",
                         (long long)step, q, r);
                if (decode_gather(M, bq, nbq, cp[j].recv + (size_t)r * d->send_nbytes,
                                  d->send_nbytes, where, NULL))
                    fail();
            }
            payload += s;
            wire += (double)(M->P - 1) * (double)s;
            ngather++;
            seen->gather++;
        } else {
            assert_int_equal(d->dtype, IGRAD_DTYPE_F32);
            assert_int_equal(d->count, (size_t)dn);
            assert_int_equal(d->recv_nbytes, (size_t)dn * 4);
            snprintf(where, sizeof where, "step %lld bucket %d (reduce)", (long long)step, q);
            if (decode_reduce(M, bq, nbq, (const float *)cp[j].send, d->count, where)) fail();
            payload += 4 * dn;
            wire += 2.0 * (M->P - 1) / M->P * 4.0 * (double)dn;
            nreduce++;
            seen->reduce++;
        }
        j++;
    }
    assert_int_equal(j, nbk);
    assert_int_equal(st.payload_nbytes, payload);
    assert_near(st.wire_nbytes, wire, 1e-6 * (1 + wire));
    assert_int_equal(st.gather_buckets, ngather);
    assert_int_equal(st.reduce_buckets, nreduce);
    assert_int_equal(st.buckets, ngather + nreduce);

    /* the averaged result and the residuals */
    for (size_t t = 0; t < M->T; t++) {
        const tensor_t *x = &M->t[t];
        float *want = calloc((size_t)x->n, sizeof *want);
        assert_non_null(want);
        for (int64_t e = 0; e < x->count; e++)
            want[(e / x->per_row) * x->cols + x->idx[e]] = x->val[e];
        for (int64_t i = 0; i < x->n; i++)
            if (!(fabsf(grads[t][i] - want[i]) <= 1e-6f * fabsf(want[i]))) {
                print_error("step %lld tensor %zu entry %lld: result %.9g, %.9g expected\n",
                            (long long)step, t, (long long)i, (double)grads[t][i],
                            (double)want[i]);
                fail();
            }
        const float *res = igrad_engine_residual(eng, t);
        assert_non_null(res);
        for (int64_t i = 0; i < x->n; i++)
            if (!same_bits(res[i], x->e[i])) {
                print_error("step %lld tensor %zu residual %lld: %.9g, %.9g expected\n",
                            (long long)step, t, (long long)i, (double)res[i], (double)x->e[i]);
                fail();
            }
        free(want);
    }

    free(start);
    free(b);
    for (size_t k = 0; k < nbk; k++) {
        free(cp[k].send);
        free(cp[k].recv);
    }
    free(cp);
    for (size_t t = 0; t < M->T; t++) free(grads[t]);
    free(grads);
}

/* ---- layouts and runs ------------------------------------------------------ */

/* Index-width boundaries: rows of 32 and of exactly 65536 columns (u16),
 * a row of 70000 columns (u32), flat tensors of 65536 (u16), 65537 and
 * 70000 entries (u32), small flat ones (u16). */
static const tdef_t WIRE_LAYOUT[] = {
    {"model.embed_tokens.weight", 2, {300, 32}},
    {"model.layers.0.self_attn.q_proj.weight", 2, {32, 32}},
    {"model.layers.0.self_attn.k_proj.weight", 2, {1, 65536}},
    {"model.layers.0.mlp.up_proj.weight", 2, {64, 32}},
    {"model.layers.0.mlp.up_proj.bias", 1, {70000, 1}},
    {"model.layers.0.mlp.down_proj.weight", 2, {2, 70000}},
    {"model.layers.0.input_layernorm.weight", 1, {32, 1}},
    {"model.layers.0.post_attention_layernorm.weight", 1, {65537, 1}},
    {"model.norm.weight", 1, {65536, 1}},
    {"lm_head.weight", 2, {300, 32}},
};
#define WIRE_T (sizeof WIRE_LAYOUT / sizeof WIRE_LAYOUT[0])

static igrad_layout_t *layout_of(const tdef_t *defs, size_t T)
{
    igrad_layout_t *L = NULL;
    assert_ok(igrad_layout_create(&L));
    for (size_t t = 0; t < T; t++)
        assert_ok(igrad_layout_add(L, defs[t].name, IGRAD_DTYPE_F32, defs[t].ndim,
                                   defs[t].shape));
    return L;
}

/* Runs `steps` steps of `cfg` on the wire layout over P ranks, decoding
 * every bucket; returns what was seen. */
static seen_t run_case(igrad_config_t cfg, int P, int steps)
{
    replica_t rep;
    igrad_comm_t *comm = comm_new(&rep, P);
    igrad_layout_t *L = layout_of(WIRE_LAYOUT, WIRE_T);
    igrad_engine_t *eng = NULL;
    assert_ok(igrad_engine_create(L, NULL, &cfg, comm, &eng));
    model_t M;
    model_init(&M, WIRE_LAYOUT, WIRE_T, &cfg, P);
    /* the plan's index widths agree with the doc's rule */
    for (size_t t = 0; t < WIRE_T; t++) {
        igrad_tensor_plan_t tp;
        assert_ok(igrad_engine_tensor_plan(eng, t, &tp));
        model_spec(&M, &M.t[t], 0);
        assert_int_equal(tp.index_nbytes, M.t[t].ib);
        assert_int_equal(tp.count, M.t[t].count);
        assert_int_equal(tp.row_wise, M.t[t].row_wise);
    }
    block_t *blk = NULL;
    size_t nblk = model_blocks(&M, &blk);
    for (size_t t = 0; t < WIRE_T; t++) {
        igrad_tensor_plan_t tp;
        assert_ok(igrad_engine_tensor_plan(eng, t, &tp));
        int64_t want = 0;
        for (size_t i = 0; i < nblk; i++)
            if (blk[i].t == t) want += blk[i].wire;
        assert_int_equal(tp.step_nbytes, want);
    }
    free(blk);
    seen_t seen;
    memset(&seen, 0, sizeof seen);
    for (int64_t s = 0; s < steps; s++) run_step(&M, eng, comm, s, &seen);
    model_free(&M);
    igrad_engine_free(eng);
    igrad_layout_free(L);
    igrad_comm_free(comm);
    return seen;
}

static igrad_config_t wire_config(igrad_method_t method, int buckets, int64_t block_entries)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = method;
    c.density = 0.01;
    c.buckets = buckets;
    c.block_entries = block_entries;
    c.verify_every = 0;
    c.index_code = IGRAD_INDEX_CODE_FIXED; /* the compact tests set it */
    return c;
}

/* Flat top-k, one bucket: every block of every tensor in one gather, so
 * u32 (65537, 70000, 140000 entries) and u16 blocks share the bucket. */
static void test_wire_topk_one_bucket(void **state)
{
    (void)state;
    seen_t s = run_case(wire_config(IGRAD_METHOD_TOPK_SYNC, 1, 16384), 1, 3);
    assert_int_equal(s.gather, 3);
    assert_int_equal(s.mixed_widths, 3);
    assert_true(s.u16_blocks > 0 && s.u32_blocks > 0);
}

/* Flat top-k, small blocks (a tensor over several blocks and buckets). */
static void test_wire_topk_buckets(void **state)
{
    (void)state;
    seen_t s = run_case(wire_config(IGRAD_METHOD_TOPK_SYNC, 3, 200), 1, 3);
    assert_true(s.gather >= 6);
    assert_true(s.mixed_widths > 0);
    igrad_config_t c = wire_config(IGRAD_METHOD_TOPK_SYNC, 4, 150);
    c.pack = IGRAD_PACK_SEQUENTIAL;
    s = run_case(c, 1, 2);
    assert_true(s.gather >= 6);
}

/* Row-wise ADTopk: u16 column indices for rows of 32 and 65536 columns,
 * u32 for rows of 70000, flat u32/u16 for the 1-D tensors; whole-row
 * blocks (a 700-entry row is one block even with block_entries 200). */
static void test_wire_adtopk(void **state)
{
    (void)state;
    seen_t s = run_case(wire_config(IGRAD_METHOD_ADTOPK_SYNC, 1, 16384), 1, 2);
    assert_int_equal(s.mixed_widths, 2);
    assert_true(s.rowwise_blocks > 0 && s.flat_blocks > 0);
    s = run_case(wire_config(IGRAD_METHOD_ADTOPK_SYNC, 4, 200), 1, 3);
    assert_true(s.gather >= 8);
    assert_true(s.mixed_widths > 0);
}

/* ADTopk with interleave: odd steps are flat with the same count, and
 * their index width follows the tensor's entries (140000: u32). */
static void test_wire_adtopk_interleave(void **state)
{
    (void)state;
    igrad_config_t c = wire_config(IGRAD_METHOD_ADTOPK_SYNC, 2, 300);
    c.interleave = 1;
    seen_t s = run_case(c, 1, 4);
    assert_true(s.rowwise_blocks > 0 && s.flat_blocks > 0);
    /* as reduce buckets: odd steps' flat blocks of a 2-D tensor are
     * whole-tensor segments */
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    s = run_case(c, 2, 2);
    assert_true(s.reduce >= 4);
}

/* index_dtype U32: every index 4 bytes. */
static void test_wire_u32_only(void **state)
{
    (void)state;
    igrad_config_t c = wire_config(IGRAD_METHOD_ADTOPK_SYNC, 3, 500);
    c.index_dtype = IGRAD_DTYPE_U32;
    seen_t s = run_case(c, 1, 2);
    assert_int_equal(s.u16_blocks, 0);
}

/* Several ranks: recv holds P copies at r * send_nbytes; forced reduce
 * and `auto` with P = 8 (mixes reduce and gather buckets) decode too. */
static void test_wire_ranks(void **state)
{
    (void)state;
    igrad_config_t c = wire_config(IGRAD_METHOD_TOPK_SYNC, 3, 400);
    c.collective = IGRAD_COLLECTIVE_GATHER;
    seen_t s = run_case(c, 4, 2);
    assert_true(s.gather >= 6 && s.reduce == 0);
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    s = run_case(c, 2, 2);
    assert_true(s.reduce >= 6 && s.gather == 0);
    c = wire_config(IGRAD_METHOD_ADTOPK_SYNC, 4, 400);
    c.collective = IGRAD_COLLECTIVE_REDUCE;
    s = run_case(c, 4, 2);
    assert_true(s.reduce >= 6);
    /* auto at density 0.15, P = 8: a bucket of u32 blocks only has
     * P·s = 8·0.15·8·d = 9.6 d > 8 d (reduce), one of u16 blocks only
     * 7.2 d (gather) */
    c = wire_config(IGRAD_METHOD_TOPK_SYNC, 10, 1 << 20);
    c.density = 0.15;
    s = run_case(c, 8, 1);
    assert_true(s.reduce > 0);
    assert_true(s.gather > 0);
}

/* index_code compact (the default): every run decoded bit by bit from
 * formats.md §8 (contract_model.h, wire_code_ref.h). The wire layout's
 * tensors give EF rows (32 and 65536 columns at 1 %), EF flat blocks, and
 * with a high density bitmaps; U32 makes 70000-column rows' fixed width
 * 32 bits. */
static void test_wire_compact(void **state)
{
    (void)state;
    igrad_config_t c = wire_config(IGRAD_METHOD_TOPK_SYNC, 1, 16384);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    seen_t s = run_case(c, 1, 3);
    assert_int_equal(s.gather, 3);
    assert_true(s.runs[3] > 0);
    c = wire_config(IGRAD_METHOD_TOPK_SYNC, 3, 200);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    s = run_case(c, 1, 3);
    assert_true(s.gather >= 6 && s.runs[3] > 0);
    c = wire_config(IGRAD_METHOD_ADTOPK_SYNC, 4, 200);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    s = run_case(c, 1, 3);
    assert_true(s.rowwise_blocks == 0 || s.runs[3] > 0);
    c.interleave = 1;
    s = run_case(c, 1, 4);
    assert_true(s.runs[3] > 0);
    /* dense rows: bitmaps (k = u/2: EF 2k bits > u bits) */
    c = wire_config(IGRAD_METHOD_ADTOPK_SYNC, 2, 16384);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    c.density = 0.5;
    s = run_case(c, 1, 2);
    assert_true(s.runs[4] > 0);
    /* several ranks, gather and `auto` at P = 8 */
    c = wire_config(IGRAD_METHOD_TOPK_SYNC, 3, 400);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    c.collective = IGRAD_COLLECTIVE_GATHER;
    s = run_case(c, 4, 2);
    assert_true(s.gather >= 6 && s.reduce == 0);
    c = wire_config(IGRAD_METHOD_TOPK_SYNC, 10, 1 << 20);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    c.density = 0.15;
    s = run_case(c, 8, 1);
    assert_true(s.gather > 0);
    c = wire_config(IGRAD_METHOD_ADTOPK_SYNC, 3, 500);
    c.index_code = IGRAD_INDEX_CODE_COMPACT;
    c.index_dtype = IGRAD_DTYPE_U32;
    s = run_case(c, 1, 2);
    assert_true(s.runs[3] > 0);
}

/* ---- pinned `auto` decisions ---------------------------------------------- */

/* One tensor, one bucket, block_entries above its count. s = the gather
 * bytes per rank, d = the dense floats; reduce iff 8·d < P·s. Each case
 * is within a factor 4 of the boundary, so a rule off by 4× either way
 * flips at least one pinned decision of each kind. */
typedef struct auto_case {
    const char *what;
    igrad_method_t method;
    igrad_dtype_t index_dtype;
    double density;
    int ndim;
    int64_t shape[2];
    int P;
    int64_t s, d;      /* computed by hand below */
    int reduce;        /* pinned decision */
    igrad_index_code_t code; /* FIXED unless given */
} auto_case_t;

static const auto_case_t AUTO_CASES[] = {
    /* flat [1000], rho 0.25: k = 250, u16: s = 250·6 = 1500, d = 1000,
     * 8d = 8000. P = 5: P·s = 7500 < 8000 → gather (ratio 0.94);
     * P = 6: 9000 > 8000 → reduce (ratio 1.125). */
    {"topk [1000] u16 P5", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 1, {1000, 1}, 5,
     1500, 1000, 0, IGRAD_INDEX_CODE_FIXED},
    {"topk [1000] u16 P6", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 1, {1000, 1}, 6,
     1500, 1000, 1, IGRAD_INDEX_CODE_FIXED},
    /* same with u32: s = 250·8 = 2000. P = 4: P·s = 8000 = 8d, a tie →
     * gather; P = 5: 10000 → reduce (ratio 1.25). */
    {"topk [1000] u32 P4 tie", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U32, 0.25, 1, {1000, 1}, 4,
     2000, 1000, 0, IGRAD_INDEX_CODE_FIXED},
    {"topk [1000] u32 P5", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U32, 0.25, 1, {1000, 1}, 5,
     2000, 1000, 1, IGRAD_INDEX_CODE_FIXED},
    /* row-wise [8, 100], rho 0.25: per_row 25, s = 8·25·6 = 1200, d = 800
     * (the rows), 8d = 6400. P = 5: 6000 → gather; P = 6: 7200 → reduce. */
    {"adtopk [8,100] P5", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 2, {8, 100}, 5,
     1200, 800, 0, IGRAD_INDEX_CODE_FIXED},
    {"adtopk [8,100] P6", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 2, {8, 100}, 6,
     1200, 800, 1, IGRAD_INDEX_CODE_FIXED},
    /* the default density: flat [65536], rho 0.01: k = ceil(655.36) = 656,
     * u16 (65536 entries fit): s = 3936, d = 65536, 8d = 524288.
     * P = 133: 523488 → gather (ratio 0.9985); P = 134: 527424 → reduce. */
    {"topk [65536] rho 0.01 P133", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 1,
     {65536, 1}, 133, 3936, 65536, 0, IGRAD_INDEX_CODE_FIXED},
    {"topk [65536] rho 0.01 P134", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 1,
     {65536, 1}, 134, 3936, 65536, 1, IGRAD_INDEX_CODE_FIXED},
    /* row-wise [64, 2048], rho 0.01: per_row = ceil(20.48) = 21, s = 64·21·6
     * = 8064, d = 131072, 8d = 1048576. P = 130: 1048320 → gather;
     * P = 131: 1056384 → reduce. */
    {"adtopk [64,2048] P130", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 2, {64, 2048},
     130, 8064, 131072, 0, IGRAD_INDEX_CODE_FIXED},
    {"adtopk [64,2048] P131", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 2, {64, 2048},
     131, 8064, 131072, 1, IGRAD_INDEX_CODE_FIXED},
    /* index_code compact (formats.md §8): the same tensors, their runs
     * coded. flat [1000], k 250: EF l = 2, 500 + 250 + 250 bits = 125
     * bytes (the bitmap ties at 125: EF), s = 1000 + 125 = 1125, 8d =
     * 8000. P = 7: 7875 → gather; P = 8: 9000 → reduce. */
    {"compact topk [1000] P7", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 1, {1000, 1}, 7,
     1125, 1000, 0, IGRAD_INDEX_CODE_COMPACT},
    {"compact topk [1000] P8", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 1, {1000, 1}, 8,
     1125, 1000, 1, IGRAD_INDEX_CODE_COMPACT},
    /* rows [8, 100], 25 per row: EF l = 2, 50 + 25 + 25 bits = 13 bytes a
     * row (bitmap 13 too), s = 800 + 104 = 904, 8d = 6400. P = 7: 6328 →
     * gather; P = 8: 7232 → reduce. */
    {"compact adtopk [8,100] P7", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 2, {8, 100},
     7, 904, 800, 0, IGRAD_INDEX_CODE_COMPACT},
    {"compact adtopk [8,100] P8", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 2, {8, 100},
     8, 904, 800, 1, IGRAD_INDEX_CODE_COMPACT},
    /* flat [65536], k 656: l = 6, 3936 + 656 + 1024 bits = 702 bytes
     * (fixed16 1312), s = 2624 + 702 = 3326, 8d = 524288. P = 157: 522182
     * → gather; P = 158: 525508 → reduce. */
    {"compact topk [65536] P157", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 1, {65536, 1},
     157, 3326, 65536, 0, IGRAD_INDEX_CODE_COMPACT},
    {"compact topk [65536] P158", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 1, {65536, 1},
     158, 3326, 65536, 1, IGRAD_INDEX_CODE_COMPACT},
    /* rows [64, 2048], 21 per row: l = 6, 126 + 21 + 32 bits = 23 bytes a
     * row (fixed16 42), s = 5376 + 1472 = 6848, 8d = 1048576. P = 153:
     * 1047744 → gather; P = 154: 1054592 → reduce. */
    {"compact adtopk [64,2048] P153", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 2,
     {64, 2048}, 153, 6848, 131072, 0, IGRAD_INDEX_CODE_COMPACT},
    {"compact adtopk [64,2048] P154", IGRAD_METHOD_ADTOPK_SYNC, IGRAD_DTYPE_U16, 0.01, 2,
     {64, 2048}, 154, 6848, 131072, 1, IGRAD_INDEX_CODE_COMPACT},
    /* far from the boundary, for orientation: P = 2 gathers, 8d ≫ 2s */
    {"topk [1000] u16 P2", IGRAD_METHOD_TOPK_SYNC, IGRAD_DTYPE_U16, 0.25, 1, {1000, 1}, 2,
     1500, 1000, 0, IGRAD_INDEX_CODE_FIXED},
};

static void test_auto_pinned(void **state)
{
    (void)state;
    for (size_t c = 0; c < sizeof AUTO_CASES / sizeof AUTO_CASES[0]; c++) {
        const auto_case_t *k = &AUTO_CASES[c];
        /* the hand computation agrees with the documented rule */
        assert_int_equal(doc_auto_reduce(k->P, k->s, k->d), k->reduce);
        tdef_t def = {"model.layers.0.mlp.up_proj.weight", k->ndim, {k->shape[0], k->shape[1]}};
        igrad_config_t cfg = wire_config(k->method, 1, 1 << 20);
        cfg.density = k->density;
        cfg.index_dtype = k->index_dtype;
        cfg.index_code = k->code;
        replica_t rep;
        igrad_comm_t *comm = comm_new(&rep, k->P);
        igrad_layout_t *L = layout_of(&def, 1);
        igrad_engine_t *eng = NULL;
        assert_ok(igrad_engine_create(L, NULL, &cfg, comm, &eng));
        int64_t n = k->ndim == 2 ? k->shape[0] * k->shape[1] : k->shape[0];
        float *g = malloc((size_t)n * sizeof *g);
        assert_non_null(g);
        for (int64_t i = 0; i < n; i++) g[i] = (float)((i * 37) % 101) - 50.0f;
        const igrad_bucket_t *bk = NULL;
        size_t nb = 0;
        assert_ok(igrad_engine_begin(eng, 0, &g, &bk, &nb));
        assert_int_equal(nb, 1);
        int got = bk[0].kind == IGRAD_BUCKET_REDUCE;
        if (got != k->reduce) {
            print_error("%s: P %d, s %lld, d %lld (8d %lld vs P*s %lld): engine chose %s, "
                        "pinned %s\n",
                        k->what, k->P, (long long)k->s, (long long)k->d, (long long)(8 * k->d),
                        (long long)(k->P * k->s), got ? "reduce" : "gather",
                        k->reduce ? "reduce" : "gather");
            fail();
        }
        if (got)
            assert_int_equal(bk[0].count, (size_t)k->d);
        else
            assert_int_equal(bk[0].send_nbytes, (size_t)k->s);
        /* the other collective is what forcing it gives */
        if (bk[0].kind == IGRAD_BUCKET_GATHER)
            assert_ok(igrad_comm_allgather(comm, bk[0].send, bk[0].send_nbytes, bk[0].recv));
        else
            assert_ok(igrad_comm_allreduce(comm, bk[0].recv, bk[0].recv, bk[0].count,
                                           IGRAD_DTYPE_F32, IGRAD_REDUCE_SUM));
        assert_ok(igrad_engine_end(eng, 0, &g));
        igrad_step_stats_t st;
        assert_ok(igrad_engine_last_stats(eng, &st));
        assert_int_equal(st.reduce_buckets, k->reduce);
        assert_int_equal(st.gather_buckets, !k->reduce);
        assert_int_equal(st.bucket_loads[0], k->s); /* block cost = gather bytes */
        double wire = k->reduce ? 2.0 * (k->P - 1) / k->P * 4.0 * (double)k->d
                                : (double)(k->P - 1) * (double)k->s;
        assert_near(st.wire_nbytes, wire, 1e-9 * wire);
        free(g);
        igrad_engine_free(eng);
        igrad_layout_free(L);
        igrad_comm_free(comm);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_wire_topk_one_bucket),
        cmocka_unit_test(test_wire_topk_buckets),
        cmocka_unit_test(test_wire_adtopk),
        cmocka_unit_test(test_wire_adtopk_interleave),
        cmocka_unit_test(test_wire_u32_only),
        cmocka_unit_test(test_wire_ranks),
        cmocka_unit_test(test_wire_compact),
        cmocka_unit_test(test_auto_pinned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
