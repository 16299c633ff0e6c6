#!/usr/bin/env python3
"""bench/churn.py - runner of the thread-churn benchmark (bench/churn.c): shardmm against its peers.

Runs <build-dir>/bench/churn-system with each allocator's library preloaded (shard-noreserve's is
build/noreserve/libshardmm.so), as the peers run (--linked: churn-<alloc>, the binary built for each
allocator from bench/churn.c), as a process of its own for every (run, allocator):

    churn-system -threads T -rounds R -objects N -mix M -scale F

The allocators are shardmm, shardmm built without the reserve an exiting thread leaves for the next
one (shard-noreserve: an exiting thread returns all its free memory at once), mimalloc, jemalloc, the
system malloc (glibc), and tcmalloc when its binary exists.

Each process prints "churn ms peak_rss_mb minor_faults errors"; the runner prints a markdown table on
stdout, one row per allocator: the median ms of all rounds (and the range over the runs), peer/shard of
time, the medians of the minor page faults and the peak RSS of the whole process, and the objects that
failed their pattern check (summed over the runs). Progress goes to stderr. A binary that fails its
checks (exit status 1 with its line printed) is reported in the table, and the runner exits with status
1 after it; a binary that exits otherwise or prints something unexpected stops the whole run.

The method (interleaving, medians, run-by-run ratios and their intervals, page faults beside time,
the peers built from source, --peer, --variant, --save): bench/README.md.

Standard library only.
"""

import argparse
import statistics
import sys

import runner
from runner import BASELINE

DEFAULT_ALLOCS = ["shard", "shard-noreserve", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["tcmalloc"]  # added to the default when its binary exists
# The defaults and mixes of bench/churn.c (keep in sync); the runner passes every parameter explicitly.
DEFAULTS = {"threads": 4, "rounds": 200, "objects": 20000, "mix": "mixed", "scale": 1.0}
MIXES = ["small", "mixed", "medium"]
STEPS_PER_SLOT = 4  # bench/churn.c: a thread holds steps / 4 live slots
TIMEOUT_S = 600  # per process; a hung binary is an error too

# Rough seconds per million steps (threads x rounds x steps per thread) with the mixed sizes, for the
# estimate printed before the first run (a 2-core VM, 2026-11); other allocators: the slowest of these.
# Refined from measured times once the first run is done.
ROUGH_S_PER_MSTEP = {"shard": 0.07, "shard-noreserve": 0.09, "mimalloc": 0.08, "tcmalloc": 0.12,
                     "system": 0.14, "jemalloc": 0.47}


def run_one(binary, params, env=None):
    """Runs one binary; returns (ms, peak_mb, minor_faults, errors), or stops the runner with an error."""
    command = [binary]
    for name in ("threads", "rounds", "objects", "mix", "scale"):
        command += ["-" + name, repr(params[name]) if name == "scale" else str(params[name])]
    # Status 1 with errors counted is a failed check, reported in the table; anything else is broken.
    fields, shown, status = runner.run_line(command, TIMEOUT_S, env, runner.preload_shown(command, env),
                                            statuses=(0, 1))
    if len(fields) != 5 or fields[0] != "churn":
        runner.fail(f"{shown} (status {status}) printed {' '.join(fields)!r}, "
                    f"expected 'churn <ms> <peak_rss_mb> <minor_faults> <errors>'")
    result = runner.numbers(fields[1:], (float, float, int, int), shown)
    if status != (1 if result[3] > 0 else 0):
        runner.fail(f"{shown} exited with status {status}")
    return result


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm thread-churn benchmark against other allocators.")
    runner.add_options(parser, runs=3, scale_help="multiplier of --objects: work and live memory per thread "
                                                  "(default: 1.0)", linked=True)
    parser.add_argument("--threads", type=int, default=DEFAULTS["threads"],
                        help=f"threads per round (default: {DEFAULTS['threads']})")
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"],
                        help=f"rounds of threads (default: {DEFAULTS['rounds']})")
    parser.add_argument("--objects", type=int, default=DEFAULTS["objects"],
                        help="allocation steps per thread at scale 1; a thread holds a quarter as many "
                             f"live objects at most (default: {DEFAULTS['objects']})")
    parser.add_argument("--mix", choices=MIXES, default=DEFAULTS["mix"],
                        help=f"size mix (default: {DEFAULTS['mix']}; see bench/churn.c)")
    args = parser.parse_args()
    if not 1 <= args.threads <= 1024:
        parser.error("--threads must be 1 .. 1024")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.objects < STEPS_PER_SLOT:
        parser.error(f"--objects must be at least {STEPS_PER_SLOT}")
    runner.check_options(parser, args, DEFAULT_ALLOCS, OPTIONAL_ALLOCS, "churn")
    return args


