/*
 * select.c — error feedback fused with selection. a = grad + residual; keep
 * the spec's entries of largest |a| (topk: flat, adtopk: per row, none:
 * all); residual = a with the kept entries set to 0. Also the budget and
 * spec arithmetic that every rank must agree on, and the sparsifier names.
 * Not here: which tensors are sent when (schedule.c), packing (pack.c), the
 * activity trace (profile.c).
 *
 * How one selection runs, exactly and in O(n):
 *  pass 1, read-only over grad and residual: a is formed in blocks of BLK;
 *    each block is checked for NaN/Inf and compared with a threshold, and
 *    entries with |a| >= threshold are appended, in index order, to a
 *    candidate buffer. The threshold is a high order statistic of a few
 *    thousand samples of |a|, so the buffer ends up holding a small multiple
 *    of k entries and most blocks cost a vector compare. If the buffer fills
 *    up it is compacted to its exact top k and the threshold rises above the
 *    k-th value (a later tie can never beat an earlier one), so any
 *    threshold, even 0, still gives the exact answer in linear time; if
 *    fewer than k entries pass, pass 1 runs again with a lower threshold.
 *  fix-up: the k-th largest |a| among the candidates (radix select on the
 *    float bits, quickselect for small sets); everything above it is kept,
 *    and as many ties as needed, lowest index first.
 *  pass 2: residual = grad + residual in cache-sized chunks, the kept entries
 *    of each chunk zeroed while it is still in cache.
 * Nothing is written to the residual before pass 1 has seen every entry of
 * the tensor, so a NaN/Inf anywhere leaves it bit-identical. That costs one
 * extra read of grad and residual over a plain streaming pass.
 * Rows of a row-wise selection that fit in cache keep a copy of their a, so
 * sampling and retries never go back to memory, and the threshold that
 * worked for one row is tried first on the next.
 * Results are exact, so they do not depend on thresholds, thread counts or
 * the workspace's history: only the time does.
 */
#include "internal.h"
#include "select_internal.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define BLK 16                  /* entries per block of pass 1 */
#define CHUNK 4096              /* entries per chunk of pass 2 */
#define ROW_BUFFERED_MAX 65536  /* rows (or flat tensors) up to this many
                                   entries keep a copy of a (256 KiB) */
#define QSELECT_MAX 2048        /* quickselect below, radix select above */
#define STREAM_SAMPLES 16384    /* most samples for a long range */

/* ------------------------------------------------------------------------ */
/* Names, budgets, specs                                                    */
/* ------------------------------------------------------------------------ */

const char *igrad_sparsifier_name(igrad_sparsifier_t sp)
{
    switch (sp) {
    case IGRAD_SPARSIFIER_NONE: return "none";
    case IGRAD_SPARSIFIER_TOPK: return "topk";
    case IGRAD_SPARSIFIER_ADTOPK: return "adtopk";
    }
    return "unknown";
}

static int name_equal(const char *a, const char *b)
{
    for (; *a && *b; a++, b++) {
        char ca = (*a >= 'A' && *a <= 'Z') ? (char)(*a - 'A' + 'a') : *a;
        if (ca != *b) return 0;
    }
    return *a == *b;
}

igrad_status_t igrad_sparsifier_from_name(const char *name, igrad_sparsifier_t *sp)
{
    IGRAD_FAIL_IF(!name || !sp, IGRAD_E_INVALID, "igrad_sparsifier_from_name: NULL argument");
    static const igrad_sparsifier_t all[] = {IGRAD_SPARSIFIER_NONE, IGRAD_SPARSIFIER_TOPK,
                                             IGRAD_SPARSIFIER_ADTOPK};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if (name_equal(name, igrad_sparsifier_name(all[i]))) {
            *sp = all[i];
            return IGRAD_OK;
        }
    }
    return igrad__fail(IGRAD_E_INVALID, __FILE__, __LINE__,
                       "unknown sparsifier '%s' (none, topk, adtopk)", name);
}

/* ceil(x) clamped to [1, n]; x may be NaN or huge. The product is taken in
 * double exactly as written (no epsilon), so any other implementation that
 * evaluates ceil(density * n) in double agrees with it. */
static int64_t ceil_clamped(double x, int64_t n)
{
    double c = ceil(x);
    if (!(c >= 1.0)) return 1;
    if (c >= (double)n) return n;
    return (int64_t)c;
}

