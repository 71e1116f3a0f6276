/*
 * plan_step.c — the per-step plan: the gate (which tensors are sent and
 * released at a step, where each one's selection is staged) and the
 * blocks and buckets of the step (cut, packed by the policy, routed by
 * the route table, laid out in the arenas). Pure functions of the plan
 * and the step number (and, for the risk policy, its history).
 */
#include "plan/plan.h"
#include "core/sparsifier.h"
#include "plan/route.h"
#include "plan/schedule.h"
#include "plan/step.h"
#include "comm/sparse_allreduce.h"
#include "core/value8.h"

#include <stdlib.h>
#include <string.h>

/* The gate of the step (a pure function of plan and step, so it can run
 * before the check: the data plane may start the sent tensors' selections
 * there) and where each sent tensor's selection goes in the staging
 * memory; the per-tensor results start at 0 / OK. */
void igrad__plan_gate(const igrad__plan_t *p, igrad__step_t *s, int64_t step)
{
    int64_t off = 0;
    int par = igrad__plan_parity(p, step);
    for (size_t t = 0; t < p->ntensors; t++) {
        int ph = p->t[t].phase;
        s->sent[t] = (unsigned char)igrad__schedule_sent(ph, p->cfg.release_period, step);
        s->rel[t] = (unsigned char)(ph >= 0);
        s->stage_off[t] = off;
        s->tsumsq[t] = s->tdropped[t] = 0.0;
        s->tstatus[t] = IGRAD_OK;
        if (s->sent[t]) off += p->t[t].spec[s->rel[t]][par].count;
    }
}

/* ------------------------------------------------------------------------ */
/* One step: blocks and buckets                                             */
/* ------------------------------------------------------------------------ */

/* Cuts the sent tensors into blocks (readiness order: last tensor first),
 * assigns them to buckets and lays the buckets out in the arenas; with
 * update_history the risk policy's history learns the step's blocks (a
 * streamed step does that at close, once the step is known to count). */
igrad_status_t igrad__plan_step(igrad__plan_t *p, igrad__step_t *s, int update_history,
                                unsigned char *send_arena, size_t send_cap,
                                unsigned char *recv_arena, size_t recv_cap)
{
    int par = igrad__plan_parity(p, s->cur_step);
    int dense = igrad__sparsifier_dense(p->sp);
    size_t T = p->ntensors, m = 0;
    int nsent = 0;
    for (size_t k = T; k-- > 0;) {
        if (!s->sent[k]) continue;
        const igrad__plan_tensor_t *tp = &p->t[k];
        int rel = s->rel[k];
        const igrad_select_spec_t *sp = &tp->spec[rel][par];
        int64_t blk = tp->blk_entries[rel][par];
        int idxb = tp->idx_nbytes[rel][par];
        int64_t nb = igrad__pack_split((uint32_t)k, sp->count, blk, p->value_nbytes + idxb,
                                       (int64_t)(T - 1 - k), s->blocks + m);
        for (int64_t b = 0; b < nb; b++) {
            igrad__step_block_t *bi = &s->binfo[m + (size_t)b];
            memset(bi, 0, sizeof *bi);
            bi->tensor = (uint32_t)k;
            bi->idx_nbytes = idxb;
            bi->row_wise = sp->row_wise;
            bi->first = b * blk;
            bi->count = s->blocks[m + (size_t)b].entries;
            igrad__plan_block_code(p, sp, bi);
            if (dense) {
                bi->seg_begin = bi->first;
                bi->seg_count = bi->count;
            } else if (sp->row_wise) {
                bi->row0 = bi->first / sp->per_row;
                bi->seg_begin = bi->row0 * sp->cols;
                bi->seg_count = bi->count / sp->per_row * sp->cols;
            } else {
                bi->seg_begin = 0;
                bi->seg_count = tp->n;
            }
            if (p->per_tensor_buckets) s->bucket_of[m + (size_t)b] = nsent;
        }
        m += (size_t)nb;
        nsent++;
    }
    s->nblk = m;

    int nplan;
    if (p->per_tensor_buckets) {
        nplan = nsent;
        for (int j = 0; j < nplan; j++) s->loads[j] = 0;
        for (size_t i = 0; i < m; i++)
            s->loads[s->bucket_of[i]] += s->blocks[i].nbytes;
    } else {
        nplan = p->cfg.buckets;
        igrad__pack_config_t pc = {.policy = p->cfg.pack,
                                   .nbuckets = nplan,
                                   .history = p->hist.count ? &p->hist : NULL,
                                   .map = &p->map};
        IGRAD_CHECK(igrad__pack_plan(&pc, s->blocks, m, s->pack_scratch,
                                     s->pack_scratch_nbytes, s->bucket_of,
                                     s->loads));
        if (p->hist.count && update_history)
            IGRAD_CHECK(igrad__pack_history_update(&p->hist, s->blocks, m));
    }
    s->nplanned = nplan;
    if (nplan > 0)
        IGRAD_CHECK(
            igrad__pack_bucket_order(s->bucket_of, m, nplan, s->start, s->order));

    size_t P = (size_t)p->nranks;
    size_t send_off = 0, recv_off = 0;
    size_t nbk = 0;
    const igrad__route_link_t link = igrad__route_link_of(&p->cfg, s->step_sar);
    for (int j = 0; j < nplan; j++) {
        size_t first = s->start[j], cnt = s->start[j + 1] - first;
        if (cnt == 0) continue;
        igrad__step_bucket_t *bk = &s->bk[nbk];
        memset(bk, 0, sizeof *bk);
        bk->index = j;
        bk->first = first;
        bk->nblocks = cnt;
        int64_t entries = 0, gbytes = 0, dcount = 0;
        const igrad__step_block_t *prev = NULL;
        for (size_t q = 0; q < cnt; q++) {
            igrad__step_block_t *bi = &s->binfo[s->order[first + q]];
            entries += bi->count;
            gbytes += igrad__value_area_nbytes(p->value_nbytes, bi->count) +
                      igrad__step_block_idx_bytes(bi);
            /* flat blocks of one tensor share its whole-tensor segment */
            int shares = !dense && !bi->row_wise && prev && prev->tensor == bi->tensor;
            bi->seg_owner = !shares;
            if (shares) {
                bi->dense_off = prev->dense_off;
            } else {
                bi->dense_off = (size_t)dcount;
                dcount += bi->seg_count;
            }
            prev = bi;
        }
        bk->entries = entries;
        s->loads[j] = gbytes; /* the wire's bytes (the policy saw the fixed widths') */
        bk->dense_count = (size_t)dcount;
        igrad__route_bucket_t rb = {(int64_t)P, gbytes, dcount, entries};
        bk->route = igrad__route_choose(p->cfg.collective, dense, &rb, &link);
        bk->kind = bk->route->kind;
        bk->route->layout(s, p->nranks, p->value_nbytes, bk, &send_off, &recv_off);
        nbk++;
    }
    if (send_off > send_cap || recv_off > recv_cap)
        return igrad__fail(IGRAD_E_STATE, __FILE__, __LINE__,
                           "step %lld needs %zu + %zu bucket bytes, the plan sized %zu + %zu "
                           "(internal error)",
                           (long long)s->cur_step, send_off, recv_off,
                           send_cap, recv_cap);
    s->nbk = nbk;
    if (!recv_arena) return IGRAD_OK; /* plan-only: no arenas to point into */
    for (size_t j = 0; j < nbk; j++) {
        igrad__step_bucket_t *bk = &s->bk[j];
        igrad_bucket_t *d = &s->desc[j];
        d->kind = bk->kind;
        d->index = bk->index;
        d->recv = recv_arena + bk->recv_off;
        d->recv_nbytes = bk->recv_nbytes;
        bk->route->describe(send_arena, bk, d);
    }
    return IGRAD_OK;
}

