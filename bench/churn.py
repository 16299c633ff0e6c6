#!/usr/bin/env python3
"""bench/churn.py - runner of the thread-churn benchmark (bench/churn.c): shardmm against its peers.

Runs <build-dir>/bench/churn-<alloc> (one binary per allocator, built from bench/churn.c) as a separate
process per run and allocator, --runs times, interleaved so that slow drifts of a noisy machine hit
every allocator alike:

    for run in runs:  for alloc in allocs:  churn-<alloc> -threads T -rounds R -objects N -mix M -scale F

The allocators are shardmm, shardmm built without the reserve an exiting thread leaves for the next
one (shard-noreserve: an exiting thread returns all its free memory at once), mimalloc, jemalloc, the
system malloc (glibc), and tcmalloc when its binary exists.

Each process prints "churn ms peak_rss_mb minor_faults errors"; the runner keeps the median of the runs
of each allocator for each quantity and prints a markdown table on stdout, one row per allocator: ms of
all rounds (and the range over the runs), the time ratio peer/shard (above 1 means shardmm is faster),
minor page faults of the whole process, peak RSS in MB, and objects that failed their pattern check
(summed over the runs). Progress goes to stderr. A binary that fails its checks (exit status 1 with its
line printed) is reported in the table, and the runner exits with status 1 after it; a binary that
exits otherwise or prints something unexpected stops the whole run with an error.

Page faults matter here: a thread that exits and gives its memory back makes the next thread fault it
in again, page by page; an allocator that keeps it for the next thread pays none.

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

DEFAULT_ALLOCS = ["shard", "shard-noreserve", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["tcmalloc"]  # added to the default when its binary exists
BASELINE = "shard"
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


def run_one(binary, params):
    """Runs one binary; returns (ms, peak_mb, minor_faults, errors), or stops the runner with an error."""
    command = [binary]
    for name in ("threads", "rounds", "objects", "mix", "scale"):
        command += ["-" + name, repr(params[name]) if name == "scale" else str(params[name])]
    # Status 1 with errors counted is a failed check, reported in the table; anything else is broken.
    fields, shown, status = run_line(command, TIMEOUT_S, statuses=(0, 1))
    if len(fields) != 5 or fields[0] != "churn":
        fail(f"{shown} (status {status}) printed {' '.join(fields)!r}, "
             f"expected 'churn <ms> <peak_rss_mb> <minor_faults> <errors>'")
    result = numbers(fields[1:], (float, float, int, int), shown)
    if status != (1 if result[3] > 0 else 0):
        fail(f"{shown} exited with status {status}")
    return result


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm thread-churn benchmark against other allocators.")
    parser.add_argument("--build-dir", default="build",
                        help="directory holding bench/churn-<alloc> (default: build)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per allocator; the median is reported (default: 3)")
    parser.add_argument("--allocs", type=comma_list, default=None,
                        help="comma-separated allocators (default: " + ",".join(DEFAULT_ALLOCS)
                             + ", plus tcmalloc when its binary exists)")
    parser.add_argument("--threads", type=int, default=DEFAULTS["threads"],
                        help=f"threads per round (default: {DEFAULTS['threads']})")
    parser.add_argument("--rounds", type=int, default=DEFAULTS["rounds"],
                        help=f"rounds of threads (default: {DEFAULTS['rounds']})")
    parser.add_argument("--objects", type=int, default=DEFAULTS["objects"],
                        help="allocation steps per thread at scale 1; a thread holds a quarter as many "
                             f"live objects at most (default: {DEFAULTS['objects']})")
    parser.add_argument("--scale", type=float, default=DEFAULTS["scale"],
                        help="multiplier of --objects: work and live memory per thread (default: 1.0)")
    parser.add_argument("--mix", choices=MIXES, default=DEFAULTS["mix"],
                        help=f"size mix (default: {DEFAULTS['mix']}; see bench/churn.c)")
    args = parser.parse_args()

    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not 1 <= args.threads <= 1024:
        parser.error("--threads must be 1 .. 1024")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.objects < STEPS_PER_SLOT:
        parser.error(f"--objects must be at least {STEPS_PER_SLOT}")
    if not args.scale > 0:
        parser.error("--scale must be positive")
    if args.allocs is None:
        args.allocs = DEFAULT_ALLOCS + [a for a in OPTIONAL_ALLOCS
                                        if os.path.exists(binary_path(args.build_dir, "churn", a))]
    if not args.allocs or len(set(args.allocs)) != len(args.allocs):
        parser.error("--allocs must name each allocator once")
    return args


def main():
    args = parse_args()
    started = datetime.datetime.now().astimezone()
    binaries = existing({a: binary_path(args.build_dir, "churn", a) for a in args.allocs})
    params = {"threads": args.threads, "rounds": args.rounds, "objects": args.objects,
              "mix": args.mix, "scale": args.scale}
    steps = max(STEPS_PER_SLOT, round(args.objects * args.scale))
    msteps = args.threads * args.rounds * steps / 1e6

    slowest = max(ROUGH_S_PER_MSTEP.values())
    per_run = sum(ROUGH_S_PER_MSTEP.get(a, slowest) * msteps for a in args.allocs)
    print(f"churn.py: {args.runs} runs x {len(args.allocs)} allocators, {args.threads} threads x "
          f"{args.rounds} rounds x {steps} steps; roughly {duration(per_run * args.runs)} "
          f"(other size mixes take longer)", file=sys.stderr, flush=True)

    samples = {a: [] for a in args.allocs}
    t_start = time.monotonic()
    for run in range(1, args.runs + 1):
        for alloc in args.allocs:
            ms, mb, faults, errors = run_one(binaries[alloc], params)
            samples[alloc].append((ms, mb, faults, errors))
            flag = f"  {errors} ERRORS" if errors else ""
            print(f"[run {run}/{args.runs}] {alloc:<16} {ms:9.1f} ms {mb:8.1f} MB {faults:9d} faults{flag}",
                  file=sys.stderr, flush=True)
        if run < args.runs:
            spent = time.monotonic() - t_start
            print(f"churn.py: {duration(spent)} so far, about {duration(spent / run * (args.runs - run))}"
                  f" to go", file=sys.stderr, flush=True)

    median = {a: tuple(statistics.median(v[i] for v in values) for i in range(3))
              for a, values in samples.items()}
    errors = {a: sum(v[3] for v in values) for a, values in samples.items()}
    if BASELINE not in args.allocs:
        print(f"churn.py: note: {BASELINE} not measured, so no ratio column", file=sys.stderr)

    command = shlex.join(["bench/churn.py"] + sys.argv[1:])
    ratio_note = (f"; peer/{BASELINE}: ratio of times (>1: {BASELINE} faster)"
                  if BASELINE in args.allocs else "")
    print(f"`{command}`: median of {args.runs} runs, {started.strftime('%Y-%m-%d %H:%M %Z')}; "
          f"{args.threads} threads x {args.rounds} rounds, {steps} steps per thread "
          f"(objects {args.objects} x scale {args.scale:g}, at most {steps // STEPS_PER_SLOT} live), "
          f"mix {args.mix}; ms of all rounds (range over the runs), minor page faults and peak RSS of "
          f"the whole process, objects that failed their check (all runs){ratio_note}")
    print()
    with_ratio = BASELINE in args.allocs
    header = (["allocator", "ms", "ms range"] + ([f"peer/{BASELINE}"] if with_ratio else [])
              + ["faults", "peak RSS MB", "errors"])
    print("| " + " | ".join(header) + " |")
    print("|---" + "|--:" * (len(header) - 1) + "|")
    for alloc in args.allocs:
        ms, mb, faults = median[alloc]
        times = [v[0] for v in samples[alloc]]
        cells = [alloc, f"{ms:.1f}", f"{min(times):.0f}-{max(times):.0f}"]
        if with_ratio:
            cells.append(f"{ms / median[BASELINE][0]:.2f}" if alloc != BASELINE else "")
        cells += [f"{faults:.0f}", f"{mb:.1f}",
                  str(errors[alloc]) if errors[alloc] == 0 else f"**{errors[alloc]} FAILED**"]
        print("| " + " | ".join(cells) + " |")
    failed = [a for a in args.allocs if errors[a]]
    if failed:
        print()
        print(f"FAILED: objects failed their pattern check under {', '.join(failed)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
