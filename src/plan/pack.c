/*
 * pack.c — bucket packing: policy names, splitting selections into blocks,
 * the five packing policies, the direct policy's fixed map, the risk
 * policy's size history, grouping by bucket and load metrics. The API and
 * how the engine drives it are documented in pack.h.
 *
 * Not here: what is sent and with which budget (schedule.c), the bucket
 * buffers and collectives (engine.c, comm*.c).
 */
#include "plan/pack.h"
#include "core/names.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define NPOLICIES igrad__pack_names.count

/* ------------------------------------------------------------------------ */
/* Blocks                                                                   */
/* ------------------------------------------------------------------------ */

int64_t igrad__pack_split_count(int64_t entries, int64_t block_entries)
{
    if (entries <= 0) return 0;
    if (block_entries <= 0) return 1;
    return entries / block_entries + (entries % block_entries != 0);
}

int64_t igrad__pack_split(uint32_t tensor, int64_t entries, int64_t block_entries,
                          int64_t entry_nbytes, int64_t ready, igrad__pack_block_t *out)
{
    int64_t nb = igrad__pack_split_count(entries, block_entries);
    int64_t step = block_entries <= 0 ? entries : block_entries;
    for (int64_t b = 0; b < nb; b++) {
        int64_t first = b * step;
        int64_t count = entries - first < step ? entries - first : step;
        out[b].key = igrad__pack_key(tensor, (uint32_t)b);
        out[b].entries = count;
        out[b].nbytes = count * entry_nbytes;
        out[b].ready = ready;
    }
    return nb;
}

/* ------------------------------------------------------------------------ */
/* Sort records and scratch                                                 */
/* ------------------------------------------------------------------------ */

/* A block as the policies sort it. `pos` (its input position) ends every
 * comparison, so each order is total and qsort's instability cannot show. */
typedef struct rec {
    double cost;
    uint64_t key;
    int64_t ready;
    int64_t pos;
} rec_t;

#define CMP3(a, b) (((a) > (b)) - ((a) < (b)))

static int cmp_ready(const void *pa, const void *pb)
{
    const rec_t *a = pa, *b = pb;
    if (a->ready != b->ready) return CMP3(a->ready, b->ready);
    if (a->key != b->key) return CMP3(a->key, b->key);
    return CMP3(a->pos, b->pos);
}

static int cmp_costly_first(const void *pa, const void *pb)
{
    const rec_t *a = pa, *b = pb;
    if (a->cost != b->cost) return a->cost > b->cost ? -1 : 1;
    if (a->key != b->key) return CMP3(a->key, b->key);
    return CMP3(a->pos, b->pos);
}

/* Scratch layout (every element 8 bytes wide, so one 8-byte-aligned block
 * serves all): rec[n] | prefix[n+1] | reach[n+1] | need[n+1] | heap[B] |
 * hload[B]. */
size_t igrad__pack_scratch_nbytes(size_t max_blocks, int nbuckets)
{
    size_t b = nbuckets > 0 ? (size_t)nbuckets : 1;
    return max_blocks * sizeof(rec_t) + 3 * (max_blocks + 1) * sizeof(int64_t) +
           b * (sizeof(int64_t) + sizeof(double));
}

typedef struct scratch {
    rec_t *rec;
    int64_t *prefix, *reach, *need;
    int64_t *heap;
    double *hload;
} scratch_t;

static scratch_t scratch_carve(void *mem, size_t n, int nbuckets)
{
    scratch_t s;
    char *p = mem;
    s.rec = (rec_t *)(void *)p;
    p += n * sizeof(rec_t);
    s.prefix = (int64_t *)(void *)p;
    p += (n + 1) * sizeof(int64_t);
    s.reach = (int64_t *)(void *)p;
    p += (n + 1) * sizeof(int64_t);
    s.need = (int64_t *)(void *)p;
    p += (n + 1) * sizeof(int64_t);
    s.heap = (int64_t *)(void *)p;
    p += (size_t)nbuckets * sizeof(int64_t);
    s.hload = (double *)(void *)p;
    return s;
}

