#!/usr/bin/env python3
"""bench/micro.py - runner of the micro benchmark (bench/micro.c): shardmm against its peers.

Runs <build-dir>/bench/micro-<alloc> (one binary per allocator, built from bench/micro.c) once per
(row, allocator) as a separate process, --runs times, interleaved so that slow drifts of a noisy
machine hit every allocator alike:

    for run in runs:  for row in rows:  for alloc in allocs:  micro-<alloc> <row> -scale <scale>

Each process prints "row ns_per_pair"; the runner keeps the median of the runs per (row, alloc) and
prints a markdown table on stdout: ns per malloc/free pair for each allocator, then peer/shard for
each peer (above 1 means shardmm is faster). Progress goes to stderr. A binary that exits non-zero
or prints something unexpected stops the whole run with an error.

--variant NAME=LIBRARY adds a column: micro-system with LIBRARY (another libshardmm.so, an older build
say) preloaded, compared with shard like a peer. The order of the allocators rotates from row to row
and run to run; each run's ratio peer/shard is taken (the two ran moments apart, so the drift of a
shared machine cancels), and the table gives the median of those ratios, the runs shard won and, from 6
runs, the 95 % interval of the median ratio (sign test).

With --wine it runs the Windows builds instead (<build-dir>/win64/micro-<alloc>.exe: shardmm's DLL and
the C runtime's malloc, which under Wine is Wine's heap, not Windows's) under /usr/lib/wine/wine64 with
the test suite's prefix; that measures our Windows code paths (the TEB slot read, the Win64 port), not
Windows itself.

Standard library only.
"""

import argparse
import datetime
import os
import shlex
import statistics
import sys

from runner import binary_path, comma_list, existing, fail, median_interval, numbers, run_line

# The rows of bench/micro.c, in its order (keep in sync with its row table).
ROWS = ["fixed-32", "mixed-lifo", "mixed-fifo", "lifo-1000", "fifo-1000",
        "random-replace", "foreign-free"]
DEFAULT_ALLOCS = ["shard", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["shard-purec", "tcmalloc"]  # added to the default when their binaries exist
# shard-purec: shardmm with its C fast paths (build/purec) in place of the NASM ones
BASELINE = "shard"
TIMEOUT_S = 600  # per process; a hung binary is an error too


WINE = "/usr/lib/wine/wine64"
WINE_ALLOCS = ["shard", "system"]


def micro_binary(build_dir, alloc, wine=False):
    if wine:
        return os.path.join(build_dir, "win64", "micro-" + alloc + ".exe")
    return binary_path(build_dir, "micro", alloc)


def wine_env(build_dir):
    env = dict(os.environ)
    env["WINEPREFIX"] = os.path.abspath(os.path.join(build_dir, "wine"))
    env["WINEDEBUG"] = "-all"
    return env


def run_one(binary, row, scale, wine_build_dir=None, env=None):
    """Runs one row of one binary; returns its ns per pair, or stops the runner with an error."""
    command = [binary, row, "-scale", repr(scale)]
    if wine_build_dir is not None:
        command = [WINE] + command
        env = wine_env(wine_build_dir)
    fields, shown, _ = run_line(command, TIMEOUT_S, env)
    if len(fields) != 2 or fields[0] != row:
        fail(f"{shown} printed {' '.join(fields)!r}, expected '{row} <ns_per_pair>'")
    return numbers(fields[1:], (float,), shown)[0]


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm micro benchmark against other allocators.")
    parser.add_argument("--build-dir", default="build",
                        help="directory holding bench/micro-<alloc> (default: build)")
    parser.add_argument("--runs", type=int, default=5,
                        help="runs per (row, allocator); the median is reported (default: 5)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplier of the iteration counts (default: 1.0)")
    parser.add_argument("--rows", type=comma_list, default=None,
                        help="comma-separated rows (default: all: " + ",".join(ROWS) + ")")
    parser.add_argument("--allocs", type=comma_list, default=None,
                        help="comma-separated allocators (default: " + ",".join(DEFAULT_ALLOCS)
                             + ", plus tcmalloc when its binary exists; with --wine: "
                             + ",".join(WINE_ALLOCS) + ")")
    parser.add_argument("--wine", action="store_true",
                        help="run the Windows builds (<build-dir>/win64/micro-<alloc>.exe) under Wine")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=LIBRARY",
                        help="one more column: micro-system with LIBRARY (a libshardmm.so) preloaded; repeatable")
    args = parser.parse_args()

    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not args.scale > 0:
        parser.error("--scale must be positive")
    if args.rows is None:
        args.rows = list(ROWS)
    unknown = [row for row in args.rows if row not in ROWS]
    if unknown or not args.rows:
        parser.error(f"unknown rows {unknown}; known: {','.join(ROWS)}")
    if args.allocs is None and args.wine:
        args.allocs = list(WINE_ALLOCS)
    if args.allocs is None:
        args.allocs = DEFAULT_ALLOCS + [a for a in OPTIONAL_ALLOCS
                                        if os.path.exists(micro_binary(args.build_dir, a))]
    if not args.allocs or len(set(args.allocs)) != len(args.allocs):
        parser.error("--allocs must name each allocator once")
    args.env = {}
    for spec in args.variant:
        name, sep, library = spec.partition("=")
        if not sep or not name or name in args.allocs or name in args.env or args.wine:
            parser.error(f"--variant {spec!r}: NAME=LIBRARY with a new name (and no --wine)")
        if not os.path.isfile(library):
            parser.error(f"--variant {spec!r}: no file {library}")
        args.env[name] = dict(os.environ, LD_PRELOAD=os.path.abspath(library))
    return args


