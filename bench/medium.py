#!/usr/bin/env python3
"""bench/medium.py - runner of the medium benchmark (bench/medium.c): shardmm against its peers.

Runs <build-dir>/bench/medium-<alloc> (one binary per allocator, built from bench/medium.c) once per
(row, allocator) as a separate process, --runs times, interleaved so that slow drifts of a noisy
machine hit every allocator alike:

    for run in runs:  for row in rows:  for alloc in allocs:  medium-<alloc> <row> -scale <scale>

Each process prints "row ms peak_rss_mb page_faults"; the runner keeps the median of the runs per
(row, alloc) and each quantity, and prints a markdown table on stdout: ms of the replacement loop,
peak RSS in MB and page faults (minor + major, whole process) for each allocator, then the time ratio
peer/shard for each peer (above 1 means shardmm is faster). Progress and the time estimate go to
stderr. A binary that exits non-zero or prints something unexpected stops the whole run with an error.

Page faults matter here: the blocks are written page by page, and a first touch of a page costs a
fault (up to ~17 us on some of our VMs), so an allocator that gives memory back and takes fresh memory
pays in faults what one that reuses its memory does not.

Standard library only.
"""

import argparse
import datetime
import os
import shlex
import statistics
import sys
import time

from runner import binary_path, comma_list, duration, existing, fail, numbers, run_line

# The rows of bench/medium.c, in its order (keep in sync with its row table).
ROWS = ["64k-1m", "16k-256k", "8k-16k"]
DEFAULT_ALLOCS = ["shard", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["tcmalloc"]  # added to the default when its binary exists
BASELINE = "shard"
TIMEOUT_S = 3600  # per process; a hung binary is an error too

# Rough wall time of one process, for the estimate printed before the first run: seconds of fill and
# teardown, plus seconds per million replacements (the slower peers on a 2-core VM, 2026-11; an
# allocator that takes fresh pages for every block, or slower page faults, take far longer). Refined
# from measured times once the first run is done.
ROUGH_S = {"64k-1m": (1.5, 12.0), "16k-256k": (0.3, 2.5), "8k-16k": (0.05, 0.3)}


def run_one(binary, row, scale):
    """Runs one row of one binary; returns (ms, peak_mb, faults), or stops the runner with an error."""
    command = [binary, row, "-scale", repr(scale)]
    fields, shown, _ = run_line(command, TIMEOUT_S)
    if len(fields) != 4 or fields[0] != row:
        fail(f"{shown} printed {' '.join(fields)!r}, expected '{row} <ms> <peak_rss_mb> <page_faults>'")
    return numbers(fields[1:], (float, float, int), shown)


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm medium-block benchmark against other allocators.")
    parser.add_argument("--build-dir", default="build",
                        help="directory holding bench/medium-<alloc> (default: build)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per (row, allocator); the median is reported (default: 3)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplier of the replacement count, 1.0 = 2 million (default: 1.0)")
    parser.add_argument("--rows", type=comma_list, default=None,
                        help="comma-separated rows (default: all: " + ",".join(ROWS) + ")")
    parser.add_argument("--allocs", type=comma_list, default=None,
                        help="comma-separated allocators (default: " + ",".join(DEFAULT_ALLOCS)
                             + ", plus tcmalloc when its binary exists)")
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
    if args.allocs is None:
        args.allocs = DEFAULT_ALLOCS + [a for a in OPTIONAL_ALLOCS
                                        if os.path.exists(binary_path(args.build_dir, "medium", a))]
    if not args.allocs or len(set(args.allocs)) != len(args.allocs):
        parser.error("--allocs must name each allocator once")
    return args


def main():
    args = parse_args()
    started = datetime.datetime.now().astimezone()
    binaries = existing({a: binary_path(args.build_dir, "medium", a) for a in args.allocs})

    per_run = sum(ROUGH_S[row][0] + ROUGH_S[row][1] * 2.0 * args.scale for row in args.rows)
    estimate = per_run * len(args.allocs) * args.runs
    print(f"medium.py: {args.runs} runs x {len(args.rows)} rows x {len(args.allocs)} allocators; "
          f"roughly {duration(estimate)} if every allocator runs like the peers "
          f"(an allocator that faults on every reuse, or slow page faults, take much longer)",
          file=sys.stderr, flush=True)

    samples = {(row, a): [] for row in args.rows for a in args.allocs}
    t_start = time.monotonic()
    for run in range(1, args.runs + 1):
        for row in args.rows:
            for alloc in args.allocs:
                ms, mb, faults = run_one(binaries[alloc], row, args.scale)
                samples[(row, alloc)].append((ms, mb, faults))
                print(f"[run {run}/{args.runs}] {row:<9} {alloc:<9} {ms:10.1f} ms {mb:8.1f} MB "
                      f"{faults:9d} faults", file=sys.stderr, flush=True)
        if run < args.runs:
            spent = time.monotonic() - t_start
            print(f"medium.py: {duration(spent)} so far, about {duration(spent / run * (args.runs - run))}"
                  f" to go", file=sys.stderr, flush=True)

    median = {key: tuple(statistics.median(v[i] for v in values) for i in range(3))
              for key, values in samples.items()}
    peers = [a for a in args.allocs if a != BASELINE] if BASELINE in args.allocs else []
    if BASELINE not in args.allocs:
        print(f"medium.py: note: {BASELINE} not measured, so no ratio columns", file=sys.stderr)

    command = shlex.join(["bench/medium.py"] + sys.argv[1:])
    ratio_note = f"; ratio = peer/{BASELINE} of time (>1: {BASELINE} faster)" if peers else ""
    print(f"`{command}`: median of {args.runs} runs, scale {args.scale:g} "
          f"({round(2000000 * args.scale)} replacements), {started.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"ms of the replacement loop, peak RSS in MB, page faults of the whole process{ratio_note}")
    print()
    header = (["row"] + [f"{a} ms" for a in args.allocs] + [f"{a} MB" for a in args.allocs]
              + [f"{a} faults" for a in args.allocs] + [f"{p}/{BASELINE}" for p in peers])
    print("| " + " | ".join(header) + " |")
    print("|---" + "|--:" * (len(header) - 1) + "|")
    for row in args.rows:
        cells = [row]
        cells += [f"{median[(row, a)][0]:.1f}" for a in args.allocs]
        cells += [f"{median[(row, a)][1]:.1f}" for a in args.allocs]
        cells += [f"{median[(row, a)][2]:.0f}" for a in args.allocs]
        cells += [f"{median[(row, p)][0] / median[(row, BASELINE)][0]:.2f}" for p in peers]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
