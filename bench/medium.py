#!/usr/bin/env python3
"""bench/medium.py - runner of the medium benchmark (bench/medium.c): shardmm against its peers.

Runs <build-dir>/bench/medium-system <row> -scale <scale> with each allocator's library preloaded, as
the peers run (--linked: medium-<alloc>, the binary built for each allocator from bench/medium.c), as a
process of its own for every (run, row, allocator). Each process prints
"row ms peak_rss_mb page_faults"; the runner prints a markdown table on stdout: the medians of the ms
of the replacement loop, the peak RSS in MB and the page faults (minor + major, whole process) of each
allocator, then peer/shard of time for each peer. Progress and the time estimate go to stderr. A binary
that exits non-zero or prints something unexpected stops the whole run with an error.

The method (interleaving, medians, run-by-run ratios and their intervals, page faults beside time,
the peers built from source, --peer, --variant, --save): bench/README.md.

Standard library only.
"""

import argparse
import statistics
import sys

import runner
from runner import BASELINE

# The rows of bench/medium.c, in its order (keep in sync with its row table).
ROWS = ["64k-1m", "16k-256k", "8k-16k"]
DEFAULT_ALLOCS = ["shard", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["tcmalloc"]  # added to the default when its binary exists
TIMEOUT_S = 3600  # per process; a hung binary is an error too

# Rough wall time of one process, for the estimate printed before the first run: seconds of fill and
# teardown, plus seconds per million replacements (the slower peers on a 2-core VM, 2026-11; an
# allocator that takes fresh pages for every block, or slower page faults, take far longer). Refined
# from measured times once the first run is done.
ROUGH_S = {"64k-1m": (1.5, 12.0), "16k-256k": (0.3, 2.5), "8k-16k": (0.05, 0.3)}


def run_one(binary, row, scale, env=None):
    """Runs one row of one binary; returns (ms, peak_mb, faults), or stops the runner with an error."""
    command = [binary, row, "-scale", repr(scale)]
    fields, shown, _ = runner.run_line(command, TIMEOUT_S, env, runner.preload_shown(command, env))
    if len(fields) != 4 or fields[0] != row:
        runner.fail(f"{shown} printed {' '.join(fields)!r}, expected '{row} <ms> <peak_rss_mb> <page_faults>'")
    return runner.numbers(fields[1:], (float, float, int), shown)


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm medium-block benchmark against other allocators.")
    runner.add_options(parser, runs=3,
                       scale_help="multiplier of the replacement count, 1.0 = 2 million (default: 1.0)",
                       linked=True)
    parser.add_argument("--rows", type=runner.comma_list, default=None,
                        help="comma-separated rows (default: all: " + ",".join(ROWS) + ")")
    args = parser.parse_args()
    runner.check_options(parser, args, DEFAULT_ALLOCS, OPTIONAL_ALLOCS, "medium")
    args.rows = runner.choose(parser, args.rows, ROWS, "rows")
    return args


def main():
    args = parse_args()
    started = runner.started_at()
    allocs, binaries = runner.columns(args, "medium")

    per_run = sum(ROUGH_S[row][0] + ROUGH_S[row][1] * 2.0 * args.scale for row in args.rows)
    print(f"medium.py: {args.runs} runs x {len(args.rows)} rows x {len(allocs)} allocators; "
          f"roughly {runner.duration(per_run * len(allocs) * args.runs)} if every allocator runs like the "
          f"peers (an allocator that faults on every reuse, or slow page faults, take much longer)",
          file=sys.stderr, flush=True)

    samples = {(row, a): [] for row in args.rows for a in allocs}
    progress = runner.Progress(args.runs * len(args.rows) * len(allocs))
    for run, index, row in runner.interleaved(args.runs, args.rows):
        for alloc in runner.rotated(allocs, run + index):
            ms, mb, faults = run_one(binaries[alloc], row, args.scale, args.env.get(alloc))
            samples[(row, alloc)].append((ms, mb, faults))
            print(f"{progress.step()} run {run + 1} {row:<9} {alloc:<9} {ms:10.1f} ms {mb:8.1f} MB "
                  f"{faults:9d} faults", file=sys.stderr, flush=True)

    median = {key: tuple(statistics.median(v[i] for v in values) for i in range(3))
              for key, values in samples.items()}
    peers = [a for a in allocs if a != BASELINE] if BASELINE in allocs else []
    if not peers:
        print(f"medium.py: note: {BASELINE} not measured, so no ratio columns", file=sys.stderr)
    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, scale {args.scale:g} "
             f"({round(2000000 * args.scale)} replacements), {runner.stamp(started)}; ms of the replacement "
             f"loop, peak RSS in MB, page faults of the whole process" +
             (f"; {runner.RATIO_NOTE}, of time" if peers else ""), ""]
    header = ([f"{a} ms" for a in allocs] + [f"{a} MB" for a in allocs] + [f"{a} faults" for a in allocs]
              + [f"{p}/{BASELINE}" for p in peers])
    rows = []
    for row in args.rows:
        cells = [row]
        cells += [f"{median[(row, a)][0]:.1f}" for a in allocs]
        cells += [f"{median[(row, a)][1]:.1f}" for a in allocs]
        cells += [f"{median[(row, a)][2]:.0f}" for a in allocs]
        cells += [runner.pair_text(runner.paired([v[0] for v in samples[(row, p)]],
                                                 [v[0] for v in samples[(row, BASELINE)]])) for p in peers]
        rows.append(cells)
    lines += runner.markdown_table(["row"] + header, rows)
    runner.finish(lines, args, started, "bench/medium.py")


if __name__ == "__main__":
    main()