int64_t igrad_budget(int64_t n, double density)
{
    if (n <= 0) return 0;
    return ceil_clamped(density * (double)n, n);
}

igrad_status_t igrad_select_spec(igrad_sparsifier_t sp, double density, double scale,
                                 int interleave, int64_t step, int ndim,
                                 const int64_t *shape, igrad_select_spec_t *out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_select_spec: out is NULL");
    IGRAD_FAIL_IF(sp != IGRAD_SPARSIFIER_NONE && sp != IGRAD_SPARSIFIER_TOPK &&
                      sp != IGRAD_SPARSIFIER_ADTOPK,
                  IGRAD_E_INVALID, "igrad_select_spec: unknown sparsifier %d", (int)sp);
    IGRAD_FAIL_IF(!(density > 0.0 && density <= 1.0), IGRAD_E_INVALID,
                  "igrad_select_spec: density %g outside (0, 1]", density);
    IGRAD_FAIL_IF(!(scale > 0.0 && scale <= DBL_MAX), IGRAD_E_INVALID,
                  "igrad_select_spec: scale %g is not a positive finite number", scale);
    IGRAD_FAIL_IF(ndim < 0 || ndim > IGRAD_MAX_DIMS, IGRAD_E_INVALID,
                  "igrad_select_spec: ndim %d outside 0..%d", ndim, IGRAD_MAX_DIMS);
    IGRAD_FAIL_IF(ndim > 0 && !shape, IGRAD_E_INVALID, "igrad_select_spec: shape is NULL");
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) {
        IGRAD_FAIL_IF(shape[d] <= 0, IGRAD_E_INVALID,
                      "igrad_select_spec: dimension %d is %lld", d, (long long)shape[d]);
        IGRAD_FAIL_IF(n > INT64_MAX / shape[d], IGRAD_E_INVALID,
                      "igrad_select_spec: entry count overflows int64");
        n *= shape[d];
    }
    /* Selections carry 32-bit indices. */
    IGRAD_FAIL_IF(n > (int64_t)UINT32_MAX + 1, IGRAD_E_INVALID,
                  "igrad_select_spec: %lld entries, more than 32-bit indices can address",
                  (long long)n);

    memset(out, 0, sizeof *out);
    out->n = n;
    out->rows = 1;
    out->cols = n;
    if (sp == IGRAD_SPARSIFIER_NONE) {
        out->count = out->per_row = n;
        return IGRAD_OK;
    }
    if (sp == IGRAD_SPARSIFIER_ADTOPK && ndim >= 2) {
        int64_t rows = shape[0], cols = n / rows;
        int64_t per_row = ceil_clamped(scale * (double)igrad_budget(cols, density), cols);
        if (interleave && step % 2 != 0) {
            out->count = out->per_row = rows * per_row;
        } else {
            out->row_wise = 1;
            out->rows = rows;
            out->cols = cols;
            out->per_row = per_row;
            out->count = rows * per_row;
        }
        return IGRAD_OK;
    }
    out->count = out->per_row = ceil_clamped(scale * (double)igrad_budget(n, density), n);
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* Workspace                                                                */
/* ------------------------------------------------------------------------ */

struct igrad_select_ws {
    uint32_t *cidx; /* candidate indices, ascending */
    float *cval;    /* candidate values a */
    size_t ccap;
    uint32_t *keys; /* scratch for order statistics (samples, compaction) */
    size_t kcap;
    float *row;     /* a of one buffered row */
    size_t rcap;
    int policy;     /* IGRAD__SELECT_* */
};

igrad_status_t igrad_select_ws_create(igrad_select_ws_t **out)
{
    IGRAD_FAIL_IF(!out, IGRAD_E_INVALID, "igrad_select_ws_create: out is NULL");
    *out = calloc(1, sizeof **out);
    IGRAD_FAIL_IF(!*out, IGRAD_E_NOMEM, "igrad_select_ws_create: out of memory");
    return IGRAD_OK;
}

void igrad_select_ws_free(igrad_select_ws_t *ws)
{
    if (!ws) return;
    free(ws->cidx);
    free(ws->cval);
    free(ws->keys);
    free(ws->row);
    free(ws);
}

size_t igrad_select_ws_nbytes(const igrad_select_ws_t *ws)
{
    if (!ws) return 0;
    return sizeof *ws + ws->ccap * (sizeof(uint32_t) + sizeof(float)) +
           ws->kcap * sizeof(uint32_t) + ws->rcap * sizeof(float);
}

