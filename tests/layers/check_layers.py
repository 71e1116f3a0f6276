#!/usr/bin/env python3
"""check_layers.py — the include direction of src/ (docs/architecture.md §3).

Every file under src/ sits in one layer folder; it may include headers of
its own folder and of the folders its layer lists below, never of a layer
above. Prints each offending include as FILE:LINE: LAYER includes HEADER
(LAYER2) and exits 1; exits 0 with a count when there is none. A file in an
unknown folder, or an include of a src/ header by a bare name, is an error
too, so a new folder must be given its place here first.

Usage: check_layers.py [--expect N] [SRC_DIR]   (default: src/ beside tests/)
  --expect N: exit 0 only if exactly N includes offend (the check's own
  test, on the fixture tree tests/layers/upward/).
"""
import os
import re
import sys

# Layer -> the layers it may include (besides its own). Lower layers first.
ALLOWED = {
    "core": set(),
    "model": {"core"},
    "comm": {"core"},
    "profile": {"core", "model"},
    "plan": {"core", "model", "profile", "comm"},
    "dp": {"core", "model", "profile", "plan", "comm"},
    "dp/cpu": {"core", "model", "profile", "plan", "comm", "dp"},
    "dp/cuda": {"core", "model", "profile", "plan", "comm", "dp"},
    "engine": {"core", "model", "profile", "plan", "comm", "dp", "dp/cpu", "dp/cuda"},
}
PUBLIC = {"igrad.h", "igrad_cuda.h"}  # include/: every layer may use them
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(rel):
    folder = os.path.dirname(rel)
    return folder if folder in ALLOWED else None


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    args = sys.argv[1:]
    expect = None
    if args[:1] == ["--expect"]:
        expect = int(args[1])
        args = args[2:]
    src = args[0] if args else os.path.join(here, "..", "..", "src")
    bad, files = [], 0
    for root, _, names in os.walk(src):
        for name in sorted(names):
            if not name.endswith((".c", ".h", ".cu", ".cuh")):
                continue
            path = os.path.join(root, name)
            rel = os.path.relpath(path, src).replace(os.sep, "/")
            files += 1
            mine = layer_of(rel)
            if mine is None:
                bad.append(f"{rel}: in folder '{os.path.dirname(rel)}', which has no layer")
                continue
            with open(path, encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m or m.group(1) in PUBLIC:
                        continue
                    inc = m.group(1)
                    theirs = layer_of(inc)
                    if theirs is None or not os.path.exists(os.path.join(src, inc)):
                        bad.append(f"{rel}:{lineno}: includes \"{inc}\", not a header of a layer "
                                   "folder (name it by folder: \"core/internal.h\")")
                    elif theirs != mine and theirs not in ALLOWED[mine]:
                        bad.append(f"{rel}:{lineno}: {mine} includes {inc} ({theirs}, a higher layer)")
    for b in bad:
        print(b)
    print(f"check_layers: {files} files, {len(bad)} offending includes")
    if expect is not None:
        return 0 if len(bad) == expect and files > 0 else 1
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
