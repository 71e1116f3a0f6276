/*
 * select.c — error feedback fused with selection. a = grad + residual; keep
 * the spec's entries of largest |a| (topk: flat, adtopk: per row, none:
 * all); residual = a with the kept entries set to 0.
 * Not here: the budget and spec arithmetic every rank must agree on and the
 * sparsifier names (select_spec.c), which tensors are sent when
 * (schedule.c), packing (pack.c), the activity trace (profile.c).
 *
 * How one selection runs, exactly and in O(n):
 *  pass 1, read-only over grad and residual: a is formed in small blocks;
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
 * extra read of grad and residual over a plain streaming pass; the engine
 * makes it its finiteness check (igrad__select_find also sums a^2) and
 * runs pass 2 (igrad__select_apply, which also rounds 16-bit wire values
 * into the residual) once the ranks agreed.
 * Rows of a row-wise selection that fit in cache keep a copy of their a, so
 * sampling and retries never go back to memory, and a threshold just below
 * one row's k-th value is tried first on the next. Short rows, or rows
 * where k is a large share, skip thresholds and select directly.
 * Row-wise selections that keep a few entries of each row (the usual case:
 * 3 of 256) skip all of that: a bound per row from its lane maxima in pass
 * 1, then one pass that writes the residual while keeping a short sorted
 * list per row (see "Row-wise selection of a few entries per row").
 * Pass 1 has a portable kernel and an AVX2 one (chosen at run time). Large
 * tensors are cut into pieces on OpenMP threads: pass 2 always, pass 1 of
 * a flat selection as an attempt that falls back to the serial path, both
 * passes of the few-per-row path by rows.
 * Results are exact, so they do not depend on thresholds, kernels, thread
 * counts or the workspace's history: only the time does.
 */
#include "core/internal.h"
#include "dp/cpu/select_internal.h"
#include "core/value16.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

/* The AVX2 pass-1 kernel is compiled on x86-64 and chosen at run time. */
#if defined(__x86_64__) && defined(__GNUC__)
#define IGRAD__HAVE_AVX2 1
#include <immintrin.h>
#else
#define IGRAD__HAVE_AVX2 0
#endif

/* The scan kernels are written once with optional arguments (NULL) and
 * must be inlined into each specialised caller to be vectorized. */
#if defined(__GNUC__)
#define FORCE_INLINE static inline __attribute__((always_inline))
#else
#define FORCE_INLINE static inline
#endif

#define BLK 16                  /* entries per block of the portable pass 1 */
#define BLK_MAX 64              /* largest block of any pass-1 kernel */
#define CHUNK 4096              /* entries per chunk of pass 2 */
#define ROW_BUFFERED_MAX 65536  /* rows (or flat tensors) up to this many
                                   entries keep a copy of a (256 KiB) */
#define QSELECT_MAX 2048        /* quickselect below, radix select above */
#define STREAM_SAMPLES 16384    /* most samples for a long range */
#define HINT_SCALE 0.9f         /* next row's threshold / this row's k-th */
#define PAR_MIN ((int64_t)1 << 20) /* entries per thread worth a fork */
#define PAR_MAX 64              /* most pieces of a parallel pass */

/* Threads for a pass over n entries: OpenMP's current setting, at most one
 * per PAR_MIN entries, and one inside any parallel region, even a team of
 * one (the caller, e.g. the engine, already chose how to spread tensors
 * over threads). Results never depend on it. */
static int par_threads(int64_t n)
{
#ifdef _OPENMP
    if (n < 2 * PAR_MIN || omp_get_level() > 0) return 1;
    int64_t t = omp_get_max_threads(), most = n / PAR_MIN;
    if (t > most) t = most;
    return t > PAR_MAX ? PAR_MAX : (int)t;
#else
    (void)n;
    return 1;
#endif
}

/* Start of piece p of T over [0, n), at a multiple of 64 entries. */
static int64_t piece_start(int64_t n, int p, int T)
{
    return p == T ? n : (int64_t)((uint64_t)n * (uint64_t)p / (uint64_t)T) & ~(int64_t)63;
}

/* ------------------------------------------------------------------------ */
/* Workspace                                                                */
/* ------------------------------------------------------------------------ */