void igrad__select_ws_force(igrad_select_ws_t *ws, int policy)
{
    if (ws) ws->policy = policy;
}

/* Grows one array to hold at least `count` elements of `size` bytes (the
 * old contents are not kept: every selection starts from scratch). */
static int grow(void **p, size_t *cap, size_t count, size_t size)
{
    if (count <= *cap) return 1;
    size_t want = count + count / 4;
    void *q = malloc(want * size);
    if (!q) return 0;
    free(*p);
    *p = q;
    *cap = want;
    return 1;
}

static igrad_status_t ws_reserve(igrad_select_ws_t *ws, size_t ccap, size_t kcap, size_t rcap)
{
    if (ccap > ws->ccap) {
        /* Both candidate arrays share ccap: grow them together. */
        size_t c1 = ws->ccap, c2 = ws->ccap;
        int ok = grow((void **)&ws->cidx, &c1, ccap, sizeof(uint32_t)) &&
                 grow((void **)&ws->cval, &c2, ccap, sizeof(float));
        if (c1 == c2) ws->ccap = c1;
        else ws->ccap = 0; /* one grew, one did not: treat as empty next time */
        IGRAD_FAIL_IF(!ok, IGRAD_E_NOMEM,
                      "igrad_select_ef: out of memory for %zu candidates", ccap);
    }
    IGRAD_FAIL_IF(!grow((void **)&ws->keys, &ws->kcap, kcap, sizeof(uint32_t)), IGRAD_E_NOMEM,
                  "igrad_select_ef: out of memory for %zu keys", kcap);
    IGRAD_FAIL_IF(!grow((void **)&ws->row, &ws->rcap, rcap, sizeof(float)), IGRAD_E_NOMEM,
                  "igrad_select_ef: out of memory for a row of %zu entries", rcap);
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* Order statistics on the bits of |a|                                      */
/* ------------------------------------------------------------------------ */

/* For non-negative floats (NaN excluded) the bit patterns order like the
 * values, so selection works on integers; |-0| and 0 share key 0. */
static inline uint32_t key_of(float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u & 0x7fffffffu;
}

static inline float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* k-th largest (1-based, 1 <= k <= m) of keys[0..m), by three rounds of
 * most-significant-digit radix (11 + 10 + 10 bits of the 31 that matter).
 * Each round keeps only the keys of the digit holding the answer, in
 * place, so the work is at most 2m per round whatever the data. */
static uint32_t radix_kth(uint32_t *keys, size_t m, size_t k)
{
    static const int shift[3] = {20, 10, 0};
    static const uint32_t mask[3] = {0x7ffu, 0x3ffu, 0x3ffu};
    uint32_t hist[2048];
    uint32_t prefix = 0;
    for (int round = 0; round < 3; round++) {
        int sh = shift[round];
        uint32_t mk = mask[round];
        memset(hist, 0, (mk + 1) * sizeof hist[0]);
        for (size_t i = 0; i < m; i++) hist[(keys[i] >> sh) & mk]++;
        uint32_t d = mk;
        size_t above = 0;
        while (above + hist[d] < k) above += hist[d--];
        k -= above;
        size_t w = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t x = keys[i];
            keys[w] = x;
            w += ((x >> sh) & mk) == d;
        }
        m = w;
        prefix |= d << sh;
    }
    return prefix;
}

static inline uint32_t median3(uint32_t a, uint32_t b, uint32_t c)
{
    if (a > b) { uint32_t t = a; a = b; b = t; }
    if (b > c) b = c;
    return a > b ? a : b;
}

/* k-th largest (1-based) of keys[0..m); reorders keys. Quickselect with a
 * three-way partition (ties cost nothing) for small sets; radix select for
 * large ones, and as the fallback once quickselect has used up a budget of
 * rounds, so the worst case stays linear. */
