/*
 * mpi_hier.c — the two-level sync (config.topology hier, engine_hier.c)
 * over MPI (CTest runs it with -np 4 and -np 8; nodes of ranks_per_node 2
 * and 4, and the nodes MPI reports).
 *
 *  - dense, adtopk_sync and ig over two release cycles: every rank's
 *    gradients equal a brute-force reference computed here from every
 *    rank's inputs (node sums in rank order, igrad_select_ef of each
 *    piece's node sum plus its residual with the spec the method implies
 *    for the step, the average over all P ranks), bit for bit (the
 *    gradients are multiples of 2^-10, so every sum is exact in any
 *    order); the pieces are the ownership rule's, written again here
 *    (rule_pieces) and compared with the engine's; the owner's residuals
 *    equal the reference's, the other ranks have none; per shard and
 *    piece Σ node sums = Σ sent + residual (conservation); the busiest
 *    shard within 1.10 x total/L in planned bytes;
 *  - the same on a layout whose embedding is 61 % of the entries (split
 *    into row pieces at ranks_per_node 2 and 4), its resume, and a state
 *    file of one split refused by another;
 *  - statistics: inter-node bytes are the shard's collectives among the N
 *    owners, intra-node bytes 2(L-1)/L·4 per parameter, and a plan-only
 *    engine of the same layout (igrad_engine_create_plan) plans exactly
 *    each rank's payload and inter-node bytes (its shard's buckets) and
 *    the busiest shard's;
 *  - agreement: a NaN on one rank, a NULL gradient, ranks at different
 *    steps, a config or topology that differs on one rank: the same error
 *    on every rank, nothing changed, the next step runs;
 *  - the dense warm-up (start_iter): method dense's steps and bytes, then
 *    the method as an engine without warm-up;
 *  - resume: state saved after step 5 and loaded into a new engine replays
 *    steps 6.. bit for bit;
 *  - the entry points it does not have are refused by name.
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

#define STEPS 10

static igrad_config_t config_of(igrad_method_t method, int rpn)
{
    igrad_config_t c = IGRAD_CONFIG_INIT;
    c.dense_below = 0;
    c.method = method;
    c.density = 0.05;
    c.release_period = 4;
    c.buckets = 2;
    c.block_entries = 256;
    c.threads = 1;
    c.timeout_s = 60;
    c.topology = IGRAD_TOPOLOGY_HIER;
    c.ranks_per_node = rpn;
    return c;
}

/* engine_hier.c's test accessor (not in a header: tests only). */
int igrad__hier_piece(const igrad_engine_t *e, size_t p, size_t *t, int64_t *row0, int64_t *rows,
                      int *owner, igrad_tensor_plan_t *plan, const float **residual);

/* A piece of the ownership rule: rows [row0, row0 + rows) of tensor t
 * (entries [off, off + n)) owned by local rank `owner`. */
typedef struct piece {
    size_t t;
    int64_t row0, rows, off, n;
    int owner;
} piece_t;

typedef struct unit_w {
    int64_t w;
    size_t u;
} unit_w_t;

static int by_weight(const void *a, const void *b)
{
    const unit_w_t *x = a, *y = b;
    if (x->w != y->w) return x->w > y->w ? -1 : 1;
    return x->u < y->u ? -1 : x->u > y->u;
}

/* The tensors' weights for the ownership rule: their planned wire bytes
 * per step in a flat plan of the whole layout over the N owners (the
 * shard engines' config: topology flat), through the public
 * igrad_engine_tensor_plan: step bytes for a tensor sent every step, else
 * its release bytes over the release period, rounded up; at least 1. */
static int64_t *rule_weights(const mpi_model_t *m, const igrad_config_t *c, int N)
{
    igrad_config_t f = *c;
    f.topology = IGRAD_TOPOLOGY_FLAT;
    f.ranks_per_node = 1;
    igrad_engine_t *whole = NULL;
    REQUIRE(igrad_engine_create_plan(m->L, m->prof, &f, N, &whole) == IGRAD_OK);
    int64_t *w = calloc(m->T, sizeof *w);
    REQUIRE(w);
    const int64_t R = f.release_period > 0 ? f.release_period : 1;
    for (size_t t = 0; t < m->T; t++) {
        igrad_tensor_plan_t tp;
        REQUIRE(igrad_engine_tensor_plan(whole, t, &tp) == IGRAD_OK);
        int64_t b = tp.every_step ? tp.step_nbytes : (tp.release_nbytes + R - 1) / R;
        w[t] = b > 0 ? b : 1;
    }
    igrad_engine_free(whole);
    return w;
}

