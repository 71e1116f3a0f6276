/*
 * test_pack.c — unit tests of bucket packing (src/pack.c): policy names,
 * block splitting, that every policy assigns every block exactly once,
 * greedy against an independent LPT reference, contiguous against a brute
 * force over all contiguous splits, sequential and direct on hand cases,
 * the risk policy's history (Welford against a two-pass reference) and its
 * preference for stable blocks, metrics on hand-computed loads,
 * determinism under input permutation, and a demonstration on a
 * LLaMA-like payload mix.
 *
 * Not here: the schedule (test_schedule.c), copying entries into buckets
 * and collectives (engine and comm tests).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan/pack.h"

#define ASSERT_NEAR(a, b, tol)                                                      \
    do {                                                                            \
        double a_ = (a), b_ = (b);                                                  \
        if (!(fabs(a_ - b_) <= (tol)))                                              \
            fail_msg("%s = %.17g, expected %s = %.17g (tol %g)", #a, a_, #b, b_,    \
                     (double)(tol));                                                \
    } while (0)

static uint64_t rng_state;
static uint64_t rng_next(void)
{
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}
static int64_t rng_range(int64_t lo, int64_t hi) /* inclusive */
{
    return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo + 1));
}

static const igrad_pack_policy_t all_policies[] = {
    IGRAD_PACK_DIRECT, IGRAD_PACK_SEQUENTIAL, IGRAD_PACK_GREEDY, IGRAD_PACK_RISK,
    IGRAD_PACK_CONTIGUOUS};

/* Random blocks: `ntensors` tensors with 1..4 blocks each, sizes in
 * [0, maxb] (zero-size blocks included on purpose when zero_ok), readiness
 * = reverse tensor order with occasional ties. */
static size_t random_blocks(igrad__pack_block_t *b, size_t cap, int ntensors, int64_t maxb)
{
    size_t m = 0;
    for (int t = 0; t < ntensors && m < cap; t++) {
        int nb = (int)rng_range(1, 4);
        int64_t ready = (ntensors - t) / 2;
        for (int j = 0; j < nb && m < cap; j++, m++) {
            b[m].key = igrad__pack_key((uint32_t)t, (uint32_t)j);
            b[m].nbytes = rng_range(0, maxb);
            b[m].entries = b[m].nbytes / 8;
            b[m].ready = ready;
        }
    }
    return m;
}

static void test_names(void **state)
{
    (void)state;
    const char *names[] = {"direct", "sequential", "greedy", "risk", "contiguous"};
    for (int p = 0; p < 5; p++) {
        igrad_pack_policy_t got = IGRAD_PACK_DIRECT;
        assert_string_equal(igrad_pack_policy_name(all_policies[p]), names[p]);
        assert_int_equal(igrad_pack_policy_from_name(names[p], &got), IGRAD_OK);
        assert_int_equal(got, all_policies[p]);
    }
    igrad_pack_policy_t got = IGRAD_PACK_DIRECT;
    assert_int_equal(igrad_pack_policy_from_name("GREEDY", &got), IGRAD_OK);
    assert_int_equal(got, IGRAD_PACK_GREEDY);
    assert_int_equal(igrad_pack_policy_from_name("lpt", &got), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "\"lpt\""));
    assert_string_equal(igrad_pack_policy_name((igrad_pack_policy_t)9), "unknown");
}

static void test_split(void **state)
{
    (void)state;
    igrad__pack_block_t b[4];
    assert_int_equal(igrad__pack_split_count(10, 4), 3);
    assert_int_equal(igrad__pack_split_count(8, 4), 2);
    assert_int_equal(igrad__pack_split_count(0, 4), 0);
    assert_int_equal(igrad__pack_split_count(10, 0), 1);
    assert_int_equal(igrad__pack_split(7, 10, 4, 8, 42, b), 3);
    int64_t want[3] = {4, 4, 2};
    for (int j = 0; j < 3; j++) {
        assert_int_equal(igrad__pack_key_tensor(b[j].key), 7);
        assert_int_equal(igrad__pack_key_block(b[j].key), j);
        assert_int_equal(b[j].entries, want[j]);
        assert_int_equal(b[j].nbytes, want[j] * 8);
        assert_int_equal(b[j].ready, 42);
    }
    assert_int_equal(igrad__pack_split(1, 10, 0, 6, 0, b), 1);
    assert_int_equal(b[0].nbytes, 60);
    assert_true(igrad__pack_key(1, 0) > igrad__pack_key(0, 0xffffffffu));
}

/* Builds a direct map over a full layout that contains every key of
 * `blocks` (the same blocks, sizes doubled as "full budget"). */
static void map_for(const igrad__pack_block_t *blocks, size_t n, int B, igrad__pack_map_t *map)
{
    igrad__pack_block_t *full = malloc((n ? n : 1) * sizeof *full);
    assert_non_null(full);
    for (size_t i = 0; i < n; i++) {
        full[i] = blocks[i];
        full[i].nbytes = 2 * blocks[i].nbytes + 1;
    }
    assert_int_equal(igrad__pack_map_build(full, n, B, map), IGRAD_OK);
    free(full);
}

