/* bench_select.c — placeholder until the benchmark lands (being written now). */
#include <stdio.h>

#include "cli.h"

int bench_select(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: 'bench select' is not built yet\n");
    return 1;
}