/* The ownership rule as docs/architecture.md §5.7b states it, written here
 * again (not the engine's function), over the weights wt (planned bytes):
 * LPT over the units (components, OTHER
 * tensors; heaviest first, ties by unit; least loaded rank, ties lower);
 * while the busiest rank holds more than 1.10 x total/L, the largest
 * unsplit tensor of >= 2 dims and >= L rows is cut into L row ranges
 * [jR/L, (j+1)R/L), piece j on rank j, and the units less their split
 * tensors are placed again by LPT on top. Returns the pieces (layout
 * order, rows ascending); *busiest and *lpt_busiest (whole units only). */
static piece_t *rule_pieces(const mpi_model_t *m, const int64_t *wt, int L, size_t *np_out,
                            int64_t *busiest, int64_t *lpt_busiest)
{
    size_t T = m->T, C = igrad_layout_component_count(m->L), U = C;
    for (size_t t = 0; t < T; t++) U += m->info[t].component < 0;
    size_t *unit = calloc(T, sizeof *unit);
    char *split = calloc(T, 1);
    unit_w_t *uw = calloc(U, sizeof *uw);
    int *uown = calloc(U, sizeof *uown);
    int64_t *load = calloc((size_t)L, sizeof *load), total = 0;
    REQUIRE(unit && split && uw && uown && load);
    for (size_t t = 0, o = C; t < T; t++) {
        unit[t] = m->info[t].component >= 0 ? (size_t)m->info[t].component : o++;
        total += wt[t];
    }
    for (int round = 0;; round++) {
        for (size_t u = 0; u < U; u++) uw[u] = (unit_w_t){0, u};
        for (int l = 0; l < L; l++) load[l] = 0;
        for (size_t t = 0; t < T; t++) {
            if (!split[t]) {
                uw[unit[t]].w += wt[t];
                continue;
            }
            int64_t R = m->info[t].shape[0];
            for (int j = 0; j < L; j++) load[j] += wt[t] * ((R * (j + 1)) / L - (R * j) / L) / R;
        }
        qsort(uw, U, sizeof *uw, by_weight);
        for (size_t i = 0; i < U; i++) {
            int b = 0;
            for (int l = L - 1; l >= 0; l--)
                if (load[l] <= load[b]) b = l;
            uown[uw[i].u] = b;
            load[b] += uw[i].w;
        }
        int64_t top = 0;
        for (int l = 0; l < L; l++)
            if (load[l] > top) top = load[l];
        if (round == 0) *lpt_busiest = top;
        *busiest = top;
        if ((double)top <= 1.1 * (double)total / L + 1e-9) break;
        size_t pick = T;
        for (size_t t = 0; t < T; t++)
            if (!split[t] && m->info[t].ndim >= 2 && m->info[t].shape[0] >= L && L > 1 &&
                (pick == T || wt[t] > wt[pick]))
                pick = t;
        if (pick == T) break;
        split[pick] = 1;
    }
    size_t npc = 0;
    for (size_t t = 0; t < T; t++) npc += split[t] ? (size_t)L : 1;
    piece_t *pcs = calloc(npc, sizeof *pcs);
    REQUIRE(pcs);
    size_t q = 0;
    for (size_t t = 0; t < T; t++) {
        if (!split[t]) {
            pcs[q++] = (piece_t){t, 0, m->info[t].ndim ? m->info[t].shape[0] : 1, 0, m->n[t],
                                 uown[unit[t]]};
            continue;
        }
        int64_t R = m->info[t].shape[0], row = m->n[t] / R;
        for (int j = 0; j < L; j++) {
            int64_t r0 = (R * j) / L, r1 = (R * (j + 1)) / L;
            pcs[q++] = (piece_t){t, r0, r1 - r0, r0 * row, (r1 - r0) * row, j};
        }
    }
    free(unit);
    free(split);
    free(uw);
    free(uown);
    free(load);
    *np_out = npc;
    return pcs;
}

/* The reference of one method: per node and tensor the owner's residual
 * (the pieces' rows of it); per node and piece the sums. */
typedef struct reference {
    int N, L;
    size_t np;
    const piece_t *pc;
    float ***e;    /* [N][T][n] */
    float **out;   /* [T][n] the averaged result */
    double **sent; /* [N][np] Σ over steps of the values sent */
    double **in;   /* [N][np] Σ over steps of the node sums */
} reference_t;