struct igrad_select_ws {
    uint32_t *cidx; /* candidate indices, ascending */
    float *cval;    /* candidate values a */
    size_t ccap;
    uint32_t *keys; /* order statistics: samples or candidate keys, then
                       twice as much room for kth_largest */
    size_t kcap;
    float *row;     /* a of one buffered row */
    size_t rcap;
    int policy;     /* IGRAD__SELECT_* threshold policy (tests) */
    int kernel;     /* IGRAD__SELECT_KERNEL_* (tests) */
    int rows;       /* IGRAD__SELECT_ROWS_* (tests) */
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

void igrad__select_ws_kernel(igrad_select_ws_t *ws, int kernel)
{
    if (ws) ws->kernel = kernel;
}

void igrad__select_ws_rows(igrad_select_ws_t *ws, int rows)
{
    if (ws) ws->rows = rows;
}

/* Makes room for ccap candidates, kcap keys and a row of rcap entries.
 * Old contents are not kept (every selection starts from scratch); a
 * failed allocation leaves that capacity at 0, so the next call retries. */
static igrad_status_t ws_reserve(igrad_select_ws_t *ws, size_t ccap, size_t kcap, size_t rcap)
{
    if (ccap > ws->ccap) {
        size_t want = ccap + ccap / 4;
        free(ws->cidx);
        free(ws->cval);
        ws->cidx = malloc(want * sizeof *ws->cidx);
        ws->cval = malloc(want * sizeof *ws->cval);
        ws->ccap = ws->cidx && ws->cval ? want : 0;
        IGRAD_FAIL_IF(!ws->ccap, IGRAD_E_NOMEM,
                      "igrad_select_ef: out of memory for %zu candidates", ccap);
    }
    if (kcap > ws->kcap) {
        size_t want = kcap + kcap / 4;
        free(ws->keys);
        ws->keys = malloc(want * sizeof *ws->keys);
        ws->kcap = ws->keys ? want : 0;
        IGRAD_FAIL_IF(!ws->kcap, IGRAD_E_NOMEM, "igrad_select_ef: out of memory for %zu keys",
                      kcap);
    }
    if (rcap > ws->rcap) {
        free(ws->row);
        ws->row = malloc(rcap * sizeof *ws->row);
        ws->rcap = ws->row ? rcap : 0;
        IGRAD_FAIL_IF(!ws->rcap, IGRAD_E_NOMEM,
                      "igrad_select_ef: out of memory for a row of %zu entries", rcap);
    }
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
 * The first round reads keys and copies the keys of the digit holding the
 * answer to tmp (room for m); later rounds filter tmp in place. At most 2m
 * steps per round whatever the data; keys is not modified. */
static uint32_t radix_kth(const uint32_t *keys, size_t m, size_t k, uint32_t *tmp)
{
    static const int shift[3] = {20, 10, 0};
    static const uint32_t mask[3] = {0x7ffu, 0x3ffu, 0x3ffu};
    uint32_t hist[2048];
    uint32_t prefix = 0;
    const uint32_t *src = keys;
    for (int round = 0; round < 3; round++) {
        int sh = shift[round];
        uint32_t mk = mask[round];
        memset(hist, 0, (mk + 1) * sizeof hist[0]);
        for (size_t i = 0; i < m; i++) hist[(src[i] >> sh) & mk]++;
        uint32_t d = mk;
        size_t above = 0;
        while (above + hist[d] < k) above += hist[d--];
        k -= above;
        size_t w = 0;
        for (size_t i = 0; i < m; i++) {
            uint32_t x = src[i];
            tmp[w] = x;
            w += ((x >> sh) & mk) == d;
        }
        src = tmp;
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

/* k-th largest (1-based) of keys[0..m), which is not modified; tmp has
 * room for 2m keys. Small sets: quickselect whose partition is branch-free
 * (every key is written to both ends of the other buffer, and only the
 * side it belongs to advances), because the compares of a selection are
 * coin flips to a branch predictor. Large sets, and any quickselect that
 * has not converged after 32 rounds: radix select, so the worst case stays
 * linear. */
static uint32_t kth_largest(const uint32_t *keys, size_t m, size_t k, uint32_t *tmp)
{
    if (m > QSELECT_MAX) return radix_kth(keys, m, k, tmp);
    const uint32_t *src = keys;
    uint32_t *half[2] = {tmp, tmp + m};
    size_t t = k - 1; /* 0-based position, descending */
    for (int round = 0; m > 1; round++) {
        uint32_t *dst = half[round & 1];
        if (round == 32) return radix_kth(src, m, t + 1, dst);
        uint32_t p = median3(src[0], src[m / 2], src[m - 1]);
        size_t ng = 0, nl = 0; /* > p from the front, < p from the back */
        for (size_t i = 0; i < m; i++) {
            uint32_t x = src[i];
            dst[ng] = x;
            dst[m - 1 - nl] = x;
            ng += x > p;
            nl += x < p;
        }
        if (t < ng) {
            src = dst;
            m = ng;
        } else if (t < m - nl) {
            return p;
        } else {
            t -= m - nl;
            src = dst + (m - nl);
            m = nl;
        }
    }
    return src[0];
}

/* ------------------------------------------------------------------------ */
/* Sums of squares                                                          */
/* ------------------------------------------------------------------------ */

/* Sums of squares in double run in eight fixed lanes (vectorizable, and
 * the same order whatever the caller), entry p into lane p % 8, combined
 * in a fixed order. */
static double lanes_total(const double lane[8])
{
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* Sum of squares of v[0..n). */
static double sumsq_of(const float *v, int64_t n)
{
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += (double)v[i + j] * (double)v[i + j];
    for (int j = 0; i < n; i++, j++) lane[j] += (double)v[i] * (double)v[i];
    return lanes_total(lane);
}

/* Sum of squares of a = g + e over [0, n): the check that selection pass 1
 * does for the engine, on entries it has just read (still in cache).
 * Portable C; sumsq_ge_avx2 gives the same bits. */
static double sumsq_ge_generic(const float *restrict g, const float *restrict e, int64_t n)
{
    double lane[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) {
            double a = (double)(g[i + j] + e[i + j]);
            lane[j] += a * a;
        }
    for (int j = 0; i < n; i++, j++) {
        double a = (double)(g[i] + e[i]);
        lane[j] += a * a;
    }
    return lanes_total(lane);
}

/* ------------------------------------------------------------------------ */
/* Candidate buffer                                                         */
/* ------------------------------------------------------------------------ */

typedef struct cands {
    uint32_t *idx;     /* ascending */
    float *val;
    size_t c;          /* entries held */
    size_t cap;        /* == len, or >= k + BLK_MAX so that a compaction
                          makes room for a whole block */
    size_t k;          /* entries to keep */
    float thr;         /* admission: |a| >= thr */
    uint32_t *scratch; /* room for 3 * cap keys */
    int fixed;         /* no compaction: a full buffer sets overflow and the
                          scan stops (parallel pieces) */
    int overflow;
} cands_t;

/* Reduces the buffer to its exact top k (larger |a| first, then lower
 * index), keeping index order, and raises the threshold above the k-th
 * value: from now on an entry must beat it strictly, since an equal one
 * comes later and loses the tie. Requires c >= k. */
static uint32_t cands_compact(cands_t *cs)
{
    size_t c = cs->c, k = cs->k;
    for (size_t i = 0; i < c; i++) cs->scratch[i] = key_of(cs->val[i]);
    uint32_t kth = kth_largest(cs->scratch, c, k, cs->scratch + c);
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
    return kth;
}

/* Before a block of nb entries: room for all of them? Compacts when it
 * may; @return 0 when the buffer is fixed and full (the scan stops). */
static inline int cands_room(cands_t *cs, size_t nb)
{
    if (cs->c + nb <= cs->cap) return 1;
    if (cs->fixed) {
        cs->overflow = 1;
        return 0;
    }
    cands_compact(cs);
    return 1;
}

/* Pass 1 kernels. A scan walks x[0..len) (a = x + y, or a = x when y is
 * NULL), optionally stores a, and appends every entry with |a| >= cs->thr
 * to the candidates, indices offset by `base`. One compare per entry does
 * both jobs: !(|a| < thr) also holds for NaN and Inf, and the rare flagged
 * entries are sorted out one by one. @return the first index (relative to
 * x) whose a is not finite, or -1.
 * Two implementations with identical results: portable C in blocks of BLK
 * (the compiler vectorizes the block test), and AVX2 in blocks of 64 whose
 * compare mask lets the slow path visit only the flagged entries. */

/* What a scan reads and writes; always a constant, so that each inlined
 * copy of a kernel is specialised and its block loop vectorized. */
enum { SCAN_Y = 1, SCAN_STORE = 2 };

FORCE_INLINE float a_at(int mode, const float *x, const float *y, int64_t i)
{
    return (mode & SCAN_Y) ? x[i] + y[i] : x[i];
}

/* Appends entry i if |a| >= thr, branch-free: the slot is written anyway
 * and only a passing entry advances the count. @return 0, or 1 if a is not
 * finite (nothing appended). */
FORCE_INLINE int append_one(cands_t *cs, float v, int64_t index)
{
    float m = fabsf(v);
    if (!(m <= FLT_MAX)) return 1;
    cs->idx[cs->c] = (uint32_t)index;
    cs->val[cs->c] = v;
    cs->c += m >= cs->thr;
    return 0;
}

FORCE_INLINE int64_t scan_generic(int mode, const float *restrict x, const float *restrict y,
                                  float *restrict store, int64_t len, int64_t base,
                                  cands_t *cs)
{
    for (int64_t i = 0; i < len; i += BLK) {
        int nb = len - i < BLK ? (int)(len - i) : BLK;
        float thr = cs->thr;
        int flag = 0;
        if (nb == BLK) { /* constant trip count: vectorized */
            for (int j = 0; j < BLK; j++) {
                float v = a_at(mode, x, y, i + j);
                if (mode & SCAN_STORE) store[i + j] = v;
                flag |= !(fabsf(v) < thr);
            }
        } else {
            for (int j = 0; j < nb; j++) {
                float v = a_at(mode, x, y, i + j);
                if (mode & SCAN_STORE) store[i + j] = v;
                flag |= !(fabsf(v) < thr);
            }
        }
        if (__builtin_expect(flag, 0)) {
            if (!cands_room(cs, (size_t)nb)) return -1;
            for (int j = 0; j < nb; j++)
                if (append_one(cs, a_at(mode, x, y, i + j), base + i + j)) return i + j;
        }
    }
    return -1;
}

static int64_t scan_ge_generic(const float *x, const float *y, int64_t len, int64_t base,
                               cands_t *cs)
{
    return scan_generic(SCAN_Y, x, y, NULL, len, base, cs);
}
static int64_t scan_fill_generic(const float *x, const float *y, float *a, int64_t len,
                                 cands_t *cs)
{
    return scan_generic(SCAN_Y | SCAN_STORE, x, y, a, len, 0, cs);
}
static int64_t scan_a_generic(const float *a, int64_t len, cands_t *cs)
{
    return scan_generic(0, a, NULL, NULL, len, 0, cs);
}

#if IGRAD__HAVE_AVX2
#define AVX2_FN __attribute__((target("avx2"))) static
#define AVX2_INLINE __attribute__((target("avx2"), always_inline)) static inline

AVX2_INLINE int64_t scan_avx2(int mode, const float *restrict x, const float *restrict y,
                              float *restrict store, int64_t len, int64_t base, cands_t *cs)
{
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    int64_t i = 0;
    for (; i + 64 <= len; i += 64) {
        __m256 thr = _mm256_set1_ps(cs->thr);
        uint64_t flag = 0;
        for (int j = 0; j < 64; j += 8) {
            __m256 v = _mm256_loadu_ps(x + i + j);
            if (mode & SCAN_Y) v = _mm256_add_ps(v, _mm256_loadu_ps(y + i + j));
            if (mode & SCAN_STORE) _mm256_storeu_ps(store + i + j, v);
            __m256 ge = _mm256_cmp_ps(_mm256_and_ps(v, absmask), thr, _CMP_NLT_UQ);
            flag |= (uint64_t)(uint32_t)_mm256_movemask_ps(ge) << j;
        }
        if (__builtin_expect(flag != 0, 0)) {
            if (!cands_room(cs, 64)) return -1;
            while (flag) {
                int j = __builtin_ctzll(flag);
                flag &= flag - 1;
                if (append_one(cs, a_at(mode, x, y, i + j), base + i + j)) return i + j;
            }
        }
    }
    if (i < len && !cs->overflow) {
        int64_t bad = scan_generic(mode, x + i, (mode & SCAN_Y) ? y + i : NULL,
                                   (mode & SCAN_STORE) ? store + i : NULL, len - i, base + i, cs);
        if (bad >= 0) return i + bad;
    }
    return -1;
}

AVX2_FN int64_t scan_ge_avx2(const float *x, const float *y, int64_t len, int64_t base,
                             cands_t *cs)
{
    return scan_avx2(SCAN_Y, x, y, NULL, len, base, cs);
}
AVX2_FN int64_t scan_fill_avx2(const float *x, const float *y, float *a, int64_t len,
                               cands_t *cs)
{
    return scan_avx2(SCAN_Y | SCAN_STORE, x, y, a, len, 0, cs);
}
AVX2_FN int64_t scan_a_avx2(const float *a, int64_t len, cands_t *cs)
{
    return scan_avx2(0, a, NULL, NULL, len, 0, cs);
}
#endif

#if IGRAD__HAVE_AVX2
static int use_avx2(const igrad_select_ws_t *ws)
{
    return ws->kernel != IGRAD__SELECT_KERNEL_GENERIC && __builtin_cpu_supports("avx2");
}
#endif

#if IGRAD__HAVE_AVX2
/* sumsq_ge_generic in AVX2: the same eight lanes (two registers of four
 * doubles) and the same operations in the same order (a float add, a
 * conversion, a multiply and an add in double; no FMA), so the same bits. */
AVX2_FN double sumsq_ge_avx2(const float *restrict g, const float *restrict e, int64_t n)
{
    __m256d l0 = _mm256_setzero_pd(), l1 = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 a = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i));
        __m256d d0 = _mm256_cvtps_pd(_mm256_castps256_ps128(a));
        __m256d d1 = _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1));
        l0 = _mm256_add_pd(l0, _mm256_mul_pd(d0, d0));
        l1 = _mm256_add_pd(l1, _mm256_mul_pd(d1, d1));
    }
    double lane[8];
    _mm256_storeu_pd(lane, l0);
    _mm256_storeu_pd(lane + 4, l1);
    for (int j = 0; i < n; i++, j++) {
        double a = (double)(g[i] + e[i]);
        lane[j] += a * a;
    }
    return lanes_total(lane);
}
#endif

