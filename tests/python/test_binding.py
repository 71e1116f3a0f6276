"""test_binding.py — the ctypes binding itself, in one process:

  - every ctypes.Structure matches include/igrad.h (a C program compiled
    here prints the real offsets and sizes);
  - the version check refuses a library of another version (a fake
    libigrad built here, imported in a subprocess, and the expected-version
    hook), with an ImportError that names both versions;
  - a non-OK status becomes the matching IgradError subclass carrying
    igrad_last_error();
  - layout_from_module (trainable only, "module." stripped, HF components);
  - the custom communicator: Python callbacks give the same step as the
    self communicator, and an exception in a callback is a CommError;
  - IgradState/GradientSynchronizer errors without torch.distributed: a
    profile of another model, an unknown parameter name, another model;
    a parameter replaced, resized or cast to another dtype after attaching
    (MismatchError naming it), and the Profiler's own size check;
  - every enum table of the binding equals its igrad.h enum (a C program
    prints the values); every dtype the library names works in a Layout.
"""
import ctypes
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import unittest_main  # noqa: E402 (tests/python, the script's folder)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import igrad_torch_helpers as H  # noqa: E402

import torch  # noqa: E402

import igrad  # noqa: E402
import igrad.torch as it  # noqa: E402
from igrad.torch.comm import _wrap  # noqa: E402
from igrad import _lib as L  # noqa: E402

STRUCTS = {
    "igrad_tensor_info_t": L.TensorInfo, "igrad_component_info_t": L.ComponentInfo,
    "igrad_select_spec_t": L.SelectSpec, "igrad_selection_t": L.Selection,
    "igrad_profile_options_t": L.ProfileOptions, "igrad_profile_entry_t": L.ProfileEntry,
    "igrad_comm_ops_t": L.CommOps, "igrad_config_t": L.Config, "igrad_bucket_t": L.Bucket,
    "igrad_step_stats_t": L.StepStats, "igrad_tensor_plan_t": L.TensorPlan,
    "igrad_target_fit_t": L.TargetFit,
}


def cc():
    return shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")


