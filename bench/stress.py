#!/usr/bin/env python3
"""bench/stress.py - mimalloc's own stress test under shardmm and its peers.

Runs build/peers/test-stress (mimalloc's test/test-stress.c, built by bench/peers with -DUSE_STD_MALLOC
so that it calls malloc) as a process of its own for every (run, setting, allocator):

    [LD_PRELOAD=<library>] build/peers/test-stress THREADS SCALE ITERATIONS

The program runs ITERATIONS rounds of THREADS new threads; each allocates (calloc) and writes blocks of
8 bytes to 50 KB (up to 5 MB above scale 100), frees most of them again at random, and swaps some with
a shared array of 1000 slots that outlives the threads, so that blocks are freed by other threads than
their owner, some after it has exited; every block is checked when freed (a corrupted one aborts the
program). The settings are those issue 25 names: 4 threads at scale 200 for 100 iterations, and 32
threads at scale 100 for the program's default 50 iterations (16 times this machine's cores).

The allocators (columns), each the same program with its library preloaded: shard
(<build-dir>/libshardmm.so), Debian 12's mimalloc, jemalloc and tcmalloc (runner.PACKAGED), system (no
library: glibc's malloc), then the peers built from source (build/peers/*.so) and those of --peer and
--variant. Time is the wall time of the process, from its start to its end, taken here; peak RSS and
minor page faults are the process's own (wait4's resource usage).

The report: one table per setting, an allocator per row, with the medians of ms, peak RSS in MB and
minor faults, and peer/shard of time with its interval from 6 runs on, then the verdict per peer:
faster, tie or slower. Progress goes to stderr. A process of shardmm's (shard, or a --variant) that exits
otherwise than with status 0, prints something unexpected or does not finish stops the whole run with an
error. A peer's failure is a result: its run is left out of that column (and of the pairs with shard),
the run goes on, and the report says under the table which runs failed and how (rpmalloc 2.0.1 aborted
once in 32x100 with "memory corruption at block ...", which had thrown away the runs before it).

The method (interleaving, medians, run-by-run ratios and their intervals, page faults beside time, the
peers built from source, --peer, --variant, --save): bench/README.md.

Standard library only.
"""

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time

import runner
from runner import BASELINE

KNOWN = ["shard", "mimalloc", "jemalloc", "tcmalloc", "system"]
# name: (threads, scale, iterations); scale is test-stress's own: its load per thread in per cent
SETTINGS = {"4x200": (4, 200, 100), "32x100": (32, 100, 50)}
TIMEOUT_S = 1800  # per process; a hung program is an error too
# Rough seconds per iteration of each setting (glibc and the peers on the 2-core VM, 2026-12), for the
# estimate printed before the first run.
ROUGH_S = {"4x200": 0.1, "32x100": 0.8}


def run_one(command, env, expected):
    """Runs one process; returns (ms, peak_mb, minor_faults), or what went wrong in a line (a string).
    `expected`: the start of the line it prints, which echoes its settings."""
    shown = runner.preload_shown(command, env)
    start = time.monotonic()
    try:
        child = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        runner.fail(f"cannot run {command[0]}: {e}")
    late = threading.Event()
    timer = threading.Timer(TIMEOUT_S, lambda: (late.set(), child.kill()))
    timer.start()
    # The output is a line (a few more on a failure): the pipes cannot fill, so reading them after the
    # end is safe. wait4 gives the child's own resource usage, which subprocess's wait does not.
    _, status, usage = os.wait4(child.pid, 0)
    ms = (time.monotonic() - start) * 1000
    timer.cancel()
    child.returncode = os.waitstatus_to_exitcode(status)  # reaped here: subprocess must not wait for it
    out, err = child.communicate()
    said = " ".join(err.split())[-300:]
    if late.is_set():
        return f"did not finish within {TIMEOUT_S} s"
    if child.returncode != 0:
        return f"exited with status {child.returncode}" + (f" ({said})" if said else "")
    if not out.startswith(expected):
        return f"printed {out.strip()[:200]!r}, expected {expected!r}..."
    return ms, usage.ru_maxrss / 1024, usage.ru_minflt


def parse_args():
    parser = argparse.ArgumentParser(description="Run mimalloc's stress test (build/peers/test-stress) under "
                                                 "shardmm and its peers.")
    runner.add_options(parser, runs=3)
    parser.add_argument("--settings", type=runner.comma_list, default=None,
                        help="comma-separated settings, THREADSxSCALE (default: all: " + ",".join(SETTINGS) + ")")
    parser.add_argument("--iterations", type=int, default=None,
                        help="iterations of every setting, in place of its own (100 and 50): for a short check")
    args = parser.parse_args()
    if args.iterations is not None and args.iterations < 1:
        parser.error("--iterations must be at least 1")
    defaults = [a for a in KNOWN if a not in runner.PACKAGED or os.path.exists(runner.PACKAGED[a])]
    runner.check_options(parser, args, defaults, known=KNOWN)
    args.settings = runner.choose(parser, args.settings, SETTINGS, "settings")
    return args