/* Sum of a^2 (a = g + e) with the workspace's kernel. */
static double sumsq_ge(const igrad_select_ws_t *ws, const float *g, const float *e, int64_t n)
{
#if IGRAD__HAVE_AVX2
    if (use_avx2(ws)) return sumsq_ge_avx2(g, e, n);
#endif
    (void)ws;
    return sumsq_ge_generic(g, e, n);
}

double igrad__sumsq_ge(const float *g, const float *e, int64_t n)
{
#if IGRAD__HAVE_AVX2
    if (__builtin_cpu_supports("avx2")) return sumsq_ge_avx2(g, e, n);
#endif
    return sumsq_ge_generic(g, e, n);
}

/* Pass 1 straight from grad and residual; candidate indices are offset
 * by `base` (the returned bad index is not). */
static int64_t scan_ge(const igrad_select_ws_t *ws, const float *g, const float *e,
                       int64_t len, int64_t base, cands_t *cs)
{
#if IGRAD__HAVE_AVX2
    if (use_avx2(ws)) return scan_ge_avx2(g, e, len, base, cs);
#endif
    (void)ws;
    return scan_ge_generic(g, e, len, base, cs);
}

/* Pass 1 of a buffered row: also stores a into ws->row. */
static int64_t scan_fill(const igrad_select_ws_t *ws, const float *g, const float *e,
                         int64_t len, cands_t *cs)
{
#if IGRAD__HAVE_AVX2
    if (use_avx2(ws)) return scan_fill_avx2(g, e, ws->row, len, cs);
#endif
    return scan_fill_generic(g, e, ws->row, len, cs);
}