static void fill_recs(rec_t *rec, const igrad__pack_block_t *blocks, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        rec[i].cost = (double)blocks[i].nbytes;
        rec[i].key = blocks[i].key;
        rec[i].ready = blocks[i].ready;
        rec[i].pos = (int64_t)i;
    }
}

/* ------------------------------------------------------------------------ */
/* Policies                                                                 */
/* ------------------------------------------------------------------------ */

static void plan_sequential(const igrad__pack_block_t *blocks, size_t n, int nbuckets,
                            int64_t total, rec_t *rec, int *bucket)
{
    fill_recs(rec, blocks, n);
    qsort(rec, n, sizeof *rec, cmp_ready);
    int cur = 0;
    int64_t load = 0;
    for (size_t i = 0; i < n; i++) {
        size_t pos = (size_t)rec[i].pos;
        bucket[pos] = cur;
        load += blocks[pos].nbytes;
        /* load * B >= total without division; the caller bounded total so
         * that total * IGRAD__PACK_MAX_BUCKETS fits in int64 */
        if (cur < nbuckets - 1 && load * nbuckets >= total) {
            cur++;
            load = 0;
        }
    }
}

/* Min-heap of bucket indices under (hload, index). */
static int heap_less(const double *hload, int64_t a, int64_t b)
{
    return hload[a] < hload[b] || (hload[a] == hload[b] && a < b);
}

static void heap_sift_down(int64_t *heap, const double *hload, int64_t size, int64_t i)
{
    for (;;) {
        int64_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < size && heap_less(hload, heap[l], heap[m])) m = l;
        if (r < size && heap_less(hload, heap[r], heap[m])) m = r;
        if (m == i) return;
        int64_t t = heap[i];
        heap[i] = heap[m];
        heap[m] = t;
        i = m;
    }
}

/* LPT over rec[].cost (already filled): costliest first into the lightest
 * bucket. All loads start at 0, so the identity permutation is a valid heap. */
static void plan_lpt(size_t n, int nbuckets, scratch_t *s, int *bucket)
{
    qsort(s->rec, n, sizeof *s->rec, cmp_costly_first);
    for (int b = 0; b < nbuckets; b++) {
        s->heap[b] = b;
        s->hload[b] = 0.0;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t b = s->heap[0];
        bucket[s->rec[i].pos] = (int)b;
        s->hload[b] += s->rec[i].cost;
        heap_sift_down(s->heap, s->hload, nbuckets, 0);
    }
}

/* Number of runs the greedy split of c[0..n) needs under cap T (every
 * c[i] <= T); stops counting past `limit`. */
static int64_t greedy_runs(const int64_t *prefix, size_t n, int64_t cap, int64_t limit)
{
    int64_t runs = 0;
    size_t i = 0;
    while (i < n && runs <= limit) {
        /* furthest end e with prefix[e] - prefix[i] <= cap: binary search,
         * prefix is non-decreasing */
        size_t lo = i + 1, hi = n;
        while (lo < hi) {
            size_t mid = lo + (hi - lo + 1) / 2;
            if (prefix[mid] - prefix[i] <= cap) lo = mid;
            else hi = mid - 1;
        }
        i = lo;
        runs++;
    }
    return runs;
}

/* |a*B - target| where target = total*(j+1): distance of a cut from its
 * ideal position, scaled by B to stay in integers. */
static int64_t cut_distance(int64_t prefix_at, int nbuckets, int64_t target)
{
    int64_t d = prefix_at * nbuckets - target;
    return d < 0 ? -d : d;
}