static void ref_init(reference_t *R, const mpi_model_t *m, int N, int L, const piece_t *pc,
                     size_t npc)
{
    R->N = N;
    R->L = L;
    R->np = npc;
    R->pc = pc;
    R->e = calloc((size_t)N, sizeof *R->e);
    R->sent = calloc((size_t)N, sizeof *R->sent);
    R->in = calloc((size_t)N, sizeof *R->in);
    REQUIRE(R->e && R->sent && R->in);
    for (int k = 0; k < N; k++) {
        R->e[k] = mpi_grads_alloc(m);
        REQUIRE((R->sent[k] = calloc(npc, sizeof(double))));
        REQUIRE((R->in[k] = calloc(npc, sizeof(double))));
    }
    R->out = mpi_grads_alloc(m);
}

static void ref_free(reference_t *R, const mpi_model_t *m)
{
    for (int k = 0; k < R->N; k++) {
        mpi_grads_free(m, R->e[k]);
        free(R->sent[k]);
        free(R->in[k]);
    }
    free(R->e);
    free(R->sent);
    free(R->in);
    mpi_grads_free(m, R->out);
}

/* One step of the reference: what every rank must end with. Each piece is
 * sparsified on its own (its rows as a tensor: ADTopk per row, the phase
 * of its owner's shard plan). */
static void ref_step(reference_t *R, const mpi_model_t *m, const igrad_engine_t *e,
                     const igrad_config_t *c, int64_t step)
{
    int P = R->N * R->L;
    float inv = 1.0f / (float)P;
    float *ns = NULL;
    int64_t nmax = 0;
    for (size_t t = 0; t < m->T; t++) nmax = m->n[t] > nmax ? m->n[t] : nmax;
    ns = calloc((size_t)nmax, sizeof *ns);
    uint32_t *idx = calloc((size_t)nmax, sizeof *idx);
    float *val = calloc((size_t)nmax, sizeof *val);
    igrad_select_ws_t *ws = NULL;
    REQUIRE(ns && idx && val && igrad_select_ws_create(&ws) == IGRAD_OK);
    for (size_t t = 0; t < m->T; t++) memset(R->out[t], 0, (size_t)m->n[t] * sizeof(float));
    for (size_t q = 0; q < R->np; q++) {
        const piece_t *pc = &R->pc[q];
        size_t t = pc->t;
        const igrad_tensor_info_t *ti = &m->info[t];
        igrad_tensor_plan_t tp;
        size_t et = 0;
        int64_t er0 = 0, err = 0;
        int eo = 0;
        const float *eres = NULL;
        REQUIRE(igrad__hier_piece(e, q, &et, &er0, &err, &eo, &tp, &eres));
        int released = tp.phase >= 0 && step % c->release_period == tp.phase;
        int sent = tp.every_step || released;
        int64_t shape[IGRAD_MAX_DIMS];
        memcpy(shape, ti->shape, sizeof shape);
        if (ti->ndim > 0) shape[0] = pc->rows;
        for (int k = 0; k < R->N; k++) {
            float *res = R->e[k][t] + pc->off;
            for (int64_t i = 0; i < pc->n; i++) {
                float s = 0.0f;
                for (int l = 0; l < R->L; l++)
                    s += mpi_value_2p10(k * R->L + l, step, t, pc->off + i);
                ns[i] = s;
                R->in[k][q] += s;
            }
            if (c->method == IGRAD_METHOD_DENSE) {
                for (int64_t i = 0; i < pc->n; i++) R->out[t][pc->off + i] += ns[i];
                continue;
            }
            if (!sent) {
                for (int64_t i = 0; i < pc->n; i++) res[i] += ns[i];
                continue;
            }
            double scale = released && c->method == IGRAD_METHOD_IG
                               ? c->release_keep * (double)c->release_period
                               : 1.0;
            igrad_select_spec_t sp;
            REQUIRE(igrad_select_spec(IGRAD_SPARSIFIER_ADTOPK, c->density, scale, 0, step,
                                      ti->ndim, shape, &sp) == IGRAD_OK);
            CHECK(sp.count == (released ? tp.release_count : tp.count),
                  "tensor %s rows %lld+%lld: reference count %lld, plan %lld", ti->name,
                  (long long)pc->row0, (long long)pc->rows, (long long)sp.count,
                  (long long)(released ? tp.release_count : tp.count));
            igrad_selection_t sel = {idx, val, 0, 0, 0.0};
            REQUIRE(igrad_select_ef(ns, res, &sp, ti->name, ws, &sel) == IGRAD_OK);
            for (int64_t j = 0; j < sel.count; j++) {
                int64_t flat = sp.row_wise ? (j / sp.per_row) * sp.cols + idx[j] : idx[j];
                R->out[t][pc->off + flat] += val[j] * inv;
                R->sent[k][q] += val[j];
            }
        }
    }
    if (c->method == IGRAD_METHOD_DENSE)
        for (size_t t = 0; t < m->T; t++)
            for (int64_t i = 0; i < m->n[t]; i++) R->out[t][i] *= inv;
    igrad_select_ws_free(ws);
    free(ns);
    free(idx);
    free(val);
}

