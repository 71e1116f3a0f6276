"""test_wheel.py — the non-editable install of README.md, as written.

In a temporary directory: a copy of the checkout's python/ beside a link
to the build directory (so pip's in-tree build writes nothing into the
source tree), HOME pointing there, and the README's install lines, taken
from README.md itself (the lines of its "Using igrad from PyTorch" block
that name ~/igrad-venv), run by bash from the copy's root, with neither
IGRAD_LIBRARY nor PYTHONPATH set: a fresh venv of /usr/bin/python3 made
with --system-site-packages, `pip install --no-build-isolation
--no-index python/` (no network), then the snippet, from another
directory. Checked: the wheel put a real libigrad.so into the installed
package, the snippet printed this package's version and that library's
path, igrad.torch imported (torch through the system site packages);
and with the system site packages off (python -S, the installed package
on PYTHONPATH), `import igrad` works and `import igrad.torch` raises
ModuleNotFoundError saying that it needs PyTorch and which interpreter
has it.
Run with /usr/bin/python3; IGRAD_LIBRARY (set by CTest) names the built
library, whose directory is the build directory packaged.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("IGRAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(SOURCE_DIR, "python"))
from igrad._lib import __version__  # noqa: E402 (the checkout's package, via IGRAD_LIBRARY)

SYSTEM_PYTHON = "/usr/bin/python3"


def readme_install_lines():
    """The lines of README.md's install block that use ~/igrad-venv."""
    with open(os.path.join(SOURCE_DIR, "README.md")) as f:
        text = f.read()
    section = text[text.index("## Using igrad from PyTorch"):]
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        lines = [ln for ln in block.splitlines() if "igrad-venv" in ln]
        if lines:
            return lines
    raise AssertionError("README.md's PyTorch section has no block using ~/igrad-venv")


def clean_env(home):
    env = {k: v for k, v in os.environ.items()
           if k not in ("IGRAD_LIBRARY", "PYTHONPATH", "IGRAD_SOURCE_DIR", "PYTHONHOME",
                        "VIRTUAL_ENV", "PIP_INDEX_URL", "PIP_FIND_LINKS")}
    env["HOME"] = home
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd, cwd, env, timeout=120):
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    return p.returncode, p.stdout


class WheelInstall(unittest.TestCase):
    def test_readme_install_in_fresh_venv(self):
        if not os.path.exists(SYSTEM_PYTHON):
            self.skipTest("no %s" % SYSTEM_PYTHON)
        built = os.environ.get("IGRAD_LIBRARY")
        self.assertTrue(built and os.path.isfile(built), "IGRAD_LIBRARY=%r" % built)
        build_dir = os.path.dirname(os.path.abspath(built))
        self.assertTrue(os.path.isfile(os.path.join(build_dir, "libigrad.so")), build_dir)
        lines = readme_install_lines()
        self.assertEqual(len(lines), 3, lines)  # venv, pip install, the snippet

        with tempfile.TemporaryDirectory(prefix="igrad-wheel-") as tmp:
            checkout = os.path.join(tmp, "checkout")
            os.makedirs(checkout)
            shutil.copytree(os.path.join(SOURCE_DIR, "python"), os.path.join(checkout, "python"),
                            ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                          "libigrad.so*"))
            shutil.copy(os.path.join(SOURCE_DIR, "CMakeLists.txt"), checkout)
            os.symlink(build_dir, os.path.join(checkout, "build"))
            env = clean_env(tmp)

            outputs = []
            for line in lines:
                rc, out = run(["bash", "-ec", line], checkout, env)
                outputs.append(out)
                self.assertEqual(rc, 0, "README line failed (rc %d): %s\n%s" % (rc, line, out))

            venv = os.path.join(tmp, "igrad-venv")
            py = os.path.join(venv, "bin", "python")
            rc, site = run([py, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                           tmp, env)
            site = site.strip()
            installed = os.path.join(site, "igrad", "libigrad.so")
            self.assertTrue(os.path.isfile(installed) and not os.path.islink(installed),
                            "the wheel installed no libigrad.so: %s" % installed)
            with open(installed, "rb") as a, open(os.path.join(build_dir, "libigrad.so"),
                                                  "rb") as b:
                self.assertTrue(a.read() == b.read(), "installed library differs from the build's")

            # the snippet printed the version and the installed library
            self.assertEqual(outputs[2].split(), [__version__, installed], outputs[2])

            # without the system site packages: no torch, a clear message
            nowhere = os.path.join(tmp, "elsewhere")
            os.makedirs(nowhere)
            env_s = dict(env, PYTHONPATH=site)
            rc, out = run([py, "-S", "-c", "import igrad; print(igrad.library_path())"],
                          nowhere, env_s)
            self.assertEqual((rc, out.strip()), (0, installed), out)
            rc, out = run([py, "-S", "-c", "import igrad.torch"], nowhere, env_s)
            self.assertNotEqual(rc, 0, out)
            self.assertIn("ModuleNotFoundError: igrad.torch needs PyTorch", out)
            self.assertIn(py, out)  # the interpreter that lacks it
            self.assertIn("/usr/bin/python3", out)  # and the one that has it
            rc, out = run([py, "-S", "-c", "import igrad; igrad.torch"], nowhere, env_s)
            self.assertIn("igrad.torch needs PyTorch", out)


if __name__ == "__main__":
    unittest_main.main()
