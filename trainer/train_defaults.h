/*
 * train_defaults.h — what `igrad train` runs when a flag is not given:
 * the values train_options_resolve() (train.c) gives the auto options of
 * a dense or a sparse method. Header only, on igrad.h alone, so that a
 * tool pricing "what train runs" takes the same definition without the
 * trainer being built: `igrad plan` (tools/cmd_plan.c) defaults its
 * sparse rows to TRAIN_SPARSE_DENSITY and TRAIN_SPARSE_VALUE_DTYPE
 * (decision 0064).
 *
 * Not here: the other option defaults (train_options_default(), train.h)
 * and the library's own config defaults (IGRAD_CONFIG_INIT, igrad.h).
 */
#ifndef IGRAD_TRAINER_TRAIN_DEFAULTS_H
#define IGRAD_TRAINER_TRAIN_DEFAULTS_H

#include "igrad.h"

/* --beta1, --momentum, --start-iter not given: dense keeps AdamW's beta1
 * 0.9 and no remedy; a sparse method gets TRAIN_SPARSE_* (measured,
 * docs/results/remedies.md; with --ef-on update too: beta1 0.9 there
 * measured 1.03 x dense). */
#define TRAIN_DENSE_BETA1 0.9
#define TRAIN_SPARSE_BETA1 0.0
#define TRAIN_SPARSE_MOMENTUM 0.0
#define TRAIN_SPARSE_START_ITER 0
/* --density not given (NaN): the sparse methods' density, the fewest bytes
 * that kept adtopk_sync within 1 % of dense on the suite's workloads
 * (docs/results/vs_dense.md, decision 0062); dense keeps 0.01 (unused).
 * adtopk_sync at 0.01 stays the yardstick, reached with --density 0.01. */
#define TRAIN_SPARSE_DENSITY 0.04
#define TRAIN_DENSE_DENSITY 0.01
/* --value-dtype not given: the sparse methods send BF16 values (loss-neutral
 * against F32 over 3 seeds on two workloads, 0.62 x the bytes:
 * docs/results/wire.md, decision 0063); dense all-reduces F32. */
#define TRAIN_SPARSE_VALUE_DTYPE IGRAD_DTYPE_BF16
/* Spelled for --help texts. */
#define TRAIN_STR_(x) #x
#define TRAIN_STR(x) TRAIN_STR_(x)

#endif /* IGRAD_TRAINER_TRAIN_DEFAULTS_H */