static void test_every_block_once(void **state)
{
    (void)state;
    rng_state = 2024;
    igrad__pack_block_t b[200];
    int bucket[200];
    int64_t loads[16];
    size_t start[17], order[200];
    for (int trial = 0; trial < 300; trial++) {
        int B = (int)rng_range(1, 16);
        size_t n = random_blocks(b, 200, (int)rng_range(0, 60), rng_range(1, 100000));
        igrad__pack_map_t map;
        map_for(b, n, B, &map);
        igrad__pack_history_t hist;
        uint64_t keys[200];
        for (size_t i = 0; i < n; i++) keys[i] = b[i].key;
        assert_int_equal(igrad__pack_history_init(&hist, keys, n), IGRAD_OK);
        assert_int_equal(igrad__pack_history_update(&hist, b, n / 2), IGRAD_OK);
        size_t snb = igrad__pack_scratch_nbytes(200, 16);
        void *scratch = malloc(snb);
        assert_non_null(scratch);
        for (int p = 0; p < 5; p++) {
            igrad__pack_config_t cfg = {all_policies[p], B, &hist, &map};
            for (size_t i = 0; i < n; i++) bucket[i] = -1;
            assert_int_equal(igrad__pack_plan(&cfg, b, n, scratch, snb, bucket, loads),
                             IGRAD_OK);
            int64_t sum[16] = {0}, total = 0, ltotal = 0;
            for (size_t i = 0; i < n; i++) {
                assert_in_range(bucket[i], 0, B - 1);
                sum[bucket[i]] += b[i].nbytes;
                total += b[i].nbytes;
            }
            for (int j = 0; j < B; j++) {
                assert_int_equal(loads[j], sum[j]);
                ltotal += loads[j];
            }
            assert_int_equal(ltotal, total);
            /* grouping by bucket is a permutation, stable within a bucket */
            assert_int_equal(igrad__pack_bucket_order(bucket, n, B, start, order), IGRAD_OK);
            assert_int_equal(start[0], 0);
            assert_int_equal(start[B], n);
            unsigned char seen[200] = {0};
            for (int j = 0; j < B; j++) {
                for (size_t q = start[j]; q < start[j + 1]; q++) {
                    assert_int_equal(bucket[order[q]], j);
                    assert_int_equal(seen[order[q]], 0);
                    seen[order[q]] = 1;
                    if (q > start[j]) assert_true(order[q] > order[q - 1]);
                }
            }
        }
        free(scratch);
        igrad__pack_map_free(&map);
        igrad__pack_history_free(&hist);
    }
}

/* Independent LPT: scan for the largest unplaced block (lowest key on
 * ties), scan for the lightest bucket (lowest index on ties). O(n^2). */
static void lpt_reference(const igrad__pack_block_t *b, const double *cost, size_t n, int B,
                          int *bucket)
{
    unsigned char *done = calloc(n ? n : 1, 1);
    double load[64] = {0};
    assert_non_null(done);
    for (size_t it = 0; it < n; it++) {
        size_t pick = n;
        for (size_t i = 0; i < n; i++) {
            if (done[i]) continue;
            if (pick == n || cost[i] > cost[pick] ||
                (cost[i] == cost[pick] && b[i].key < b[pick].key))
                pick = i;
        }
        int j = 0;
        for (int q = 1; q < B; q++)
            if (load[q] < load[j]) j = q;
        bucket[pick] = j;
        load[j] += cost[pick];
        done[pick] = 1;
    }
    free(done);
}

static void test_greedy_reference(void **state)
{
    (void)state;
    rng_state = 5;
    igrad__pack_block_t b[150];
    double cost[150];
    int got[150], want[150];
    for (int trial = 0; trial < 300; trial++) {
        int B = (int)rng_range(1, 40);
        /* small sizes give many ties, large ones few */
        int64_t maxb = trial % 2 ? 6 : 1000000;
        size_t n = random_blocks(b, 150, (int)rng_range(0, 50), maxb);
        for (size_t i = 0; i < n; i++) cost[i] = (double)b[i].nbytes;
        igrad__pack_config_t cfg = {IGRAD_PACK_GREEDY, B, NULL, NULL};
        assert_int_equal(igrad__pack_plan(&cfg, b, n, NULL, 0, got, NULL), IGRAD_OK);
        lpt_reference(b, cost, n, B, want);
        for (size_t i = 0; i < n; i++)
            if (got[i] != want[i])
                fail_msg("trial %d block %zu: bucket %d, reference %d", trial, i, got[i],
                         want[i]);
        /* risk without history is greedy */
        cfg.policy = IGRAD_PACK_RISK;
        assert_int_equal(igrad__pack_plan(&cfg, b, n, NULL, 0, got, NULL), IGRAD_OK);
        for (size_t i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
    }
}

/* Readiness order by insertion sort on (ready, key). */
static void ready_order(const igrad__pack_block_t *b, size_t n, size_t *ord)
{
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (j > 0 && (b[ord[j - 1]].ready > b[i].ready ||
                         (b[ord[j - 1]].ready == b[i].ready && b[ord[j - 1]].key > b[i].key))) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = i;
    }
}

/* Smallest possible largest bucket over all splits of c[0..n) into at most
 * B consecutive runs: every subset of the n-1 gaps with < B cuts. */
