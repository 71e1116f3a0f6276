"""igrad — importance-aware sparse-gradient synchronization for
data-parallel post-training, as a Python package over the C library
libigrad (ctypes; no compiled extension).

    import igrad
    igrad.library_version()              # "0.1.0" of the loaded libigrad
    layout = igrad.Layout.load("config.json")
    profile = igrad.build_profile("trace.csv", window=(50, 200), out="profile.json")

igrad.Config holds the engine's options (every default read from the
library's IGRAD_CONFIG_INIT). The PyTorch integration is the package
igrad.torch (imported on demand,
so this package works without torch): layout_from_module, IgradState +
hook for DDP, GradientSynchronizer for manual or DeepSpeed-style loops,
Profiler, and TorchComm (a communicator over torch.distributed).

Every failing library call raises igrad.IgradError (subclasses per
status: InvalidArgumentError, FileError, FormatError, MismatchError,
NonFiniteError, CommError, CommTimeoutError, StateError, ...) carrying igrad_last_error().
The library is found through IGRAD_LIBRARY (an absolute path: a relative
one is resolved against the working directory), next to this package
(where an installed wheel carries its own copy: python/setup.py), or in
the repository's build/ directory; a library whose major.minor differ
from this package's is refused with ImportError. igrad.torch needs
PyTorch (here Debian's python3-torch, under /usr/bin/python3) and says
so when it is missing.
"""
from ._lib import (CommError, CommTimeoutError, FileError, FormatError, IgradError,  # noqa: F401
                   InvalidArgumentError, MismatchError, NonFiniteError, OutOfMemoryError,
                   StateError, UnsupportedError, __version__, load_library)
from .core import (Comm, Config, Engine, Layout, NameMap, Profile,  # noqa: F401
                   SelectWorkspace, Trace, config_to_dict, ig_default_target_ratio,
                   link_config, link_presets, make_config, partition, select_spec,
                   target_fit)
from .profile import build_profile  # noqa: F401

__all__ = [
    "__version__", "load_library", "library_version", "library_path", "component_of",
    "IgradError", "InvalidArgumentError", "OutOfMemoryError", "FileError", "FormatError",
    "UnsupportedError", "NonFiniteError", "MismatchError", "CommError", "StateError",
    "CommTimeoutError", "Config", "Layout", "NameMap", "Trace", "Profile", "Comm", "Engine",
    "SelectWorkspace", "make_config", "config_to_dict", "partition", "select_spec",
    "build_profile", "target_fit", "ig_default_target_ratio", "link_config",
    "link_presets",
]

_LIB = load_library()  # fails at import (ImportError) when no usable library


def library_version():
    """"MAJOR.MINOR.PATCH" of the loaded libigrad."""
    return _LIB.dll.igrad_version_string().decode()


def library_path():
    """Path of the loaded libigrad."""
    return _LIB.path


def component_of(name):
    """(layer, kind) of a parameter name, e.g. (3, "Q"), (3, "NORM"),
    (-1, "EMB"), (-1, "HEAD"); (-1, "OTHER") for names no rule knows."""
    import ctypes
    from ._lib import KIND_NAMES
    layer = ctypes.c_int()
    kind = _LIB.dll.igrad_component_of(name.encode(), ctypes.byref(layer))
    return layer.value, KIND_NAMES[kind]


def __getattr__(name):
    # `igrad.torch` without an explicit import, loaded only when used.
    if name == "torch":
        import importlib
        return importlib.import_module(".torch", __name__)
    raise AttributeError("module 'igrad' has no attribute %r" % name)