static int same_floats(const float *a, const float *b, int64_t n)
{
    return memcmp(a, b, (size_t)n * sizeof(float)) == 0;
}

/* The engine against the reference over STEPS steps; statistics against
 * the plan. */
static void check_method(const mpi_model_t *m, igrad_method_t method, int rpn)
{
    igrad_config_t c = config_of(method, rpn);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *e = NULL;
    CHECK_OK(igrad_engine_create(m->L, m->prof, &c, comm, &e));
    if (!e) {
        igrad_comm_free(comm);
        return;
    }
    /* the node shape MPI gave (rpn 0) or the config's */
    int L = rpn;
    if (L == 0) {
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node);
        MPI_Comm_size(node, &L);
        MPI_Comm_free(&node);
    }
    int N = np / L, local = me % L, node = me / L;
    const char *mn = igrad_method_name(method);

    /* the engine's pieces are the rule's; every piece has exactly one owner
     * per node; the busiest shard within the bound; a split tensor's
     * residual is no rank's whole */
    size_t np_rule = 0;
    int64_t busiest = 0, lpt_busiest = 0, total = 0;
    int64_t *wt = rule_weights(m, &c, N);
    for (size_t t = 0; t < m->T; t++) total += wt[t];
    piece_t *pcs = rule_pieces(m, wt, L, &np_rule, &busiest, &lpt_busiest);
    size_t np_engine = 0;
    int64_t *shard = calloc((size_t)L, sizeof *shard);
    REQUIRE(shard);
    for (;; np_engine++) {
        size_t t = 0;
        int64_t r0 = 0, rows = 0;
        int owner = 0;
        igrad_tensor_plan_t tp;
        const float *res = NULL;
        if (!igrad__hier_piece(e, np_engine, &t, &r0, &rows, &owner, &tp, &res)) break;
        if (np_engine >= np_rule) continue;
        const piece_t *q = &pcs[np_engine];
        CHECK(t == q->t && r0 == q->row0 && rows == q->rows && owner == q->owner,
              "%s L %d: piece %zu is tensor %zu rows %lld+%lld on %d, the rule's tensor %zu rows "
              "%lld+%lld on %d",
              mn, L, np_engine, t, (long long)r0, (long long)rows, owner, q->t,
              (long long)q->row0, (long long)q->rows, q->owner);
        shard[q->owner] += q->rows == (m->info[t].ndim ? m->info[t].shape[0] : 1)
                               ? wt[t]
                               : wt[t] * q->rows / m->info[t].shape[0];
        int mine = res != NULL, owners = 0;
        MPI_Allreduce(&mine, &owners, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
        if (method != IGRAD_METHOD_DENSE)
            CHECK(owners == N && (!mine || owner == local),
                  "%s: piece %zu has %d owners over %d nodes", mn, np_engine, owners, N);
        if (q->rows != (m->info[t].ndim ? m->info[t].shape[0] : 1))
            CHECK(igrad_engine_residual(e, t) == NULL,
                  "%s: split tensor %s has a whole residual", mn, m->info[t].name);
    }
    CHECK(np_engine == np_rule, "%s L %d: the engine has %zu pieces, the rule %zu", mn, L,
          np_engine, np_rule);
    int64_t top = 0;
    for (int l = 0; l < L; l++) top = shard[l] > top ? shard[l] : top;
    CHECK(top == busiest, "%s L %d: busiest shard %lld bytes, the rule's %lld", mn, L,
          (long long)top, (long long)busiest);
    /* within the bound whenever a split can reach it (this file's layouts:
     * always) */
    CHECK((double)top <= 1.1 * (double)total / L + 1e-9,
          "%s L %d: busiest shard %lld planned bytes > 1.10 x %lld / %d", mn, L, (long long)top,
          (long long)total, L);
    free(shard);
    free(wt);
    if (me == 0 && method != IGRAD_METHOD_DENSE)
        printf("mpi_hier: %s L %d: %zu pieces for %zu tensors; busiest shard %lld bytes "
               "(%.3f x total/L; whole units: %.3f)\n",
               mn, L, np_rule, m->T, (long long)top, (double)top * L / (double)total,
               (double)lpt_busiest * L / (double)total);

    igrad_config_t plan_cfg = c;
    plan_cfg.ranks_per_node = L;
    igrad_engine_t *plan = NULL;
    CHECK_OK(igrad_engine_create_plan(m->L, m->prof, &plan_cfg, np, &plan));
    igrad_planned_bucket_t pb[64];

    reference_t R;
    ref_init(&R, m, N, L, pcs, np_rule);
    float **g = mpi_grads_alloc(m);
    for (int64_t s = 0; s < STEPS; s++) {
        mpi_grads_fill(m, g, me, s);
        CHECK_OK(igrad_engine_sync(e, s, g));
        ref_step(&R, m, e, &c, s);
        for (size_t t = 0; t < m->T; t++)
            CHECK(same_floats(g[t], R.out[t], m->n[t]), "%s L %d step %lld: tensor %s differs "
                  "from the reference", mn, L, (long long)s, m->info[t].name);
        for (size_t q = 0; q < np_rule && method != IGRAD_METHOD_DENSE; q++) {
            size_t t = 0;
            int64_t r0 = 0, rows = 0;
            int owner = 0;
            igrad_tensor_plan_t tp;
            const float *res = NULL;
            REQUIRE(igrad__hier_piece(e, q, &t, &r0, &rows, &owner, &tp, &res));
            if (!res) continue;
            const piece_t *pc = &pcs[q];
            CHECK(same_floats(res, R.e[node][t] + pc->off, pc->n),
                  "%s step %lld: residual of %s rows %lld+%lld differs from the reference", mn,
                  (long long)s, m->info[t].name, (long long)pc->row0, (long long)pc->rows);
            double sum = 0.0;
            for (int64_t i = 0; i < pc->n; i++) sum += res[i];
            CHECK(fabs(R.in[node][q] - (R.sent[node][q] + sum)) <=
                      1e-9 * (1.0 + fabs(R.in[node][q])),
                  "%s step %lld: conservation of %s rows %lld+%lld: node sums %.17g, sent + "
                  "residual %.17g",
                  mn, (long long)s, m->info[t].name, (long long)pc->row0, (long long)pc->rows,
                  R.in[node][q], R.sent[node][q] + sum);
        }
        /* statistics: the plan's, and the levels */
        igrad_step_stats_t st, ps;
        CHECK_OK(igrad_engine_last_stats(e, &st));
        /* windows in step order: the node sums, the shard's buckets (when it
         * has any), the broadcasts, all within the step */
        const double *w = st.comm_window_ms;
        CHECK(w[2] > 0 && w[3] >= w[2] && w[4] >= w[3] && w[5] >= w[4] &&
                  w[5] - w[2] <= st.total_ms + 1e-9 &&
                  (w[0] == 0 || (w[0] >= w[3] && w[1] >= w[0] && w[4] >= w[1])),
              "%s step %lld: windows %.3f %.3f | %.3f %.3f | %.3f %.3f (total %.3f ms)", mn,
              (long long)s, w[0], w[1], w[2], w[3], w[4], w[5], st.total_ms);
        size_t nb = 0;
        CHECK_OK(igrad_engine_plan_step(plan, s, &ps, pb, 64, &nb));
        int64_t pay = 0;
        double wire = 0.0;
        for (size_t j = 0; j < nb && j < 64; j++)
            if (pb[j].local_rank == local) {
                pay += pb[j].payload_nbytes;
                wire += pb[j].wire_nbytes;
            }
        CHECK(pay == st.payload_nbytes, "%s step %lld: payload planned %lld, measured %lld", mn,
              (long long)s, (long long)pay, (long long)st.payload_nbytes);
        CHECK(fabs(wire - st.inter_wire_nbytes) <= 1e-6 * (1.0 + wire),
              "%s step %lld: inter-node bytes planned %.17g, measured %.17g", mn, (long long)s,
              wire, st.inter_wire_nbytes);
        double intra = 2.0 * (L - 1) / L * 4.0 * (double)igrad_layout_total_count(m->L);
        CHECK(st.intra_wire_nbytes == intra && ps.intra_wire_nbytes == intra,
              "%s step %lld: intra-node bytes %.17g (plan %.17g), expected %.17g", mn,
              (long long)s, st.intra_wire_nbytes, ps.intra_wire_nbytes, intra);
        CHECK(st.wire_nbytes == st.intra_wire_nbytes + st.inter_wire_nbytes,
              "%s: wire is not intra + inter", mn);
        int64_t pmax = 0;
        MPI_Allreduce(&st.payload_nbytes, &pmax, 1, MPI_INT64_T, MPI_MAX, MPI_COMM_WORLD);
        CHECK(pmax == ps.payload_nbytes, "%s step %lld: busiest shard planned %lld, measured %lld",
              mn, (long long)s, (long long)ps.payload_nbytes, (long long)pmax);
    }
    if (me == 0)
        printf("mpi_hier: %s, %d nodes x %d ranks: %d steps equal the reference\n", mn, N, L,
               STEPS);
    ref_free(&R, m);
    free(pcs);
    mpi_grads_free(m, g);
    igrad_engine_free(plan);
    igrad_engine_free(e);
    igrad_comm_free(comm);
}

