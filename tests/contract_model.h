/*
 * contract_model.h — what a step of topk_sync / adtopk_sync must put on the
 * wire, modelled from docs/formats.md §8 (index codes: wire_code_ref.h)
 * and docs/architecture.md §5.1,
 * §5.6, §5.7 (never from src/), and a decoder of bucket bytes that checks
 * them. Shared by test_contract_wire.c (cmocka, one process) and
 * mpi_contract.c (MPI ranks). The includer defines CT_REQUIRE(cond) (a
 * fatal check) and CT_REPORT(...) (prints a failure); the decoders print
 * their first mismatch and return 1, or return 0.
 */
#ifndef IGRAD_CONTRACT_MODEL_H
#define IGRAD_CONTRACT_MODEL_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "igrad.h"
#include "wire_code_ref.h"


typedef struct tensor {
    int64_t n, shape0;
    int ndim;
    float *g, *e;      /* gradient of the step, residual as the doc predicts */
    /* selection of the step */
    int row_wise;
    int64_t rows, cols, per_row, count;
    uint32_t *idx;     /* flat index, or column index (row-wise) */
    float *val;
    int ib;            /* index bytes on the wire */
} tensor_t;

typedef struct model {
    size_t T;
    tensor_t *t;
    igrad_config_t cfg;
    igrad_sparsifier_t sp;
    int P;
} model_t;

/* clamp(ceil(rho * n), 1, n), the product in double as written (§5.1). */
static int64_t doc_budget(int64_t n, double rho)
{
    double k = ceil(rho * (double)n);
    if (k < 1) k = 1;
    if (k > (double)n) k = (double)n;
    return (int64_t)k;
}

static void model_spec(model_t *M, tensor_t *x, int64_t step)
{
    int adtopk = M->sp == IGRAD_SPARSIFIER_ADTOPK && x->ndim >= 2;
    if (adtopk) {
        x->rows = x->shape0;
        x->cols = x->n / x->rows;
        x->per_row = doc_budget(x->cols, M->cfg.density);
        x->count = x->rows * x->per_row;
        x->row_wise = !(M->cfg.interleave && (step % 2 != 0));
    } else {
        x->row_wise = 0;
        x->count = doc_budget(x->n, M->cfg.density);
    }
    if (!x->row_wise) {
        x->rows = 1;
        x->cols = x->n;
        x->per_row = x->count;
    }
    /* formats.md §8: 2 bytes when index_dtype = U16 and the index range
     * (columns, or the tensor's entries) is <= 65536 */
    int64_t range = x->row_wise ? x->cols : x->n;
    x->ib = (M->cfg.index_dtype == IGRAD_DTYPE_U16 && range <= 65536) ? 2 : 4;
}

typedef struct cand {
    float mag;
    uint32_t i;
} cand_t;