static void plan_contiguous(const igrad__pack_block_t *blocks, size_t n, int nbuckets,
                            scratch_t *s, int *bucket)
{
    rec_t *rec = s->rec;
    fill_recs(rec, blocks, n);
    qsort(rec, n, sizeof *rec, cmp_ready);
    if (n <= (size_t)nbuckets) {
        for (size_t i = 0; i < n; i++) bucket[rec[i].pos] = (int)i;
        return;
    }
    int64_t *prefix = s->prefix, *reach = s->reach, *need = s->need;
    int64_t biggest = 0;
    prefix[0] = 0;
    for (size_t i = 0; i < n; i++) {
        int64_t c = blocks[rec[i].pos].nbytes;
        prefix[i + 1] = prefix[i] + c;
        if (c > biggest) biggest = c;
    }
    int64_t total = prefix[n];

    /* Smallest feasible cap: the largest bucket is at least the largest
     * block and at least the mean; the whole payload in one bucket always
     * fits. Feasibility is monotone in the cap. */
    int64_t lo = total / nbuckets + (total % nbuckets != 0);
    if (lo < biggest) lo = biggest;
    int64_t hi = total;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (greedy_runs(prefix, n, mid, nbuckets) <= nbuckets) hi = mid;
        else lo = mid + 1;
    }
    int64_t cap = lo;

    /* reach[i]: furthest end of a run starting at i under the cap (two
     * pointers); need[i]: fewest runs for the suffix from i, by the greedy
     * rule (optimal for a fixed cap), non-increasing in i. */
    size_t e = 0;
    for (size_t i = 0; i < n; i++) {
        if (e < i + 1) e = i + 1;
        while (e < n && prefix[e + 1] - prefix[i] <= cap) e++;
        reach[i] = (int64_t)e;
    }
    need[n] = 0;
    for (size_t i = n; i-- > 0;) need[i] = 1 + need[reach[i]];

    /* Among the splits whose largest bucket is `cap`, put each cut as close
     * as possible to its share (j+1)/B of the total: any end in
     * [first, last] keeps the rest feasible and every bucket non-empty. */
    size_t i = 0;
    for (int j = 0; j < nbuckets; j++) {
        size_t end;
        int64_t left = nbuckets - j; /* buckets still to fill, this one included */
        if (left == 1) {
            end = n;
        } else {
            /* first end whose suffix fits in the remaining left-1 buckets */
            size_t a = i + 1, b = n;
            while (a < b) {
                size_t mid = a + (b - a) / 2;
                if (need[mid] <= left - 1) b = mid;
                else a = mid + 1;
            }
            size_t first = a;
            size_t last = (size_t)reach[i];
            if (last > n - (size_t)(left - 1)) last = n - (size_t)(left - 1);
            int64_t target = total * (int64_t)(j + 1);
            /* first end at or past the target, then compare with the one
             * before it; the earlier one wins a tie */
            a = first;
            b = last;
            while (a < b) {
                size_t mid = a + (b - a) / 2;
                if (prefix[mid] * nbuckets >= target) b = mid;
                else a = mid + 1;
            }
            end = a;
            if (end > first &&
                cut_distance(prefix[end - 1], nbuckets, target) <=
                    cut_distance(prefix[end], nbuckets, target))
                end--;
        }
        for (size_t k = i; k < end; k++) bucket[rec[k].pos] = j;
        i = end;
    }
}