/* Errors found at the agreement fail every rank alike and change nothing. */
static void check_agreement(const mpi_model_t *m, int rpn)
{
    igrad_config_t c = config_of(IGRAD_METHOD_IG, rpn);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *e = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &e) == IGRAD_OK);
    float **g = mpi_grads_alloc(m);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(e, 0, g));

    /* snapshot of the residuals this rank owns */
    float **snap = mpi_grads_alloc(m);
    for (size_t t = 0; t < m->T; t++)
        if (igrad_engine_residual(e, t))
            memcpy(snap[t], igrad_engine_residual(e, t), (size_t)m->n[t] * sizeof(float));
    size_t bad_t = 5;

    /* a NaN on the last rank */
    mpi_grads_fill(m, g, me, 1);
    if (me == np - 1) g[bad_t][3] = NAN;
    CHECK_STATUS(igrad_engine_sync(e, 1, g), IGRAD_E_NONFINITE);
    CHECK(strstr(igrad_last_error(), m->info[bad_t].name) != NULL,
          "the NaN's message does not name %s: %s", m->info[bad_t].name, igrad_last_error());
    igrad_step_stats_t st;
    igrad_engine_last_stats(e, &st);
    CHECK(st.skipped == 1, "a NaN step is not marked skipped");
    for (size_t t = 0; t < m->T; t++) {
        const float *r = igrad_engine_residual(e, t);
        if (r) CHECK(same_floats(r, snap[t], m->n[t]), "a NaN step changed residual %zu", t);
        if (!(me == np - 1 && t == bad_t)) {
            int same = 1;
            for (int64_t i = 0; i < m->n[t]; i++) same &= g[t][i] == mpi_value_2p10(me, 1, t, i);
            CHECK(same, "a NaN step changed the gradient of tensor %zu", t);
        }
    }
    /* a NULL gradient on rank 0 */
    mpi_grads_fill(m, g, me, 1);
    float *keep = g[2];
    if (me == 0) g[2] = NULL;
    CHECK_STATUS(igrad_engine_sync(e, 1, g), IGRAD_E_INVALID);
    g[2] = keep;
    /* ranks at different steps */
    CHECK_STATUS(igrad_engine_sync(e, me == 1 ? 2 : 1, g), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "step") != NULL, "step mismatch message: %s",
          igrad_last_error());
    /* and the step then runs */
    CHECK_OK(igrad_engine_sync(e, 1, g));
    igrad_engine_last_stats(e, &st);
    CHECK(st.skipped == 0, "the retried step is skipped");

    /* two-phase and streamed steps are refused by name */
    const igrad_bucket_t *bk = NULL;
    size_t nbk = 0;
    CHECK_STATUS(igrad_engine_begin(e, 2, g, &bk, &nbk), IGRAD_E_UNSUPPORTED);
    CHECK_STATUS(igrad_engine_open(e, 2), IGRAD_E_UNSUPPORTED);
    igrad_engine_free(e);

    /* a config differing on one rank: every rank fails, naming it */
    igrad_config_t c2 = c;
    if (me == np - 1) c2.density = 0.02;
    e = NULL;
    CHECK_STATUS(igrad_engine_create(m->L, m->prof, &c2, comm, &e), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.density") != NULL, "density mismatch: %s",
          igrad_last_error());
    /* one rank flat: the same exchange, the topology named */
    c2 = c;
    if (me == 0) c2.topology = IGRAD_TOPOLOGY_FLAT;
    CHECK_STATUS(igrad_engine_create(m->L, m->prof, &c2, comm, &e), IGRAD_E_MISMATCH);
    CHECK(strstr(igrad_last_error(), "config.topology") != NULL, "topology mismatch: %s",
          igrad_last_error());
    /* ranks_per_node that does not divide P */
    c2 = c;
    c2.ranks_per_node = np + 1;
    CHECK_STATUS(igrad_engine_create(m->L, m->prof, &c2, comm, &e), IGRAD_E_INVALID);
    CHECK(e == NULL, "a failed create returned an engine");
    mpi_grads_free(m, g);
    mpi_grads_free(m, snap);
    igrad_comm_free(comm);
}