def table(setting, samples, pairs, allocs):
    """One setting's table: samples {allocator: [(ms, MB, faults), or None for a failed run]}, pairs
    {peer: runner.paired of ms, or None when no run of both succeeded}."""
    threads, scale, iterations = setting
    rows = []
    for a in allocs:
        ok = [r for r in samples[a] if r is not None]
        ratio = runner.pair_text(pairs[a]) if pairs.get(a) else "1" if a == BASELINE else "-"
        if not ok:
            rows.append([a, "failed", ratio, "-", "-"])
            continue
        ms, mb, faults = (statistics.median(r[i] for r in ok) for i in range(3))
        rows.append([a, f"{ms:.0f}", ratio, f"{mb:.0f}", f"{faults:.0f}"])
    title = (f"**{threads} threads, scale {scale}, {iterations} iteration{'s' if iterations > 1 else ''}**" +
             (" (blocks up to 5 MB)" if scale > 100 else ""))
    return [title, ""] + runner.markdown_table(["allocator", "ms", f"peer/{BASELINE}", "peak RSS MB",
                                                "minor faults"], rows)


def main():
    args = parse_args()
    program = os.path.join(runner.peers_dir(args.build_dir), "test-stress")
    if not os.path.exists(program):
        runner.fail(f"no {program}: build it with bench/peers (from a mimalloc source)")
    args.programs = [program]  # its line of build/peers/VERSIONS goes into a saved report
    allocs = args.allocs + list(args.libraries)
    runner.preload_allocators(args)  # every column but system preloads a library
    settings = {name: SETTINGS[name][:2] + (args.iterations or SETTINGS[name][2],) for name in args.settings}
    started = runner.started_at()

    per_run = sum(ROUGH_S[name] * settings[name][2] for name in args.settings) * len(allocs)
    print(f"stress.py: {args.runs} runs x {len(args.settings)} settings x {len(allocs)} allocators; roughly "
          f"{runner.duration(per_run * args.runs)}", file=sys.stderr, flush=True)
    # shardmm's own columns: their failure is an error; a peer's is a result (the docstring)
    ours = {BASELINE} | (set(args.libraries) - set(args.peers))
    samples = {(name, a): [None] * args.runs for name in args.settings for a in allocs}
    failures = {(name, a): [] for name in args.settings for a in allocs}  # (run, what happened)
    progress = runner.Progress(args.runs * len(args.settings) * len(allocs))
    for run, index, name in runner.interleaved(args.runs, args.settings):
        threads, scale, iterations = settings[name]
        command = [program, str(threads), str(scale), str(iterations)]
        for alloc in runner.rotated(allocs, run + index):
            result = run_one(command, args.env.get(alloc), f"Using {threads} threads with a {scale}% ")
            if isinstance(result, str):
                if alloc in ours:
                    runner.fail(f"{runner.preload_shown(command, args.env.get(alloc))} {result}")
                failures[(name, alloc)].append((run, result))
                print(f"{progress.step()} run {run + 1} {name:<6} {alloc:<16} FAILED: {result}", file=sys.stderr,
                      flush=True)
                continue
            ms, mb, faults = result
            samples[(name, alloc)][run] = result
            print(f"{progress.step()} run {run + 1} {name:<6} {alloc:<16} {ms:9.0f} ms {mb:7.0f} MB "
                  f"{faults:9d} faults", file=sys.stderr, flush=True)

    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, {runner.stamp(started)}; "
             f"`test-stress THREADS SCALE ITERATIONS` (mimalloc's test/test-stress.c on malloc), each "
             f"allocator preloaded; ms: wall time of the process, peak RSS (ru_maxrss) and minor "
             f"page faults of the process; {runner.RATIO_NOTE}, of ms"]
    peers = [a for a in allocs if a != BASELINE] if BASELINE in allocs else []
    for name in args.settings:
        pairs = {}
        for p in peers:  # the runs both finished
            both = [(a, b) for a, b in zip(samples[(name, p)], samples[(name, BASELINE)]) if a and b]
            pairs[p] = runner.paired([a[0] for a, _ in both], [b[0] for _, b in both]) if both else None
        lines += [""] + table(settings[name], {a: samples[(name, a)] for a in allocs}, pairs, allocs)
        for a in allocs:
            if failures[(name, a)]:
                told = "; ".join(f"run {run + 1}: {what}" for run, what in failures[(name, a)])
                lines += ["", f"{a} failed in {len(failures[(name, a)])} of {args.runs} runs, left out: {told}"]
        if peers and args.runs >= 6:
            judged = {p: runner.verdict(pairs[p]) if pairs[p] else "failed" for p in peers}
            group = {v: ", ".join(p for p in peers if judged[p] == v) or "none"
                     for v in ("faster", "tie", "slower", "failed")}
            lines += ["", f"By the 95 % interval of the median ratio, {BASELINE} is faster than: {group['faster']}; "
                          f"a tie with: {group['tie']}; slower than: {group['slower']}" +
                          (f"; no run finished: {group['failed']}." if group["failed"] != "none" else ".")]
    if peers and args.runs < 6:
        lines += ["", "No confidence intervals: they take 6 runs at least."]
    runner.finish(lines, args, started, "bench/stress.py: mimalloc's test-stress")


if __name__ == "__main__":
    main()