static int64_t brute_min_max(const int64_t *c, size_t n, int B)
{
    int64_t best = INT64_MAX;
    for (uint32_t mask = 0; mask < (1u << (n > 0 ? n - 1 : 0)); mask++) {
        if (__builtin_popcount(mask) > B - 1) continue;
        int64_t run = 0, worst = 0;
        for (size_t i = 0; i < n; i++) {
            run += c[i];
            if (i == n - 1 || (mask >> i) & 1u) {
                if (run > worst) worst = run;
                run = 0;
            }
        }
        if (worst < best) best = worst;
    }
    return n == 0 ? 0 : best;
}

static void test_contiguous_brute_force(void **state)
{
    (void)state;
    rng_state = 31337;
    igrad__pack_block_t b[10];
    int bucket[10];
    int64_t loads[4];
    size_t ord[10];
    int64_t c[10];
    for (int trial = 0; trial < 4000; trial++) {
        size_t n = (size_t)rng_range(0, 10);
        int B = (int)rng_range(1, 4);
        int64_t maxb = trial % 3 == 0 ? 3 : 1000;
        for (size_t i = 0; i < n; i++) {
            b[i].key = igrad__pack_key((uint32_t)rng_range(0, 3), (uint32_t)i);
            b[i].nbytes = rng_range(0, maxb);
            b[i].entries = b[i].nbytes;
            b[i].ready = rng_range(0, 4);
        }
        igrad__pack_config_t cfg = {IGRAD_PACK_CONTIGUOUS, B, NULL, NULL};
        assert_int_equal(igrad__pack_plan(&cfg, b, n, NULL, 0, bucket, loads), IGRAD_OK);
        ready_order(b, n, ord);
        for (size_t i = 0; i < n; i++) c[i] = b[ord[i]].nbytes;
        int64_t best = brute_min_max(c, n, B), worst = 0;
        for (int j = 0; j < B; j++)
            if (loads[j] > worst) worst = loads[j];
        if (worst != best)
            fail_msg("trial %d (n=%zu, B=%d): largest bucket %lld, optimum %lld", trial, n, B,
                     (long long)worst, (long long)best);
        /* keeps readiness order; no empty bucket when there are enough
         * blocks; with fewer, block i gets bucket i */
        for (size_t i = 1; i < n; i++)
            assert_true(bucket[ord[i]] >= bucket[ord[i - 1]]);
        if (n >= (size_t)B) {
            int count[4] = {0};
            for (size_t i = 0; i < n; i++) count[bucket[i]]++;
            for (int j = 0; j < B; j++) assert_true(count[j] > 0);
        } else {
            for (size_t i = 0; i < n; i++) assert_int_equal(bucket[ord[i]], (int)i);
        }
    }
}

static void test_contiguous_larger(void **state)
{
    (void)state;
    /* Larger n: check against an independent exact optimum by dynamic
     * programming over (prefix, buckets), O(n^2 B). */
    rng_state = 4242;
    enum { N = 120 };
    igrad__pack_block_t b[N];
    int bucket[N];
    int64_t loads[8];
    size_t ord[N];
    static int64_t dp[9][N + 1];
    for (int trial = 0; trial < 30; trial++) {
        int B = (int)rng_range(1, 8);
        for (size_t i = 0; i < N; i++) {
            b[i].key = igrad__pack_key((uint32_t)i, 0);
            b[i].nbytes = rng_range(1, trial % 2 ? 50 : 100000);
            b[i].entries = 1;
            b[i].ready = rng_range(0, 30);
        }
        igrad__pack_config_t cfg = {IGRAD_PACK_CONTIGUOUS, B, NULL, NULL};
        assert_int_equal(igrad__pack_plan(&cfg, b, N, NULL, 0, bucket, loads), IGRAD_OK);
        ready_order(b, N, ord);
        int64_t pre[N + 1] = {0};
        for (size_t i = 0; i < N; i++) pre[i + 1] = pre[i] + b[ord[i]].nbytes;
        for (size_t i = 0; i <= N; i++) dp[1][i] = pre[i];
        for (int k = 2; k <= B; k++)
            for (size_t i = 0; i <= N; i++) {
                int64_t best = INT64_MAX;
                for (size_t s = 0; s <= i; s++) {
                    int64_t v = dp[k - 1][s] > pre[i] - pre[s] ? dp[k - 1][s] : pre[i] - pre[s];
                    if (v < best) best = v;
                }
                dp[k][i] = best;
            }
        int64_t worst = 0;
        for (int j = 0; j < B; j++)
            if (loads[j] > worst) worst = loads[j];
        assert_int_equal(worst, dp[B][N]);
        for (size_t i = 1; i < N; i++) assert_true(bucket[ord[i]] >= bucket[ord[i - 1]]);
    }
}

static void plan_hand(igrad_pack_policy_t policy, const int64_t *sizes, size_t n, int B,
                      int *bucket, int64_t *loads)
{
    igrad__pack_block_t b[16];
    for (size_t i = 0; i < n; i++) {
        b[i].key = igrad__pack_key((uint32_t)i, 0);
        b[i].nbytes = sizes[i];
        b[i].entries = sizes[i];
        b[i].ready = (int64_t)i;
    }
    igrad__pack_config_t cfg = {policy, B, NULL, NULL};
    assert_int_equal(igrad__pack_plan(&cfg, b, n, NULL, 0, bucket, loads), IGRAD_OK);
}

