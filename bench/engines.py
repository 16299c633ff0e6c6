#!/usr/bin/env python3
"""bench/engines.py - runner of the engine benchmark (bench/engines.c): scripting engines on shardmm's heaps
against the same engines on shardmm's drop-in malloc and on its peers.

A cell is an (engine, script) pair: Lua, Duktape and mruby, each with the scripts of tests/engines/ that
engine_scripts in tests/engine.h names. For every (run, cell, allocator) the runner starts one process,

    <build-dir>/bench/engines-heap ENGINE SCRIPT -runs R [-malloc]

which runs the script R times, each in a fresh engine, and prints "ENGINE SCRIPT ms_per_run peak_rss_mb
hash". The allocators (columns):

    heap      engines-heap: each engine on a shard_heap of its own, through the engine's hook (the baseline)
    shard     engines-heap -malloc with build/libshardmm.so preloaded: shardmm as the process's malloc
    mimalloc, jemalloc, tcmalloc
              engines-heap -malloc with Debian 12's library preloaded
    system    engines-heap -malloc as it is: glibc's malloc
    then the peers built from source (build/peers/*.so, bench/peers) and those of --peer and --variant:
              engines-heap -malloc with their library preloaded

R is chosen per cell so that a process runs for about TARGET_MS at --scale 1 (ROUGH_MS), the same R for
every allocator of the cell. The hash of the output must be the same for every allocator of a cell.
The report: ms per script run (median over the runs) of every allocator, X/heap of time for every other
column (the run-by-run ratio, > 1: the heaps faster, with the 95 % interval from 6 runs on), peak RSS in
MB, and the targets: heap within 2 % of shard or faster (a median shard/heap of 0.98 or more) and the
verdict (faster, tie, slower) against every peer.

The method (interleaving, medians, run-by-run ratios and their intervals, the peers built from source,
--peer, --variant, --save): bench/README.md. Run from the repository's root (the programs read
tests/engines/).

Standard library only.
"""

import argparse
import os
import statistics
import sys

import runner

HEAP = "heap"  # the baseline of every ratio here
KNOWN = [HEAP, "shard", "mimalloc", "jemalloc", "tcmalloc", "system"]
ENGINES = ["lua", "duktape", "mruby"]
SCRIPTS = ["table", "strings", "json", "trees", "closures"]  # engine_scripts in tests/engine.h, in its order
TIMEOUT_S = 600
TARGET_MS = 300  # wall time of one process at --scale 1
TARGET_VS_SHARD = 0.98  # heap within 2 % of shard or faster: median shard/heap at least this
# Rough ms of one run of each script on glibc's malloc (the 2-core VM, 2026-12), for R and the estimate.
ROUGH_MS = {
    "lua": {"table": 460, "strings": 70, "json": 60, "trees": 35, "closures": 40},
    "duktape": {"table": 900, "strings": 470, "json": 650, "trees": 90, "closures": 340},
    "mruby": {"table": 190, "strings": 40, "json": 260, "trees": 30, "closures": 15},
}


def runs_in_process(engine, script, scale):
    return max(1, round(scale * TARGET_MS / ROUGH_MS[engine][script]))


def run_one(binary, engine, script, repeat, env=None, on_malloc=False):
    """One process; returns (ms_per_run, peak_mb, hash), or stops the runner with an error."""
    command = [binary, engine, script, "-runs", str(repeat)] + (["-malloc"] if on_malloc else [])
    fields, shown, _ = runner.run_line(command, TIMEOUT_S, env, runner.preload_shown(command, env))
    if len(fields) != 5 or fields[:2] != [engine, script]:
        runner.fail(f"{shown} printed {' '.join(fields)!r}, expected '{engine} {script} <ms> <peak_rss_mb> <hash>'")
    ms, mb = runner.numbers(fields[2:4], (float, float), shown)
    return ms, mb, fields[4]


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the scripting-engine benchmark: shardmm's heaps against malloc's.")
    runner.add_options(parser, runs=6, scale_help="multiplier of the script runs per process (default: 1.0, "
                                                  f"about {TARGET_MS} ms per process)")
    parser.add_argument("--engines", type=runner.comma_list, default=None,
                        help="comma-separated engines (default: all: " + ",".join(ENGINES) + ")")
    parser.add_argument("--scripts", type=runner.comma_list, default=None,
                        help="comma-separated scripts (default: all: " + ",".join(SCRIPTS) + ")")
    args = parser.parse_args()
    defaults = [a for a in KNOWN if a not in runner.PACKAGED or os.path.exists(runner.PACKAGED[a])]
    runner.check_options(parser, args, defaults, known=KNOWN)
    args.engines = runner.choose(parser, args.engines, ENGINES, "engines")
    args.scripts = runner.choose(parser, args.scripts, SCRIPTS, "scripts")
    if not os.path.isdir(os.path.join("tests", "engines")):
        parser.error("run from the repository's root (the programs read tests/engines/)")
    return args