def main():
    args = parse_args()
    started = datetime.datetime.now().astimezone()
    binaries = existing({a: micro_binary(args.build_dir, a, args.wine) for a in args.allocs})
    for name in args.env:
        binaries[name] = existing({name: micro_binary(args.build_dir, "system")})[name]
    allocs = args.allocs + list(args.env)

    samples = {(row, a): [] for row in args.rows for a in allocs}
    for run in range(1, args.runs + 1):
        for r, row in enumerate(args.rows):
            k = (run + r) % len(allocs)  # the order rotates: no allocator always runs first
            for alloc in allocs[k:] + allocs[:k]:
                ns = run_one(binaries[alloc], row, args.scale, args.build_dir if args.wine else None,
                             args.env.get(alloc))
                samples[(row, alloc)].append(ns)
                print(f"[run {run}/{args.runs}] {row:<15} {alloc:<9} {ns:9.2f} ns/pair",
                      file=sys.stderr, flush=True)

    median = {key: statistics.median(values) for key, values in samples.items()}
    peers = [a for a in allocs if a != BASELINE] if BASELINE in allocs else []
    if BASELINE not in allocs:
        print(f"micro.py: note: {BASELINE} not measured, so no ratio columns", file=sys.stderr)

    command = shlex.join(["bench/micro.py"] + sys.argv[1:])
    ratio_note = (f", ratio = peer/{BASELINE} run by run, median (runs {BASELINE} won) and its 95 % interval "
                  f"from 6 runs (>1: {BASELINE} faster)" if peers else "")
    print(f"`{command}`: median of {args.runs} runs, scale {args.scale:g}, "
          f"{started.strftime('%Y-%m-%d %H:%M %Z')}, ns per malloc/free pair{ratio_note}")
    print()
    header = ["row"] + allocs + [f"{p}/{BASELINE}" for p in peers]
    print("| " + " | ".join(header) + " |")
    print("|---" + "|--:" * (len(header) - 1) + "|")
    for row in args.rows:
        cells = [row] + [f"{median[(row, a)]:.2f}" for a in allocs]
        for p in peers:
            ratios = [x / max(b, 1e-9) for x, b in zip(samples[(row, p)], samples[(row, BASELINE)])]
            interval = median_interval(ratios)
            text = f"{statistics.median(ratios):.2f} ({sum(q > 1 for q in ratios)}/{len(ratios)})"
            cells.append(text + (f" {interval[0]:.3f}-{interval[1]:.3f}" if interval else ""))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