static void test_sequential_hand(void **state)
{
    (void)state;
    int bucket[8];
    int64_t loads[4];
    /* share 6: 3, 3 reaches it -> next bucket */
    int64_t s1[4] = {3, 3, 3, 3};
    plan_hand(IGRAD_PACK_SEQUENTIAL, s1, 4, 2, bucket, loads);
    int w1[4] = {0, 0, 1, 1};
    for (int i = 0; i < 4; i++) assert_int_equal(bucket[i], w1[i]);
    /* share 10/3: 1,1,1,1 (4 >= 3.33) | 1,5 | nothing left: a hole */
    int64_t s2[6] = {1, 1, 1, 1, 1, 5};
    plan_hand(IGRAD_PACK_SEQUENTIAL, s2, 6, 3, bucket, loads);
    int w2[6] = {0, 0, 0, 0, 1, 1};
    for (int i = 0; i < 6; i++) assert_int_equal(bucket[i], w2[i]);
    assert_int_equal(loads[0], 4);
    assert_int_equal(loads[1], 6);
    assert_int_equal(loads[2], 0);
    /* the last bucket takes whatever is left */
    int64_t s3[5] = {1, 1, 1, 1, 9};
    plan_hand(IGRAD_PACK_SEQUENTIAL, s3, 5, 2, bucket, loads);
    assert_int_equal(loads[0], 4 + 9);
    assert_int_equal(loads[1], 0);
    /* share 14/3: 4,4 | 1,1,1,1,1 | 1 — overshoot leaves the last light */
    int64_t s4[8] = {4, 4, 1, 1, 1, 1, 1, 1};
    plan_hand(IGRAD_PACK_SEQUENTIAL, s4, 8, 3, bucket, loads);
    assert_int_equal(loads[0], 8);
    assert_int_equal(loads[1], 5);
    assert_int_equal(loads[2], 1);

    /* readiness, not input position, orders the blocks */
    igrad__pack_block_t b[3] = {
        {igrad__pack_key(0, 0), 5, 2, 5},
        {igrad__pack_key(1, 0), 5, 1, 5},
        {igrad__pack_key(2, 0), 5, 0, 5},
    };
    igrad__pack_config_t cfg = {IGRAD_PACK_SEQUENTIAL, 3, NULL, NULL};
    assert_int_equal(igrad__pack_plan(&cfg, b, 3, NULL, 0, bucket, loads), IGRAD_OK);
    assert_int_equal(bucket[2], 0);
    assert_int_equal(bucket[1], 1);
    assert_int_equal(bucket[0], 2);
}

static void test_contiguous_hand(void **state)
{
    (void)state;
    int bucket[8];
    int64_t loads[3];
    /* optimum 7 allows cuts after 5 or after 7; both are 2 (x B) from the
     * share 6: the earlier cut wins */
    int64_t s1[5] = {2, 3, 2, 2, 3};
    plan_hand(IGRAD_PACK_CONTIGUOUS, s1, 5, 2, bucket, loads);
    assert_int_equal(loads[0], 5);
    assert_int_equal(loads[1], 7);
    /* eight unit blocks into 3: greedy filling would give 3,3,2; cuts go
     * nearest to 8/3 and 16/3 instead */
    int64_t s2[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    plan_hand(IGRAD_PACK_CONTIGUOUS, s2, 8, 3, bucket, loads);
    assert_int_equal(loads[0], 3);
    assert_int_equal(loads[1], 2);
    assert_int_equal(loads[2], 3);
    /* a light tail is balanced as far as the optimum allows */
    int64_t s3[6] = {3, 3, 1, 1, 1, 1};
    plan_hand(IGRAD_PACK_CONTIGUOUS, s3, 6, 3, bucket, loads);
    assert_int_equal(loads[0], 3);
    assert_int_equal(loads[1], 4);
    assert_int_equal(loads[2], 3);
}

static void test_direct_hand(void **state)
{
    (void)state;
    /* full layout: 3 tensors x 2 blocks of 10 bytes, B = 3: each tensor
     * fills one bucket */
    igrad__pack_block_t full[6];
    for (int t = 0; t < 3; t++)
        for (int j = 0; j < 2; j++) {
            igrad__pack_block_t *x = &full[2 * t + j];
            x->key = igrad__pack_key((uint32_t)t, (uint32_t)j);
            x->nbytes = 10;
            x->entries = 10;
            x->ready = 2 - t;   /* reverse layout order */
        }
    igrad__pack_map_t map;
    assert_int_equal(igrad__pack_map_build(full, 6, 3, &map), IGRAD_OK);
    assert_int_equal(map.count, 6);
    /* ready reverses the layout: tensor 2 is first, bucket 0 */
    assert_int_equal(igrad__pack_map_lookup(&map, igrad__pack_key(2, 0)), 0);
    assert_int_equal(igrad__pack_map_lookup(&map, igrad__pack_key(1, 1)), 1);
    assert_int_equal(igrad__pack_map_lookup(&map, igrad__pack_key(0, 0)), 2);
    /* a block the full layout did not have joins its tensor's last block */
    assert_int_equal(igrad__pack_map_lookup(&map, igrad__pack_key(1, 7)), 1);

    /* this step tensor 1 is deferred: its bucket stays empty (a hole) and
     * the release block (0, 5) travels with tensor 0 */
    igrad__pack_block_t step[5] = {full[0], full[1], full[4], full[5], full[0]};
    step[4].key = igrad__pack_key(0, 5);
    step[0].nbytes = 7;   /* sizes do not move blocks under direct */
    int bucket[5];
    int64_t loads[3];
    igrad__pack_config_t cfg = {IGRAD_PACK_DIRECT, 3, NULL, &map};
    assert_int_equal(igrad__pack_plan(&cfg, step, 5, NULL, 0, bucket, loads), IGRAD_OK);
    int want[5] = {2, 2, 0, 0, 2};
    for (int i = 0; i < 5; i++) assert_int_equal(bucket[i], want[i]);
    assert_int_equal(loads[0], 20);
    assert_int_equal(loads[1], 0);
    assert_int_equal(loads[2], 7 + 10 + 10);

    /* map built for another B is refused; duplicate keys are refused */
    cfg.nbuckets = 4;
    assert_int_equal(igrad__pack_plan(&cfg, step, 5, NULL, 0, bucket, loads),
                     IGRAD_E_INVALID);
    cfg.map = NULL;
    cfg.nbuckets = 3;
    assert_int_equal(igrad__pack_plan(&cfg, step, 5, NULL, 0, bucket, loads),
                     IGRAD_E_INVALID);
    uint64_t h = igrad__pack_map_hash(IGRAD__HASH_SEED, &map);
    igrad__pack_map_free(&map);
    igrad__pack_block_t dup[2] = {full[0], full[0]};
    assert_int_equal(igrad__pack_map_build(dup, 2, 3, &map), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "duplicate"));
    assert_null(map.key);
    /* the map hash is a function of the layout */
    assert_int_equal(igrad__pack_map_build(full, 6, 3, &map), IGRAD_OK);
    assert_int_equal(igrad__pack_map_hash(IGRAD__HASH_SEED, &map), h);
    igrad__pack_map_free(&map);
    assert_int_equal(igrad__pack_map_build(full, 6, 2, &map), IGRAD_OK);
    assert_int_not_equal(igrad__pack_map_hash(IGRAD__HASH_SEED, &map), h);
    igrad__pack_map_free(&map);
    igrad__pack_map_free(&map); /* second free of a zeroed map is a no-op */
}