/* Candidates from the stored row (all finite by now). */
static void scan_a(const igrad_select_ws_t *ws, int64_t len, cands_t *cs)
{
#if IGRAD__HAVE_AVX2
    if (use_avx2(ws)) {
        scan_a_avx2(ws->row, len, cs);
        return;
    }
#endif
    scan_a_generic(ws->row, len, cs);
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

/* Number of samples for a range: a sixteenth of a buffered row (it is in
 * cache, at least 256), 1/256 of a long range (1024 to 16384: each sample
 * is a cache miss there). */
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

/* Candidate capacity of a range: twice the count the first sampled
 * threshold is expected to admit, at least 2k, never more than len, and
 * room for a compaction to free a whole block. */
static size_t cap_for(int64_t len, size_t k, int buffered, int policy)
{
    size_t cap;
    if (policy == IGRAD__SELECT_FORCE_LOW) {
        cap = k + BLK_MAX + k / 8; /* a compaction every k/8 appends */
    } else if (buffered && take_all(len, k)) {
        cap = (size_t)len;
    } else {
        size_t m = samples_for(len, buffered);
        size_t r = sample_rank(m, k, len, 3.0);
        double expect = r ? (double)len * (double)r / (double)m : (double)len;
        cap = (size_t)fmin(2.0 * expect, (double)len) + BLK_MAX;
        if (cap < 2 * k + BLK_MAX) cap = 2 * k + BLK_MAX;
    }
    if (cap < k + BLK_MAX) cap = k + BLK_MAX;
    if (cap > (size_t)len) cap = (size_t)len;
    return cap;
}

/* Thresholds of the attempts of pass 1, from m sampled keys (keys[0..m),
 * room for 2m more after them): ranks r1 and r2 (0 = take all), then 0,
 * which always admits enough. The test policies replace them: FORCE_HIGH
 * with the largest sample (some candidates, too few when k > len/m), then
 * +Inf (none); FORCE_LOW with 0 throughout. */
static void attempt_thresholds(int policy, uint32_t *keys, size_t m, size_t r1, size_t r2,
                               float thr[3])
{
    thr[0] = r1 ? float_of(kth_largest(keys, m, r1, keys + m)) : 0.0f;
    thr[1] = r2 ? float_of(kth_largest(keys, m, r2, keys + m)) : 0.0f;
    thr[2] = 0.0f;
    if (policy == IGRAD__SELECT_FORCE_HIGH) {
        thr[0] = m ? float_of(kth_largest(keys, m, 1, keys + m)) : INFINITY;
        thr[1] = INFINITY;
    } else if (policy == IGRAD__SELECT_FORCE_LOW) {
        thr[0] = thr[1] = 0.0f;
    }
}

/* ------------------------------------------------------------------------ */
/* Selecting k of one range                                                 */
/* ------------------------------------------------------------------------ */

/* Writes the exact top k (requires c >= k). @return the k-th largest |a|. */
static float cands_emit(cands_t *cs, uint32_t *oidx, float *oval)
{
    uint32_t kth;
    if (cs->c > cs->k) {
        kth = cands_compact(cs);
    } else {
        kth = UINT32_MAX;
        for (size_t i = 0; i < cs->k; i++) {
            uint32_t x = key_of(cs->val[i]);
            kth = x < kth ? x : kth;
        }
    }
    memcpy(oidx, cs->idx, cs->k * sizeof *oidx);
    memcpy(oval, cs->val, cs->k * sizeof *oval);
    return float_of(kth);
}

/* Pass 1 of select_stream on T threads: each piece of the range collects
 * its candidates at threshold thr into its own fixed slice of ws->cidx /
 * ws->cval (no compaction), then the slices are joined in index order and
 * the exact top k taken. An opportunistic fast path: if a slice
 * overflows, or fewer than k entries pass, it gives up (*done = 0) and the
 * serial path, which always succeeds, takes over (*too_few: skip this
 * threshold). @return the first non-finite index (*done = 1), or -1. */
static int64_t select_stream_parallel(igrad_select_ws_t *ws, const float *g, const float *e,
                                      int64_t len, size_t k, size_t cap, float thr, int T,
                                      uint32_t *oidx, float *oval, int *done, int *too_few)
{
    *done = 0;
    *too_few = 0;
#ifdef _OPENMP
    size_t slice = cap / (size_t)T + BLK_MAX, count[PAR_MAX];
    int64_t bad[PAR_MAX];
    int over[PAR_MAX];
#pragma omp parallel for num_threads(T) schedule(static, 1)
    for (int p = 0; p < T; p++) {
        int64_t s0 = piece_start(len, p, T), s1 = piece_start(len, p + 1, T);
        cands_t cs = {ws->cidx + (size_t)p * slice, ws->cval + (size_t)p * slice, 0, slice, k,
                      thr, NULL, 1, 0};
        bad[p] = scan_ge(ws, g + s0, e + s0, s1 - s0, 0, &cs);
        count[p] = cs.c;
        over[p] = cs.overflow;
    }
    size_t total = 0;
    for (int p = 0; p < T; p++) {
        /* pieces before p were scanned to their end, so a NaN/Inf here is
         * the first of the range; after an overflow nothing is known */
        if (bad[p] >= 0) {
            *done = 1;
            return piece_start(len, p, T) + bad[p];
        }
        if (over[p]) return -1;
        total += count[p];
    }
    if (total < k) {
        *too_few = 1;
        return -1;
    }
    size_t off = 0;
    for (int p = 0; p < T; p++) { /* join: slices only move down */
        uint32_t s0 = (uint32_t)piece_start(len, p, T);
        for (size_t i = 0; i < count[p]; i++) {
            ws->cidx[off + i] = ws->cidx[(size_t)p * slice + i] + s0;
            ws->cval[off + i] = ws->cval[(size_t)p * slice + i];
        }
        off += count[p];
    }
    cands_t all = {ws->cidx, ws->cval, total, total, k, 0.0f, ws->keys, 0, 0};
    cands_emit(&all, oidx, oval);
    *done = 1;
#else
    (void)ws, (void)g, (void)e, (void)len, (void)k, (void)cap, (void)thr, (void)T;
    (void)oidx, (void)oval, (void)too_few;
#endif
    return -1;
}

/* Entries per piece of a pass-1 scan that also sums a^2: the piece is
 * summed right after it was scanned, from cache. */
#define SUMSQ_PIECE 2048

/* scan_ge over [0, len) that also adds the sum of a^2 to *a2, piece by
 * piece. @return the first non-finite index, or -1. */
static int64_t scan_ge_sumsq(const igrad_select_ws_t *ws, const float *g, const float *e,
                             int64_t len, cands_t *cs, double *a2)
{
    for (int64_t s = 0; s < len; s += SUMSQ_PIECE) {
        int64_t nb = len - s < SUMSQ_PIECE ? len - s : SUMSQ_PIECE;
        int64_t bad = scan_ge(ws, g + s, e + s, nb, s, cs);
        if (bad >= 0) return s + bad;
        *a2 += sumsq_ge(ws, g + s, e + s, nb);
    }
    return -1;
}

/* Top k of a range too long to buffer, reading grad and residual directly;
 * indices are relative to the range. Attempts: the sampled threshold, a
 * lower sampled one, then 0 (always enough; compactions keep it linear).
 * With a2 the first attempt also adds the range's sum of a^2 to it (and
 * runs serially). @return the first non-finite index, or -1 (selection in
 * oidx/oval). */
static int64_t select_stream(igrad_select_ws_t *ws, const float *g, const float *e,
                             int64_t len, size_t k, size_t cap, uint32_t *oidx, float *oval,
                             double *a2)
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
    int T = a2 ? 1 : par_threads(len), first = 0;
    if (T > 1) {
        int done, too_few;
        int64_t bad = select_stream_parallel(ws, g, e, len, k, cap, thr[0], T, oidx, oval,
                                             &done, &too_few);
        if (done) return bad;
        first = too_few; /* the same threshold would admit too few again */
    }
    cands_t cs = {ws->cidx, ws->cval, 0, cap, k, 0.0f, ws->keys, 0, 0};
    for (int attempt = first; attempt < 3; attempt++) {
        cs.c = 0;
        cs.thr = thr[attempt];
        int64_t bad = a2 && attempt == first ? scan_ge_sumsq(ws, g, e, len, &cs, a2)
                                             : scan_ge(ws, g, e, len, 0, &cs);
        if (bad >= 0) return bad;
        if (cs.c >= k) break;
    }
    cands_emit(&cs, oidx, oval);
    return -1;
}

/* Candidates of a stored row (ws->row) when there was no threshold to try
 * or it admitted too few: thresholds from samples of the row, then rescans
 * of it, which stay in cache. */
static void select_buffered_sampled(igrad_select_ws_t *ws, int64_t len, cands_t *cs)
{
    size_t k = cs->k;
    int policy = ws->policy;
    size_t m = samples_for(len, 1);
    size_t r1 = sample_rank(m, k, len, 3.0);
    size_t r2 = r1 ? sample_rank(m, 4 * k, len, 4.0) : 0;
    if (!r1) m = 0;
    uint64_t s = 0xb0ffe7ULL ^ (uint64_t)len;
    for (size_t j = 0; j < m; j++) {
        int64_t p = (int64_t)(((splitmix64(&s) >> 32) * (uint64_t)len) >> 32);
        ws->keys[j] = key_of(ws->row[p]);
    }
    float thr[3];
    attempt_thresholds(policy, ws->keys, m, r1, r2, thr);
    for (int attempt = 0; attempt < 3; attempt++) {
        cs->c = 0;
        cs->thr = thr[attempt];
        scan_a(ws, len, cs);
        if (cs->c >= k) break;
    }
}

/* Top k of a range where every entry is a candidate (a short row, or k a
 * large share of the range): a into ws->row, the keys of |a|, the k-th
 * largest key, then a filter in index order; k = 1 is a first-maximum
 * scan. Needs ws->row, ws->cidx and ws->cval for len entries and ws->keys
 * for 3 len. */
static int64_t select_direct(igrad_select_ws_t *ws, const float *restrict g,
                             const float *restrict e, int64_t len, size_t k, uint32_t *oidx,
                             float *oval)
{
    float *restrict a = ws->row;
    uint32_t *restrict keys = ws->keys;
    int bad = 0;
    for (int64_t i = 0; i < len; i++) {
        float v = g[i] + e[i];
        a[i] = v;
        keys[i] = key_of(v);
        bad |= !(fabsf(v) <= FLT_MAX);
    }
    if (bad) {
        for (int64_t i = 0;; i++)
            if (!(fabsf(a[i]) <= FLT_MAX)) return i;
    }
    if (k == 1) {
        int64_t best = 0;
        for (int64_t i = 1; i < len; i++)
            if (keys[i] > keys[best]) best = i;
        oidx[0] = (uint32_t)best;
        oval[0] = a[best];
        return -1;
    }
    uint32_t kth = kth_largest(keys, (size_t)len, k, keys + len);
    size_t greater = 0;
    for (int64_t i = 0; i < len; i++) greater += keys[i] > kth;
    size_t ties = k - greater, w = 0;
    uint32_t *restrict idx = ws->cidx;
    float *restrict val = ws->cval;
    for (int64_t i = 0; i < len; i++) { /* branch-free, like cands_compact */
        int keep = keys[i] > kth || (keys[i] == kth && ties > 0);
        ties -= keys[i] == kth && ties > 0;
        idx[w] = (uint32_t)i;
        val[w] = a[i];
        w += (size_t)keep;
    }
    memcpy(oidx, idx, k * sizeof *oidx);
    memcpy(oval, val, k * sizeof *oval);
    return -1;
}