igrad_status_t igrad__pack_plan(const igrad__pack_config_t *cfg,
                                const igrad__pack_block_t *blocks, size_t nblocks,
                                void *scratch, size_t scratch_nbytes, int *bucket,
                                int64_t *loads)
{
    IGRAD_FAIL_IF(!cfg, IGRAD_E_INVALID, "pack: NULL config");
    int nb = cfg->nbuckets;
    IGRAD_FAIL_IF(nb < 1 || nb > IGRAD__PACK_MAX_BUCKETS, IGRAD_E_INVALID,
                  "pack: %d buckets outside [1, %d]", nb, IGRAD__PACK_MAX_BUCKETS);
    IGRAD_FAIL_IF((int)cfg->policy < 0 || (int)cfg->policy >= NPOLICIES, IGRAD_E_INVALID,
                  "pack: unknown policy %d", (int)cfg->policy);
    IGRAD_FAIL_IF(nblocks > 0 && (!blocks || !bucket), IGRAD_E_INVALID,
                  "pack: NULL block or bucket array");
    IGRAD_FAIL_IF(cfg->policy == IGRAD_PACK_DIRECT &&
                      (!cfg->map || cfg->map->nbuckets != nb),
                  IGRAD_E_INVALID, "pack: direct policy needs a map built for %d buckets",
                  nb);

    /* Bound the total so that load * B and total * (j+1) stay in int64. */
    const int64_t max_total = INT64_MAX / IGRAD__PACK_MAX_BUCKETS;
    int64_t total = 0;
    for (size_t i = 0; i < nblocks; i++) {
        IGRAD_FAIL_IF(blocks[i].nbytes < 0, IGRAD_E_INVALID,
                      "pack: block (tensor %u, block %u) has %lld bytes",
                      igrad__pack_key_tensor(blocks[i].key),
                      igrad__pack_key_block(blocks[i].key), (long long)blocks[i].nbytes);
        IGRAD_FAIL_IF(blocks[i].nbytes > max_total - total, IGRAD_E_INVALID,
                      "pack: step payload exceeds %lld bytes", (long long)max_total);
        total += blocks[i].nbytes;
    }

    void *owned = NULL;
    size_t need_nbytes = igrad__pack_scratch_nbytes(nblocks, nb);
    if (cfg->policy != IGRAD_PACK_DIRECT) {
        if (!scratch) {
            owned = malloc(need_nbytes);
            IGRAD_FAIL_IF(!owned, IGRAD_E_NOMEM, "pack: out of memory for %zu blocks",
                          nblocks);
            scratch = owned;
        } else {
            IGRAD_FAIL_IF(scratch_nbytes < need_nbytes, IGRAD_E_INVALID,
                          "pack: scratch of %zu bytes, %zu blocks need %zu",
                          scratch_nbytes, nblocks, need_nbytes);
        }
    }

    scratch_t s = {0};
    if (cfg->policy != IGRAD_PACK_DIRECT) s = scratch_carve(scratch, nblocks, nb);
    switch (cfg->policy) {
    case IGRAD_PACK_DIRECT:
        for (size_t i = 0; i < nblocks; i++)
            bucket[i] = igrad__pack_map_lookup(cfg->map, blocks[i].key);
        break;
    case IGRAD_PACK_SEQUENTIAL:
        plan_sequential(blocks, nblocks, nb, total, s.rec, bucket);
        break;
    case IGRAD_PACK_GREEDY:
        fill_recs(s.rec, blocks, nblocks);
        plan_lpt(nblocks, nb, &s, bucket);
        break;
    case IGRAD_PACK_RISK:
        fill_recs(s.rec, blocks, nblocks);
        for (size_t i = 0; i < nblocks; i++)
            s.rec[i].cost = igrad__pack_history_cost(cfg->history, blocks[i].key,
                                                     blocks[i].nbytes,
                                                     IGRAD__PACK_RISK_LAMBDA);
        plan_lpt(nblocks, nb, &s, bucket);
        break;
    case IGRAD_PACK_CONTIGUOUS:
        plan_contiguous(blocks, nblocks, nb, &s, bucket);
        break;
    }
    free(owned);

    if (loads) {
        for (int b = 0; b < nb; b++) loads[b] = 0;
        for (size_t i = 0; i < nblocks; i++) loads[bucket[i]] += blocks[i].nbytes;
    }
    return IGRAD_OK;
}