/* Saved after step 5, loaded into a new engine: steps 6.. replay exactly. */
static void check_resume(const mpi_model_t *m, int rpn)
{
    igrad_config_t c = config_of(IGRAD_METHOD_IG, rpn);
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *a = NULL, *b = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &a) == IGRAD_OK);
    float **g = mpi_grads_alloc(m), **h = mpi_grads_alloc(m);
    char path[128];
    snprintf(path, sizeof path, "mpi_hier_state_np%d_r%d.bin", np, me);
    float ***want = calloc(STEPS, sizeof *want);
    REQUIRE(want);
    for (int64_t s = 0; s < STEPS; s++) {
        mpi_grads_fill(m, g, me, s);
        CHECK_OK(igrad_engine_sync(a, s, g));
        want[s] = mpi_grads_alloc(m);
        for (size_t t = 0; t < m->T; t++)
            memcpy(want[s][t], g[t], (size_t)m->n[t] * sizeof(float));
        if (s == 5) CHECK_OK(igrad_engine_save_state(a, path));
    }
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &b) == IGRAD_OK);
    CHECK_OK(igrad_engine_load_state(b, path));
    CHECK(igrad_engine_step(b) == 5, "the loaded engine is at step %lld",
          (long long)igrad_engine_step(b));
    for (int64_t s = 6; s < STEPS; s++) {
        mpi_grads_fill(m, h, me, s);
        CHECK_OK(igrad_engine_sync(b, s, h));
        for (size_t t = 0; t < m->T; t++)
            CHECK(same_floats(h[t], want[s][t], m->n[t]),
                  "resumed step %lld: tensor %zu differs", (long long)s, t);
    }
    /* a file of another rank (another shard, or another node's) is refused
     * on every rank */
    char other[128];
    snprintf(other, sizeof other, "mpi_hier_state_np%d_r%d.bin", np, (me + 1) % np);
    igrad_engine_t *x = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &x) == IGRAD_OK);
    MPI_Barrier(MPI_COMM_WORLD);
    igrad_status_t ls = igrad_engine_load_state(x, other);
    CHECK(ls != IGRAD_OK, "rank %d loaded rank %d's state file", me, (me + 1) % np);
    int lsi = (int)ls, lmin = 0, lmax = 0;
    MPI_Allreduce(&lsi, &lmin, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&lsi, &lmax, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lmin == lmax, "ranks disagree on loading another rank's file (%d vs %d)", lmin, lmax);
    igrad_engine_free(x);
    MPI_Barrier(MPI_COMM_WORLD);
    remove(path);
    for (int64_t s = 0; s < STEPS; s++) mpi_grads_free(m, want[s]);
    free(want);
    mpi_grads_free(m, g);
    mpi_grads_free(m, h);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(comm);
}

