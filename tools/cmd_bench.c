/*
 * cmd_bench.c — `igrad bench <what>`: dispatches to the benchmarks in
 * tools/bench_*.c. Benchmarks print ratios measured side by side in one run;
 * they are never tests with time limits.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fprintf(argc < 2 ? stderr : stdout,
                "usage: igrad bench select [options]   fused EF + top-k vs streaming pass\n"
                "       igrad bench sync [options]     sync methods over MPI (mpirun -np P)\n"
                "       igrad bench comm [options]     all-gather / all-reduce / reduce / bcast\n"
                "                                      size sweep (mpirun)\n"
                "(igrad bench <what> --help for options)\n");
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "select")) return bench_select(argc - 1, argv + 1);
    if (!strcmp(argv[1], "sync")) return bench_sync(argc - 1, argv + 1);
    if (!strcmp(argv[1], "comm")) return bench_comm(argc - 1, argv + 1);
    fprintf(stderr, "igrad: unknown benchmark '%s' (select, sync, comm)\n", argv[1]);
    return 2;
}