static void test_history_welford(void **state)
{
    (void)state;
    rng_state = 8;
    enum { K = 5, STEPS = 200 };
    uint64_t keys[K];
    for (int i = 0; i < K; i++) keys[i] = igrad__pack_key((uint32_t)(K - i), 0); /* unsorted */
    igrad__pack_history_t h;
    assert_int_equal(igrad__pack_history_init(&h, keys, K), IGRAD_OK);
    static double obs[K][STEPS];
    int cnt[K] = {0};
    for (int s = 0; s < STEPS; s++) {
        igrad__pack_block_t blk[K];
        size_t m = 0;
        for (int i = 0; i < K; i++) {
            if (rng_next() % 3 == 0) continue; /* not sent this step */
            blk[m].key = keys[i];
            blk[m].nbytes = 1000000 + rng_range(0, 1000) * (i + 1);
            blk[m].entries = 0;
            blk[m].ready = 0;
            obs[i][cnt[i]++] = (double)blk[m].nbytes;
            m++;
        }
        assert_int_equal(igrad__pack_history_update(&h, blk, m), IGRAD_OK);
    }
    for (int i = 0; i < K; i++) {
        /* two-pass reference */
        double mean = 0, ss = 0;
        for (int j = 0; j < cnt[i]; j++) mean += obs[i][j];
        mean /= cnt[i];
        for (int j = 0; j < cnt[i]; j++) ss += (obs[i][j] - mean) * (obs[i][j] - mean);
        double sd = sqrt(ss / cnt[i]);
        int64_t at = igrad__pack_history_find(&h, keys[i]);
        assert_true(at >= 0);
        assert_int_equal(h.n[at], cnt[i]);
        ASSERT_NEAR(h.mean[at], mean, 1e-9 * mean);
        ASSERT_NEAR(igrad__pack_history_cost(&h, keys[i], 1, 2.0), mean + 2.0 * sd,
                    1e-6 * (mean + sd));
    }
    /* a key without observations uses its current size; unknown keys
     * are refused by update, costed by their size */
    igrad__pack_history_t e;
    assert_int_equal(igrad__pack_history_init(&e, keys, K), IGRAD_OK);
    assert_true(igrad__pack_history_cost(&e, keys[0], 1234, 1.0) == 1234.0);
    assert_true(igrad__pack_history_cost(&e, igrad__pack_key(99, 0), 77, 1.0) == 77.0);
    assert_true(igrad__pack_history_cost(NULL, keys[0], 55, 1.0) == 55.0);
    igrad__pack_block_t bad = {igrad__pack_key(99, 3), 5, 0, 0};
    assert_int_equal(igrad__pack_history_update(&e, &bad, 1), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "tensor 99, block 3"));

    /* save/restore as plain arrays: same hash, same costs */
    for (size_t i = 0; i < e.count; i++) {
        e.n[i] = h.n[i];
        e.mean[i] = h.mean[i];
        e.m2[i] = h.m2[i];
    }
    assert_int_equal(igrad__pack_history_hash(IGRAD__HASH_SEED, &e),
                     igrad__pack_history_hash(IGRAD__HASH_SEED, &h));
    e.n[2]++;
    assert_int_not_equal(igrad__pack_history_hash(IGRAD__HASH_SEED, &e),
                         igrad__pack_history_hash(IGRAD__HASH_SEED, &h));
    igrad__pack_history_free(&e);
    igrad__pack_history_free(&h);

    uint64_t dup[2] = {7, 7};
    assert_int_equal(igrad__pack_history_init(&h, dup, 2), IGRAD_E_INVALID);
    assert_null(h.key);
}

