"""igrad.torch.layout — which parameters igrad synchronizes, and their
igrad Layout: named_trainable_parameters (what requires grad, a DDP
"module." prefix stripped, tied weights once), layout_from_module, and
_ParamSlots, which notices a parameter replaced in the model after the
state was attached.
"""
import operator
import os

import torch

from .. import _lib as L
from ..core import Layout, NameMap

_TORCH_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
                 torch.float64: "F64"}
for _t, _n in (("float8_e4m3fn", "F8_E4M3"), ("float8_e5m2", "F8_E5M2")):  # torch >= 2.1
    if hasattr(torch, _t):
        _TORCH_DTYPES[getattr(torch, _t)] = _n


def _strip_prefix(name):
    # DistributedDataParallel (and DataParallel) wrap the model as `.module`.
    return name[len("module."):] if name.startswith("module.") else name


def _trainable(model):
    """(root, [(name, path, parameter)]): the parameters that require grad
    in named_parameters() order (tied weights once), `name` without a DDP
    "module." prefix, `path` the name relative to `root`, the Module they
    were read from. root is None when it is unknown (an iterable of pairs
    that is not the generator of a Module's named_parameters())."""
    root, prefix = None, ""
    if hasattr(model, "named_parameters"):
        root, items = model, model.named_parameters()
    else:
        items = model
        # A named_parameters() generator that has not started yet holds its
        # module and prefix as the frame's arguments (CPython and PyPy
        # expose them): with them a replaced parameter can be noticed even
        # when the caller passed model.named_parameters().
        frame = getattr(model, "gi_frame", None)
        f_locals = frame.f_locals if frame is not None else {}
        if isinstance(f_locals.get("self"), torch.nn.Module):
            root, prefix = f_locals["self"], f_locals.get("prefix") or ""
            prefix = prefix + "." if prefix else ""
    out, seen = [], set()
    for name, p in items:
        if not p.requires_grad or id(p) in seen:  # tied weights count once
            continue
        seen.add(id(p))
        path = name[len(prefix):] if root is not None and name.startswith(prefix) else None
        if path is None:
            root = None
        out.append((_strip_prefix(name), path, p))
    return root, out


def named_trainable_parameters(model):
    """[(name, parameter)] of the parameters that require grad, in
    named_parameters() order, with a DDP "module." prefix removed. `model`
    is a Module (DDP or not) or an iterable of (name, parameter)."""
    return [(n, p) for n, _, p in _trainable(model)[1]]


class _ParamSlots:
    """Where each attached parameter sits in its module tree, to notice
    cheaply when one is replaced after attaching (model.set_input_embeddings
    (new), resize_token_embeddings, module.weight = nn.Parameter(...)): the
    state would otherwise go on synchronizing the old tensor. Every link
    from the root to a parameter is kept as (dict, key, object), the dict
    being a module's _modules or _parameters, so one pass of identity tests
    checks all of them. Only dicts and child objects are held, never the
    root itself (DDP holds the state through its comm hook: no cycle)."""

    def __init__(self, root, paths):
        links = {}
        self.paths = []
        for path, p in paths:
            parts = path.split(".")
            owner = root
            for part in parts[:-1]:
                child = owner._modules[part]
                links.setdefault((id(owner._modules), part), (owner._modules, part, child))
                owner = child
            if owner._parameters.get(parts[-1]) is not p:
                raise KeyError(path)
            links.setdefault((id(owner._parameters), parts[-1]),
                             (owner._parameters, parts[-1], p))
            self.paths.append(parts)
        self.root_modules, self.root_params = root._modules, root._parameters
        self.dicts = [d for d, _, _ in links.values()]
        self.keys = [k for _, k, _ in links.values()]
        self.objs = [o for _, _, o in links.values()]

    def intact(self):
        return all(map(operator.is_, map(dict.get, self.dicts, self.keys), self.objs))

    def current(self, t):
        """The tensor the model now has at parameter t's place (None if
        the place is gone)."""
        parts = self.paths[t]
        modules, params = self.root_modules, self.root_params
        for part in parts[:-1]:
            m = modules.get(part)
            if m is None:
                return None
            modules, params = m._modules, m._parameters
        return params.get(parts[-1])


def layout_from_module(model, name_map=None):
    """The igrad Layout of a model's trainable parameters (names and shapes
    from named_parameters(), only those that require grad; a DDP "module."
    prefix is stripped). Tensors of more than 4 dimensions keep their first
    dimension and fold the rest (rows of a row-wise selection). name_map:
    user name rules tried before the built-in ones (igrad.NameMap: a list
    of (pattern, kind, layer) or a map file's path)."""
    return Layout.from_tensors([(n, tuple(p.shape) if p.dim() else (), _TORCH_DTYPES.get(
        p.dtype, "F32")) for n, p in named_trainable_parameters(model)], name_map=name_map)


def _name_map_spec(name_map):
    """name_map= as kept by IgradState (picklable): None, a path string or a
    list of (pattern string, kind, layer)."""
    if name_map is None or isinstance(name_map, str):
        return name_map
    if isinstance(name_map, os.PathLike):
        return os.fspath(name_map)
    if isinstance(name_map, NameMap):
        raise L.InvalidArgumentError("name_map: give IgradState the rules (a list of "
                                     "(pattern, kind, layer)) or a map file's path, not a "
                                     "NameMap (the state must pickle)")
    rules = [tuple(r) if isinstance(r, (list, tuple)) else r for r in name_map]
    rules = [(getattr(r[0], "pattern", r[0]),) + r[1:] if isinstance(r, tuple) and r else r
             for r in rules]
    NameMap.create(rules)  # validates now, not at the first backward
    return rules

