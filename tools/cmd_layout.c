/* cmd_layout.c — placeholder until the subcommand lands (being written now). */
#include <stdio.h>

#include "cli.h"

int cmd_layout(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: 'layout' is not built yet\n");
    return 1;
}