/* A block whose size history varies is treated as bigger than a stable
 * block of the same current size, so it gets a bucket to itself. */
static void test_risk_prefers_stable(void **state)
{
    (void)state;
    uint64_t kx = igrad__pack_key(0, 0), ky = igrad__pack_key(1, 0), kz = igrad__pack_key(2, 0);
    uint64_t keys[3] = {kx, ky, kz};
    igrad__pack_history_t h;
    assert_int_equal(igrad__pack_history_init(&h, keys, 3), IGRAD_OK);
    int64_t xs[3] = {100, 100, 100}, ys[3] = {50, 150, 100}, zs[3] = {90, 90, 90};
    for (int s = 0; s < 3; s++) {
        igrad__pack_block_t step[3] = {{kx, xs[s], 0, 0}, {ky, ys[s], 0, 0}, {kz, zs[s], 0, 0}};
        assert_int_equal(igrad__pack_history_update(&h, step, 3), IGRAD_OK);
    }
    /* y: mean 100, population std sqrt(5000/3) = 40.82 */
    ASSERT_NEAR(igrad__pack_history_cost(&h, ky, 0, 1.0), 100.0 + sqrt(5000.0 / 3.0), 1e-9);
    ASSERT_NEAR(igrad__pack_history_cost(&h, kx, 0, 1.0), 100.0, 1e-12);

    igrad__pack_block_t now[3] = {{kx, 100, 0, 0}, {ky, 100, 0, 0}, {kz, 90, 0, 0}};
    int bucket[3];
    int64_t loads[2];
    igrad__pack_config_t cfg = {IGRAD_PACK_GREEDY, 2, &h, NULL};
    /* greedy: x (lower key) first -> 0, y -> 1, z -> 0 (tie, lower index) */
    assert_int_equal(igrad__pack_plan(&cfg, now, 3, NULL, 0, bucket, loads), IGRAD_OK);
    assert_int_equal(bucket[0], 0);
    assert_int_equal(bucket[1], 1);
    assert_int_equal(bucket[2], 0);
    /* risk: y costs 140.8 -> 0 alone; x -> 1; z -> 1 (100 < 140.8) */
    cfg.policy = IGRAD_PACK_RISK;
    assert_int_equal(igrad__pack_plan(&cfg, now, 3, NULL, 0, bucket, loads), IGRAD_OK);
    assert_int_equal(bucket[1], 0);
    assert_int_equal(bucket[0], 1);
    assert_int_equal(bucket[2], 1);
    assert_int_equal(loads[0], 100);
    assert_int_equal(loads[1], 190);
    /* lambda = 0 would be greedy on the means: the cost without the spread */
    ASSERT_NEAR(igrad__pack_history_cost(&h, ky, 0, 0.0), 100.0, 1e-12);
    igrad__pack_history_free(&h);
}

static void test_metrics_hand(void **state)
{
    (void)state;
    igrad_pack_metrics_t m;
    double l1[4] = {10, 20, 30, 40};
    assert_int_equal(igrad_pack_metrics_compute(l1, 4, &m), IGRAD_OK);
    ASSERT_NEAR(m.imbalance, 4.0, 0);
    ASSERT_NEAR(m.mean_nbytes, 25.0, 0);
    ASSERT_NEAR(m.max_nbytes, 40.0, 0);
    ASSERT_NEAR(m.min_nbytes, 10.0, 0);
    ASSERT_NEAR(m.cv, sqrt(125.0) / 25.0, 1e-15); /* deviations 15,5,5,15 */
    assert_int_equal(m.overflow, 2);               /* 30, 40 > 26.25 */
    assert_int_equal(m.empty, 0);

    int64_t l2[3] = {5, 0, 10};
    assert_int_equal(igrad__pack_metrics(l2, 3, &m), IGRAD_OK);
    assert_true(isinf(m.imbalance) && m.imbalance > 0);
    assert_int_equal(m.empty, 1);
    assert_int_equal(m.overflow, 1); /* 10 > 5.25; 5 is not */

    int64_t l3[2] = {0, 0};
    assert_int_equal(igrad__pack_metrics(l3, 2, &m), IGRAD_OK);
    ASSERT_NEAR(m.imbalance, 1.0, 0);
    ASSERT_NEAR(m.cv, 0.0, 0);
    assert_int_equal(m.overflow, 0);
    assert_int_equal(m.empty, 2);

    double l4[3] = {7, 7, 7};
    assert_int_equal(igrad_pack_metrics_compute(l4, 3, &m), IGRAD_OK);
    ASSERT_NEAR(m.imbalance, 1.0, 0);
    ASSERT_NEAR(m.cv, 0.0, 0);
    assert_int_equal(m.overflow, 0);

    /* overflow is strict: mean 105, 110 is below 1.05 * 105 = 110.25 */
    double l5[2] = {100, 110};
    assert_int_equal(igrad_pack_metrics_compute(l5, 2, &m), IGRAD_OK);
    assert_int_equal(m.overflow, 0);
    ASSERT_NEAR(m.imbalance, 1.1, 1e-15);

    double bad[2] = {1, -1};
    assert_int_equal(igrad_pack_metrics_compute(bad, 2, &m), IGRAD_E_INVALID);
    bad[1] = NAN;
    assert_int_equal(igrad_pack_metrics_compute(bad, 2, &m), IGRAD_E_INVALID);
    bad[1] = INFINITY;
    assert_int_equal(igrad_pack_metrics_compute(bad, 2, &m), IGRAD_E_INVALID);
    assert_int_equal(igrad_pack_metrics_compute(l4, 0, &m), IGRAD_E_INVALID);
}

