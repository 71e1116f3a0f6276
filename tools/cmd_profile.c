/* cmd_profile.c — placeholder until the subcommand lands (being written now). */
#include <stdio.h>

#include "cli.h"

int cmd_profile(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "igrad: 'profile' is not built yet\n");
    return 1;
}