/* Top k of a range that fits in cache, through ws->row. *hint is the
 * threshold to try first (NaN: none) and receives the one to try next. */
static int64_t select_buffered(igrad_select_ws_t *ws, const float *g, const float *e,
                               int64_t len, size_t k, size_t cap, float *hint,
                               uint32_t *oidx, float *oval)
{
    if (take_all(len, k)) return select_direct(ws, g, e, len, k, oidx, oval);
    int have_hint = ws->policy == IGRAD__SELECT_NORMAL && !isnan(*hint);
    cands_t cs = {ws->cidx, ws->cval, 0, cap, k, 0.0f, ws->keys, 0, 0};
    cs.thr = have_hint ? *hint : INFINITY; /* Inf: only fill and check */
    int64_t bad = scan_fill(ws, g, e, len, &cs);
    if (bad >= 0) return bad;
    if (!(have_hint && cs.c >= k)) select_buffered_sampled(ws, len, &cs);
    /* Rows of one matrix look alike: a little below this row's k-th value
     * admits about 2k entries of the next row when it is like this one (a
     * normal's 99th percentile times 0.9 is its 98th). */
    *hint = cands_emit(&cs, oidx, oval) * HINT_SCALE;
    return -1;
}

/* ------------------------------------------------------------------------ */
/* Passes over the whole tensor                                             */
/* ------------------------------------------------------------------------ */

static inline void add_into(const float *restrict g, float *restrict e, int64_t len)
{
    for (int64_t i = 0; i < len; i++) e[i] = g[i] + e[i];
}

/* A kept entry's residual, written by pass 2: 0, or with 16-bit wire
 * values (dt BF16 or F16) the rounding error v - q of its value v, which
 * becomes q = round16(v) (architecture.md §5.2); *rsum adds (v - q)^2. */
FORCE_INLINE void keep_entry(float *restrict e, int64_t flat, float *restrict val, int64_t k,
                             igrad_dtype_t dt, double *rsum)
{
    if (dt == IGRAD_DTYPE_F32) {
        e[flat] = 0.0f;
        return;
    }
    float v = val[k], q = igrad__round16(dt, v), d = v - q;
    e[flat] = d;
    val[k] = q;
    *rsum += (double)d * (double)d;
}

/* Pass 2 over [s0, s1) of the tensor: e = g + e in chunks, and the kept
 * entries of each chunk are zeroed (keep_entry) while it is still in
 * cache. kept holds per_row ascending column indices for each of `rows`
 * rows of `cols` entries, val their values (a flat selection is one row;
 * rows = 0: nothing kept). With zero_g each chunk of g is zeroed once it
 * has been added, while it is in cache (the engine's sync then needs no
 * separate pass to clear the gradients it unpacks into); g is only written
 * when zero_g is set. */
static void write_residual_range(float *restrict g, float *restrict e, int64_t s0, int64_t s1,
                                 const uint32_t *kept, float *val, int64_t rows, int64_t cols,
                                 int64_t per_row, int zero_g, igrad_dtype_t dt, double *rsum)
{
    int64_t r = rows, j = 0; /* the next kept entry at or after s0: row r, its j-th */
    if (rows > 0 && s0 / cols < rows) {
        r = s0 / cols;
        int64_t lo = 0, hi = per_row, col0 = s0 - r * cols;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if ((int64_t)kept[r * per_row + mid] < col0) lo = mid + 1;
            else hi = mid;
        }
        j = lo;
        if (j == per_row) {
            j = 0;
            r++;
        }
    }
    for (int64_t s = s0; s < s1; s += CHUNK) {
        int64_t end = s1 - s < CHUNK ? s1 : s + CHUNK;
        /* A constant trip count lets -O2 vectorize without an epilogue. */
        if (end - s == CHUNK) add_into(g + s, e + s, CHUNK);
        else add_into(g + s, e + s, end - s);
        if (zero_g) memset(g + s, 0, (size_t)(end - s) * sizeof *g);
        while (r < rows) {
            int64_t flat = r * cols + kept[r * per_row + j];
            if (flat >= end) break;
            keep_entry(e, flat, val, r * per_row + j, dt, rsum);
            if (++j == per_row) {
                j = 0;
                r++;
            }
        }
    }
}

/* Pass 2 over the whole tensor, in pieces on threads for large ones
 * (serially with 16-bit values, so that *rsum adds in kept order). */
static void write_residual(float *g, float *e, int64_t n, const uint32_t *kept, float *val,
                           int64_t rows, int64_t cols, int64_t per_row, int zero_g,
                           igrad_dtype_t dt, double *rsum)
{
    int T = dt == IGRAD_DTYPE_F32 ? par_threads(n) : 1;
    if (T <= 1) {
        write_residual_range(g, e, 0, n, kept, val, rows, cols, per_row, zero_g, dt, rsum);
        return;
    }
#ifdef _OPENMP
#pragma omp parallel for num_threads(T) schedule(static, 1)
#endif
    for (int p = 0; p < T; p++)
        write_residual_range(g, e, piece_start(n, p, T), piece_start(n, p + 1, T), kept, val,
                             rows, cols, per_row, zero_g, dt, NULL);
}

/* Read-only check of a = g + e. @return first non-finite index or -1. */
static int64_t check_finite_range(const float *restrict g, const float *restrict e, int64_t len)
{
    for (int64_t i = 0; i < len; i += CHUNK) {
        int64_t nb = len - i < CHUNK ? len - i : CHUNK;
        int bad = 0;
        if (nb == CHUNK) { /* constant trip count: vectorized */
            for (int64_t j = 0; j < CHUNK; j++) bad |= !(fabsf(g[i + j] + e[i + j]) <= FLT_MAX);
        } else {
            for (int64_t j = 0; j < nb; j++) bad |= !(fabsf(g[i + j] + e[i + j]) <= FLT_MAX);
        }
        if (bad)
            for (int64_t j = 0; j < nb; j++)
                if (!(fabsf(g[i + j] + e[i + j]) <= FLT_MAX)) return i + j;
    }
    return -1;
}

static int64_t check_finite(const float *g, const float *e, int64_t n)
{
    int T = par_threads(n);
    if (T <= 1) return check_finite_range(g, e, n);
    int64_t bad[PAR_MAX];
#ifdef _OPENMP
#pragma omp parallel for num_threads(T) schedule(static, 1)
#endif
    for (int p = 0; p < T; p++) {
        int64_t s0 = piece_start(n, p, T);
        bad[p] = check_finite_range(g + s0, e + s0, piece_start(n, p + 1, T) - s0);
    }
    for (int p = 0; p < T; p++)
        if (bad[p] >= 0) return piece_start(n, p, T) + bad[p];
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

/* a = g + e into val[0..len) with a NaN/Inf check. @return nonzero if some
 * a is not finite. */
static inline int add_check(const float *restrict g, const float *restrict e,
                            float *restrict val, int64_t len)
{
    int bad = 0;
    for (int64_t i = 0; i < len; i++) {
        float x = g[i] + e[i];
        val[i] = x;
        bad |= !(fabsf(x) <= FLT_MAX);
    }
    return bad;
}

/* Everything is kept (a dense spec). Pass 1: values = a (and indices)
 * chunk by chunk with a NaN/Inf check (and the sum of a^2 with a2);
 * nothing but out is written. */
static igrad_status_t find_dense(const float *restrict g, const float *restrict e,
                                 const igrad_select_spec_t *spec, const char *name,
                                 igrad_selection_t *out, double *a2)
{
    int64_t n = spec->n;
    float *restrict val = out->value;
    for (int64_t s = 0; s < n; s += CHUNK) {
        int64_t len = n - s < CHUNK ? n - s : CHUNK;
        int bad = len == CHUNK ? add_check(g + s, e + s, val + s, CHUNK)
                               : add_check(g + s, e + s, val + s, len);
        if (bad) return fail_nonfinite(name, g, e, s + check_finite_range(g + s, e + s, len));
        if (a2) *a2 += sumsq_of(val + s, len);
    }
    if (out->index) {
        int64_t rows = spec->row_wise ? spec->rows : 1, cols = n / rows;
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) out->index[r * cols + c] = (uint32_t)c;
    }
    return IGRAD_OK;
}

