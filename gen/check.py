#!/usr/bin/env python3
"""Fail when a checked-in generated file differs from what its generator writes now.

Each generator module exposes its outputs; this script regenerates them in memory, compares them with
the files in the tree and names the command to run for each one that differs. Part of the test command
(tests/run) and so of CI.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import build  # noqa: E402
import layout  # noqa: E402
import realloc_pairs  # noqa: E402
import sizeclasses  # noqa: E402

# (path in the tree, function giving its content, command that rewrites it)
GENERATED = [(rel, fn, "python3 gen/sizeclasses.py") for rel, fn in sizeclasses.OUTPUTS.items()]
GENERATED += [(rel, fn, "python3 gen/layout.py") for rel, fn in layout.OUTPUTS.items()]
GENERATED.append((realloc_pairs.OUTPUT, realloc_pairs.output, "python3 gen/realloc_pairs.py"))
GENERATED += [(rel, fn, "python3 gen/build.py") for rel, fn in build.OUTPUTS.items()]


def main():
    stale = []
    for rel, fn, command in GENERATED:
        try:
            with open(os.path.join(ROOT, rel)) as f:
                current = f.read()
        except FileNotFoundError:
            current = None
        if current != fn():
            stale.append((rel, command))
    for rel, command in stale:
        print(f"gen/check.py: {rel} is not what its generator writes; run: {command}")
    if not stale:
        print(f"gen/check.py: {len(GENERATED)} generated files are current")
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