igrad_status_t igrad__pack_bucket_order(const int *bucket, size_t nblocks, int nbuckets,
                                        size_t *start, size_t *order)
{
    IGRAD_FAIL_IF(nbuckets < 1, IGRAD_E_INVALID, "pack: %d buckets", nbuckets);
    for (int b = 0; b <= nbuckets; b++) start[b] = 0;
    for (size_t i = 0; i < nblocks; i++) {
        IGRAD_FAIL_IF(bucket[i] < 0 || bucket[i] >= nbuckets, IGRAD_E_INVALID,
                      "pack: block %zu in bucket %d, outside [0, %d)", i, bucket[i],
                      nbuckets);
        start[bucket[i] + 1]++;
    }
    for (int b = 0; b < nbuckets; b++) start[b + 1] += start[b];
    /* place with a running cursor per bucket, kept in start[] shifted by
     * one, then shift back */
    for (size_t i = 0; i < nblocks; i++) order[start[bucket[i]]++] = i;
    for (int b = nbuckets; b > 0; b--) start[b] = start[b - 1];
    start[0] = 0;
    return IGRAD_OK;
}

/* ------------------------------------------------------------------------ */
/* Direct map                                                               */
/* ------------------------------------------------------------------------ */

igrad_status_t igrad__pack_map_build(const igrad__pack_block_t *full, size_t nfull,
                                     int nbuckets, igrad__pack_map_t *map)
{
    IGRAD_FAIL_IF(!map, IGRAD_E_INVALID, "pack map: NULL map");
    memset(map, 0, sizeof *map);
    IGRAD_FAIL_IF(nbuckets < 1 || nbuckets > IGRAD__PACK_MAX_BUCKETS, IGRAD_E_INVALID,
                  "pack map: %d buckets outside [1, %d]", nbuckets,
                  IGRAD__PACK_MAX_BUCKETS);
    igrad_status_t st = IGRAD_OK;
    int *bucket = malloc((nfull ? nfull : 1) * sizeof *bucket);
    rec_t *rec = malloc((nfull ? nfull : 1) * sizeof *rec);
    map->key = malloc((nfull ? nfull : 1) * sizeof *map->key);
    map->bucket = malloc((nfull ? nfull : 1) * sizeof *map->bucket);
    IGRAD_FAIL_GOTO(!bucket || !rec || !map->key || !map->bucket, IGRAD_E_NOMEM,
                    "pack map: out of memory for %zu blocks", nfull);

    igrad__pack_config_t cfg = {IGRAD_PACK_SEQUENTIAL, nbuckets, NULL, NULL};
    IGRAD_CHECK_GOTO(igrad__pack_plan(&cfg, full, nfull, NULL, 0, bucket, NULL));

    /* store by key: sort (key, position) records */
    fill_recs(rec, full, nfull);
    for (size_t i = 0; i < nfull; i++) rec[i].ready = 0;
    qsort(rec, nfull, sizeof *rec, cmp_ready);
    for (size_t i = 0; i < nfull; i++) {
        IGRAD_FAIL_GOTO(i > 0 && rec[i].key == rec[i - 1].key, IGRAD_E_INVALID,
                        "pack map: duplicate block key (tensor %u, block %u)",
                        igrad__pack_key_tensor(rec[i].key),
                        igrad__pack_key_block(rec[i].key));
        map->key[i] = rec[i].key;
        map->bucket[i] = bucket[rec[i].pos];
    }
    map->count = nfull;
    map->nbuckets = nbuckets;

cleanup:
    free(bucket);
    free(rec);
    if (st != IGRAD_OK) igrad__pack_map_free(map);
    return st;
}

void igrad__pack_map_free(igrad__pack_map_t *map)
{
    if (!map) return;
    free(map->key);
    free(map->bucket);
    memset(map, 0, sizeof *map);
}

int igrad__pack_map_lookup(const igrad__pack_map_t *map, uint64_t key)
{
    if (!map || map->count == 0) return 0;
    /* last entry with key <= the wanted key */
    size_t lo = 0, hi = map->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (map->key[mid] <= key) lo = mid + 1;
        else hi = mid;
    }
    return map->bucket[lo > 0 ? lo - 1 : 0];
}

