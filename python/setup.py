"""setup.py — the build step that puts libigrad.so and its plugins into
the wheel.

pyproject.toml holds the package's metadata; this file only adds what
setuptools cannot do from it: copying the C library built by the
project's CMake (../build/libigrad.so, or the file IGRAD_LIBRARY names)
into the wheel's igrad/ directory, where igrad/_lib.py looks first, so an
installed package finds its own library from any working directory, and
with it the plugins found beside it (libigrad_mpi.so, libigrad_cuda.so:
libigrad.so loads them from its own directory on first use, so the wheel
imports and runs CPU engines on a machine without MPI, CUDA or NCCL, and
says which library is missing when asked for one). When no built library
is there, it runs CMake to build one (target `lib`: the library and its
plugins, into ../build). Editable installs copy nothing: the package is
the checkout's python/igrad, which finds ../build/libigrad.so by itself.

The wheel is platform-specific (it carries a compiled library), so the
distribution says it has extension modules.

Offline (no PyPI): pip install --no-build-isolation --no-index python/
"""
import os
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
BUILD_DIR = os.path.join(REPO, "build")
# libigrad.so's plugins, packaged when the build made them (CMakeLists.txt)
PLUGINS = ("libigrad_mpi.so", "libigrad_cuda.so")


def _built_library():
    """The libigrad.so to package: IGRAD_LIBRARY, else the checkout's
    build/libigrad.so, built with CMake when it is absent."""
    env = os.environ.get("IGRAD_LIBRARY")
    if env:
        path = os.path.abspath(env)
        if not os.path.isfile(path):
            raise SystemExit("igrad setup: IGRAD_LIBRARY=%s: no such file (resolved as %s)"
                             % (env, path))
        return path
    path = os.path.join(BUILD_DIR, "libigrad.so")
    if os.path.isfile(path):
        return path
    if not os.path.isfile(os.path.join(REPO, "CMakeLists.txt")):
        raise SystemExit("igrad setup: no libigrad.so to package: %s is missing and %s is "
                         "not the igrad checkout; set IGRAD_LIBRARY to a built libigrad.so"
                         % (path, REPO))
    print("igrad setup: %s is missing; building it with CMake" % path)
    subprocess.check_call(["cmake", "-S", REPO, "-B", BUILD_DIR,
                           "-DCMAKE_BUILD_TYPE=RelWithDebInfo"])
    subprocess.check_call(["cmake", "--build", BUILD_DIR, "--target", "lib",
                           "-j", str(os.cpu_count() or 1)])
    return path


class BuildPyWithLibrary(build_py):
    """build_py, then libigrad.so and the plugins beside it copied (the
    files, not symlinks) next to the package's modules."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        src = _built_library()
        files = [(src, "libigrad.so")]
        for name in PLUGINS:
            plugin = os.path.join(os.path.dirname(src), name)
            if os.path.isfile(plugin):
                files.append((plugin, name))
            else:
                print("igrad setup: no %s beside %s: the package will not have it"
                      % (name, src))
        for path, name in files:
            dst = os.path.join(self.build_lib, "igrad", name)
            shutil.copyfile(path, dst)  # follows build/libigrad.so -> libigrad.so.0...
            os.chmod(dst, 0o755)
            print("igrad setup: packaged %s" % path)


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=BinaryDistribution)
