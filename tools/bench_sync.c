/* bench_sync.c — placeholder until the benchmark lands (being written now). */
#include <stdio.h>

#include "cli.h"

int bench_sync(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: 'bench sync' is not built yet\n");
    return 1;
}