uint64_t igrad__pack_map_hash(uint64_t h, const igrad__pack_map_t *map)
{
    h = igrad__hash_str(h, "igrad-pack-map");
    h = igrad__hash_i64(h, (int64_t)map->nbuckets);
    h = igrad__hash_i64(h, (int64_t)map->count);
    for (size_t i = 0; i < map->count; i++) {
        h = igrad__hash_i64(h, (int64_t)map->key[i]);
        h = igrad__hash_i64(h, (int64_t)map->bucket[i]);
    }
    return h;
}

/* ------------------------------------------------------------------------ */
/* Risk history                                                             */
/* ------------------------------------------------------------------------ */

static int cmp_u64(const void *pa, const void *pb)
{
    uint64_t a = *(const uint64_t *)pa, b = *(const uint64_t *)pb;
    return CMP3(a, b);
}

igrad_status_t igrad__pack_history_init(igrad__pack_history_t *hist, const uint64_t *keys,
                                        size_t count)
{
    IGRAD_FAIL_IF(!hist, IGRAD_E_INVALID, "pack history: NULL history");
    memset(hist, 0, sizeof *hist);
    IGRAD_FAIL_IF(count > 0 && !keys, IGRAD_E_INVALID, "pack history: NULL keys");
    igrad_status_t st = IGRAD_OK;
    size_t c = count ? count : 1;
    hist->key = malloc(c * sizeof *hist->key);
    hist->n = calloc(c, sizeof *hist->n);
    hist->mean = calloc(c, sizeof *hist->mean);
    hist->m2 = calloc(c, sizeof *hist->m2);
    IGRAD_FAIL_GOTO(!hist->key || !hist->n || !hist->mean || !hist->m2, IGRAD_E_NOMEM,
                    "pack history: out of memory for %zu keys", count);
    if (count) memcpy(hist->key, keys, count * sizeof *keys);
    qsort(hist->key, count, sizeof *hist->key, cmp_u64);
    for (size_t i = 1; i < count; i++)
        IGRAD_FAIL_GOTO(hist->key[i] == hist->key[i - 1], IGRAD_E_INVALID,
                        "pack history: duplicate key (tensor %u, block %u)",
                        igrad__pack_key_tensor(hist->key[i]),
                        igrad__pack_key_block(hist->key[i]));
    hist->count = count;
cleanup:
    if (st != IGRAD_OK) igrad__pack_history_free(hist);
    return st;
}

void igrad__pack_history_free(igrad__pack_history_t *hist)
{
    if (!hist) return;
    free(hist->key);
    free(hist->n);
    free(hist->mean);
    free(hist->m2);
    memset(hist, 0, sizeof *hist);
}

int64_t igrad__pack_history_find(const igrad__pack_history_t *hist, uint64_t key)
{
    if (!hist) return -1;
    size_t lo = 0, hi = hist->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (hist->key[mid] < key) lo = mid + 1;
        else hi = mid;
    }
    return lo < hist->count && hist->key[lo] == key ? (int64_t)lo : -1;
}

igrad_status_t igrad__pack_history_update(igrad__pack_history_t *hist,
                                          const igrad__pack_block_t *blocks, size_t nblocks)
{
    IGRAD_FAIL_IF(!hist, IGRAD_E_INVALID, "pack history: NULL history");
    for (size_t i = 0; i < nblocks; i++) {
        int64_t at = igrad__pack_history_find(hist, blocks[i].key);
        IGRAD_FAIL_IF(at < 0, IGRAD_E_INVALID,
                      "pack history: no entry for block (tensor %u, block %u)",
                      igrad__pack_key_tensor(blocks[i].key),
                      igrad__pack_key_block(blocks[i].key));
        /* Welford: stable running mean and squared deviations */
        double x = (double)blocks[i].nbytes;
        hist->n[at]++;
        double d = x - hist->mean[at];
        hist->mean[at] += d / (double)hist->n[at];
        hist->m2[at] += d * (x - hist->mean[at]);
    }
    return IGRAD_OK;
}

