"""unittest_main.py — the entry point every tests/python/test_*.py ends
with: runs the file's tests like unittest.main() and exits 0 when all
passed, 1 on a failure or error, and 77 when none failed but some were
skipped (a missing compiler, mpirun, capsh or privilege), which CTest
reports as Skipped (SKIP_RETURN_CODE), so a skip never reads "Passed"."""
import sys
import unittest


def main(verbosity=1):
    prog = unittest.main(module="__main__", exit=False, verbosity=verbosity)
    result = prog.result
    if not result.wasSuccessful():
        sys.exit(1)
    if result.skipped:
        print("%d test(s) skipped: %s" % (len(result.skipped),
                                        "; ".join(why for _, why in result.skipped)))
        sys.exit(77)
    sys.exit(0)
