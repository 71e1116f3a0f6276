/*
 * test_util.h — assertions the cmocka unit tests share: a status check that
 * prints the library's message, a message-fragment check, and a tolerance
 * check that prints both values. Include after <cmocka.h> and "igrad.h".
 */
#ifndef IGRAD_TEST_UTIL_H
#define IGRAD_TEST_UTIL_H

#include <math.h>
#include <string.h>

static inline void assert_ok_(igrad_status_t st, const char *expr, const char *file, int line)
{
    if (st != IGRAD_OK) {
        print_error("%s:%d: %s returned %d (%s): %s\n", file, line, expr, (int)st,
                    igrad_status_str(st), igrad_last_error());
        fail();
    }
}
#define assert_ok(expr) assert_ok_((expr), #expr, __FILE__, __LINE__)

static inline void assert_error_has(const char *frag)
{
    const char *msg = igrad_last_error();
    if (!strstr(msg, frag)) {
        print_error("last error '%s' does not contain '%s'\n", msg, frag);
        fail();
    }
}

static inline void check_near(double a, double b, double tol, const char *ea, const char *eb,
                              const char *file, int line)
{
    if (!(fabs(a - b) <= tol)) {
        print_error("%s:%d: %s = %.17g, %s = %.17g, |diff| %.3g > %.3g\n", file, line, ea, a,
                    eb, b, fabs(a - b), tol);
        fail();
    }
}
#define assert_near(a, b, tol) check_near((a), (b), (tol), #a, #b, __FILE__, __LINE__)

#endif /* IGRAD_TEST_UTIL_H */
