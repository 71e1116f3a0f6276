/*
 * config.c — igrad_config_validate: every field of igrad_config_t
 * checked, with a message naming the field and its value. The enums'
 * ranges are their name tables' (core/names.h).
 */
#include "core/names.h"
#include "core/sparsifier.h"
#include "plan/plan.h"
#include "plan/route.h"
#include "plan/schedule.h"
#include "profile/profile_internal.h"

#include <string.h>

#include <float.h>
#include <math.h>

static int method_defers(igrad_method_t m)
{
    return m == IGRAD_METHOD_IAD || m == IGRAD_METHOD_IG;
}

igrad_status_t igrad_config_validate(const igrad_config_t *c)
{
    IGRAD_FAIL_IF(!c, IGRAD_E_INVALID, "config is NULL");
    IGRAD_FAIL_IF(c->size < sizeof(igrad_config_t), IGRAD_E_INVALID,
                  "config.size is %zu, but this igrad's igrad_config_t has %zu bytes "
                  "(initialise it with IGRAD_CONFIG_INIT)",
                  c->size, sizeof(igrad_config_t));
    IGRAD_FAIL_IF((int)c->method < 0 || (int)c->method >= igrad__method_names.count,
                  IGRAD_E_INVALID, "config.method is %d (dense, topk_sync, adtopk_sync, iad, ig)",
                  (int)c->method);
    IGRAD_FAIL_IF((int)c->sparsifier < 0 || (int)c->sparsifier >= igrad__sparsifier_names.count,
                  IGRAD_E_INVALID, "config.sparsifier is %d (none, topk, adtopk)",
                  (int)c->sparsifier);
    IGRAD_FAIL_IF(method_defers(c->method) && igrad__sparsifier_dense(c->sparsifier),
                  IGRAD_E_INVALID,
                  "config.sparsifier is none, but method %s needs topk or adtopk "
                  "(method dense sends everything)",
                  igrad_method_name(c->method));
    IGRAD_FAIL_IF(c->interleave != 0 && c->interleave != 1, IGRAD_E_INVALID,
                  "config.interleave is %d (must be 0 or 1)", c->interleave);
    IGRAD_FAIL_IF(!(c->density > 0.0 && c->density <= 1.0), IGRAD_E_INVALID,
                  "config.density is %g (must be in (0, 1])", c->density);
    IGRAD_FAIL_IF(c->release_period < 1 || c->release_period > IGRAD__SCHEDULE_MAX_PERIOD,
                  IGRAD_E_INVALID, "config.release_period is %d (must be in [1, %d])",
                  c->release_period, IGRAD__SCHEDULE_MAX_PERIOD);
    IGRAD_FAIL_IF(!(c->release_keep > 0.0 && c->release_keep <= 1.0), IGRAD_E_INVALID,
                  "config.release_keep is %g (must be in (0, 1])", c->release_keep);
    IGRAD_FAIL_IF(c->schedule != IGRAD_SCHEDULE_ALIGNED && c->schedule != IGRAD_SCHEDULE_STAGGERED,
                  IGRAD_E_INVALID, "config.schedule is %d (aligned, staggered)",
                  (int)c->schedule);
    IGRAD_FAIL_IF((int)c->residual < 0 || (int)c->residual >= igrad__residual_names.count,
                  IGRAD_E_INVALID, "config.residual is %d (on, drop)", (int)c->residual);
    IGRAD_FAIL_IF((int)c->pack < 0 || (int)c->pack > IGRAD_PACK_CONTIGUOUS, IGRAD_E_INVALID,
                  "config.pack is %d (direct, sequential, greedy, risk, contiguous)",
                  (int)c->pack);
    IGRAD_FAIL_IF(c->buckets < 1 || c->buckets > IGRAD__PACK_MAX_BUCKETS, IGRAD_E_INVALID,
                  "config.buckets is %d (must be in [1, %d])", c->buckets,
                  IGRAD__PACK_MAX_BUCKETS);
    IGRAD_FAIL_IF(c->block_entries < 1, IGRAD_E_INVALID,
                  "config.block_entries is %lld (must be >= 1)", (long long)c->block_entries);
    IGRAD_FAIL_IF(c->verify_every < 0, IGRAD_E_INVALID,
                  "config.verify_every is %lld (must be >= 0; 0 = only at create)",
                  (long long)c->verify_every);
    IGRAD_FAIL_IF(c->value_dtype != IGRAD_DTYPE_F32 && c->value_dtype != IGRAD_DTYPE_BF16 &&
                      c->value_dtype != IGRAD_DTYPE_F16 && c->value_dtype != IGRAD_DTYPE_F8_E4M3,
                  IGRAD_E_INVALID, "config.value_dtype is %s (F32, BF16, F16 or F8_E4M3)",
                  igrad_dtype_name(c->value_dtype));
    IGRAD_FAIL_IF(c->value_dtype != IGRAD_DTYPE_F32 && c->method == IGRAD_METHOD_DENSE,
                  IGRAD_E_UNSUPPORTED,
                  "config.value_dtype is %s, but method dense all-reduces F32 (it keeps no "
                  "residual to take the rounding error back; use F32)",
                  igrad_dtype_name(c->value_dtype));
    IGRAD_FAIL_IF(c->grad_dtype != IGRAD_DTYPE_F32 && c->grad_dtype != IGRAD_DTYPE_BF16 &&
                      c->grad_dtype != IGRAD_DTYPE_F16,
                  IGRAD_E_INVALID, "config.grad_dtype is %s (F32, BF16 or F16)",
                  igrad_dtype_name(c->grad_dtype));
    IGRAD_FAIL_IF(c->index_dtype != IGRAD_DTYPE_U16 && c->index_dtype != IGRAD_DTYPE_U32,
                  IGRAD_E_INVALID,
                  "config.index_dtype is %s (U16: 16-bit where indices fit, U32: always 32-bit)",
                  igrad_dtype_name(c->index_dtype));
    IGRAD_FAIL_IF((int)c->collective < 0 || (int)c->collective >= igrad__collective_names.count,
                  IGRAD_E_INVALID, "config.collective is %d (auto, gather, reduce, sparse_reduce)",
                  (int)c->collective);
    IGRAD_FAIL_IF((int)c->topology < 0 || (int)c->topology >= igrad__topology_names.count,
                  IGRAD_E_INVALID, "config.topology is %d (flat, hier)", (int)c->topology);
    IGRAD_FAIL_IF(c->ranks_per_node < 0, IGRAD_E_INVALID,
                  "config.ranks_per_node is %d (must be >= 0; 0 = the nodes MPI reports)",
                  c->ranks_per_node);
    IGRAD_FAIL_IF(c->dense_below < 0, IGRAD_E_INVALID,
                  "config.dense_below is %lld (must be >= 0; 0 = off)",
                  (long long)c->dense_below);
    IGRAD_FAIL_IF(c->link_latency_ns < 0 || c->link_latency_ns > IGRAD__LINK_MAX_LATENCY_NS,
                  IGRAD_E_INVALID,
                  "config.link_latency_ns is %lld (must be in [0, 1000000000]; 0 = auto by "
                  "bytes alone)",
                  (long long)c->link_latency_ns);
    IGRAD_FAIL_IF(c->link_bandwidth_mbps < 1 ||
                      c->link_bandwidth_mbps > IGRAD__LINK_MAX_BANDWIDTH_MBPS,
                  IGRAD_E_INVALID,
                  "config.link_bandwidth_mbps is %lld (must be in [1, 1000000000] Mbit/s)",
                  (long long)c->link_bandwidth_mbps);
    IGRAD_FAIL_IF(c->auto_sparse_reduce != 0 && c->auto_sparse_reduce != 1, IGRAD_E_INVALID,
                  "config.auto_sparse_reduce is %d (0 or 1)", c->auto_sparse_reduce);
    IGRAD_FAIL_IF(c->index_code != IGRAD_INDEX_CODE_FIXED &&
                      c->index_code != IGRAD_INDEX_CODE_COMPACT,
                  IGRAD_E_INVALID, "config.index_code is %d (fixed, compact)", (int)c->index_code);
    IGRAD_FAIL_IF(c->allocation != IGRAD_ALLOCATION_PARTITION &&
                      c->allocation != IGRAD_ALLOCATION_BUDGET,
                  IGRAD_E_INVALID, "config.allocation is %d (0 partition, 1 budget)",
                  (int)c->allocation);
    IGRAD_FAIL_IF(c->allocation == IGRAD_ALLOCATION_BUDGET && c->topology != IGRAD_TOPOLOGY_FLAT,
                  IGRAD_E_UNSUPPORTED,
                  "config.allocation budget needs topology flat (a shard engine would "
                  "allocate its own shard's bytes)");
    IGRAD_FAIL_IF(c->threads < 0 || c->threads > 4096, IGRAD_E_INVALID,
                  "config.threads is %d (must be in [0, 4096]; 0 = OpenMP default)", c->threads);
    IGRAD_FAIL_IF(!(c->timeout_s >= 0.0 && c->timeout_s <= DBL_MAX), IGRAD_E_INVALID,
                  "config.timeout_s is %g (must be a finite number of seconds >= 0; 0 = no "
                  "timeout)",
                  c->timeout_s);
    /* online profiling */
    IGRAD_FAIL_IF(c->profile_steps < 0 || c->profile_steps > IGRAD__ONLINE_MAX_STEPS,
                  IGRAD_E_INVALID, "config.profile_steps is %lld (must be in [0, %d]; 0 = off)",
                  (long long)c->profile_steps, IGRAD__ONLINE_MAX_STEPS);
    IGRAD_FAIL_IF(c->profile_steps > 0 && !method_defers(c->method), IGRAD_E_INVALID,
                  "config.profile_steps is %lld, but method %s uses no profile (iad, ig)",
                  (long long)c->profile_steps, igrad_method_name(c->method));
    IGRAD_FAIL_IF(!(c->profile_alpha >= 0.0 && c->profile_alpha <= 1.0), IGRAD_E_INVALID,
                  "config.profile_alpha is %g (must be in [0, 1])", c->profile_alpha);
    if (c->profile_partition) {
        igrad__partition_method_t pm;
        IGRAD_FAIL_IF(strlen(c->profile_partition) >= IGRAD__ONLINE_PARTITION_NBYTES ||
                          igrad__partition_parse(c->profile_partition, &pm) != IGRAD_OK,
                      IGRAD_E_INVALID,
                      "config.profile_partition is \"%.60s\" (knee, otsu, kmeans2, gmm2, "
                      "percentile:P, fixed:F)",
                      c->profile_partition);
    }
    IGRAD_FAIL_IF(!(c->momentum >= 0.0 && c->momentum < 1.0), IGRAD_E_INVALID,
                  "config.momentum is %g (must be in [0, 1); 0 = off)", c->momentum);
    IGRAD_FAIL_IF(c->start_iter < 0, IGRAD_E_INVALID,
                  "config.start_iter is %lld (must be >= 0; 0 = no dense warm-up)",
                  (long long)c->start_iter);
    IGRAD_FAIL_IF(!(c->target_ratio == 0.0 || (c->target_ratio > 0.0 && c->target_ratio <= 1.0)),
                  IGRAD_E_INVALID, "config.target_ratio is %g (must be in (0, 1]; 0 = off)",
                  c->target_ratio);
    IGRAD_FAIL_IF(c->target_ratio > 0.0 && c->method != IGRAD_METHOD_IG, IGRAD_E_INVALID,
                  "config.target_ratio is %g, but method %s has no kappa to choose (ig)",
                  c->target_ratio, igrad_method_name(c->method));
    IGRAD_FAIL_IF(c->reprofile_every < 0 || c->reprofile_every > IGRAD__ONLINE_MAX_STEPS,
                  IGRAD_E_INVALID,
                  "config.reprofile_every is %lld (must be in [0, %d]; 0 = off)",
                  (long long)c->reprofile_every, IGRAD__ONLINE_MAX_STEPS);
    IGRAD_FAIL_IF(c->reprofile_every > 0 && c->profile_steps == 0, IGRAD_E_INVALID,
                  "config.reprofile_every is %lld, but config.profile_steps is 0 (re-profiling "
                  "follows online profiling)",
                  (long long)c->reprofile_every);
    IGRAD_FAIL_IF(!(c->reprofile_margin >= 0.0 && c->reprofile_margin <= 1.0), IGRAD_E_INVALID,
                  "config.reprofile_margin is %g (must be in [0, 1])", c->reprofile_margin);
    return IGRAD_OK;
}