/* Pass 2 of a dense spec: the residual becomes 0 (with 16-bit values each
 * entry's rounding error, keep_entry), the gradient 0 if asked. */
static void apply_dense(float *restrict g, float *restrict e, int64_t n, float *val, int zero_g,
                        igrad_dtype_t dt, double *rsum)
{
    if (dt == IGRAD_DTYPE_F32) memset(e, 0, (size_t)n * sizeof *e);
    else
        for (int64_t i = 0; i < n; i++) keep_entry(e, i, val, i, dt, rsum);
    if (zero_g) memset(g, 0, (size_t)n * sizeof *g);
}

/* ------------------------------------------------------------------------ */
/* Row-wise selection of a few entries per row                              */
/* ------------------------------------------------------------------------ */

/* Rows that keep a few entries (ADTopk at 1 % keeps 3 of 256 or 7 of 688;
 * few_fits() says which) take two passes of their own: the candidate
 * buffer's per-row sampling and order statistics cost more than such rows.
 *  pass 1, read-only over the whole tensor: the maxima of the keys of 16
 *    lanes of each row (column c in lane c % 16, in blocks of 16). They
 *    belong to 16 distinct entries, so the k-th largest of them is a lower
 *    bound of the row's k-th largest key: the row's bound. A NaN or Inf
 *    key is above every finite one and shows in the lane maxima, so this
 *    pass is also the finiteness check.
 *  pass 2, row by row, once every row is known to be finite: residual = a
 *    is written while a sorted list of the row's best entries so far is
 *    kept on the stack. An entry is admitted at or above the bound while
 *    the list is not full, then only strictly above its last key (an equal
 *    key comes later and loses the tie). Most blocks cost one vector
 *    compare, and only a few more than k entries per row are inserted.
 *    The list's columns, sorted, are the row's selection; their values
 *    are read back from the residual (a by then), then zeroed there while
 *    the row is still in cache.
 * Like the general path it reads the tensor twice and writes it once, and
 * writes nothing before every entry has been seen. The bound only decides
 * how many entries are inserted, never which are kept. */
#define FEW_MAX 16
#define KEY_INF 0x7f800000 /* keys at or above it are Inf or NaN */

typedef struct few {
    uint64_t e[FEW_MAX]; /* descending; key << 32 | ~column, so that an
                            equal key with a lower column ranks higher */
    int m, k;            /* held, wanted */
    int32_t thr;         /* admission: key > thr (the bound - 1 while
                            m < k, then the key of e[k - 1]) */
} few_t;

/* Compare-exchange into descending order; branch-free (min/max). */
#define FEW_CX(v, i, j)                                                        \
    do {                                                                       \
        int32_t hi_ = v[i] > v[j] ? v[i] : v[j], lo_ = v[i] > v[j] ? v[j] : v[i]; \
        v[i] = hi_;                                                            \
        v[j] = lo_;                                                            \
    } while (0)

/* Sorts 8 values descending: a 19-comparator network. */
static inline void few_sort8(int32_t *v)
{
    FEW_CX(v, 0, 2); FEW_CX(v, 1, 3); FEW_CX(v, 4, 6); FEW_CX(v, 5, 7);
    FEW_CX(v, 0, 4); FEW_CX(v, 1, 5); FEW_CX(v, 2, 6); FEW_CX(v, 3, 7);
    FEW_CX(v, 0, 1); FEW_CX(v, 2, 3); FEW_CX(v, 4, 5); FEW_CX(v, 6, 7);
    FEW_CX(v, 2, 4); FEW_CX(v, 3, 5);
    FEW_CX(v, 1, 4); FEW_CX(v, 3, 6);
    FEW_CX(v, 1, 2); FEW_CX(v, 3, 4); FEW_CX(v, 5, 6);
}

/* The k-th largest (1 <= k <= 2m) of the union of two descending lists a
 * and b of m values: the largest over i of min(a_i, b_(k-i)) (1-based,
 * a_0 = b_0 = +inf). Branch-free. */
static int32_t few_kth2(const int32_t *a, const int32_t *b, int m, int k)
{
    int32_t best = -1;
    for (int i = k > m ? k - m : 0; i <= k && i <= m; i++) {
        int32_t x = i ? a[i - 1] : INT32_MAX, y = k - i ? b[k - i - 1] : INT32_MAX;
        int32_t lo = x < y ? x : y;
        best = lo > best ? lo : best;
    }
    return best;
}

/* The row's bound from the maxima of its 16 lanes (-1 for a lane without
 * entries): the k-th largest of them. @return KEY_INF when some key is Inf
 * or NaN. */
static int32_t few_bound_of(int32_t *lane, int k)
{
    few_sort8(lane);
    few_sort8(lane + 8);
    if (lane[0] >= KEY_INF || lane[8] >= KEY_INF) return KEY_INF;
    return few_kth2(lane, lane + 8, 8, k);
}

/* Pass 1 of one row in portable C: lane j takes columns j, j + 16, ...
 * (the lane loop vectorizes). */
static int32_t few_bound_generic(const float *restrict g, const float *restrict e, int64_t len,
                                 int k)
{
    int32_t lane[16];
    for (int j = 0; j < 16; j++) lane[j] = -1;
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        for (int j = 0; j < 16; j++) {
            int32_t x = (int32_t)key_of(g[i + j] + e[i + j]);
            lane[j] = x > lane[j] ? x : lane[j];
        }
    }
    for (int j = 0; i + j < len; j++) {
        int32_t x = (int32_t)key_of(g[i + j] + e[i + j]);
        lane[j] = x > lane[j] ? x : lane[j];
    }
    return few_bound_of(lane, k);
}

/* Pass 2 of one row: see above. The list takes entry j of the row. */
FORCE_INLINE void few_offer(few_t *f, const float *a, int64_t j)
{
    uint32_t key = key_of(a[j]);
    if ((int32_t)key <= f->thr) return;
    uint64_t x = (uint64_t)key << 32 | (uint32_t)~(uint32_t)j;
    int p = f->m < f->k ? f->m++ : f->k - 1;
    for (; p > 0 && f->e[p - 1] < x; p--) f->e[p] = f->e[p - 1];
    f->e[p] = x;
    if (f->m == f->k) f->thr = (int32_t)(f->e[f->k - 1] >> 32);
}

/* Pass 2 of one row in portable C: e = g + e in blocks of BLK whose flag
 * loop vectorizes; flagged blocks are offered entry by entry. */
FORCE_INLINE void few_row_generic(const float *restrict g, float *restrict e, int64_t len,
                                  few_t *f)
{
    for (int64_t i = 0; i < len; i += BLK) {
        int64_t nb = len - i < BLK ? len - i : BLK;
        int32_t thr = f->thr;
        int flag = 0;
        if (nb == BLK) { /* constant trip count: vectorized */
            for (int j = 0; j < BLK; j++) {
                float v = g[i + j] + e[i + j];
                e[i + j] = v;
                flag |= (int32_t)key_of(v) > thr;
            }
        } else {
            for (int64_t j = 0; j < nb; j++) {
                float v = g[i + j] + e[i + j];
                e[i + j] = v;
                flag |= (int32_t)key_of(v) > thr;
            }
        }
        if (__builtin_expect(flag, 0))
            for (int64_t j = i; j < i + nb; j++) few_offer(f, e, j);
    }
}

static void few_row_generic_fn(const float *g, float *e, int64_t len, few_t *f)
{
    few_row_generic(g, e, len, f);
}

