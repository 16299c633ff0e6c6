#!/usr/bin/env python3
"""bench/shapes.py - runner of the shapes benchmark (bench/shapes.c): the allocation patterns where other
allocators lead, shardmm against its peers.

Runs <build-dir>/bench/shapes-system with each allocator's library preloaded (shardmm's, Debian's; none
for glibc), as the peers run (--linked: shapes-<alloc>, the binary built for each allocator from
bench/shapes.c; bench/README.md says why), as a process of its own for every (run, scenario, thread
count, allocator):

    shapes-system <scenario> -threads N -scale F

The rows are the scenarios, each at the thread counts where it means something (SHAPES below: 1 and 2
threads, and 8, more than this 2-core machine has; --threads replaces them); the columns shardmm,
mimalloc, jemalloc, the system malloc (glibc), tcmalloc when its binary exists, and each --variant: the
system build with another library preloaded. A scenario's work is split between its threads, so every
cell takes about as long.

Each process prints "shapes <scenario> ms peak_rss_mb minor_faults errors"; the runner prints a markdown
table on stdout, a row per (scenario, threads): the median ms of each allocator, peer/shard of time
run by run with its interval, the medians of peak RSS and minor page faults, and the blocks that failed
their check (all runs, all allocators); then the verdict of each (cell, peer) pair, at 1-2 threads and
apart at more. Progress goes to stderr. A binary that fails its checks (exit status 1 with its line
printed) is reported, and the runner exits with status 1 after the report; a binary that exits
otherwise or prints something unexpected stops the whole run.

The method (interleaving, medians, run-by-run ratios and their intervals, verdicts, page faults beside
time, --variant, --save): bench/README.md.

Standard library only.
"""

import argparse
import statistics
import subprocess
import sys

import runner
from runner import BASELINE, pair_text