/* The plan is a function of (keys, sizes, readiness[, history]), not of
 * the order the blocks are listed in, and with or without scratch. */
static void test_determinism(void **state)
{
    (void)state;
    rng_state = 606;
    enum { CAP = 120 };
    igrad__pack_block_t b[CAP], p[CAP];
    int bb[CAP], bp[CAP], bn[CAP];
    size_t perm[CAP];
    for (int trial = 0; trial < 100; trial++) {
        int B = (int)rng_range(1, 12);
        size_t n = random_blocks(b, CAP, (int)rng_range(0, 40), trial % 2 ? 5 : 100000);
        for (size_t i = 0; i < n; i++) perm[i] = i;
        for (size_t i = n; i > 1; i--) {
            size_t j = (size_t)(rng_next() % i);
            size_t t = perm[i - 1];
            perm[i - 1] = perm[j];
            perm[j] = t;
        }
        for (size_t i = 0; i < n; i++) p[i] = b[perm[i]];
        igrad__pack_map_t map;
        map_for(b, n, B, &map);
        uint64_t keys[CAP];
        for (size_t i = 0; i < n; i++) keys[i] = b[i].key;
        igrad__pack_history_t h;
        assert_int_equal(igrad__pack_history_init(&h, keys, n), IGRAD_OK);
        for (int s = 0; s < 3; s++) {
            for (size_t i = 0; i < n; i++) p[i].nbytes = rng_range(0, 1000);
            assert_int_equal(igrad__pack_history_update(&h, p, n), IGRAD_OK);
        }
        for (size_t i = 0; i < n; i++) p[i] = b[perm[i]];
        size_t snb = igrad__pack_scratch_nbytes(n, B);
        void *scratch = malloc(snb ? snb : 1);
        assert_non_null(scratch);
        for (int q = 0; q < 5; q++) {
            igrad__pack_config_t cfg = {all_policies[q], B, &h, &map};
            assert_int_equal(igrad__pack_plan(&cfg, b, n, NULL, 0, bb, NULL), IGRAD_OK);
            assert_int_equal(igrad__pack_plan(&cfg, b, n, scratch, snb, bn, NULL), IGRAD_OK);
            assert_int_equal(igrad__pack_plan(&cfg, p, n, scratch, snb, bp, NULL), IGRAD_OK);
            for (size_t i = 0; i < n; i++) {
                assert_int_equal(bb[i], bn[i]);
                if (bp[i] != bb[perm[i]])
                    fail_msg("policy %s trial %d: block %zu in bucket %d after "
                             "permutation, %d before", igrad_pack_policy_name(cfg.policy),
                             trial, perm[i], bp[i], bb[perm[i]]);
            }
        }
        free(scratch);
        igrad__pack_history_free(&h);
        igrad__pack_map_free(&map);
    }
}

static void test_plan_errors(void **state)
{
    (void)state;
    igrad__pack_block_t b[2] = {{igrad__pack_key(0, 0), 10, 0, 0},
                                {igrad__pack_key(1, 0), -1, 0, 0}};
    int bucket[2];
    igrad__pack_config_t cfg = {IGRAD_PACK_GREEDY, 2, NULL, NULL};
    assert_int_equal(igrad__pack_plan(&cfg, b, 2, NULL, 0, bucket, NULL), IGRAD_E_INVALID);
    assert_non_null(strstr(igrad_last_error(), "tensor 1, block 0"));
    b[1].nbytes = 10;
    char small[16];
    assert_int_equal(igrad__pack_plan(&cfg, b, 2, small, sizeof small, bucket, NULL),
                     IGRAD_E_INVALID);
    cfg.nbuckets = 0;
    assert_int_equal(igrad__pack_plan(&cfg, b, 2, NULL, 0, bucket, NULL), IGRAD_E_INVALID);
    cfg.nbuckets = IGRAD__PACK_MAX_BUCKETS + 1;
    assert_int_equal(igrad__pack_plan(&cfg, b, 2, NULL, 0, bucket, NULL), IGRAD_E_INVALID);
    cfg.nbuckets = 2;
    cfg.policy = (igrad_pack_policy_t)17;
    assert_int_equal(igrad__pack_plan(&cfg, b, 2, NULL, 0, bucket, NULL), IGRAD_E_INVALID);
    cfg.policy = IGRAD_PACK_GREEDY;
    b[0].nbytes = INT64_MAX / 2;
    b[1].nbytes = INT64_MAX / 2;
    assert_int_equal(igrad__pack_plan(&cfg, b, 2, NULL, 0, bucket, NULL), IGRAD_E_INVALID);
    /* no blocks: every policy is fine, every bucket empty */
    int64_t loads[2] = {5, 5};
    assert_int_equal(igrad__pack_plan(&cfg, NULL, 0, NULL, 0, NULL, loads), IGRAD_OK);
    assert_int_equal(loads[0], 0);
    assert_int_equal(loads[1], 0);
    int bad_bucket[1] = {3};
    size_t start[3], order[1];
    assert_int_equal(igrad__pack_bucket_order(bad_bucket, 1, 2, start, order), IGRAD_E_INVALID);
}