static uint32_t kth_largest(uint32_t *keys, size_t m, size_t k)
{
    if (m > QSELECT_MAX) return radix_kth(keys, m, k);
    size_t lo = 0, hi = m, t = k - 1; /* t: 0-based position, descending */
    int rounds = 24;
    while (hi - lo > 1) {
        if (rounds-- == 0) return radix_kth(keys + lo, hi - lo, t - lo + 1);
        uint32_t p = median3(keys[lo], keys[lo + (hi - lo) / 2], keys[hi - 1]);
        /* [lo, lt) > p, [lt, i) == p, [gt, hi) < p */
        size_t lt = lo, i = lo, gt = hi;
        while (i < gt) {
            uint32_t x = keys[i];
            if (x > p) {
                keys[i++] = keys[lt];
                keys[lt++] = x;
            } else if (x < p) {
                keys[i] = keys[--gt];
                keys[gt] = x;
            } else {
                i++;
            }
        }
        if (t < lt) hi = lt;
        else if (t < gt) return p;
        else lo = gt;
    }
    return keys[lo];
}

/* ------------------------------------------------------------------------ */
/* Candidate buffer                                                         */
/* ------------------------------------------------------------------------ */

typedef struct cands {
    uint32_t *idx;     /* ascending */
    float *val;
    size_t c;          /* entries held */
    size_t cap;        /* == len, or >= k + BLK so a compaction makes room */
    size_t k;          /* entries to keep */
    float thr;         /* admission: |a| >= thr */
    uint32_t *scratch; /* >= cap keys */
    int compactions;
} cands_t;

/* Reduces the buffer to its exact top k (larger |a| first, then lower
 * index), keeping index order, and raises the threshold above the k-th
 * value: from now on an entry must beat it strictly, since an equal one
 * comes later and loses the tie. Requires c >= k. */
static void cands_compact(cands_t *cs)
{
    size_t c = cs->c, k = cs->k;
    for (size_t i = 0; i < c; i++) cs->scratch[i] = key_of(cs->val[i]);
    uint32_t kth = kth_largest(cs->scratch, c, k);
    size_t greater = 0;
    for (size_t i = 0; i < c; i++) greater += key_of(cs->val[i]) > kth;
    size_t ties = k - greater, w = 0;
    for (size_t i = 0; i < c; i++) {
        uint32_t x = key_of(cs->val[i]);
        int keep = x > kth || (x == kth && ties > 0);
        ties -= x == kth && ties > 0;
        cs->idx[w] = cs->idx[i];
        cs->val[w] = cs->val[i];
        w += (size_t)keep;
    }
    cs->c = w;
    cs->thr = nextafterf(float_of(kth), INFINITY);
    cs->compactions++;
}

/* Bit 0: some |a| >= thr; bit 1: some a is NaN or Inf. Branch-free so the
 * compiler turns it into a few vector compares per block. */
static inline int block_flags_ge(const float *restrict g, const float *restrict e, int nb,
                                 float thr)
{
    int hit = 0, bad = 0;
    for (int j = 0; j < nb; j++) {
        float m = fabsf(g[j] + e[j]);
        hit |= m >= thr;
        bad |= !(m <= FLT_MAX);
    }
    return hit | (bad << 1);
}

static inline int block_flags_a(const float *restrict a, int nb, float thr)
{
    int hit = 0;
    for (int j = 0; j < nb; j++) hit |= fabsf(a[j]) >= thr;
    return hit;
}

/* Same as block_flags_ge, also storing a (buffered rows). */
static inline int block_fill(const float *restrict g, const float *restrict e,
                             float *restrict a, int nb, float thr)
{
    int hit = 0, bad = 0;
    for (int j = 0; j < nb; j++) {
        float x = g[j] + e[j];
        float m = fabsf(x);
        a[j] = x;
        hit |= m >= thr;
        bad |= !(m <= FLT_MAX);
    }
    return hit | (bad << 1);
}

static int first_bad(const float *g, const float *e, int nb)
{
    for (int j = 0; j < nb; j++)
        if (!(fabsf(g[j] + e[j]) <= FLT_MAX)) return j;
    return nb; /* unreachable when called on a flagged block */
}

/* Appends the block's entries with |a| >= thr (branch-free: every entry is
 * written, only the passing ones advance the count). Makes room first. */
static inline void block_append(cands_t *cs, const float *a_or_g, const float *e, int64_t base,
                                int nb)
{
    if (cs->c + (size_t)nb > cs->cap) cands_compact(cs);
    size_t c = cs->c;
    float thr = cs->thr;
    uint32_t *restrict idx = cs->idx;
    float *restrict val = cs->val;
    for (int j = 0; j < nb; j++) {
        float x = e ? a_or_g[j] + e[j] : a_or_g[j];
        idx[c] = (uint32_t)(base + j);
        val[c] = x;
        c += fabsf(x) >= thr;
    }
    cs->c = c;
}