DEFAULT_ALLOCS = ["shard", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["tcmalloc"]  # added to the default when its binary exists
# The scenarios of bench/shapes.c, in its order (keep in sync with its table), and the thread counts of
# their rows: 8 where threads hand blocks to each other or share cache lines, 1 where they would only
# run copies side by side.
SHAPES = {
    "larson": (1, 2, 8), "larson-sized": (1, 2, 8), "xmalloc": (2, 8),
    "cache-thrash": (1, 2, 8), "cache-scratch": (1, 2, 8), "alloc-test": (1, 2, 8),
    "glibc-simple": (1,), "glibc-thread": (2, 8), "glibc-thread-fixed": (2, 8), "rptest": (2, 8),
    "malloc-large": (1,), "large-ends": (1,), "turnover": (1, 2, 8), "requests": (1, 2, 8),
    "large-heads": (1, 8), "ring": (2, 8), "mixed": (1,), "strings": (1,),
}
MACHINE_CORES = 2  # the verdicts are counted apart above this many threads
TIMEOUT_S = 600  # per process; a hung binary is an error too
ROUGH_S = 0.45  # rough seconds per process at scale 1 (0.2-1.5 s under glibc, 2026-11), for the estimate


def run_one(binary, shape, threads, scale, env=None):
    """Runs one cell of one binary; returns (ms, peak_mb, minor_faults, errors), or stops the runner."""
    command = [binary, shape, "-threads", str(threads), "-scale", repr(scale)]
    # Status 1 with errors counted is a failed check, reported in the table; anything else is broken.
    fields, shown, status = runner.run_line(command, TIMEOUT_S, env, runner.preload_shown(command, env),
                                            statuses=(0, 1))
    if len(fields) != 6 or fields[:2] != ["shapes", shape]:
        runner.fail(f"{shown} (status {status}) printed {' '.join(fields)!r}, "
                    f"expected 'shapes {shape} <ms> <peak_rss_mb> <minor_faults> <errors>'")
    result = runner.numbers(fields[2:], (float, float, int, int), shown)
    if status != (1 if result[3] > 0 else 0):
        runner.fail(f"{shown} exited with status {status}")
    return result


def check_scenarios(binary):
    """Stops the runner when SHAPES and the scenarios the binary lists (shapes -list) differ."""
    try:
        listed = subprocess.run([binary, "-list"], capture_output=True, text=True, timeout=60,
                                check=True).stdout.split()
    except (OSError, subprocess.SubprocessError) as e:
        runner.fail(f"{binary} -list: {e}")
    if listed != list(SHAPES):
        runner.fail(f"{binary} -list names {','.join(listed)}; bench/shapes.py's SHAPES, "
                    f"{','.join(SHAPES)}: bring them in line")


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm shapes benchmark (the patterns where peers lead) against other allocators.")
    runner.add_options(parser, runs=3, scale_help="multiplier of every scenario's work (default: 1.0)",
                       linked=True)
    parser.add_argument("--shapes", type=runner.comma_list, default=None,
                        help="comma-separated scenarios (default: all: " + ",".join(SHAPES) + ")")
    parser.add_argument("--threads", type=runner.comma_list, default=None,
                        help="comma-separated thread counts for every scenario chosen (default: each "
                             "scenario's own, 1, 2 and 8 where they mean something)")
    args = parser.parse_args()
    runner.check_options(parser, args, DEFAULT_ALLOCS, OPTIONAL_ALLOCS, "shapes")
    args.shapes = runner.choose(parser, args.shapes, list(SHAPES), "shapes")
    if args.threads is not None:
        try:
            args.threads = [int(t) for t in args.threads]
        except ValueError:
            parser.error("--threads takes numbers")
        if not args.threads or not all(1 <= t <= 1024 for t in args.threads) \
                or len(set(args.threads)) != len(args.threads):
            parser.error("--threads: each count once, 1 .. 1024")
    return args


def main():
    args = parse_args()
    started = runner.started_at()
    allocs, binaries = runner.columns(args, "shapes")
    check_scenarios(binaries[allocs[0]])
    cells = [(s, t) for s in args.shapes for t in (args.threads or SHAPES[s])]

    print(f"shapes.py: {args.runs} runs x {len(cells)} cells x {len(allocs)} allocators; roughly "
          f"{runner.duration(ROUGH_S * args.scale * len(cells) * len(allocs) * args.runs)}",
          file=sys.stderr, flush=True)
    samples = {(s, t, a): [] for s, t in cells for a in allocs}
    progress = runner.Progress(args.runs * len(cells) * len(allocs))
    for run, index, (s, t) in runner.interleaved(args.runs, cells):
        for alloc in runner.rotated(allocs, run + index):
            ms, mb, faults, errors = run_one(binaries[alloc], s, t, args.scale, args.env.get(alloc))
            samples[(s, t, alloc)].append((ms, mb, faults, errors))
            flag = f"  {errors} ERRORS" if errors else ""
            print(f"{progress.step()} run {run + 1} {s:<13} {t:>2} threads {alloc:<10} {ms:8.1f} ms "
                  f"{mb:7.1f} MB {faults:8d} faults{flag}", file=sys.stderr, flush=True)

    median = {key: tuple(statistics.median(v[i] for v in values) for i in range(3))
              for key, values in samples.items()}
    errors = {(s, t): sum(v[3] for a in allocs for v in samples[(s, t, a)]) for s, t in cells}
    peers = [a for a in allocs if a != BASELINE] if BASELINE in allocs else []
    if not peers:
        print(f"shapes.py: note: {BASELINE} not measured, so no ratio columns", file=sys.stderr)
    paired = {(s, t, p): runner.paired([v[0] for v in samples[(s, t, p)]], [v[0] for v in samples[(s, t, BASELINE)]])
              for s, t in cells for p in peers}

    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, scale {args.scale:g}, "
             f"{runner.stamp(started)}; ms of the work (split between the threads), peak RSS in MB and minor "
             f"page faults of the whole process, blocks that failed their check (all runs and allocators)"
             + (f"; {runner.RATIO_NOTE}, of time" if peers else "")
             + ". larson-sized frees with mi_free_size, sdallocx or tc_free_sized in the peers' builds, with "
               "free in shardmm's (it has no sized free), and in the system build and the variants with C23's "
               "free_sized where a library of the process exports it, else free.", ""]
    header = (["scenario", "threads"] + [f"{a} ms" for a in allocs] + [f"{p}/{BASELINE}" for p in peers]
              + [f"{a} MB" for a in allocs] + [f"{a} faults" for a in allocs] + ["errors"])
    rows = []
    for s, t in cells:
        row = [s, str(t)] + [f"{median[(s, t, a)][0]:.1f}" for a in allocs]
        row += [pair_text(paired[(s, t, p)]) for p in peers]
        row += [f"{median[(s, t, a)][1]:.1f}" for a in allocs]
        row += [f"{median[(s, t, a)][2]:.0f}" for a in allocs]
        row.append(str(errors[(s, t)]) if errors[(s, t)] == 0 else f"**{errors[(s, t)]} FAILED**")
        rows.append(row)
    lines += runner.markdown_table(header, rows)

    if peers and args.runs < 6:
        lines += ["", "No verdicts: the confidence intervals take 6 runs at least."]
    elif peers:
        groups = [(f"at 1-{MACHINE_CORES} threads", [c for c in cells if c[1] <= MACHINE_CORES]),
                  (f"at {MACHINE_CORES + 1} threads or more", [c for c in cells if c[1] > MACHINE_CORES])]
        for where, group in groups:
            if not group:
                continue
            judged = {v: [f"{s}@{t} vs {p} {pair_text(paired[(s, t, p)])}" for s, t in group for p in peers
                          if runner.verdict(paired[(s, t, p)]) == v] for v in ("faster", "tie", "slower")}
            lines += ["", f"By the 95 % interval of the median ratio (sign test: {BASELINE} faster where the whole "
                          f"interval lies above 1), {where} {BASELINE} is faster in {len(judged['faster'])} of "
                          f"{len(group) * len(peers)} (cell, peer) pairs" +
                      "".join(f"; {v} in {len(judged[v])}: {'; '.join(judged[v])}" for v in ("tie", "slower")
                              if judged[v]) + "."]
    failed = [f"{s}@{t}: " + ", ".join(a for a in allocs if any(v[3] for v in samples[(s, t, a)]))
              for s, t in cells if errors[(s, t)]]
    if failed:
        lines += ["", f"FAILED: blocks failed their check in {'; '.join(failed)}"]
    runner.finish(lines, args, started, "bench/shapes.py")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