def main():
    args = parse_args()
    started = runner.started_at()
    allocs = args.allocs + list(args.libraries)  # the peers and variants: -malloc with their library
    runner.preload_allocators(args)  # shard and Debian's peers: -malloc with theirs
    # One binary for every column (bench/engines.c says why): the heaps, or -malloc with a library preloaded.
    binaries = runner.existing({a: runner.binary_path(args.build_dir, "engines", HEAP) for a in allocs})
    env = args.env
    cells = [(e, s) for e in args.engines for s in args.scripts]

    per_run = sum(max(TARGET_MS * args.scale, ROUGH_MS[e][s]) for e, s in cells) / 1000
    print(f"engines.py: {args.runs} runs x {len(cells)} cells x {len(allocs)} allocators; roughly "
          f"{runner.duration(per_run * len(allocs) * args.runs)}", file=sys.stderr, flush=True)

    samples = {(cell, a): [] for cell in cells for a in allocs}
    hashes = {}
    progress = runner.Progress(args.runs * len(cells) * len(allocs))
    for run, index, cell in runner.interleaved(args.runs, cells):
        engine, script = cell
        repeat = runs_in_process(engine, script, args.scale)
        for alloc in runner.rotated(allocs, run + index):
            ms, mb, digest = run_one(binaries[alloc], engine, script, repeat, env.get(alloc), alloc != HEAP)
            samples[(cell, alloc)].append((ms, mb))
            if hashes.setdefault(cell, (alloc, digest))[1] != digest:
                runner.fail(f"{engine} {script}: {alloc} printed hash {digest}, {hashes[cell][0]} "
                            f"{hashes[cell][1]}: the allocators disagree")
            print(f"{progress.step()} run {run + 1} {engine:<8} {script:<9} {alloc:<9} {ms:9.2f} ms {mb:7.1f} MB",
                  file=sys.stderr, flush=True)

    median = {key: tuple(statistics.median(v[i] for v in values) for i in range(2))
              for key, values in samples.items()}
    others = [a for a in allocs if a != HEAP] if HEAP in allocs else []
    pairs = {(cell, a): runner.paired([v[0] for v in samples[(cell, a)]], [v[0] for v in samples[(cell, HEAP)]])
             for cell in cells for a in others}
    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, scale {args.scale:g}, "
             f"{runner.stamp(started)}; ms per script run (a fresh engine made, the script run, the engine "
             f"closed; for {HEAP}, its heap made and destroyed too), peak RSS of the process in MB"
             + (f"; X/{HEAP}: the median of the run-by-run ratios of time (> 1: the heaps faster), the runs "
                f"{HEAP} won and, from 6 runs, the 95 % interval of that median (bench/README.md)" if others else ""),
             ""]
    header = ["engine", "script"] + [f"{a} ms" for a in allocs] + [f"{a}/{HEAP}" for a in others]
    rows = [[e, s] + [f"{median[((e, s), a)][0]:.1f}" for a in allocs]
            + [runner.pair_text(pairs[((e, s), a)]) for a in others] for e, s in cells]
    lines += runner.markdown_table(header, rows) + [""]
    rows = [[e, s] + [f"{median[((e, s), a)][1]:.1f}" for a in allocs] for e, s in cells]
    lines += runner.markdown_table(["engine", "script"] + [f"{a} MB" for a in allocs], rows)
    if others:
        lines += ["", "Targets:", ""]
        if "shard" in others:
            met = [c for c in cells if pairs[(c, "shard")][0] >= TARGET_VS_SHARD]
            missed = ", ".join(f"{e} {s} {pairs[((e, s), 'shard')][0]:.2f}" for e, s in cells if (e, s) not in met)
            lines.append(f"- {HEAP} within 2 % of shard (malloc) or faster, median shard/{HEAP} >= "
                         f"{TARGET_VS_SHARD}: {len(met)} of {len(cells)} cells" + (f"; not: {missed}" if missed else ""))
        if args.runs < 6:
            lines.append(f"- (with {args.runs} runs no ratio has an interval, so every pair is a tie)")
        for a in others:
            counts = {v: sum(runner.verdict(pairs[(c, a)]) == v for c in cells) for v in ("faster", "tie", "slower")}
            lines.append(f"- {HEAP} against {a}: faster in {counts['faster']}, tie in {counts['tie']}, slower in "
                         f"{counts['slower']} of {len(cells)} cells")
    runner.finish(lines, args, started, "bench/engines.py")


if __name__ == "__main__":
    main()