/* A LLaMA-like step (hidden 2048, MLP 5504, 16 layers, vocab 32000; topk
 * at 1 %, 8-byte entries, 64 Ki-entry blocks, 8 buckets) with the FC1
 * pair of layers 3-6 and V of layers 10-12 deferred. Prints every
 * policy's metrics; asserts what the design claims: greedy and contiguous
 * within 10 % (max/min), sequential worse than both. */
static void test_demo_realistic_mix(void **state)
{
    (void)state;
    enum { L = 16, H = 2048, I = 5504, V = 32000, B = 8, BLOCK = 65536, EB = 8 };
    igrad__pack_block_t *blk = malloc(4096 * sizeof *blk);
    igrad__pack_block_t *full = malloc(4096 * sizeof *full);
    assert_non_null(blk);
    assert_non_null(full);
    size_t m = 0, nfull = 0;
    uint32_t t = 0;
    int ntensors = 2 + L * 9 + 1;
    /* tensors in layout order; readiness = reverse layout order */
#define ADD(numel, deferred)                                                             \
    do {                                                                                 \
        int64_t n_ = (int64_t)(numel), k_ = (n_ + 99) / 100;                            \
        int64_t r_ = ntensors - 1 - (int64_t)t;                                         \
        nfull += (size_t)igrad__pack_split(t, k_, BLOCK, EB, r_, full + nfull);          \
        if (!(deferred)) m += (size_t)igrad__pack_split(t, k_, BLOCK, EB, r_, blk + m);  \
        t++;                                                                             \
    } while (0)
    ADD((int64_t)V * H, 0); /* embed_tokens */
    for (int l = 0; l < L; l++) {
        ADD(H, 0);                                   /* input_layernorm */
        ADD((int64_t)H * H, 0);                      /* q */
        ADD((int64_t)H * H, 0);                      /* k */
        ADD((int64_t)H * H, l >= 10 && l <= 12);     /* v */
        ADD((int64_t)H * H, 0);                      /* o */
        ADD(H, 0);                                   /* post_attention_layernorm */
        ADD((int64_t)I * H, l >= 3 && l <= 6);       /* gate (FC1) */
        ADD((int64_t)I * H, l >= 3 && l <= 6);       /* up (FC1) */
        ADD((int64_t)H * I, 0);                      /* down (FC2) */
    }
    ADD(H, 0);              /* final norm */
    ADD((int64_t)V * H, 0); /* lm_head */
#undef ADD
    assert_int_equal(t, (uint32_t)ntensors);
    igrad__pack_map_t map;
    assert_int_equal(igrad__pack_map_build(full, nfull, B, &map), IGRAD_OK);

    int *bucket = malloc(m * sizeof *bucket);
    assert_non_null(bucket);
    double imb[5];
    for (int q = 0; q < 5; q++) {
        igrad__pack_config_t cfg = {all_policies[q], B, NULL, &map};
        int64_t loads[B];
        igrad_pack_metrics_t mt;
        assert_int_equal(igrad__pack_plan(&cfg, blk, m, NULL, 0, bucket, loads), IGRAD_OK);
        assert_int_equal(igrad__pack_metrics(loads, B, &mt), IGRAD_OK);
        imb[q] = mt.imbalance;
        print_message("demo %-10s blocks %zu: imbalance %.4f cv %.4f overflow %d empty %d "
                      "max %.0f min %.0f mean %.0f\n",
                      igrad_pack_policy_name(cfg.policy), m, mt.imbalance, mt.cv, mt.overflow,
                      mt.empty, mt.max_nbytes, mt.min_nbytes, mt.mean_nbytes);
    }
    if (!(imb[2] <= 1.10)) fail_msg("greedy imbalance %.4f above 1.10", imb[2]);
    if (!(imb[4] <= 1.10)) fail_msg("contiguous imbalance %.4f above 1.10", imb[4]);
    if (!(imb[1] > imb[2] && imb[1] > imb[4]))
        fail_msg("sequential imbalance %.4f not worse than greedy %.4f and contiguous %.4f",
                 imb[1], imb[2], imb[4]);
    free(bucket);
    free(blk);
    free(full);
    igrad__pack_map_free(&map);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_split),
        cmocka_unit_test(test_every_block_once),
        cmocka_unit_test(test_greedy_reference),
        cmocka_unit_test(test_contiguous_brute_force),
        cmocka_unit_test(test_contiguous_larger),
        cmocka_unit_test(test_sequential_hand),
        cmocka_unit_test(test_contiguous_hand),
        cmocka_unit_test(test_direct_hand),
        cmocka_unit_test(test_history_welford),
        cmocka_unit_test(test_risk_prefers_stable),
        cmocka_unit_test(test_metrics_hand),
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_plan_errors),
        cmocka_unit_test(test_demo_realistic_mix),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