#if IGRAD__HAVE_AVX2
/* Pass 1 of one row in AVX2: the 16 lanes of two registers. */
AVX2_FN int32_t few_bound_avx2(const float *restrict g, const float *restrict e, int64_t len,
                               int k)
{
    const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
    __m256i t1 = _mm256_set1_epi32(-1), t2 = t1;
    int64_t i = 0;
    for (; i + 16 <= len; i += 16) {
        __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i));
        __m256 v2 = _mm256_add_ps(_mm256_loadu_ps(g + i + 8), _mm256_loadu_ps(e + i + 8));
        t1 = _mm256_max_epi32(t1, _mm256_and_si256(_mm256_castps_si256(v1), absmask));
        t2 = _mm256_max_epi32(t2, _mm256_and_si256(_mm256_castps_si256(v2), absmask));
    }
    int32_t lane[16];
    _mm256_storeu_si256((__m256i *)lane, t1);
    _mm256_storeu_si256((__m256i *)(lane + 8), t2);
    for (int j = 0; i + j < len; j++) {
        int32_t x = (int32_t)key_of(g[i + j] + e[i + j]);
        lane[j] = x > lane[j] ? x : lane[j];
    }
    return few_bound_of(lane, k);
}

/* e[i..i+8) = g + e; @return the mask of the entries whose key > thr. */
AVX2_INLINE uint32_t few_block8_avx2(const float *restrict g, float *restrict e, int64_t i,
                                     __m256i thr)
{
    __m256 v = _mm256_add_ps(_mm256_loadu_ps(g + i), _mm256_loadu_ps(e + i));
    _mm256_storeu_ps(e + i, v);
    __m256i key = _mm256_and_si256(_mm256_castps_si256(v), _mm256_set1_epi32(0x7fffffff));
    return (uint32_t)_mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(key, thr)));
}

/* Pass 2 of one row in AVX2: blocks of 32 entries whose four compares make
 * one mask (only flagged entries are offered), then 8, then one by one. */
AVX2_INLINE void few_row_avx2(const float *restrict g, float *restrict e, int64_t len,
                              few_t *f)
{
    int64_t i = 0;
    for (; i + 32 <= len; i += 32) {
        __m256i thr = _mm256_set1_epi32(f->thr);
        uint32_t flag = few_block8_avx2(g, e, i, thr) | few_block8_avx2(g, e, i + 8, thr) << 8 |
                        few_block8_avx2(g, e, i + 16, thr) << 16 |
                        few_block8_avx2(g, e, i + 24, thr) << 24;
        while (__builtin_expect(flag != 0, 0)) {
            few_offer(f, e, i + __builtin_ctz(flag));
            flag &= flag - 1;
        }
    }
    for (; i + 8 <= len; i += 8) {
        uint32_t flag = few_block8_avx2(g, e, i, _mm256_set1_epi32(f->thr));
        while (__builtin_expect(flag != 0, 0)) {
            few_offer(f, e, i + __builtin_ctz(flag));
            flag &= flag - 1;
        }
    }
    for (; i < len; i++) {
        e[i] = g[i] + e[i];
        few_offer(f, e, i);
    }
}

AVX2_FN void few_row_avx2_fn(const float *g, float *e, int64_t len, few_t *f)
{
    few_row_avx2(g, e, len, f);
}
#endif

typedef int32_t (*few_bound_fn)(const float *g, const float *e, int64_t len, int k);
typedef void (*few_row_fn)(const float *g, float *e, int64_t len, few_t *f);

/* Pass 1 over rows [r0, r1): thr[r] = the row's bound - 1 (and with a2
 * the sum of a^2, each row summed while it is in cache). @return the first
 * flat index whose a is not finite (rows after it are not seen), or -1. */
static int64_t few_pass1(const igrad_select_ws_t *ws, few_bound_fn bound, const float *g,
                         const float *e, int64_t r0, int64_t r1, int64_t cols, int k,
                         int32_t *thr, double *a2)
{
    for (int64_t r = r0; r < r1; r++) {
        int32_t b = bound(g + r * cols, e + r * cols, cols, k);
        if (b >= KEY_INF) return r * cols + check_finite_range(g + r * cols, e + r * cols, cols);
        thr[r] = b - 1;
        if (a2) *a2 += sumsq_ge(ws, g + r * cols, e + r * cols, cols);
    }
    return -1;
}

/* Pass 2 over rows [r0, r1): selections (k per row, column order) and the
 * residual (keep_entry). With lane (16-bit values) the unrounded values'
 * squares go into lane[position % 8], in position order: sumsq_of's sum. */
static void few_pass2(few_row_fn row, float *g, float *e, int64_t r0, int64_t r1, int64_t cols,
                      int k, const int32_t *thr, uint32_t *oidx, float *oval, int zero_g,
                      igrad_dtype_t dt, double *rsum, double *lane)
{
    for (int64_t r = r0; r < r1; r++) {
        few_t f;
        f.m = 0;
        f.k = k;
        f.thr = thr[r];
        float *er = e + r * cols;
        row(g + r * cols, er, cols, &f);
        if (zero_g) memset(g + r * cols, 0, (size_t)cols * sizeof *g); /* still in cache */
        /* the list (descending keys) in column order: insertion sort */
        uint32_t *ix = oidx + r * k;
        float *vl = oval + r * k;
        for (int i = 0; i < k; i++) {
            uint32_t c = ~(uint32_t)f.e[i];
            int p = i;
            for (; p > 0 && ix[p - 1] > c; p--) ix[p] = ix[p - 1];
            ix[p] = c;
        }
        for (int i = 0; i < k; i++) { /* pass 2 left a in the residual */
            float v = er[ix[i]];
            vl[i] = v;
            if (lane) lane[(r * k + i) & 7] += (double)v * (double)v;
            keep_entry(er, ix[i], vl, i, dt, rsum);
        }
    }
}

/* Where the few-per-row path beats the candidate buffer (measured with
 * `igrad bench select --shape`, in and out of cache): rows of 8 or more
 * entries of which k keeps at most a quarter, and k <= 8 or rows of at
 * most 256 entries (where the candidate buffer takes every entry). With
 * more than 8 per row on longer rows the list's insertions cost more than
 * the buffer's order statistics. */
static int few_fits(int64_t cols, int64_t k)
{
    return k <= FEW_MAX && cols >= 8 && 4 * k <= cols && (k <= 8 || cols <= 256);
}

/* The few-per-row path's kernels (portable or AVX2). */
static void few_kernels(const igrad_select_ws_t *ws, few_bound_fn *bound, few_row_fn *row)
{
    *bound = few_bound_generic;
    *row = few_row_generic_fn;
#if IGRAD__HAVE_AVX2
    if (use_avx2(ws)) {
        *bound = few_bound_avx2;
        *row = few_row_avx2_fn;
    }
#else
    (void)ws;
#endif
}

/* Does this sparse spec take the few-per-row path? (Both halves of a
 * selection ask, with the same workspace policy.) */
static int takes_few(const igrad_select_ws_t *ws, const igrad_select_spec_t *spec)
{
    return spec->row_wise && spec->per_row <= FEW_MAX &&
           (ws->rows == IGRAD__SELECT_ROWS_FEW ||
            (ws->rows == IGRAD__SELECT_ROWS_AUTO && few_fits(spec->cols, spec->per_row)));
}

/* Pass 1 of the few-per-row path into thr (spec->rows bounds); rows are
 * spread over threads for large tensors, except when summing a^2. */
static igrad_status_t find_few(const igrad_select_ws_t *ws, const float *g, const float *e,
                               const igrad_select_spec_t *spec, const char *name, int32_t *thr,
                               double *a2)
{
    int64_t n = spec->n, rows = spec->rows, cols = spec->cols;
    int k = (int)spec->per_row, T = a2 ? 1 : par_threads(n);
    few_bound_fn bound;
    few_row_fn row;
    few_kernels(ws, &bound, &row);
    int64_t bad[PAR_MAX];
    if (T <= 1) {
        bad[0] = few_pass1(ws, bound, g, e, 0, rows, cols, k, thr, a2);
    } else {
#ifdef _OPENMP
#pragma omp parallel for num_threads(T) schedule(static, 1)
#endif
        for (int p = 0; p < T; p++)
            bad[p] = few_pass1(ws, bound, g, e, rows * p / T, rows * (p + 1) / T, cols, k, thr,
                               NULL);
    }
    for (int p = 0; p < T; p++) /* pieces in order: the first is the tensor's first */
        if (bad[p] >= 0) return fail_nonfinite(name, g, e, bad[p]);
    return IGRAD_OK;
}