def main():
    args = parse_args()
    started = runner.started_at()
    allocs, binaries = runner.columns(args, "churn")
    params = {"threads": args.threads, "rounds": args.rounds, "objects": args.objects,
              "mix": args.mix, "scale": args.scale}
    steps = max(STEPS_PER_SLOT, round(args.objects * args.scale))
    msteps = args.threads * args.rounds * steps / 1e6

    slowest = max(ROUGH_S_PER_MSTEP.values())
    per_run = sum(ROUGH_S_PER_MSTEP.get(a, slowest) * msteps for a in allocs)
    print(f"churn.py: {args.runs} runs x {len(allocs)} allocators, {args.threads} threads x "
          f"{args.rounds} rounds x {steps} steps; roughly {runner.duration(per_run * args.runs)} "
          f"(other size mixes take longer)", file=sys.stderr, flush=True)

    samples = {a: [] for a in allocs}
    progress = runner.Progress(args.runs * len(allocs))
    for run, index, _ in runner.interleaved(args.runs, [None]):
        for alloc in runner.rotated(allocs, run + index):
            ms, mb, faults, errors = run_one(binaries[alloc], params, args.env.get(alloc))
            samples[alloc].append((ms, mb, faults, errors))
            flag = f"  {errors} ERRORS" if errors else ""
            print(f"{progress.step()} run {run + 1} {alloc:<16} {ms:9.1f} ms {mb:8.1f} MB {faults:9d} faults{flag}",
                  file=sys.stderr, flush=True)

    median = {a: tuple(statistics.median(v[i] for v in values) for i in range(3))
              for a, values in samples.items()}
    errors = {a: sum(v[3] for v in values) for a, values in samples.items()}
    with_ratio = BASELINE in allocs
    if not with_ratio:
        print(f"churn.py: note: {BASELINE} not measured, so no ratio column", file=sys.stderr)

    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, {runner.stamp(started)}; "
             f"{args.threads} threads x {args.rounds} rounds, {steps} steps per thread "
             f"(objects {args.objects} x scale {args.scale:g}, at most {steps // STEPS_PER_SLOT} live), "
             f"mix {args.mix}; ms of all rounds (range over the runs), minor page faults and peak RSS of "
             f"the whole process, objects that failed their check (all runs)"
             + (f"; {runner.RATIO_NOTE}, of time" if with_ratio else ""), ""]
    header = (["allocator", "ms", "ms range"] + ([f"peer/{BASELINE}"] if with_ratio else [])
              + ["faults", "peak RSS MB", "errors"])
    rows = []
    for alloc in allocs:
        ms, mb, faults = median[alloc]
        times = [v[0] for v in samples[alloc]]
        cells = [alloc, f"{ms:.1f}", f"{min(times):.0f}-{max(times):.0f}"]
        if with_ratio:
            cells.append(runner.pair_text(runner.paired(times, [v[0] for v in samples[BASELINE]]))
                         if alloc != BASELINE else "")
        cells += [f"{faults:.0f}", f"{mb:.1f}",
                  str(errors[alloc]) if errors[alloc] == 0 else f"**{errors[alloc]} FAILED**"]
        rows.append(cells)
    lines += runner.markdown_table(header, rows)
    failed = [a for a in allocs if errors[a]]
    if failed:
        lines += ["", f"FAILED: objects failed their pattern check under {', '.join(failed)}"]
    runner.finish(lines, args, started, "bench/churn.py")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