static int by_mag_then_index(const void *pa, const void *pb)
{
    const cand_t *a = pa, *b = pb;
    if (a->mag != b->mag) return a->mag > b->mag ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

static int by_index(const void *pa, const void *pb)
{
    uint32_t a = *(const uint32_t *)pa, b = *(const uint32_t *)pb;
    return a < b ? -1 : a > b;
}

/* Top-k of |a| over a[0..len) by a full sort (ties: lower index), indices
 * ascending into idx. */
static void sort_topk(const float *a, int64_t len, int64_t k, cand_t *scratch, uint32_t *idx)
{
    for (int64_t i = 0; i < len; i++) {
        scratch[i].mag = fabsf(a[i]);
        scratch[i].i = (uint32_t)i;
    }
    qsort(scratch, (size_t)len, sizeof *scratch, by_mag_then_index);
    for (int64_t j = 0; j < k; j++) idx[j] = scratch[j].i;
    qsort(idx, (size_t)k, sizeof *idx, by_index);
}

/* a = g + e; S = the spec's entries; e = a with them zeroed (§2, §5.2). */
static void model_select(model_t *M, int64_t step)
{
    for (size_t t = 0; t < M->T; t++) {
        tensor_t *x = &M->t[t];
        model_spec(M, x, step);
        float *a = malloc((size_t)x->n * sizeof *a);
        cand_t *scratch = malloc((size_t)x->n * sizeof *scratch);
        CT_REQUIRE(a);
        CT_REQUIRE(scratch);
        for (int64_t i = 0; i < x->n; i++) a[i] = x->g[i] + x->e[i];
        for (int64_t r = 0; r < x->rows; r++)
            sort_topk(a + r * x->cols, x->cols, x->per_row, scratch, x->idx + r * x->per_row);
        memcpy(x->e, a, (size_t)x->n * sizeof *a);
        for (int64_t r = 0; r < x->rows; r++)
            for (int64_t j = 0; j < x->per_row; j++) {
                int64_t flat = r * x->cols + x->idx[r * x->per_row + j];
                x->val[r * x->per_row + j] = a[flat];
                x->e[flat] = 0.0f;
            }
        free(scratch);
        free(a);
    }
}

/* A block (§5.6): a run of one tensor's selection. */
typedef struct block {
    size_t t;
    int64_t first, entries; /* entries [first, first + entries) of the selection */
    int64_t cost;           /* entries x (4 + index bytes): what the packing policy
                               weighs (the fixed widths, whatever the index code) */
    int64_t wire;           /* its bytes on the gather wire: = cost with index_code
                               fixed; compact: 4 x entries + its coded runs */
} block_t;

static int model_compact(const model_t *M)
{
    return M->cfg.index_code == IGRAD_INDEX_CODE_COMPACT;
}

/* A block's index bytes on the wire (formats.md §8). */
static int64_t model_idx_bytes(const model_t *M, const tensor_t *x, int64_t entries)
{
    if (!model_compact(M)) return entries * x->ib;
    return ref_block_idx_nbytes(x->row_wise, entries, x->per_row, x->cols, x->n, x->ib);
}

/* Blocks in readiness order: last tensor first, a tensor's blocks in order;
 * flat selections cut every block_entries, row-wise ones into whole rows
 * (per_row * max(1, block_entries / per_row) entries). */
static size_t model_blocks(const model_t *M, block_t **out)
{
    size_t nb = 0, cap = 16;
    block_t *b = malloc(cap * sizeof *b);
    CT_REQUIRE(b);
    for (size_t k = 0; k < M->T; k++) {
        size_t t = M->T - 1 - k;
        const tensor_t *x = &M->t[t];
        int64_t E = M->cfg.block_entries;
        if (x->row_wise) {
            int64_t rows_per = E / x->per_row;
            if (rows_per < 1) rows_per = 1;
            E = rows_per * x->per_row;
        }
        for (int64_t f = 0; f < x->count; f += E) {
            if (nb == cap) {
                cap *= 2;
                b = realloc(b, cap * sizeof *b);
                CT_REQUIRE(b);
            }
            int64_t m = x->count - f < E ? x->count - f : E;
            b[nb++] = (block_t){t, f, m, m * (4 + x->ib), 4 * m + model_idx_bytes(M, x, m)};
        }
    }
    *out = b;
    return nb;
}

/* Dense floats of a run of blocks (one bucket): a row-wise block's rows,
 * a flat block's whole tensor unless the previous block of the bucket is a
 * flat block of the same tensor (formats.md §8). */
static int64_t run_dense(const model_t *M, const block_t *b, size_t nb)
{
    int64_t d = 0;
    for (size_t i = 0; i < nb; i++) {
        const tensor_t *x = &M->t[b[i].t];
        if (x->row_wise)
            d += b[i].entries / x->per_row * x->cols;
        else if (!(i > 0 && b[i - 1].t == b[i].t))
            d += x->n;
    }
    return d;
}

static int doc_auto_reduce(int P, int64_t s, int64_t d)
{
    /* §5.7: reduce iff 8·d < P·s (ties gather); P = 1 always gathers */
    return P > 1 && 8 * d < (int64_t)P * s;
}

static int model_kind(const model_t *M, int64_t s, int64_t d)
{
    switch (M->cfg.collective) {
    case IGRAD_COLLECTIVE_GATHER: return IGRAD_BUCKET_GATHER;
    case IGRAD_COLLECTIVE_REDUCE: return IGRAD_BUCKET_REDUCE;
    default:
        return doc_auto_reduce(M->P, s, d) ? IGRAD_BUCKET_REDUCE : IGRAD_BUCKET_GATHER;
    }
}

/* ---- the decoder ---------------------------------------------------------- */

static uint32_t rd_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static float rd_f32(const unsigned char *p)
{
    uint32_t u = rd_u32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static int same_bits(float a, float b)
{
    return memcmp(&a, &b, sizeof a) == 0;
}

typedef struct seen {
    int gather, reduce, mixed_widths, u16_blocks, u32_blocks, rowwise_blocks, flat_blocks;
    int runs[5]; /* compact: coded runs decoded, by code (1 fixed16 .. 4 bitmap) */
} seen_t;

/* A compact block's runs at bytes + *off: each decoded bit by bit
 * (wire_code_ref.h) and compared with the model's selection. */
static int decode_runs(const model_t *M, const block_t *b, const unsigned char *bytes,
                       size_t nbytes, size_t *off, const char *where, seen_t *seen)
{
    const tensor_t *x = &M->t[b->t];
    int64_t k = x->row_wise ? x->per_row : b->entries, u = x->row_wise ? x->cols : x->n;
    int code = ref_choose(k, u, x->ib == 2);
    int64_t nb = ref_nbytes(code, k, u);
    uint32_t *got = malloc((size_t)k * sizeof *got);
    CT_REQUIRE(got);
    for (int64_t r = 0; r < b->entries / k; r++, *off += (size_t)nb) {
        if (*off + (size_t)nb > nbytes) {
            CT_REPORT("%s: tensor %zu run %lld ends past the bucket's %zu bytes\n", where,
                      b->t, (long long)r, nbytes);
            free(got);
            return 1;
        }
        if (ref_decode(code, bytes + *off, k, u, got) != 0) {
            CT_REPORT("%s: tensor %zu run %lld (code %d, k %lld, u %lld, byte %zu) does not "
                      "decode\n", where, b->t, (long long)r, code, (long long)k, (long long)u,
                      *off);
            free(got);
            return 1;
        }
        for (int64_t j = 0; j < k; j++) {
            uint32_t want = x->idx[b->first + r * k + j];
            if (got[j] != want) {
                CT_REPORT("%s: tensor %zu entry %lld of its selection: index %u decoded, %u "
                          "expected (code %d, run at byte %zu)\n",
                          where, b->t, (long long)(b->first + r * k + j), got[j], want, code,
                          *off);
                free(got);
                return 1;
            }
        }
        if (seen) seen->runs[code]++;
    }
    free(got);
    return 0;
}

/* One rank's bytes of a gather bucket holding blocks b[0..nb). */
static int decode_gather(const model_t *M, const block_t *b, size_t nb,
                         const unsigned char *bytes, size_t nbytes, const char *where,
                         seen_t *seen)
{
    size_t off = 0;
    int has2 = 0, has4 = 0;
    for (size_t i = 0; i < nb; i++) { /* values of every block, bucket order */
        const tensor_t *x = &M->t[b[i].t];
        for (int64_t j = 0; j < b[i].entries; j++, off += 4) {
            float want = x->val[b[i].first + j], got = rd_f32(bytes + off);
            if (!same_bits(got, want)) {
                CT_REPORT("%s: tensor %zu entry %lld of its selection: value %.9g on the "
                          "wire, %.9g expected (byte %zu)\n",
                          where, b[i].t, (long long)(b[i].first + j), (double)got,
                          (double)want, off);
                return 1;
            }
        }
        if (x->ib == 2) has2 = 1; else has4 = 1;
    }
    for (int width = 4; width >= 2 && !model_compact(M); width -= 2) /* u32, then u16 */
        for (size_t i = 0; i < nb; i++) {
            const tensor_t *x = &M->t[b[i].t];
            if (x->ib != width) continue;
            for (int64_t j = 0; j < b[i].entries; j++, off += (size_t)width) {
                uint32_t want = x->idx[b[i].first + j];
                uint32_t got = width == 4 ? rd_u32(bytes + off)
                                          : (uint32_t)bytes[off] | (uint32_t)bytes[off + 1] << 8;
                if (got != want) {
                    CT_REPORT("%s: tensor %zu entry %lld of its selection: %d-bit index %u "
                              "on the wire, %u expected (byte %zu)\n",
                              where, b[i].t, (long long)(b[i].first + j), width * 8, got,
                              want, off);
                    return 1;
                }
            }
        }
    for (size_t i = 0; i < nb && model_compact(M); i++) /* coded runs, block order */
        if (decode_runs(M, &b[i], bytes, nbytes, &off, where, seen)) return 1;
    if (off != nbytes) {
        CT_REPORT("%s: decoded %zu bytes of %zu\n", where, off, nbytes);
        return 1;
    }
    if (seen) {
        seen->mixed_widths += has2 && has4;
        for (size_t i = 0; i < nb; i++) {
            const tensor_t *x = &M->t[b[i].t];
            if (x->ib == 2) seen->u16_blocks++; else seen->u32_blocks++;
            if (x->row_wise) seen->rowwise_blocks++; else seen->flat_blocks++;
        }
    }
    return 0;
}

/* Adds the model's selection, scattered over the dense segments of blocks
 * b[0..nb) (formats.md §8), into dense[0..count). */
static void reduce_scatter_add(const model_t *M, const block_t *b, size_t nb, float *dense,
                               size_t count)
{
    size_t base = 0;
    for (size_t i = 0; i < nb; i++) {
        const tensor_t *x = &M->t[b[i].t];
        if (x->row_wise) {
            int64_t first_row = b[i].first / x->per_row;
            for (int64_t j = 0; j < b[i].entries; j++) {
                int64_t e = b[i].first + j, row = e / x->per_row - first_row;
                dense[base + (size_t)(row * x->cols + x->idx[e])] += x->val[e];
            }
            base += (size_t)(b[i].entries / x->per_row * x->cols);
        } else {
            int shares = i > 0 && b[i - 1].t == b[i].t;
            if (shares) base -= (size_t)x->n;
            for (int64_t j = 0; j < b[i].entries; j++) {
                int64_t e = b[i].first + j;
                dense[base + x->idx[e]] += x->val[e];
            }
            base += (size_t)x->n;
        }
    }
    CT_REQUIRE(base == count);
}

/* A reduce bucket before the collective: the dense segments with the
 * selection scattered into zeros, bit for bit. */
static int decode_reduce(const model_t *M, const block_t *b, size_t nb, const float *dense,
                         size_t count, const char *where)
{
    float *want = calloc(count ? count : 1, sizeof *want);
    CT_REQUIRE(want);
    reduce_scatter_add(M, b, nb, want, count);
    for (size_t i = 0; i < count; i++)
        if (!same_bits(dense[i], want[i])) {
            CT_REPORT("%s: dense float %zu is %.9g, %.9g expected\n", where, i,
                      (double)dense[i], (double)want[i]);
            free(want);
            return 1;
        }
    free(want);
    return 0;
}

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Gradients of (rank, step), with ties: every third tensor takes only 16
 * magnitudes. */
static void fill_grads(model_t *M, int rank, int64_t step)
{
    for (size_t t = 0; t < M->T; t++) {
        uint64_t s = 0x1234567ULL + (uint64_t)rank * 0x51ed27ULL + (uint64_t)step * 7919u +
                     t * 104729u;
        for (int64_t i = 0; i < M->t[t].n; i++) {
            uint64_t u = splitmix(&s);
            float x = (t % 3 == 0) ? (float)(u >> 60) / 8.0f
                                   : (float)((double)(u >> 40) / 16777216.0);
            M->t[t].g[i] = (u & 1) ? -x : x;
        }
    }
}

typedef struct tdef {
    const char *name;
    int ndim;
    int64_t shape[2];
} tdef_t;

static void model_init(model_t *M, const tdef_t *defs, size_t T, const igrad_config_t *cfg,
                       int P)
{
    memset(M, 0, sizeof *M);
    M->T = T;
    M->cfg = *cfg;
    M->P = P;
    M->sp = cfg->method == IGRAD_METHOD_TOPK_SYNC ? IGRAD_SPARSIFIER_TOPK
                                                   : IGRAD_SPARSIFIER_ADTOPK;
    M->t = calloc(T, sizeof *M->t);
    CT_REQUIRE(M->t);
    for (size_t t = 0; t < T; t++) {
        tensor_t *x = &M->t[t];
        x->ndim = defs[t].ndim;
        x->shape0 = defs[t].shape[0];
        x->n = defs[t].ndim == 2 ? defs[t].shape[0] * defs[t].shape[1] : defs[t].shape[0];
        x->g = calloc((size_t)x->n, sizeof(float));
        x->e = calloc((size_t)x->n, sizeof(float));
        x->idx = calloc((size_t)x->n, sizeof(uint32_t));
        x->val = calloc((size_t)x->n, sizeof(float));
        CT_REQUIRE(x->g && x->e && x->idx && x->val);
    }
}

static void model_free(model_t *M)
{
    for (size_t t = 0; t < M->T; t++) {
        free(M->t[t].g);
        free(M->t[t].e);
        free(M->t[t].idx);
        free(M->t[t].val);
    }
    free(M->t);
}

#endif /* IGRAD_CONTRACT_MODEL_H */
