/* cmd_train.c — placeholder until the subcommand lands (being written now). */
#include <stdio.h>

#include "cli.h"

int cmd_train(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: 'train' is not built yet\n");
    return 1;
}
