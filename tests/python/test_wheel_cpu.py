"""test_wheel_cpu.py — the wheel on a machine without MPI, CUDA or NCCL.

libigrad.so links none of them; the MPI communicator (libigrad_mpi.so)
and the CUDA data plane with the CUDA communicators (libigrad_cuda.so)
are plugins that it loads on first use (src/core/plugin.h). Here the
wheel is built from the checkout (a copy of python/ beside a link to the
build directory, as test_wheel.py does) into a fresh venv of
/usr/bin/python3 (pip install --no-build-isolation --no-index python/,
offline), and checked:
  - the installed package holds libigrad.so and each plugin the build
    made, copies of the build's files;
  - the installed libigrad.so needs none of MPI, CUDA, NCCL or libstdc++
    (its NEEDED entries, readelf -d), and what ldd resolves names none of
    MPI, CUDA, NCCL;
  - with MPI, CUDA and NCCL hidden from the dynamic linker (hide_libs.c,
    an LD_AUDIT module compiled here, refuses every place they would be
    found, so for the process they do not exist; checked by loading
    libmpi directly), `import igrad` and a CPU engine step run, the
    process maps none of them, and asking for the MPI communicator or a
    CUDA engine raises UnsupportedError naming the plugin and the library
    it misses (the first hidden NEEDED entry of the plugin, e.g.
    libmpi.so.40, libcudart.so.13), or the plugin file where the build
    has none;
  - with the plugins removed (a copy of the installed package without
    them) the same calls name the missing plugin file, and with
    IGRAD_PLUGIN_DIR at an empty directory too;
  - without hiding, the plugins load (MPI: "MPI is not initialized";
    CUDA: "no CUDA device" here), so the refusals above are the hidden
    libraries' doing.
Run with /usr/bin/python3; IGRAD_LIBRARY (set by CTest) names the built
library, whose directory is the build directory packaged.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("IGRAD_SOURCE_DIR") or os.path.dirname(os.path.dirname(HERE))
SYSTEM_PYTHON = "/usr/bin/python3"
PLUGINS = {"mpi": "libigrad_mpi.so", "cuda": "libigrad_cuda.so"}
# what "a machine without MPI, CUDA or NCCL" lacks (file-name prefixes)
HIDDEN = ("libmpi", "libopen-rte", "libopen-pal", "libcuda", "libnccl")
# what libigrad.so itself must not need
FORBIDDEN = HIDDEN + ("libstdc++",)

# Run inside the venv: import, one CPU step, then the plugins asked for.
# Prints one JSON object.
PROBE = r'''
import ctypes, json, sys
import igrad
from igrad import _lib as L
from igrad.core import Comm, Engine, Layout, make_config

def maps(prefixes):
    """The files mapped into this process whose names start with a prefix."""
    with open("/proc/self/maps") as f:
        files = {line.split()[5] for line in f if len(line.split()) > 5}
    return sorted(p for p in files if p.rsplit("/", 1)[-1].startswith(tuple(prefixes)))

out = {"library": igrad.library_path()}
shapes = [("model.layers.0.mlp.up_proj.weight", (64, 32)), ("lm_head.weight", (16, 8))]
layout = Layout.from_tensors(shapes)
engine = Engine(layout, None, make_config(method="topk_sync"), Comm.self_())
bufs = [(ctypes.c_float * (r * c))(*[((i * 37) % 101 - 50) / 7.0 for i in range(r * c)])
        for _, (r, c) in shapes]
before = [list(b) for b in bufs]
engine.sync(0, [ctypes.addressof(b) for b in bufs])
after = [list(b) for b in bufs]
out["kept"] = sum(1 for b in after for x in b if x != 0)
out["total"] = sum(len(b) for b in after)
out["kept_unchanged"] = all(x == 0 or x == y for b, o in zip(after, before)
                            for x, y in zip(b, o))
out["maps_after_step"] = maps(sys.argv[1].split(":"))
h = ctypes.c_void_p()
for key, fn, args in (("mpi", "igrad_comm_create_mpi", (None, ctypes.byref(h))),
                      ("cuda", "igrad_comm_create_self_cuda", (None, ctypes.byref(h)))):
    try:
        L.lib().call(fn, *args)
        out[key] = ["OK", ""]
    except L.IgradError as e:
        out[key] = [e.status_name, e.message]
try:
    Engine(layout, None, make_config(method="topk_sync"), Comm.self_(), device=0)
    out["cuda_engine"] = ["OK", ""]
except L.IgradError as e:
    out["cuda_engine"] = [e.status_name, e.message]
out["maps_at_end"] = maps(sys.argv[1].split(":"))
print(json.dumps(out))
'''


def clean_env(home):
    env = {k: v for k, v in os.environ.items()
           if k not in ("IGRAD_LIBRARY", "PYTHONPATH", "IGRAD_SOURCE_DIR", "PYTHONHOME",
                        "VIRTUAL_ENV", "PIP_INDEX_URL", "PIP_FIND_LINKS", "LD_AUDIT",
                        "IGRAD_PLUGIN_DIR", "LD_LIBRARY_PATH")}
    env["HOME"] = home
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(cmd, cwd, env, timeout=180):
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, universal_newlines=True, timeout=timeout)
    return p.returncode, p.stdout


def needed(path):
    """The NEEDED entries of an ELF file (readelf -d)."""
    out = subprocess.run(["readelf", "-d", path], check=True, stdout=subprocess.PIPE,
                         universal_newlines=True).stdout
    return [line.split("[", 1)[1].split("]", 1)[0] for line in out.splitlines()
            if "(NEEDED)" in line]


def forbidden(names):
    return [n for n in names if os.path.basename(n).startswith(FORBIDDEN)]


class WheelWithoutMpiCuda(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = None
        if not os.path.exists(SYSTEM_PYTHON):
            raise unittest.SkipTest("no %s" % SYSTEM_PYTHON)
        for tool in ("readelf", "ldd"):
            if not shutil.which(tool):
                raise unittest.SkipTest("no %s" % tool)
        compiler = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if not compiler:
            raise unittest.SkipTest("no C compiler (for the LD_AUDIT module)")
        built = os.environ.get("IGRAD_LIBRARY")
        if not (built and os.path.isfile(built)):
            raise AssertionError("IGRAD_LIBRARY=%r" % built)
        cls.build_dir = os.path.dirname(os.path.abspath(built))
        cls.plugins = {k: f for k, f in PLUGINS.items()
                       if os.path.isfile(os.path.join(cls.build_dir, f))}

        cls.tmp = tempfile.mkdtemp(prefix="igrad-wheel-cpu-")
        checkout = os.path.join(cls.tmp, "checkout")
        os.makedirs(checkout)
        shutil.copytree(os.path.join(SOURCE_DIR, "python"), os.path.join(checkout, "python"),
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__",
                                                      "libigrad*.so*"))
        shutil.copy(os.path.join(SOURCE_DIR, "CMakeLists.txt"), checkout)
        os.symlink(cls.build_dir, os.path.join(checkout, "build"))
        cls.env = clean_env(cls.tmp)
        venv = os.path.join(cls.tmp, "venv")
        for cmd in ([SYSTEM_PYTHON, "-m", "venv", "--system-site-packages", venv],
                    [os.path.join(venv, "bin", "pip"), "install", "--no-build-isolation",
                     "--no-index", "python/"]):
            rc, out = run(cmd, checkout, cls.env)
            if rc != 0:
                raise AssertionError("%s failed (rc %d):\n%s" % (" ".join(cmd), rc, out))
        cls.py = os.path.join(venv, "bin", "python")
        rc, site = run([cls.py, "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                       cls.tmp, cls.env)
        cls.package = os.path.join(site.strip(), "igrad")
        cls.hide = os.path.join(cls.tmp, "hide_libs.so")
        subprocess.run([compiler, "-shared", "-fPIC", os.path.join(HERE, "hide_libs.c"),
                        "-o", cls.hide], check=True)
        cls.probe = os.path.join(cls.tmp, "probe.py")
        with open(cls.probe, "w") as f:
            f.write(PROBE)

    @classmethod
    def tearDownClass(cls):
        if cls.tmp:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def probe_run(self, hide=False, pythonpath=None, plugin_dir=None):
        env = dict(self.env)
        if hide:
            env["LD_AUDIT"] = self.hide
            env["IGRAD_HIDE_LIBS"] = ":".join(HIDDEN)
        if pythonpath:
            env["PYTHONPATH"] = pythonpath
        if plugin_dir:
            env["IGRAD_PLUGIN_DIR"] = plugin_dir
        elsewhere = os.path.join(self.tmp, "elsewhere")
        os.makedirs(elsewhere, exist_ok=True)
        rc, out = run([self.py, self.probe, ":".join(HIDDEN)], elsewhere, env)
        self.assertEqual(rc, 0, out)
        return json.loads(out.strip().splitlines()[-1])

    def check_step(self, r):
        self.assertTrue(0 < r["kept"] < r["total"], r)  # a sparse step ran
        self.assertTrue(r["kept_unchanged"], r)         # one rank: kept values as they were
        self.assertEqual(r["maps_after_step"], [], r)

    def test_package_holds_library_and_plugins(self):
        for name in ["libigrad.so"] + list(self.plugins.values()):
            installed = os.path.join(self.package, name)
            self.assertTrue(os.path.isfile(installed) and not os.path.islink(installed),
                            "the wheel installed no %s" % installed)
            with open(installed, "rb") as a, open(os.path.join(self.build_dir, name),
                                                  "rb") as b:
                self.assertTrue(a.read() == b.read(), "installed %s differs from the build's"
                                % name)
        for key, name in PLUGINS.items():
            if key not in self.plugins:
                self.assertFalse(os.path.exists(os.path.join(self.package, name)))

    def test_core_needs_no_mpi_cuda_nccl(self):
        core = os.path.join(self.package, "libigrad.so")
        self.assertEqual(forbidden(needed(core)), [], needed(core))
        # (without LD_PRELOAD, which the sanitizer build sets and ldd would list)
        env = {k: v for k, v in self.env.items() if k != "LD_PRELOAD"}
        rc, out = run(["ldd", core], self.tmp, env)
        self.assertEqual(rc, 0, out)
        resolved = [line.split()[0] for line in out.splitlines() if line.strip()]
        # (libstdc++ may come in through the sanitizer's runtime, not MPI, CUDA, NCCL)
        self.assertEqual([n for n in resolved if os.path.basename(n).startswith(HIDDEN)], [],
                         out)
        # the plugins are what needs them
        if "mpi" in self.plugins:
            self.assertTrue(any(n.startswith("libmpi") for n in
                                needed(os.path.join(self.package, self.plugins["mpi"]))))
        if "cuda" in self.plugins:
            self.assertTrue(any(n.startswith("libcudart") for n in
                                needed(os.path.join(self.package, self.plugins["cuda"]))))

    def test_without_mpi_cuda_nccl(self):
        # the hiding works: libmpi cannot be loaded under it
        env = dict(self.env, LD_AUDIT=self.hide, IGRAD_HIDE_LIBS=":".join(HIDDEN))
        rc, out = run([self.py, "-c", "import ctypes; ctypes.CDLL('libmpi.so.40')"],
                      self.tmp, env)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("libmpi.so.40: cannot open shared object file", out)

        r = self.probe_run(hide=True)
        self.assertEqual(r["library"], os.path.join(self.package, "libigrad.so"))
        self.check_step(r)
        self.assertEqual(r["maps_at_end"], [], r)
        for key, results in (("mpi", [r["mpi"]]), ("cuda", [r["cuda"], r["cuda_engine"]])):
            for status, message in results:
                self.assertEqual(status, "E_UNSUPPORTED", message)
                self.assertIn("this igrad has no %s" % key.upper(), message)
                if key in self.plugins:
                    path = os.path.join(self.package, PLUGINS[key])
                    missing = [n for n in needed(path) if n.startswith(HIDDEN)]
                    self.assertIn("%s could not be loaded" % path, message)
                    self.assertTrue(any("%s: cannot open shared object file" % n in message
                                        for n in missing), (missing, message))
                else:
                    self.assertIn("%s is neither in %s" % (PLUGINS[key], self.package),
                                  message)

    def test_plugins_absent(self):
        copy = os.path.join(self.tmp, "copy")
        shutil.copytree(self.package, os.path.join(copy, "igrad"),
                        ignore=shutil.ignore_patterns("libigrad_*.so", "__pycache__"))
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty, exist_ok=True)
        for pythonpath, plugin_dir, where in ((copy, None, os.path.join(copy, "igrad")),
                                              (None, empty, empty)):
            r = self.probe_run(pythonpath=pythonpath, plugin_dir=plugin_dir)
            self.check_step(r)
            for key, (status, message) in (("mpi", r["mpi"]), ("cuda", r["cuda"]),
                                           ("cuda", r["cuda_engine"])):
                self.assertEqual(status, "E_UNSUPPORTED", message)
                self.assertIn("%s is neither in %s" % (PLUGINS[key], where), message)
                self.assertIn("nor on the library search path", message)

    def test_plugins_load_when_present(self):
        r = self.probe_run()
        self.check_step(r)
        if "mpi" in self.plugins:
            self.assertEqual(r["mpi"][0], "E_STATE", r["mpi"])
            self.assertIn("MPI is not initialized", r["mpi"][1])
        if "cuda" in self.plugins:  # loaded: what follows is the device's answer
            for status, message in (r["cuda"], r["cuda_engine"]):
                self.assertNotIn("could not be loaded", message)
            self.assertNotIn("this igrad has no CUDA", r["cuda_engine"][1])


if __name__ == "__main__":
    unittest_main.main()
