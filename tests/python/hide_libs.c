/*
 * hide_libs.c — an rtld-audit module (LD_AUDIT, man 7 rtld-audit) that
 * makes shared libraries unfindable, so that a test can run a process as
 * on a machine that lacks them, without a container: every library whose
 * file name starts with one of the colon-separated prefixes in
 * IGRAD_HIDE_LIBS ("libmpi:libcuda") is refused at every step of the
 * dynamic linker's search, and the load fails as it would there ("libmpi.so.40:
 * cannot open shared object file: No such file or directory").
 * Used by tests/python/test_wheel_cpu.py, which compiles it:
 *   cc -shared -fPIC hide_libs.c -o hide_libs.so
 */
#define _GNU_SOURCE
#include <link.h>
#include <stdlib.h>
#include <string.h>

unsigned int la_version(unsigned int version)
{
    (void)version;
    return LAV_CURRENT;
}

static int hidden(const char *name)
{
    const char *list = getenv("IGRAD_HIDE_LIBS");
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    while (list && *list) {
        const char *end = strchr(list, ':');
        size_t n = end ? (size_t)(end - list) : strlen(list);
        if (n > 0 && strncmp(base, list, n) == 0) return 1;
        list = end ? end + 1 : NULL;
    }
    return 0;
}

/* The name as asked for (LA_SER_ORIG) passes, so that the dynamic
 * linker's error names it; each place it would be found is refused. */
char *la_objsearch(const char *name, uintptr_t *cookie, unsigned int flag)
{
    (void)cookie;
    return flag != LA_SER_ORIG && hidden(name) ? NULL : (char *)name;
}
