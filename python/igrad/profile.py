"""profile.py — turning an activity trace into an importance profile from
Python: build_profile() is the library call behind `igrad profile` (same
window forms, same methods, same files), so a profile built here and one
built by the CLI from the same trace are identical.

Recording a trace from PyTorch gradients is igrad.torch.Profiler; the
scoring and partition themselves live in the C library (src/profile.c,
src/partition.c).
"""
import os

from .core import Profile, Trace


def build_profile(trace, window=None, method="knee", alpha=0.7, out=None, csv=None):
    """Builds the importance profile of a trace.

    trace:  a trace CSV path (igrad_trace_save / Profiler.save) or a Trace.
    window: steps [a, b): (a, b) with b None for "to the end", or the CLI's
            "A:B", "A:", ":B"; None = every step.
    method: "knee" (default), "otsu", "kmeans2", "gmm2", "percentile:P",
            "fixed:F".
    alpha:  weight of magnitude in the score (0.7).
    out:    if given, the profile JSON is written there (the engine's input);
    csv:    if given, the reference CSV (layer,component,final_score,
            global_tau,is_important).
    Returns the Profile. Raises igrad.IgradError subclasses (FormatError for
    a bad trace, InvalidArgumentError for an empty window or unknown
    method)."""
    if isinstance(trace, (str, bytes, os.PathLike)):
        trace = Trace.load(os.fspath(trace))
    profile = Profile.build(trace, window=window, method=method, alpha=alpha)
    if out is not None:
        profile.save_json(os.fspath(out))
    if csv is not None:
        profile.save_csv(os.fspath(csv))
    return profile