/* Pass 2 of the few-per-row path (rows are independent, so threads do not
 * change the result; serial with 16-bit values); sets out->sumsq. */
static void apply_few(const igrad_select_ws_t *ws, float *g, float *e,
                      const igrad_select_spec_t *spec, igrad_selection_t *out,
                      const int32_t *thr, int zero_g, igrad_dtype_t dt, double *rsum)
{
    int64_t n = spec->n, rows = spec->rows, cols = spec->cols;
    int k = (int)spec->per_row, T = dt == IGRAD_DTYPE_F32 ? par_threads(n) : 1;
    few_bound_fn bound;
    few_row_fn row;
    few_kernels(ws, &bound, &row);
    double lane[8] = {0};
    if (T <= 1) {
        few_pass2(row, g, e, 0, rows, cols, k, thr, out->index, out->value, zero_g, dt, rsum,
                  dt == IGRAD_DTYPE_F32 ? NULL : lane);
    } else {
#ifdef _OPENMP
#pragma omp parallel for num_threads(T) schedule(static, 1)
#endif
        for (int p = 0; p < T; p++)
            few_pass2(row, g, e, rows * p / T, rows * (p + 1) / T, cols, k, thr, out->index,
                      out->value, zero_g, dt, NULL, NULL);
    }
    out->sumsq = dt == IGRAD_DTYPE_F32 ? sumsq_of(out->value, spec->count) : lanes_total(lane);
}

/* Pass 1 and fix-up of the general path, range by range (a row, or the
 * whole flat tensor): the selection into out. */
static igrad_status_t find_ranges(igrad_select_ws_t *ws, const float *grad,
                                  const float *residual, const igrad_select_spec_t *spec,
                                  const char *name, igrad_selection_t *out, double *a2)
{
    int64_t rows = spec->row_wise ? spec->rows : 1;
    int64_t len = spec->row_wise ? spec->cols : spec->n;
    size_t k = (size_t)(spec->row_wise ? spec->per_row : spec->count);
    int buffered = len <= ROW_BUFFERED_MAX;
    size_t cap = cap_for(len, k, buffered, ws->policy);
    size_t m = samples_for(len, buffered);
    size_t most = cap > m ? cap : m;
    if (buffered && (size_t)len > most) most = (size_t)len; /* select_direct */
    if (!buffered) { /* slices of select_stream_parallel */
        int T = par_threads(len);
        size_t sliced = T > 1 ? (size_t)T * (cap / (size_t)T + BLK_MAX) : 0;
        if (sliced > most) most = sliced;
    }
    /* keys: samples or candidate keys, and twice that for selecting */
    IGRAD_CHECK(ws_reserve(ws, most, 3 * most, buffered ? (size_t)len : 0));

    float hint = NAN;
    for (int64_t r = 0; r < rows; r++) {
        const float *g = grad + r * len;
        const float *e = residual + r * len;
        uint32_t *oidx = out->index + (size_t)r * k;
        float *oval = out->value + (size_t)r * k;
        int64_t bad = buffered ? select_buffered(ws, g, e, len, k, cap, &hint, oidx, oval)
                               : select_stream(ws, g, e, len, k, cap, oidx, oval, a2);
        if (bad >= 0) return fail_nonfinite(name, grad, residual, r * len + bad);
        if (buffered && a2) *a2 += sumsq_of(ws->row, len); /* a of the row, in cache */
    }
    return IGRAD_OK;
}

igrad_status_t igrad_select_ef(const float *grad, float *residual,
                               const igrad_select_spec_t *spec, const char *name,
                               igrad_select_ws_t *ws, igrad_selection_t *out)
{
    /* grad is only written with zero_grad set */
    return igrad__select_ef((float *)grad, residual, spec, name, ws, out, 0, IGRAD_DTYPE_F32,
                            NULL);
}

static igrad_status_t check_args(const float *grad, const float *residual,
                                 const igrad_select_spec_t *spec, const igrad_select_ws_t *ws,
                                 const igrad_selection_t *out)
{
    IGRAD_FAIL_IF(!grad || !residual || !spec || !ws || !out, IGRAD_E_INVALID,
                  "igrad_select_ef: NULL argument");
    IGRAD_FAIL_IF(!out->value, IGRAD_E_INVALID, "igrad_select_ef: out->value is NULL");
    IGRAD_CHECK(check_spec(spec));
    IGRAD_FAIL_IF(spec->count != spec->n && !out->index, IGRAD_E_INVALID,
                  "igrad_select_ef: out->index is NULL for a sparse spec");
    return IGRAD_OK;
}

igrad_status_t igrad__select_find(const float *grad, const float *residual,
                                  const igrad_select_spec_t *spec, const char *name,
                                  igrad_select_ws_t *ws, igrad_selection_t *out,
                                  int32_t *row_bound, double *a_sumsq)
{
    IGRAD_CHECK(check_args(grad, residual, spec, ws, out));
    int dense = spec->count == spec->n;
    double a2 = 0.0, *sum = a_sumsq ? &a2 : NULL;
    if (dense) {
        IGRAD_CHECK(find_dense(grad, residual, spec, name, out, sum));
    } else if (takes_few(ws, spec)) {
        IGRAD_FAIL_IF(!row_bound, IGRAD_E_INVALID,
                      "igrad_select_ef: no room for the row bounds of %s", name ? name : "?");
        IGRAD_CHECK(find_few(ws, grad, residual, spec, name, row_bound, sum));
    } else {
        IGRAD_CHECK(find_ranges(ws, grad, residual, spec, name, out, sum));
    }
    if (a_sumsq) *a_sumsq = a2;
    return IGRAD_OK;
}

void igrad__select_apply(float *grad, float *residual, const igrad_select_spec_t *spec,
                         const igrad_select_ws_t *ws, igrad_selection_t *out,
                         const int32_t *row_bound, int zero_grad, igrad_dtype_t value_dtype,
                         double *rounded_sumsq)
{
    double rsum = 0.0;
    if (spec->count == spec->n) {
        out->sumsq = sumsq_of(out->value, spec->count); /* before rounding */
        apply_dense(grad, residual, spec->n, out->value, zero_grad, value_dtype, &rsum);
    } else if (takes_few(ws, spec)) {
        apply_few(ws, grad, residual, spec, out, row_bound, zero_grad, value_dtype, &rsum);
    } else {
        int64_t rows = spec->row_wise ? spec->rows : 1;
        int64_t len = spec->row_wise ? spec->cols : spec->n;
        int64_t k = spec->row_wise ? spec->per_row : spec->count;
        out->sumsq = sumsq_of(out->value, spec->count); /* before rounding */
        write_residual(grad, residual, spec->n, out->index, out->value, rows, len, k, zero_grad,
                       value_dtype, &rsum);
    }
    out->count = spec->count;
    out->row_wise = spec->row_wise;
    if (rounded_sumsq) *rounded_sumsq = rsum;
}

igrad_status_t igrad__select_ef(float *grad, float *residual, const igrad_select_spec_t *spec,
                                const char *name, igrad_select_ws_t *ws, igrad_selection_t *out,
                                int zero_grad, igrad_dtype_t value_dtype, double *rounded_sumsq)
{
    IGRAD_CHECK(check_args(grad, residual, spec, ws, out));
    int32_t *bound = NULL;
    if (spec->count != spec->n && takes_few(ws, spec)) {
        IGRAD_CHECK(ws_reserve(ws, 0, (size_t)spec->rows, 0));
        bound = (int32_t *)ws->keys;
    }
    IGRAD_CHECK(igrad__select_find(grad, residual, spec, name, ws, out, bound, NULL));
    igrad__select_apply(grad, residual, spec, ws, out, bound, zero_grad, value_dtype,
                        rounded_sumsq);
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
    write_residual((float *)grad, residual, n, NULL, NULL, 0, 1, 1, 0, IGRAD_DTYPE_F32, NULL);
    return IGRAD_OK;
}