igrad_status_t igrad__step_alloc(igrad__step_t *s, const igrad__plan_t *p,
                                const igrad__plan_t *w, int sar)
{
    size_t T = p->ntensors;
    size_t nbm = (size_t)p->nb_max, mb = p->max_blocks;
    if (w && (size_t)w->nb_max > nbm) nbm = (size_t)w->nb_max;
    if (w && w->max_blocks > mb) mb = w->max_blocks;
    if (!mb) mb = 1;
    s->nb_cap = nbm;
    s->blk_cap = mb;
    s->stage_off = calloc(T, sizeof *s->stage_off);
    s->sent = calloc(T, 1);
    s->rel = calloc(T, 1);
    s->work = calloc(T, sizeof *s->work);
    s->tstatus = calloc(T, sizeof *s->tstatus);
    s->tsumsq = calloc(T, sizeof *s->tsumsq);
    s->tnorm = calloc(T, sizeof *s->tnorm);
    s->tdropped = calloc(T, sizeof *s->tdropped);
    s->blocks = calloc(mb, sizeof *s->blocks);
    s->binfo = calloc(mb, sizeof *s->binfo);
    s->bucket_of = calloc(mb, sizeof *s->bucket_of);
    s->order = calloc(mb, sizeof *s->order);
    s->start = calloc(nbm + 1, sizeof *s->start);
    s->loads = calloc(nbm, sizeof *s->loads);
    s->bk = calloc(nbm, sizeof *s->bk);
    s->desc = calloc(nbm, sizeof *s->desc);
    IGRAD_FAIL_IF(!s->stage_off || !s->sent || !s->rel || !s->work || !s->tstatus || !s->tsumsq ||
                      !s->tnorm || !s->tdropped || !s->blocks || !s->binfo || !s->bucket_of ||
                      !s->order || !s->start || !s->loads || !s->bk || !s->desc,
                  IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    if (sar) {
        s->sar = calloc((size_t)p->nb_max, sizeof *s->sar); /* p's buckets only */
        IGRAD_FAIL_IF(!s->sar, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    }
    igrad__plan_sort_work(p, s->work);
    if (!p->per_tensor_buckets || (w && !w->per_tensor_buckets)) {
        int nbk = w && w->cfg.buckets > p->cfg.buckets ? w->cfg.buckets : p->cfg.buckets;
        s->pack_scratch_nbytes = igrad__pack_scratch_nbytes(mb, nbk);
        s->pack_scratch = malloc(s->pack_scratch_nbytes);
        IGRAD_FAIL_IF(!s->pack_scratch, IGRAD_E_NOMEM, "igrad_engine_create: out of memory");
    }
    return IGRAD_OK;
}

void igrad__step_free(igrad__step_t *s, int nb_max)
{
    free(s->stage_off);
    free(s->sent);
    free(s->rel);
    free(s->work);
    free(s->tstatus);
    free(s->tsumsq);
    free(s->tnorm);
    free(s->tdropped);
    free(s->blocks);
    free(s->binfo);
    free(s->bucket_of);
    free(s->order);
    free(s->start);
    free(s->loads);
    free(s->bk);
    free(s->desc);
    if (s->sar)
        for (int j = 0; j < nb_max; j++) igrad__sar_clear(&s->sar[j]);
    free(s->sar);
    free(s->pack_scratch);
}