double igrad__pack_history_cost(const igrad__pack_history_t *hist, uint64_t key,
                                int64_t nbytes, double lambda)
{
    int64_t at = igrad__pack_history_find(hist, key);
    if (at < 0 || hist->n[at] == 0) return (double)nbytes;
    double var = hist->m2[at] / (double)hist->n[at];
    return hist->mean[at] + lambda * sqrt(var > 0.0 ? var : 0.0);
}

uint64_t igrad__pack_history_hash(uint64_t h, const igrad__pack_history_t *hist)
{
    h = igrad__hash_str(h, "igrad-pack-history");
    h = igrad__hash_i64(h, (int64_t)hist->count);
    for (size_t i = 0; i < hist->count; i++) {
        h = igrad__hash_i64(h, (int64_t)hist->key[i]);
        h = igrad__hash_i64(h, hist->n[i]);
        h = igrad__hash_f64(h, hist->mean[i]);
        h = igrad__hash_f64(h, hist->m2[i]);
    }
    return h;
}

/* ------------------------------------------------------------------------ */
/* Metrics                                                                  */
/* ------------------------------------------------------------------------ */

/* One pass for the sums, one for the spread (two-pass variance: loads can
 * be large and close together, where a one-pass formula cancels). */
static void metrics_core(const double *ld, const int64_t *li, int nbuckets,
                         igrad_pack_metrics_t *out)
{
#define LOAD(b) (ld ? ld[b] : (double)li[b])
    double sum = 0.0, mx = LOAD(0), mn = LOAD(0);
    int empty = 0;
    for (int b = 0; b < nbuckets; b++) {
        double x = LOAD(b);
        sum += x;
        if (x > mx) mx = x;
        if (x < mn) mn = x;
        if (x == 0.0) empty++;
    }
    double mean = sum / nbuckets;
    double ss = 0.0;
    int overflow = 0;
    for (int b = 0; b < nbuckets; b++) {
        double d = LOAD(b) - mean;
        ss += d * d;
        if (LOAD(b) > 1.05 * mean) overflow++;
    }
#undef LOAD
    out->max_nbytes = mx;
    out->min_nbytes = mn;
    out->mean_nbytes = mean;
    out->empty = empty;
    out->overflow = overflow;
    out->cv = mean > 0.0 ? sqrt(ss / nbuckets) / mean : 0.0;
    if (mx == 0.0) out->imbalance = 1.0;
    else if (mn == 0.0) out->imbalance = INFINITY;
    else out->imbalance = mx / mn;
}

igrad_status_t igrad_pack_metrics_compute(const double *loads, int nbuckets,
                                          igrad_pack_metrics_t *out)
{
    IGRAD_FAIL_IF(!loads || !out, IGRAD_E_INVALID, "pack metrics: NULL argument");
    IGRAD_FAIL_IF(nbuckets < 1, IGRAD_E_INVALID, "pack metrics: %d buckets", nbuckets);
    for (int b = 0; b < nbuckets; b++)
        IGRAD_FAIL_IF(!(loads[b] >= 0.0 && isfinite(loads[b])), IGRAD_E_INVALID,
                      "pack metrics: bucket %d has load %g", b, loads[b]);
    metrics_core(loads, NULL, nbuckets, out);
    return IGRAD_OK;
}

igrad_status_t igrad__pack_metrics(const int64_t *loads, int nbuckets,
                                   igrad_pack_metrics_t *out)
{
    IGRAD_FAIL_IF(!loads || !out, IGRAD_E_INVALID, "pack metrics: NULL argument");
    IGRAD_FAIL_IF(nbuckets < 1, IGRAD_E_INVALID, "pack metrics: %d buckets", nbuckets);
    for (int b = 0; b < nbuckets; b++)
        IGRAD_FAIL_IF(loads[b] < 0, IGRAD_E_INVALID, "pack metrics: bucket %d has load %lld",
                      b, (long long)loads[b]);
    metrics_core(NULL, loads, nbuckets, out);
    return IGRAD_OK;
}