/* The dense warm-up of a two-level engine (start_iter 3, adtopk_sync):
 * steps 0-2 equal a two-level method dense engine's bit for bit with its
 * statistics' bytes and buckets, steps 3-5 equal a two-level engine
 * without warm-up started at step 3. */
static void check_warmup(const mpi_model_t *m, int rpn)
{
    igrad_config_t c = config_of(IGRAD_METHOD_ADTOPK_SYNC, rpn);
    c.start_iter = 3;
    igrad_config_t d = config_of(IGRAD_METHOD_DENSE, rpn), r = c;
    r.start_iter = 0;
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_engine_t *w = NULL, *de = NULL, *ref = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c, comm, &w) == IGRAD_OK);
    REQUIRE(igrad_engine_create(m->L, m->prof, &d, comm, &de) == IGRAD_OK);
    REQUIRE(igrad_engine_create(m->L, m->prof, &r, comm, &ref) == IGRAD_OK);
    float **g = mpi_grads_alloc(m), **h = mpi_grads_alloc(m);
    for (int64_t s = 0; s < 6; s++) {
        mpi_grads_fill(m, g, me, s);
        mpi_grads_fill(m, h, me, s);
        igrad_engine_t *other = s < 3 ? de : ref;
        CHECK_OK(igrad_engine_sync(w, s, g));
        CHECK_OK(igrad_engine_sync(other, s, h));
        for (size_t t = 0; t < m->T; t++)
            CHECK(same_floats(g[t], h[t], m->n[t]), "warm-up rpn %d step %lld: tensor %zu differs",
                  rpn, (long long)s, t);
        igrad_step_stats_t a, b;
        CHECK_OK(igrad_engine_last_stats(w, &a));
        CHECK_OK(igrad_engine_last_stats(other, &b));
        CHECK(a.payload_nbytes == b.payload_nbytes && a.buckets == b.buckets &&
                  a.inter_wire_nbytes == b.inter_wire_nbytes,
              "warm-up rpn %d step %lld: payload %lld, %d buckets; the other %lld, %d", rpn,
              (long long)s, (long long)a.payload_nbytes, a.buckets, (long long)b.payload_nbytes,
              b.buckets);
    }
    mpi_grads_free(m, g);
    mpi_grads_free(m, h);
    igrad_engine_free(w);
    igrad_engine_free(de);
    igrad_engine_free(ref);
    igrad_comm_free(comm);
}