/* Pass 1 straight from grad and residual. @return the first index whose a
 * is not finite, or -1. */
static int64_t collect_ge(const float *restrict g, const float *restrict e, int64_t len,
                          cands_t *cs)
{
    int64_t i = 0;
    for (; i + BLK <= len; i += BLK) {
        int f = block_flags_ge(g + i, e + i, BLK, cs->thr);
        if (__builtin_expect(f != 0, 0)) {
            if (f & 2) return i + first_bad(g + i, e + i, BLK);
            block_append(cs, g + i, e + i, i, BLK);
        }
    }
    if (i < len) {
        int nb = (int)(len - i);
        int f = block_flags_ge(g + i, e + i, nb, cs->thr);
        if (f & 2) return i + first_bad(g + i, e + i, nb);
        if (f) block_append(cs, g + i, e + i, i, nb);
    }
    return -1;
}

/* Pass 1 of a buffered row: also stores a. With have_thr = 0 it only fills
 * and checks (the threshold comes from samples of a afterwards). */
static int64_t collect_fill(const float *restrict g, const float *restrict e,
                            float *restrict a, int64_t len, cands_t *cs, int have_thr)
{
    float thr = have_thr ? cs->thr : INFINITY;
    for (int64_t i = 0; i < len; i += BLK) {
        int nb = len - i < BLK ? (int)(len - i) : BLK;
        int f = nb == BLK ? block_fill(g + i, e + i, a + i, BLK, thr)
                          : block_fill(g + i, e + i, a + i, nb, thr);
        if (__builtin_expect(f != 0, 0)) {
            if (f & 2) return i + first_bad(g + i, e + i, nb);
            if (have_thr) {
                block_append(cs, a + i, NULL, i, nb);
                thr = cs->thr;
            }
        }
    }
    return -1;
}

/* Candidates from a stored row of a (all finite by now). */
static void collect_a(const float *restrict a, int64_t len, cands_t *cs)
{
    for (int64_t i = 0; i < len; i += BLK) {
        int nb = len - i < BLK ? (int)(len - i) : BLK;
        int f = nb == BLK ? block_flags_a(a + i, BLK, cs->thr) : block_flags_a(a + i, nb, cs->thr);
        if (f) block_append(cs, a + i, NULL, i, nb);
    }
}

/* ------------------------------------------------------------------------ */
/* Thresholds from samples                                                  */
/* ------------------------------------------------------------------------ */

