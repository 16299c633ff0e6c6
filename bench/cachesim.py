#!/usr/bin/env python3
"""bench/cachesim.py - the application benchmark's scenarios under valgrind's cache simulator: the
instructions each program executes and the first-level data cache misses it takes, per allocator.
Deterministic (the same numbers on every run of the same binaries, or within 1-2 % for an allocator that
acts on the clock, such as jemalloc's purging), so it separates differences of a few per cent that the
timed runs of bench/run cannot on a shared, noisy machine.

Runs, for each scenario and allocator, <build-dir>/bench/app-<alloc> <scenario> -threads 1 -scale S (the
peers built from source, build/peers/*.so, and those of --peer and --variant: app-system with the library
preloaded) under
    valgrind --tool=cachegrind --cache-sim=yes --I1=32768,8,64 --D1=32768,8,64 --LL=8388608,16,64
(fixed caches: a 32 KB 8-way first level, 8 MB 16-way last level, whatever the machine has) and reads
the totals valgrind prints: instructions (I refs), first-level data misses (D1 misses) and last-level
data misses (LLd misses). The checksums of the allocators must agree, as in bench/run. The runs go
--jobs at a time (each is one process; valgrind runs one thread at a time).

What it does not show: time. A miss that the hardware prefetcher hides, a long dependency chain or a
mispredicted branch costs what valgrind does not count. And valgrind counts each iteration of a `rep`
string instruction as one instruction: shardmm copies (realloc) and zeroes (calloc above 256 bytes) with
`rep movsb` / `rep stosb`, one "instruction" per byte here, where the C library's vector loops count one
per 32 or 64 bytes; so shardmm's instruction counts are too high where it copies much (pack, strings,
arrays).

Prints a markdown table on stdout: per scenario, millions of instructions and thousands of D1 and LLd
misses per allocator, and each peer's D1 misses over shardmm's. A peer that fails under valgrind is
left out, with the reason below the table (snmalloc: it reserves more address space than valgrind
gives). Progress goes to stderr. Standard
library only.
"""
import argparse
import concurrent.futures
import os
import re
import subprocess
import sys

import runner
from runner import comma_list, fail

SCENARIOS = ["objects", "strings", "arrays", "maps", "pack", "json", "closures", "mixed"]
ALLOCS = ["shard", "mimalloc", "jemalloc", "tcmalloc", "system"]
CACHES = ["--I1=32768,8,64", "--D1=32768,8,64", "--LL=8388608,16,64"]
TIMEOUT_S = 1200


def count(text, label):
    """The total of valgrind's summary line `label:` (digits with commas), or None."""
    m = re.search(r"==\d+== " + re.escape(label) + r":\s+([\d,]+)", text)
    return int(m.group(1).replace(",", "")) if m else None


def simulate(binary, scenario, scale, env=None, peer=False):
    """(checksum, [instructions, D1 misses, LLd misses]); for a `peer` that fails under valgrind,
    NotUnderValgrind."""
    command = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--cachegrind-out-file=/dev/null"] + CACHES + [
        binary, scenario, "-threads", "1", "-scale", str(scale)]
    shown = runner.preload_shown(command, env)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        fail(f"{shown}: {e}")
    checksum = re.search(r"checksum=(\S+)", done.stdout)
    numbers = [count(done.stderr, label) for label in ("I   refs", "D1  misses", "LLd misses")]
    if done.returncode != 0 and peer:
        raise runner.NotUnderValgrind(runner.valgrind_reason(done.returncode, done.stderr))
    if done.returncode != 0 or checksum is None or None in numbers:
        sys.stderr.write(done.stderr[-2000:])
        fail(f"{shown} exited with status {done.returncode}, printed {done.stdout!r}")
    return checksum.group(1), numbers


def main():
    parser = argparse.ArgumentParser(description="Instructions and cache misses of the app benchmark under cachegrind.")
    runner.add_options(parser)
    parser.add_argument("--scenarios", type=comma_list, default=None,
                        help="comma-separated scenarios (default: " + ",".join(SCENARIOS) + ")")
    parser.add_argument("--scale", type=float, default=0.2, help="work per run (default 0.2: 5-40 s each)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    runner.check_options(parser, args, ALLOCS)
    if args.allocs[0] != "shard":
        parser.error("--allocs must start with shard")
    scenarios = runner.choose(parser, args.scenarios, SCENARIOS, "scenarios")
    allocs, binaries = runner.columns(args, "app")
    started = runner.started_at()
    jobs = [(s, a) for s in scenarios for a in allocs]
    results, failed = {}, {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = {pool.submit(simulate, binaries[a], s, args.scale, args.env.get(a), a in args.peers): (s, a)
                   for s, a in jobs}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            s, a = futures[future]
            try:
                results[(s, a)] = future.result()
            except runner.NotUnderValgrind as e:
                failed[a] = str(e)
                print(f"[{done}/{len(jobs)}] {s} {a}: failed under valgrind, {e}", file=sys.stderr, flush=True)
                continue
            print(f"[{done}/{len(jobs)}] {s} {a}: {results[(s, a)][1][0] / 1e6:.1f} M instructions, "
                  f"{results[(s, a)][1][1] / 1e3:.1f} k D1 misses", file=sys.stderr, flush=True)
    allocs = [a for a in allocs if a not in failed]
    for s in scenarios:
        sums = {results[(s, a)][0] for a in allocs}
        if len(sums) != 1:
            fail(f"{s}: the allocators' checksums differ ({', '.join(sorted(sums))}): a corrupted block")
    peers = allocs[1:]
    lines = [f"`{runner.command_line()}`: cachegrind, 1 thread, scale {args.scale:g}, {runner.stamp(started)}; "
             "M instructions (rep movs/stos counted per byte), k first-level (D1) and last-level (LLd) data "
             "misses; peer/shard: D1 misses over shardmm's (> 1: shardmm fewer)", ""]
    header = (["scenario"] + [f"{a} M instr" for a in allocs] + [f"{a} k D1" for a in allocs]
              + [f"{a} k LLd" for a in allocs] + [f"{p}/shard D1" for p in peers])
    rows = []
    for s in scenarios:
        r = {a: results[(s, a)][1] for a in allocs}
        cells = [f"{r[a][0] / 1e6:.1f}" for a in allocs] + [f"{r[a][1] / 1e3:.1f}" for a in allocs]
        cells += [f"{r[a][2] / 1e3:.1f}" for a in allocs]
        cells += [f"{r[p][1] / r['shard'][1]:.2f}" if r["shard"][1] else "-" for p in peers]
        rows.append([s] + cells)
    lines += runner.markdown_table(header, rows)
    fewer = [s for s in scenarios if all(results[(s, p)][1][1] >= results[(s, "shard")][1][1] for p in peers)]
    lines += ["", f"shardmm takes the fewest D1 misses in {len(fewer)} of {len(scenarios)} scenarios"
              + ("" if len(fewer) == len(scenarios) else
                 "; not in: " + ", ".join(s for s in scenarios if s not in fewer)) + "."]
    lines += runner.valgrind_failures(failed)
    runner.finish(lines, args, started, "bench/cachesim.py")


if __name__ == "__main__":
    main()