/* A state file of a split layout (the dominant model at ranks_per_node 2)
 * does not load into another split of it (ranks_per_node 4: other row
 * ranges): refused alike on every rank, the engine usable after. */
static void check_split_state(const mpi_model_t *m)
{
    igrad_comm_t *comm = NULL;
    REQUIRE(igrad_comm_create_mpi(NULL, &comm) == IGRAD_OK);
    igrad_config_t c2 = config_of(IGRAD_METHOD_ADTOPK_SYNC, 2),
                   c4 = config_of(IGRAD_METHOD_ADTOPK_SYNC, 4);
    igrad_engine_t *a = NULL, *b = NULL;
    REQUIRE(igrad_engine_create(m->L, m->prof, &c2, comm, &a) == IGRAD_OK);
    REQUIRE(igrad_engine_create(m->L, m->prof, &c4, comm, &b) == IGRAD_OK);
    float **g = mpi_grads_alloc(m);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(a, 0, g));
    char path[128];
    snprintf(path, sizeof path, "mpi_hier_split_np%d_r%d.bin", np, me);
    CHECK_OK(igrad_engine_save_state(a, path));
    MPI_Barrier(MPI_COMM_WORLD);
    igrad_status_t ls = igrad_engine_load_state(b, path);
    CHECK(ls != IGRAD_OK, "rank %d loaded a state file of another split", me);
    int lsi = (int)ls, lmin = 0, lmax = 0;
    MPI_Allreduce(&lsi, &lmin, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    MPI_Allreduce(&lsi, &lmax, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    CHECK(lmin == lmax, "ranks disagree on loading another split's file (%d vs %d)", lmin,
          lmax);
    mpi_grads_fill(m, g, me, 0);
    CHECK_OK(igrad_engine_sync(b, 0, g));
    MPI_Barrier(MPI_COMM_WORLD);
    remove(path);
    mpi_grads_free(m, g);
    igrad_engine_free(a);
    igrad_engine_free(b);
    igrad_comm_free(comm);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &np);
    mpi_model_t m;
    mpi_model_init(&m);
    int rpns[3] = {2, np >= 8 ? 4 : 1, 0};
    for (int k = 0; k < 3; k++) {
        check_method(&m, IGRAD_METHOD_IG, rpns[k]);
        check_method(&m, IGRAD_METHOD_ADTOPK_SYNC, rpns[k]);
        if (k == 0) check_method(&m, IGRAD_METHOD_DENSE, rpns[k]);
    }
    check_agreement(&m, 2);
    check_resume(&m, 2);
    check_warmup(&m, 2);
    /* a dominant embedding (61 % of the entries): split at L = 2 and 4 */
    mpi_model_t big;
    mpi_model_init_vocab(&big, 900);
    for (int rpn = 2; rpn <= 4; rpn += 2) {
        check_method(&big, IGRAD_METHOD_IG, rpn);
        check_method(&big, IGRAD_METHOD_ADTOPK_SYNC, rpn);
        check_method(&big, IGRAD_METHOD_DENSE, rpn);
    }
    check_resume(&big, 2);
    check_split_state(&big);
    mpi_model_free(&big);
    int total = 0;
    MPI_Allreduce(&failures, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (me == 0) printf("mpi_hier: %s (%d failures over %d ranks)\n", total ? "FAILED" : "ok",
                        total, np);
    mpi_model_free(&m);
    MPI_Finalize();
    return total ? 1 : 0;
}