static uint64_t splitmix64(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* Rank among m samples whose value should leave at least k of len entries
 * at or above it: the expected m*k/len plus `sigmas` binomial standard
 * deviations and a little. 0 means "no useful threshold: take all". */
static size_t sample_rank(size_t m, size_t k, int64_t len, double sigmas)
{
    double mp = (double)m * (double)k / (double)len;
    double r = ceil(mp + sigmas * sqrt(mp) + 3.0);
    if (r >= (double)m) return 0;
    return (size_t)r;
}

/* Number of samples for a range, and the candidate capacity that the first
 * sampled threshold is expected to need (twice the expected count, at least
 * 2k, never more than len). */
static size_t samples_for(int64_t len, int buffered)
{
    if (buffered) {
        size_t m = (size_t)(len / 16);
        return m < 256 ? 256 : m;
    }
    size_t m = (size_t)(len / 256);
    return m < 1024 ? 1024 : m > STREAM_SAMPLES ? STREAM_SAMPLES : m;
}

/* A buffered range with few entries or a large k takes every entry as a
 * candidate: sampling would not save anything. */
static int take_all(int64_t len, size_t k)
{
    return len <= 256 || 4 * (int64_t)k >= len;
}

static size_t cap_for(int64_t len, size_t k, int buffered, int policy)
{
    size_t cap;
    if (policy == IGRAD__SELECT_FORCE_LOW) {
        cap = k + BLK + k / 8; /* a compaction every k/8 appends */
    } else if (buffered && take_all(len, k)) {
        cap = (size_t)len;
    } else {
        size_t m = samples_for(len, buffered);
        size_t r = sample_rank(m, k, len, 3.0);
        double expect = r ? (double)len * (double)r / (double)m : (double)len;
        cap = (size_t)fmin(2.0 * expect, (double)len) + 4 * BLK;
        if (cap < 2 * k + 4 * BLK) cap = 2 * k + 4 * BLK;
    }
    if (cap < k + BLK) cap = k + BLK;
    if (cap > (size_t)len) cap = (size_t)len;
    return cap;
}

/* Thresholds of the attempts of pass 1, from m sampled keys: ranks r1 and
 * r2 (0 = take all), then 0, which always admits enough. The test policies
 * replace them: FORCE_HIGH with the largest sample (some candidates, too
 * few when k > len/m), then +Inf (none); FORCE_LOW with 0 throughout. */
static void attempt_thresholds(int policy, uint32_t *keys, size_t m, size_t r1, size_t r2,
                               float thr[3])
{
    thr[0] = r1 ? float_of(kth_largest(keys, m, r1)) : 0.0f;
    thr[1] = r2 ? float_of(kth_largest(keys, m, r2)) : 0.0f;
    thr[2] = 0.0f;
    if (policy == IGRAD__SELECT_FORCE_HIGH) {
        thr[0] = m ? float_of(kth_largest(keys, m, 1)) : INFINITY;
        thr[1] = INFINITY;
    } else if (policy == IGRAD__SELECT_FORCE_LOW) {
        thr[0] = thr[1] = 0.0f;
    }
}

/* ------------------------------------------------------------------------ */
/* Selecting k of one range                                                 */
/* ------------------------------------------------------------------------ */

static void cands_emit(cands_t *cs, uint32_t *oidx, float *oval)
{
    if (cs->c > cs->k) cands_compact(cs);
    memcpy(oidx, cs->idx, cs->k * sizeof *oidx);
    memcpy(oval, cs->val, cs->k * sizeof *oval);
}

/* Top k of a range too long to buffer, reading grad and residual directly;
 * indices are relative to the range. Attempts: the sampled threshold, a
 * lower sampled one, then 0 (always enough; compactions keep it linear).
 * @return the first non-finite index, or -1 (selection in oidx/oval). */
static int64_t select_stream(igrad_select_ws_t *ws, const float *g, const float *e,
                             int64_t len, size_t k, uint32_t *oidx, float *oval)
{
    size_t m = samples_for(len, 0);
    size_t r1 = sample_rank(m, k, len, 3.0);
    size_t r2 = r1 ? sample_rank(m, 4 * k, len, 4.0) : 0;
    if (!r1) m = 0;
    uint64_t s = 0x5e1ec7ULL ^ (uint64_t)len;
    for (size_t j = 0; j < m; j++) {
        int64_t p = (int64_t)(((splitmix64(&s) >> 32) * (uint64_t)len) >> 32);
        ws->keys[j] = key_of(g[p] + e[p]);
    }
    float thr[3];
    attempt_thresholds(ws->policy, ws->keys, m, r1, r2, thr);
    cands_t cs = {ws->cidx, ws->cval, 0, cap_for(len, k, 0, ws->policy), k, 0.0f, ws->keys, 0};
    for (int attempt = 0; attempt < 3; attempt++) {
        cs.c = 0;
        cs.thr = thr[attempt];
        int64_t bad = collect_ge(g, e, len, &cs);
        if (bad >= 0) return bad;
        if (cs.c >= k) break;
    }
    cands_emit(&cs, oidx, oval);
    return -1;
}

/* Top k of a range that fits in cache, through ws->row. *hint is the
 * threshold to try first (NaN: none) and receives the one to try next. */
static int64_t select_buffered(igrad_select_ws_t *ws, const float *g, const float *e,
                               int64_t len, size_t k, float *hint, uint32_t *oidx,
                               float *oval)
{
    float *a = ws->row;
    int all = take_all(len, k);
    int policy = ws->policy;
    int have_hint = !all && policy == IGRAD__SELECT_NORMAL && !isnan(*hint);
    cands_t cs = {ws->cidx, ws->cval, 0, cap_for(len, k, 1, policy), k, 0.0f, ws->keys, 0};
    cs.thr = have_hint ? *hint : 0.0f;
    int64_t bad = collect_fill(g, e, a, len, &cs, have_hint);
    if (bad >= 0) return bad;
    if (have_hint && cs.c >= k) {
        if (cs.compactions) *hint = NAN; /* too low: sample the next row */
        cands_emit(&cs, oidx, oval);
        return -1;
    }

    size_t m = all ? 0 : samples_for(len, 1);
    size_t r1 = all ? 0 : sample_rank(m, k, len, 3.0);
    size_t r2 = r1 ? sample_rank(m, 4 * k, len, 4.0) : 0;
    if (!r1) m = 0;
    uint64_t s = 0xb0ffe7ULL ^ (uint64_t)len;
    for (size_t j = 0; j < m; j++) {
        int64_t p = (int64_t)(((splitmix64(&s) >> 32) * (uint64_t)len) >> 32);
        ws->keys[j] = key_of(a[p]);
    }
    float thr[3];
    attempt_thresholds(policy, ws->keys, m, r1, r2, thr);
    *hint = NAN;
    for (int attempt = 0; attempt < 3; attempt++) {
        cs.c = 0;
        cs.thr = thr[attempt];
        cs.compactions = 0;
        collect_a(a, len, &cs);
        if (cs.c >= k) {
            if (attempt == 0 && !cs.compactions && r1) *hint = thr[0];
            break;
        }
    }
    cands_emit(&cs, oidx, oval);
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Passes over the whole tensor                                             */
/* ------------------------------------------------------------------------ */

/* Pass 2: e = g + e, then the kept entries (ascending, relative to the
 * range) are zeroed while their chunk is in cache. */
static inline void add_into(const float *restrict g, float *restrict e, int64_t len)
{
    for (int64_t i = 0; i < len; i++) e[i] = g[i] + e[i];
}

static void write_residual(const float *restrict g, float *restrict e, int64_t len,
                           const uint32_t *kept, size_t nkept)
{
    size_t j = 0;
    for (int64_t s = 0; s < len; s += CHUNK) {
        int64_t end = len - s < CHUNK ? len : s + CHUNK;
        /* A constant trip count lets -O2 vectorize without an epilogue. */
        if (end - s == CHUNK) add_into(g + s, e + s, CHUNK);
        else add_into(g + s, e + s, end - s);
        while (j < nkept && (int64_t)kept[j] < end) e[kept[j++]] = 0.0f;
    }
}

/* Read-only check of a = g + e. @return first non-finite index or -1. */
static int64_t check_finite(const float *restrict g, const float *restrict e, int64_t len)
{
    int64_t i = 0;
    for (; i + BLK <= len; i += BLK)
        if (block_flags_ge(g + i, e + i, BLK, INFINITY) & 2) return i + first_bad(g + i, e + i, BLK);
    if (i < len && (block_flags_ge(g + i, e + i, (int)(len - i), INFINITY) & 2))
        return i + first_bad(g + i, e + i, (int)(len - i));
    return -1;
}

static igrad_status_t fail_nonfinite(const char *name, const float *g, const float *e,
                                     int64_t i)
{
    const char *nm = name ? name : "(unnamed tensor)";
    float gi = g[i], ei = e[i];
    if (isfinite(gi) && isfinite(ei))
        return igrad__fail(IGRAD_E_NONFINITE, __FILE__, __LINE__,
                           "%s: grad + residual overflows at index %lld (grad %g, residual %g)",
                           nm, (long long)i, (double)gi, (double)ei);
    return igrad__fail(IGRAD_E_NONFINITE, __FILE__, __LINE__,
                       "%s: non-finite value at index %lld (grad %g, residual %g)", nm,
                       (long long)i, (double)gi, (double)ei);
}

static igrad_status_t check_spec(const igrad_select_spec_t *sp)
{
    IGRAD_FAIL_IF(sp->n < 1 || sp->n > (int64_t)UINT32_MAX + 1, IGRAD_E_INVALID,
                  "igrad_select_ef: spec has n = %lld", (long long)sp->n);
    IGRAD_FAIL_IF(sp->count < 1 || sp->count > sp->n, IGRAD_E_INVALID,
                  "igrad_select_ef: spec keeps %lld of %lld entries", (long long)sp->count,
                  (long long)sp->n);
    if (sp->row_wise) {
        IGRAD_FAIL_IF(sp->rows < 1 || sp->cols < 1 || sp->n / sp->rows != sp->cols ||
                          sp->n % sp->rows != 0,
                      IGRAD_E_INVALID, "igrad_select_ef: spec rows %lld x cols %lld != n %lld",
                      (long long)sp->rows, (long long)sp->cols, (long long)sp->n);
        IGRAD_FAIL_IF(sp->per_row < 1 || sp->per_row > sp->cols ||
                          sp->count != sp->rows * sp->per_row,
                      IGRAD_E_INVALID,
                      "igrad_select_ef: spec keeps %lld per row of %lld, %lld in all",
                      (long long)sp->per_row, (long long)sp->cols, (long long)sp->count);
    }
    return IGRAD_OK;
}

/* Everything is kept: values = a, residual = 0. */
static igrad_status_t select_dense(const float *restrict g, float *restrict e,
                                   const igrad_select_spec_t *spec, const char *name,
                                   igrad_selection_t *out)
{
    int64_t n = spec->n;
    float *restrict val = out->value;
    int bad = 0;
    for (int64_t i = 0; i < n; i += BLK) {
        int nb = n - i < BLK ? (int)(n - i) : BLK;
        int b = 0;
        for (int j = 0; j < nb; j++) {
            float x = g[i + j] + e[i + j];
            val[i + j] = x;
            b |= !(fabsf(x) <= FLT_MAX);
        }
        if (b) {
            bad = 1;
            break;
        }
    }
    if (bad) return fail_nonfinite(name, g, e, check_finite(g, e, n));
    memset(e, 0, (size_t)n * sizeof *e);
    if (out->index) {
        int64_t cols = spec->row_wise ? spec->cols : n;
        for (int64_t i = 0; i < n; i++) out->index[i] = (uint32_t)(i % cols);
    }
    return IGRAD_OK;
}

igrad_status_t igrad_select_ef(const float *grad, float *residual,
                               const igrad_select_spec_t *spec, const char *name,
                               igrad_select_ws_t *ws, igrad_selection_t *out)
{
    IGRAD_FAIL_IF(!grad || !residual || !spec || !ws || !out, IGRAD_E_INVALID,
                  "igrad_select_ef: NULL argument");
    IGRAD_FAIL_IF(!out->value, IGRAD_E_INVALID, "igrad_select_ef: out->value is NULL");
    IGRAD_CHECK(check_spec(spec));
    int dense = spec->count == spec->n;
    IGRAD_FAIL_IF(!dense && !out->index, IGRAD_E_INVALID,
                  "igrad_select_ef: out->index is NULL for a sparse spec");

    if (dense) {
        IGRAD_CHECK(select_dense(grad, residual, spec, name, out));
    } else {
        int64_t rows = spec->row_wise ? spec->rows : 1;
        int64_t len = spec->row_wise ? spec->cols : spec->n;
        size_t k = (size_t)(spec->row_wise ? spec->per_row : spec->count);
        int buffered = len <= ROW_BUFFERED_MAX;
        size_t ccap = cap_for(len, k, buffered, ws->policy);
        size_t m = samples_for(len, buffered);
        IGRAD_CHECK(ws_reserve(ws, ccap, ccap > m ? ccap : m, buffered ? (size_t)len : 0));

        float hint = NAN;
        for (int64_t r = 0; r < rows; r++) {
            const float *g = grad + r * len;
            const float *e = residual + r * len;
            uint32_t *oidx = out->index + (size_t)r * k;
            float *oval = out->value + (size_t)r * k;
            int64_t bad = buffered ? select_buffered(ws, g, e, len, k, &hint, oidx, oval)
                                   : select_stream(ws, g, e, len, k, oidx, oval);
            if (bad >= 0) return fail_nonfinite(name, grad, residual, r * len + bad);
        }
        for (int64_t r = 0; r < rows; r++)
            write_residual(grad + r * len, residual + r * len, len,
                           out->index + (size_t)r * k, k);
    }

    double sumsq = 0.0;
    for (int64_t i = 0; i < spec->count; i++) sumsq += (double)out->value[i] * out->value[i];
    out->count = spec->count;
    out->row_wise = spec->row_wise;
    out->sumsq = sumsq;
    return IGRAD_OK;
}

igrad_status_t igrad_residual_accumulate(const float *grad, float *residual, int64_t n,
                                         const char *name)
{
    IGRAD_FAIL_IF(!grad || !residual, IGRAD_E_INVALID,
                  "igrad_residual_accumulate: NULL argument");
    IGRAD_FAIL_IF(n < 0, IGRAD_E_INVALID, "igrad_residual_accumulate: n = %lld",
                  (long long)n);
    int64_t bad = check_finite(grad, residual, n);
    if (bad >= 0) return fail_nonfinite(name, grad, residual, bad);
    write_residual(grad, residual, n, NULL, 0);
    return IGRAD_OK;
}
