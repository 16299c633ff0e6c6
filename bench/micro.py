#!/usr/bin/env python3
"""bench/micro.py - runner of the micro benchmark (bench/micro.c): shardmm against its peers.

Runs <build-dir>/bench/micro-<alloc> <row> -scale <scale> (one binary per allocator, built from
bench/micro.c) as a process of its own for every (run, row, allocator). Each process prints
"row ns_per_pair"; the runner prints a markdown table on stdout: the median ns per malloc/free pair of
each allocator, then peer/shard for each peer. Progress goes to stderr. A binary that exits non-zero
or prints something unexpected stops the whole run with an error.

The method (interleaving, medians, run-by-run ratios and their intervals, the peers built from source,
--peer, --variant, --save): bench/README.md.

With --wine it runs the Windows builds instead (<build-dir>/win64/micro-<alloc>.exe: shardmm's DLL and
the C runtime's malloc, which under Wine is Wine's heap, not Windows's) under /usr/lib/wine/wine64 with
the test suite's prefix; that measures our Windows code paths (the TEB slot read, the Win64 port), not
Windows itself.

Standard library only.
"""

import argparse
import os
import statistics
import sys

import runner
from runner import BASELINE

# The rows of bench/micro.c, in its order (keep in sync with its row table).
ROWS = ["fixed-32", "mixed-lifo", "mixed-fifo", "lifo-1000", "fifo-1000", "fill-free",
        "random-replace", "replace-64", "replace-256", "replace-1024", "foreign-free"]
DEFAULT_ALLOCS = ["shard", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["shard-purec", "tcmalloc"]  # added to the default when their binaries exist
# shard-purec: shardmm with its C fast paths (build/purec) in place of the NASM ones
TIMEOUT_S = 600  # per process; a hung binary is an error too

WINE = "/usr/lib/wine/wine64"
WINE_ALLOCS = ["shard", "system"]


def micro_binary(build_dir, alloc, wine=False):
    if wine:
        return os.path.join(build_dir, "win64", "micro-" + alloc + ".exe")
    return runner.binary_path(build_dir, "micro", alloc)


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
    fields, shown, _ = runner.run_line(command, TIMEOUT_S, env, runner.preload_shown(command, env))
    if len(fields) != 2 or fields[0] != row:
        runner.fail(f"{shown} printed {' '.join(fields)!r}, expected '{row} <ns_per_pair>'")
    return runner.numbers(fields[1:], (float,), shown)[0]


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm micro benchmark against other allocators.")
    runner.add_options(parser, runs=5, scale_help="multiplier of the iteration counts (default: 1.0)")
    parser.add_argument("--rows", type=runner.comma_list, default=None,
                        help="comma-separated rows (default: all: " + ",".join(ROWS) + ")")
    parser.add_argument("--wine", action="store_true",
                        help="run the Windows builds (<build-dir>/win64/micro-<alloc>.exe) under Wine "
                             "(allocators: " + ",".join(WINE_ALLOCS) + ")")
    args = parser.parse_args()
    runner.check_options(parser, args, WINE_ALLOCS if args.wine else DEFAULT_ALLOCS,
                         () if args.wine else OPTIONAL_ALLOCS, "micro", preload=not args.wine)
    args.rows = runner.choose(parser, args.rows, ROWS, "rows")
    return args


def main():
    args = parse_args()
    started = runner.started_at()
    allocs, binaries = runner.columns(args, "micro", lambda build_dir, _, a: micro_binary(build_dir, a, args.wine))

    samples = {(row, a): [] for row in args.rows for a in allocs}
    progress = runner.Progress(args.runs * len(args.rows) * len(allocs))
    for run, index, row in runner.interleaved(args.runs, args.rows):
        for alloc in runner.rotated(allocs, run + index):
            ns = run_one(binaries[alloc], row, args.scale, args.build_dir if args.wine else None,
                         args.env.get(alloc))
            samples[(row, alloc)].append(ns)
            print(f"{progress.step()} run {run + 1} {row:<15} {alloc:<9} {ns:9.2f} ns/pair",
                  file=sys.stderr, flush=True)

    peers = [a for a in allocs if a != BASELINE] if BASELINE in allocs else []
    if not peers:
        print(f"micro.py: note: {BASELINE} not measured, so no ratio columns", file=sys.stderr)
    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, scale {args.scale:g}, "
             f"{runner.stamp(started)}, ns per malloc/free pair" + (f"; {runner.RATIO_NOTE}" if peers else ""),
             ""]
    rows = []
    for row in args.rows:
        cells = [row] + [f"{statistics.median(samples[(row, a)]):.2f}" for a in allocs]
        cells += [runner.pair_text(runner.paired(samples[(row, p)], samples[(row, BASELINE)])) for p in peers]
        rows.append(cells)
    lines += runner.markdown_table(["row"] + allocs + [f"{p}/{BASELINE}" for p in peers], rows)
    runner.finish(lines, args, started, "bench/micro.py" + (" --wine" if args.wine else ""))


if __name__ == "__main__":
    main()