class Binding(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    # -- ABI ---------------------------------------------------------------

    def test_struct_layouts_match_the_header(self):
        compiler = cc()
        if not compiler:
            self.skipTest("no C compiler")
        lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "igrad.h"',
                 "int main(void) {"]
        for cname, cls in STRUCTS.items():
            lines.append('printf("%s __sizeof__ %%zu\\n", sizeof(%s));' % (cname, cname))
            for field, _ in cls._fields_:
                lines.append('printf("%s %s %%zu\\n", offsetof(%s, %s));' % (
                    cname, field, cname, field))
        lines += ['printf("IGRAD_VERSION_NUMBER %d\\n", IGRAD_VERSION_NUMBER);']
        # IGRAD_CONFIG_INIT, so the package's defaults cannot drift from the header's
        lines.append("igrad_config_t d = IGRAD_CONFIG_INIT;")
        for field, ctype in L.Config._fields_:
            fmt = "%.17g" if ctype is ctypes.c_double else "%lld"
            cast = "" if ctype is ctypes.c_double else "(long long)"
            lines.append('printf("CONFIG_INIT %s %s\\n", %sd.%s);' % (field, fmt, cast, field))
        lines.append("return 0; }")
        src = os.path.join(self.dir, "abi.c")
        with open(src, "w") as f:
            f.write("\n".join(lines))
        exe = os.path.join(self.dir, "abi")
        inc = os.path.join(H.SOURCE_DIR, "include")
        subprocess.run([compiler, "-std=c11", "-I", inc, src, "-o", exe], check=True)
        out = subprocess.run([exe], check=True, capture_output=True, text=True).stdout
        c, init = {}, {}
        for line in out.splitlines():
            if line.startswith("CONFIG_INIT "):
                _, field, value = line.split(" ")
                init[field] = float(value)
                continue
            name, field, value = line.rsplit(" ", 2) if line.count(" ") == 2 else (
                line.split(" ")[0], "", line.split(" ")[1])
            c[(name, field)] = int(value)
        for cname, cls in STRUCTS.items():
            self.assertEqual(ctypes.sizeof(cls), c[(cname, "__sizeof__")], "sizeof(%s)" % cname)
            for field, _ in cls._fields_:
                self.assertEqual(getattr(cls, field).offset, c[(cname, field)],
                                 "offsetof(%s, %s)" % (cname, field))
        ours = igrad.make_config()
        for field, ctype in L.Config._fields_:
            if ctype is ctypes.c_char_p:  # a NULL default: printed as 0, None here
                self.assertEqual(getattr(ours, field) is None, init[field] == 0,
                                 "default config.%s: package vs IGRAD_CONFIG_INIT" % field)
                continue
            self.assertEqual(float(getattr(ours, field)), init[field],
                             "default config.%s: package vs IGRAD_CONFIG_INIT" % field)
        # igrad.Config's defaults are the library's (igrad_config_default)
        d = igrad.config_to_dict(igrad.make_config())
        for field, value in dataclasses.asdict(igrad.Config()).items():
            self.assertEqual(value, d[field] if field != "profile_partition" else None, field)
        eng = igrad.Engine(igrad.Layout.from_tensors([("w", (64, 64))]), None,
                           igrad.Config(method="topk_sync", density=0.125), igrad.Comm.self_())
        self.assertEqual(igrad.Config.from_struct(eng.config()),
                         igrad.Config(method="topk_sync", density=0.125))
        wrong = L.Config()
        with self.assertRaisesRegex(igrad.InvalidArgumentError, "this library's"):
            L.lib().call("igrad_config_default", ctypes.byref(wrong),
                         ctypes.sizeof(L.Config) - 8)
        self.assertEqual(L.version_number(igrad.__version__) // 100,
                         c[("IGRAD_VERSION_NUMBER", "")] // 100,
                         "package and header major.minor")

    # -- enum tables -----------------------------------------------------------

    # Every enum of igrad.h and the Python table that mirrors it: (table,
    # enumerator prefix, how a C enumerator's suffix is spelled in the table).
    ENUMS = {
        "igrad_status": (L.STATUS_NAMES, "IGRAD_", None),
        "igrad_kind": (L.KIND_NAMES, "IGRAD_KIND_", str),
        "igrad_dtype": (L.DTYPE, "IGRAD_DTYPE_", str),
        "igrad_sparsifier": (L.SPARSIFIERS, "IGRAD_SPARSIFIER_", str.lower),
        "igrad_reduce_op": ({n: getattr(L, "REDUCE_" + n) for n in ("SUM", "MAX", "MIN")},
                            "IGRAD_REDUCE_", str),
        "igrad_schedule": (L.SCHEDULES, "IGRAD_SCHEDULE_", str.lower),
        "igrad_pack_policy": (L.PACK_POLICIES, "IGRAD_PACK_", str.lower),
        "igrad_method": (L.METHODS, "IGRAD_METHOD_", str.lower),
        "igrad_residual_policy": (L.RESIDUAL_POLICIES, "IGRAD_RESIDUAL_", str.lower),
        "igrad_collective": (L.COLLECTIVES, "IGRAD_COLLECTIVE_", str.lower),
        "igrad_topology": (L.TOPOLOGIES, "IGRAD_TOPOLOGY_", str.lower),
        "igrad_index_code": (L.INDEX_CODES, "IGRAD_INDEX_CODE_", str.lower),
        "igrad_allocation": (L.ALLOCATIONS, "IGRAD_ALLOCATION_", str.lower),
        "igrad_bucket_kind": ({n.upper(): v for v, n in L.BUCKET_KINDS.items()},
                              "IGRAD_BUCKET_", str),
        "igrad_memory": ({n: getattr(L, "MEMORY_" + n) for n in ("HOST", "CUDA")},
                         "IGRAD_MEMORY_", str),
    }

    def test_memory_stats_in_last_stats(self):
        """last_stats carries igrad's memory per rank: on the CPU path no
        device bytes, and host bytes = the engine's workspace, at least the
        residual's 4 B per parameter."""
        m = torch.nn.Linear(64, 32)
        st = it.IgradState(m, method="topk_sync", density=0.1)
        for p in m.parameters():
            p.grad = torch.ones_like(p)
        stats = it.GradientSynchronizer(m.named_parameters(), st).synchronize(0)
        nparams = sum(p.numel() for p in m.parameters())
        self.assertEqual(stats["device_nbytes"], 0)
        self.assertEqual(stats["device_nbytes_per_param"], 0.0)
        self.assertEqual(stats["host_nbytes"], st.engine.workspace_nbytes)
        self.assertAlmostEqual(stats["host_nbytes_per_param"], stats["host_nbytes"] / nparams)
        self.assertGreaterEqual(stats["host_nbytes_per_param"], 4.0)

    def test_cuda_engine_entry(self):
        """Engine(..., device=N) is igrad_engine_create_cuda: without a CUDA
        device (or a library built without CUDA) an UnsupportedError that
        says so; with one, a host-only comm is refused. A custom comm with
        memory="cuda" is refused by a CPU engine, naming its data plane and
        both memory spaces; an unknown memory is refused."""
        from igrad.core import Comm, Engine, make_config
        layout = it.layout_from_module(torch.nn.Linear(4, 3))
        cfg = make_config(method="topk_sync")
        with self.assertRaises(L.UnsupportedError) as cm:
            Engine(layout, None, cfg, Comm.self_(), device=0)
        if torch.cuda.is_available():
            self.assertIn("communicator 'self' cannot take device buffers", str(cm.exception))
        else:
            self.assertRegex(str(cm.exception), "no CUDA device|has no CUDA")

        class Copies:  # one rank: every collective copies send to recv
            def allgather(self, send, nbytes, recv):
                ctypes.memmove(recv, send, nbytes)

            def allreduce(self, send, recv, count, dtype, op):
                ctypes.memmove(recv, send, count * 8)

            def bcast(self, buf, nbytes, root):
                pass

            def barrier(self):
                pass

            def iallgather(self, send, nbytes, recv):
                self.allgather(send, nbytes, recv)

            def iallreduce(self, send, recv, count, dtype, op):
                self.allreduce(send, recv, count, dtype, op)

            def wait(self, handle):
                pass

        import ctypes
        comm = Comm.custom(Copies(), 0, 1, memory="cuda")
        with self.assertRaisesRegex(L.UnsupportedError,
                                    r"data plane 'cpu'\): communicator 'custom' cannot take "
                                    r"host buffers \(it takes device buffers\)"):
            Engine(layout, None, cfg, comm)
        with self.assertRaisesRegex(L.InvalidArgumentError, "memory is 'gpu'"):
            Comm.custom(Copies(), 0, 1, memory="gpu")
        from igrad.torch.device import params_device
        self.assertIsNone(params_device(torch.nn.Linear(2, 2).parameters()))

    def test_torch_package_has_no_import_cycle(self):
        # igrad.torch is a package of modules by concern; a module may
        # import its siblings only downwards (no module imports one that
        # imports it back, at load time or inside a function), and the
        # public names stay those of the single module it replaced.
        import ast
        pkg = os.path.dirname(it.__file__)
        mods = sorted(f[:-3] for f in os.listdir(pkg) if f.endswith(".py"))
        edges = {m: set() for m in mods}
        for m in mods:
            with open(os.path.join(pkg, m + ".py")) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.level == 1:
                    names = [node.module] if node.module else [a.name for a in node.names]
                    edges[m].update(n.split(".")[0] for n in names if n.split(".")[0] in mods)
        for m in mods:  # every module reachable from m: m not among them
            seen, todo = set(), list(edges[m] - {"__init__"})
            while todo:
                n = todo.pop()
                if n not in seen:
                    seen.add(n)
                    todo.extend(edges[n])
            self.assertNotIn(m, seen, "igrad.torch.%s imports itself back through %s"
                             % (m, sorted(seen)))
        self.assertEqual(sorted(it.__all__), sorted([
            "layout_from_module", "named_trainable_parameters", "TorchComm", "IgradState",
            "hook", "GradientSynchronizer", "UpdateSynchronizer", "Profiler",
            "broadcast_profile", "state_residuals"]))
        for name in it.__all__:
            self.assertTrue(hasattr(it, name), name)

    def test_unknown_bucket_kind_is_refused(self):
        """A bucket kind the binding does not know is an error, never taken
        for an all-reduce."""
        from igrad import core
        for kind, name in L.BUCKET_KINDS.items():
            self.assertEqual(core.BucketDesc(L.Bucket(kind=kind)).kind, name)
        with self.assertRaisesRegex(L.UnsupportedError, "bucket 3 has kind 7"):
            core.BucketDesc(L.Bucket(kind=7, index=3))

    def test_enum_tables_match_the_header(self):
        """Each Python enum table equals its C enum: enumerators read from
        include/igrad.h, their values printed by a C program compiled here
        (so implicit values count too). A new enum, a new enumerator or a
        renumbering fails here until the binding knows it."""
        import re
        compiler = cc()
        if not compiler:
            self.skipTest("no C compiler")
        with open(os.path.join(H.SOURCE_DIR, "include", "igrad.h")) as f:
            header = f.read()
        enums = {}
        for m in re.finditer(r"typedef enum (\w+) \{(.*?)\}", header, re.S):
            body = re.sub(r"/\*.*?\*/", "", m.group(2), flags=re.S)
            enums[m.group(1)] = [e for e in re.findall(r"\b(IGRAD_\w+)\s*(?:=|,|$)", body)
                                 if not e.endswith("_COUNT")]
        self.assertEqual(sorted(enums), sorted(self.ENUMS),
                         "enums of igrad.h vs the ones test_binding knows")
        lines = ['#include <stdio.h>', '#include "igrad.h"', "int main(void) {"]
        for names in enums.values():
            lines += ['printf("%s %%d\\n", (int)%s);' % (n, n) for n in names]
        lines.append("return 0; }")
        src = os.path.join(self.dir, "enums.c")
        with open(src, "w") as f:
            f.write("\n".join(lines))
        exe = os.path.join(self.dir, "enums")
        subprocess.run([compiler, "-std=c11", "-I", os.path.join(H.SOURCE_DIR, "include"), src,
                        "-o", exe], check=True)
        value = dict((k, int(v)) for k, v in (line.split() for line in subprocess.run(
            [exe], check=True, capture_output=True, text=True).stdout.splitlines()))
        for enum, names in enums.items():
            table, prefix, spell = self.ENUMS[enum]
            want = {}
            for n in names:
                self.assertTrue(n.startswith(prefix), "%s: %s" % (enum, n))
                want[value[n]] = n[len(prefix):]
            if spell is None:  # statuses: number -> "E_MISMATCH"
                got = dict(table)
                exp = want
            elif isinstance(table, list):
                got = dict(enumerate(table))
                exp = {v: spell(n) for v, n in want.items()}
            else:
                got = dict(table)
                exp = {spell(n): v for v, n in want.items()}
            self.assertEqual(got, exp, "%s: Python table vs igrad.h" % enum)
        # every failure status has its exception class, carrying its number
        for v in (value[n] for n in enums["igrad_status"]):
            if v:
                cls = L._ERRORS.get(v)
                self.assertIsNotNone(cls, "no exception class for status %d" % v)
                self.assertEqual(cls.status, v)
        # and the library's own count of statuses agrees with the header
        self.assertEqual(L.c_status_count(L.lib().dll), len(enums["igrad_status"]))

    def test_every_dtype_of_the_library_in_layouts(self):
        """Layout.from_tensors takes every dtype libigrad names (the F8
        ones raised KeyError before the tables came from the library)."""
        self.assertIn("F8_E4M3", L.DTYPE)
        self.assertIn("F8_E5M2", L.DTYPE)
        names = list(L.DTYPE)
        layout = igrad.Layout.from_tensors([("t%d" % i, (3, 4), n) for i, n in enumerate(names)])
        self.assertEqual([layout.tensor(i)["dtype"] for i in range(len(names))], names)
        lower = igrad.Layout.from_tensors([("a", (2,), "f8_e4m3"), ("b", (2,), "bf16")])
        self.assertEqual([lower.tensor(i)["dtype"] for i in range(2)], ["F8_E4M3", "BF16"])
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.Layout.from_tensors([("w", (2,), "F7")])
        self.assertIn("F7", str(cm.exception))
        self.assertIn("F8_E5M2", str(cm.exception))

    # -- version -------------------------------------------------------------

    def test_library_of_another_version_is_refused(self):
        with self.assertRaises(ImportError) as cm:
            L.load_library(igrad.library_path(), expected="0.7.0")
        msg = str(cm.exception)
        self.assertIn(igrad.library_version(), msg)
        self.assertIn("0.7.0", msg)

        compiler = cc()
        if not compiler:
            self.skipTest("no C compiler")
        src = os.path.join(self.dir, "fake.c")
        with open(src, "w") as f:
            f.write('unsigned igrad_version(void) { return 9901; }\n'
                    'const char *igrad_version_string(void) { return "0.99.1"; }\n')
        fake = os.path.join(self.dir, "libfake.so")
        subprocess.run([compiler, "-shared", "-fPIC", src, "-o", fake], check=True)
        env = dict(os.environ, IGRAD_LIBRARY=fake)
        proc = subprocess.run([sys.executable, "-c", "import igrad"], env=env,
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("ImportError", proc.stderr)
        self.assertIn("0.99.1", proc.stderr)
        self.assertIn(igrad.__version__, proc.stderr)

        env = dict(os.environ, IGRAD_LIBRARY=os.path.join(self.dir, "missing.so"))
        proc = subprocess.run([sys.executable, "-c", "import igrad"], env=env,
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("missing.so (not found)", proc.stderr)

    # -- errors ----------------------------------------------------------------

    def test_status_becomes_exception_with_message(self):
        with self.assertRaises(igrad.FileError) as cm:
            igrad.Profile.load(os.path.join(self.dir, "nope.json"))
        self.assertEqual(cm.exception.status, 3)
        self.assertIn("nope.json", str(cm.exception))
        self.assertIsInstance(cm.exception, igrad.IgradError)

        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.Layout.from_tensors([("a.weight", (2, 2)), ("a.weight", (3,))])
        self.assertIn("a.weight", str(cm.exception))

        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(density=1.5)
        self.assertIn("density", str(cm.exception))
        with self.assertRaises(igrad.InvalidArgumentError):
            igrad.make_config(method="nonsense")
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(densty=0.1)
        self.assertIn("densty", str(cm.exception))

        # the link of collective auto: a round trip, link=(ns, Mbit/s), errors by name
        d = igrad.config_to_dict(igrad.make_config(link=(8000, 100000), auto_sparse_reduce=True))
        self.assertEqual((d["link_latency_ns"], d["link_bandwidth_mbps"], d["auto_sparse_reduce"]),
                         (8000, 100000, True))
        d = igrad.config_to_dict(igrad.make_config())
        self.assertEqual((d["link_latency_ns"], d["link_bandwidth_mbps"], d["auto_sparse_reduce"]),
                         (0, 100000, False))
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(link_latency_ns=-5)
        self.assertIn("config.link_latency_ns is -5", str(cm.exception))
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(link=(8000, 0))
        self.assertIn("config.link_bandwidth_mbps is 0", str(cm.exception))
        # preset names and "GBITS,LAT_US" as the CLI's --link (the library's parser)
        d = igrad.config_to_dict(igrad.make_config(link="100g"))
        self.assertEqual((d["link_latency_ns"], d["link_bandwidth_mbps"]), (8000, 100000))
        d = igrad.config_to_dict(igrad.make_config(link="2.5,1500"))
        self.assertEqual((d["link_latency_ns"], d["link_bandwidth_mbps"]), (1500000, 2500))
        presets = igrad.link_presets()
        self.assertEqual([p[0] for p in presets],
                         ["nvlink", "pcie4", "400g", "200g", "100g", "25g", "10g"])
        for name, gbit, lat_us, assumes in presets:
            self.assertTrue(assumes)
            self.assertEqual(igrad.link_config(name),
                             (round(lat_us * 1000), round(gbit * 1000)), name)
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(link="fast")
        self.assertIn("'fast' is neither a preset", str(cm.exception))
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(link="100,0")
        self.assertIn("latency 0 us is outside", str(cm.exception))  # the range is named
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.make_config(link=5)
        self.assertIn("latency_ns, bandwidth_mbps", str(cm.exception))

        bad = os.path.join(self.dir, "trace.csv")
        with open(bad, "w") as f:
            f.write("step,layer,component,raw_activity,d_activity,numel,retained_numel\n"
                    "0,0,Q,abc,0,64,1\n")
        with self.assertRaises(igrad.FormatError) as cm:
            igrad.build_profile(bad)
        self.assertIn("trace.csv", str(cm.exception))

    # -- layout ----------------------------------------------------------------

    def test_layout_from_module(self):
        model = H.TinyLlama()
        model.model.norm.weight.requires_grad_(False)

        class Wrapper(torch.nn.Module):  # what DDP's named_parameters() looks like
            def __init__(self, m):
                super().__init__()
                self.module = m

        layout = it.layout_from_module(Wrapper(model))
        want = [(n, tuple(p.shape)) for n, p in model.named_parameters() if p.requires_grad]
        self.assertEqual(len(layout), len(want))
        for i, (n, shape) in enumerate(want):
            info = layout.tensor(i)
            self.assertEqual((info["name"], info["shape"]), (n, shape))
        self.assertEqual(layout.find("model.norm.weight"), -1)
        q = layout.tensor(layout.find("model.layers.1.self_attn.q_proj.weight"))
        self.assertEqual((q["layer"], q["kind"]), (1, "Q"))
        d = layout.tensor(layout.find("model.layers.0.mlp.down_proj.weight"))
        self.assertEqual((d["layer"], d["kind"]), (0, "FC2"))
        self.assertEqual(layout.total_count,
                         sum(p.numel() for p in model.parameters() if p.requires_grad))
        # 2 layers x (Q, K, V, O, FC1, FC2, NORM), (-1, EMB), (-1, HEAD); the
        # final norm is frozen, so there is no (-1, NORM)
        self.assertEqual(len(layout.components()), 16)
        self.assertEqual(layout.components()[0]["kind"], "EMB")
        self.assertEqual(igrad.component_of("model.layers.0.input_layernorm.weight"),
                         (0, "NORM"))
        self.assertEqual(igrad.component_of("model.layers.3.mlp.up_proj.weight"), (3, "FC1"))

    # -- communicators ---------------------------------------------------------

    def test_custom_comm_from_python(self):
        model = H.TinyLlama()
        layout = it.layout_from_module(model)
        grads = []
        model(*H.batch(0, 0)).backward()
        for p in model.parameters():
            grads.append(p.grad.reshape(-1).clone())

        calls = []

        class Loop:  # one rank: the collectives are copies
            def allgather(self, send, nbytes, recv):
                calls.append("allgather")
                ctypes.memmove(recv, send, nbytes)

            def allreduce(self, send, recv, count, dtype, op):
                calls.append("allreduce")
                if send != recv:
                    ctypes.memmove(recv, send, count * (4 if dtype == "F32" else 8))

            def bcast(self, buf, nbytes, root):
                calls.append("bcast")

            def barrier(self):
                calls.append("barrier")

        cfg = igrad.make_config(method="adtopk_sync", density=0.125)
        a = [g.clone() for g in grads]
        b = [g.clone() for g in grads]
        e1 = igrad.Engine(layout, None, cfg, igrad.Comm.custom(Loop(), 0, 1))
        e2 = igrad.Engine(layout, None, cfg, igrad.Comm.self_())
        e1.sync(0, [t.data_ptr() for t in a])
        e2.sync(0, [t.data_ptr() for t in b])
        self.assertTrue(calls, "the custom comm's callbacks were never called")
        for n, x, y in zip(layout.names, a, b):
            self.assertTrue(torch.equal(x, y), n)
        self.assertEqual(e1.stats()["payload_nbytes"], e2.stats()["payload_nbytes"])

        class Broken(Loop):
            def allgather(self, send, nbytes, recv):
                raise ValueError("the network is down")

            def allreduce(self, send, recv, count, dtype, op):
                raise ValueError("the network is down")

        with self.assertRaises(igrad.CommError) as cm:
            e3 = igrad.Engine(layout, None, cfg, igrad.Comm.custom(Broken(), 0, 1))
            e3.sync(0, [t.data_ptr() for t in a])
        self.assertIn("the network is down", str(cm.exception))

    # -- error-feedback remedies ---------------------------------------------------

    def test_remedies_match_a_torch_reference(self):
        """IgradState(momentum=m) on one process against DGC written in
        torch: u = m*u + g, a = u + e, the top-k of |a| (torch.topk),
        e = a - sent, u masked (set to 0) where sent."""
        m, density = 0.9, 0.05
        model = H.TinyLlama()
        state = it.IgradState(model, method="topk_sync", density=density, momentum=m)
        self.assertEqual(state.config["momentum"], m)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        params = [p for p in model.parameters()]
        u = [torch.zeros(p.numel()) for p in params]
        e = [torch.zeros(p.numel()) for p in params]
        for step in range(4):
            model.zero_grad()
            model(*H.batch(0, step)).backward()
            want = []
            for i, p in enumerate(params):
                g = p.grad.reshape(-1).clone()
                u[i] = m * u[i] + g
                a = u[i] + e[i]
                # below dense_below (64, the default) every entry is sent
                k = a.numel() if a.numel() < 64 else L.lib().igrad_budget(a.numel(), density)
                idx = torch.topk(a.abs(), k).indices
                sent = torch.zeros_like(a)
                sent[idx] = a[idx]
                e[i] = a - sent
                u[i][idx] = 0.0
                want.append(sent)
            sync.synchronize(step)
            for i, p in enumerate(params):
                got = p.grad.reshape(-1)
                self.assertTrue(torch.allclose(got, want[i], rtol=1e-5, atol=1e-7),
                                "step %d tensor %d: max diff %g" % (
                                    step, i, (got - want[i]).abs().max()))
        eng = state.engine
        for i in range(len(params)):
            v = _wrap(eng.velocity_address(i), params[i].numel(), torch.float32)
            self.assertTrue(torch.allclose(v, u[i], rtol=1e-5, atol=1e-7))
        # the options removed from the library are not taken
        for gone in ("momentum_masking", "residual_decay", "gate_other", "risk_lambda"):
            with self.assertRaises(TypeError):
                it.IgradState(H.TinyLlama(), method="topk_sync", **{gone: 1})
            with self.assertRaises(igrad.InvalidArgumentError):
                igrad.make_config(**{gone: 1})
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            it.IgradState(H.TinyLlama(), method="topk_sync", momentum=1.0)
        self.assertIn("config.momentum", str(cm.exception))

    # -- state errors without torch.distributed ----------------------------------

    def test_state_errors(self):
        model = H.TinyLlama()
        other = H.TinyLlama(dim=8, hidden=24)
        layout = it.layout_from_module(other)
        trace = igrad.Trace.create(layout, "adtopk", 0.125)
        for s in range(3):
            for t in range(len(layout)):
                if layout.tensor(t)["component"] >= 0:
                    trace.record(s, t, float(t + 1), 1)
        path = os.path.join(self.dir, "other.json")
        igrad.build_profile(trace, out=path)

        # a profile file for another model
        state = it.IgradState(profile=path, method="ig")
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        model(*H.batch(0, 0)).backward()
        with self.assertRaises(igrad.MismatchError) as cm:
            sync.synchronize(0)
        self.assertIn("other.json", str(cm.exception))
        # the same as a Profile object
        state = it.IgradState(profile=igrad.Profile.load(path), method="ig")
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        with self.assertRaises(igrad.MismatchError) as cm:
            sync.synchronize(0)
        self.assertIn("another model", str(cm.exception))
        # ig without a profile: refused at construction, naming profile='auto'
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            it.IgradState(method="ig")
        self.assertIn("profile='auto'", str(cm.exception))

        # an unknown parameter name in a state_dict
        state = it.IgradState(model, method="topk_sync", density=0.125)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        sync.synchronize(0)
        sd = state.state_dict()
        self.assertEqual(sd["iter"], 1)
        sd["names"] = sd["names"] + ["model.layers.7.self_attn.q_proj.weight"]
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            state.load_state_dict(sd)
        self.assertIn("model.layers.7.self_attn.q_proj.weight", str(cm.exception))
        # attaching the state to another model
        with self.assertRaises(igrad.MismatchError):
            state.attach(other)
        # bad knobs are refused at construction, not at the first backward
        with self.assertRaises(igrad.InvalidArgumentError):
            it.IgradState(model, density=0)
        with self.assertRaises(igrad.InvalidArgumentError):
            it.IgradState(model, nonfinite="ignore")

    # -- budget-driven plan: target_ratio -------------------------------------------

    def test_target_ratio(self):
        model = H.TinyLlama()
        layout = it.layout_from_module(model)
        trace = igrad.Trace.create(layout, "adtopk", 0.125)
        for s in range(3):
            for t in range(len(layout)):
                c = layout.tensor(t)["component"]
                if c >= 0:
                    trace.record(s, t, float((c * 7) % 11 + 1) ** 2, 1)
        path = os.path.join(self.dir, "tiny.json")
        igrad.build_profile(trace, out=path)
        prof = igrad.Profile.load(path, layout)
        fit = igrad.target_fit(layout, prof, 0.5, density=0.125)
        self.assertTrue(fit["met"])
        self.assertLessEqual(fit["ratio"], 0.5)
        self.assertGreaterEqual(fit["release_keep"], igrad.core.TARGET_MIN_KEEP)
        self.assertLessEqual(fit["n_important"], fit["n_gated"])
        # IgradState applies it at engine creation: kappa and the important set
        state = it.IgradState(model, profile=path, method="ig", density=0.125, target_ratio=0.5)
        sync = it.GradientSynchronizer(model.named_parameters(), state)
        model(*H.batch(0, 0)).backward()
        sync.synchronize(0)
        self.assertEqual(state.target_fit, fit)
        self.assertEqual(state.config["release_keep"], fit["release_keep"])
        with self.assertRaises(igrad.InvalidArgumentError):
            it.IgradState(model, target_ratio=1.5)
        with self.assertRaises(igrad.InvalidArgumentError) as cm:
            igrad.target_fit(layout, prof, 0.5, method="topk_sync")
        self.assertIn("needs ig", str(cm.exception))

    # -- parameters changed after attaching (one process) -------------------------

    def test_parameter_changed_after_attach(self):
        def fresh(source="generator", **kw):
            model = H.TinyLlama()
            state = it.IgradState(method="topk_sync", density=0.125, **kw)
            src = model.named_parameters() if source == "generator" else model
            sync = it.GradientSynchronizer(src, state)
            model(*H.batch(0, 0)).backward()
            sync.synchronize(0)
            model.zero_grad()
            return model, sync

        def refused(sync, *words):
            with self.assertRaises(igrad.MismatchError) as cm:
                sync.synchronize(1)
            for w in words:
                self.assertIn(w, str(cm.exception))

        # replaced, the state built from model.named_parameters() (its module
        # is found through the generator) and from the module itself
        for source in ("generator", "module"):
            model, sync = fresh(source)
            model.model.embed_tokens = torch.nn.Embedding(32, 16)  # set_input_embeddings
            model(*H.batch(0, 1)).backward()
            refused(sync, "model.embed_tokens.weight", "was replaced after the state was attached")
            model, sync = fresh(source)
            model.lm_head.weight = torch.nn.Parameter(torch.zeros(32, 16))
            refused(sync, "lm_head.weight", "was replaced")
        # through DDP's "module." names too (the root is the wrapper)
        class Wrapper(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.module = m
        model = H.TinyLlama()
        sync = it.GradientSynchronizer(Wrapper(model), it.IgradState(method="topk_sync",
                                                                     density=0.125))
        sync.synchronize(0)
        model.model.layers[1].mlp.up_proj = torch.nn.Linear(16, 40, bias=False)
        refused(sync, "model.layers.1.mlp.up_proj.weight", "was replaced")

        # resized: bigger, and smaller (a heap overflow in the C engine before)
        model, sync = fresh()
        model.lm_head.weight.data = torch.zeros(40, 16)
        refused(sync, "lm_head.weight", "640 entries, the layout 512", "resized")
        # the residuals are still read at the engine's (attached) sizes
        self.assertEqual(tuple(sync.state.residuals()["lm_head.weight"].shape),
                         (32, 16))
        model, sync = fresh()
        model.model.norm.weight.data = torch.ones(4)
        refused(sync, "model.norm.weight", "4 entries, the layout 16")

        # another dtype
        model, sync = fresh()
        model.to(torch.bfloat16)
        refused(sync, "model.embed_tokens.weight", "is bfloat16, it was float32")
        model, sync = fresh()
        model.model.layers[0].self_attn.v_proj.double()
        refused(sync, "model.layers.0.self_attn.v_proj.weight", "is float64, it was float32")

        # nothing changed: the same steps go on (no false alarm, also after
        # an in-place update of the values)
        model, sync = fresh(start_iter=1)
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
        model(*H.batch(0, 1)).backward()
        self.assertEqual(sync.synchronize(1)["step"], 1)

        # the Profiler's C selection reads its residual's size: refused too
        model = H.TinyLlama()
        prof = it.Profiler(model, density=0.125)
        model(*H.batch(0, 0)).backward()
        prof.step()
        w = model.model.layers[0].self_attn.q_proj.weight
        w.data = torch.zeros(4, 16)
        w.grad = torch.zeros(4, 16)
        with self.assertRaises(igrad.MismatchError) as cm:
            prof.step()
        self.assertIn("model.layers.0.self_attn.q_proj.weight", str(cm.exception))


if __name__ == "__main__":
    unittest_main.main()
