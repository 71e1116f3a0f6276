/*
 * dump_data.c — writes the reference trainer's batches (trainer/data.c, the
 * same code `igrad train` reads its data with) to a flat file, so that
 * run.py trains the PyTorch model on exactly the tokens the C trainer sees:
 * the same train/validation split, the same windows per step and rank.
 *
 *   dump_data SPEC SEED T G P STEPS VAL_FRACTION EVAL_BATCHES OUT
 *
 * OUT: int32 little-endian words: STEPS, G, T, NVAL, then for every step
 * the G rows of the global batch (rank r's B = G/P rows at rows r*B..) as
 * inputs (G*T) then targets (G*T), then the NVAL validation rows as inputs
 * (NVAL*T) then targets (NVAL*T). Targets are -1 where masked. NVAL is
 * EVAL_BATCHES*G capped by the split, as `igrad train` sets val_max_seqs.
 * Built by run.py (cc ... trainer/data.c trainer/task.c
 * src/core/json_strict.c -lcjson).
 */
#include "data.h"

#include <stdio.h>
#include <stdlib.h>

static int put(FILE *f, const int *v, size_t n)
{
    return fwrite(v, sizeof(int), n, f) == n ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc != 10) {
        fprintf(stderr, "usage: dump_data SPEC SEED T G P STEPS VAL_FRACTION EVAL_BATCHES OUT\n");
        return 2;
    }
    data_options_t o = DATA_OPTIONS_INIT;
    o.seed = strtoull(argv[2], NULL, 10);
    o.seq_len = atoi(argv[3]);
    int G = atoi(argv[4]), P = atoi(argv[5]), steps = atoi(argv[6]);
    o.val_fraction = atof(argv[7]);
    o.val_max_seqs = (size_t)atoi(argv[8]) * (size_t)G;
    int T = o.seq_len, B = G / P;
    dataset_t ds;
    data_error_t err;
    if (dataset_load(&ds, argv[1], &o, &err) != DATA_OK) {
        fprintf(stderr, "dump_data: %s\n", err.message);
        return 1;
    }
    size_t rows = ds.nval_seqs > (size_t)G ? ds.nval_seqs : (size_t)G;
    int *in = malloc(rows * (size_t)T * sizeof(int)), *tg = malloc(rows * (size_t)T * sizeof(int));
    FILE *f = fopen(argv[9], "wb");
    int head[4] = {steps, G, T, (int)ds.nval_seqs};
    int bad = !in || !tg || !f || put(f, head, 4);
    for (int s = 0; s < steps && !bad; s++) {
        for (int r = 0; r < P && !bad; r++)
            bad = dataset_train_batch(&ds, s, G, r, P, in + (size_t)r * B * T,
                                      tg + (size_t)r * B * T, &err) != DATA_OK;
        bad = bad || put(f, in, (size_t)G * T) || put(f, tg, (size_t)G * T);
    }
    bad = bad || (ds.nval_seqs && dataset_val_batch(&ds, 0, ds.nval_seqs, in, tg, &err) != DATA_OK);
    bad = bad || put(f, in, ds.nval_seqs * (size_t)T) || put(f, tg, ds.nval_seqs * (size_t)T);
    bad = (f && fclose(f) != 0) || bad;
    free(in);
    free(tg);
    dataset_free(&ds);
    if (bad) fprintf(stderr, "dump_data: failed (%s)\n", err.message);
    return bad;
}
