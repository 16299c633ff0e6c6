#!/usr/bin/env python3
"""bench/large.py - runner of the large-block benchmark (bench/large.c): shardmm against its peers.

Runs <build-dir>/bench/large-<alloc> (one binary per allocator, built from bench/large.c by ninja)
once per (scenario, allocator) as a separate process, --runs times, interleaved so that slow drifts of
a noisy machine hit every allocator alike:

    for run in runs:  for scenario in scenarios:  for alloc in allocs:
        large-<alloc> <scenario> -scale <scale> [-cycles K -fill F | -blocks B]

Scenarios (bench/large.c says exactly what each does):
    grow   a buffer grown from 1 MB to 1 GB in steps of 1/16 of its size, new bytes written, then shrunk
           back to 1 MB, twice in a process: time, moves (realloc gave another address), peak RSS
    burst  two threads, each allocating rounds of 8 (--blocks) blocks of 1-64 MB, writing them a byte
           per page, and freeing them in a random order
    churn  the same on a window of 8 live blocks per thread, one random block replaced per step

Allocators: shard (shardmm, which asks for transparent huge pages under large blocks), mimalloc,
jemalloc, system (glibc), and when built, shard-nolp (shardmm without huge pages, as the peers run
by default) and tcmalloc. --peer-thp asks the peers for huge pages through their own settings, for
the comparison on equal terms; the header line says which way the tables were made, and the kernel's
huge-page mode.

Each process prints one line, "<scenario> key=value ..."; the runner keeps the median of the runs of
each quantity, per (scenario, alloc), and prints one markdown table per scenario on stdout, an
allocator per row, with the time ratio peer/shard (above 1 means shardmm is faster). Progress goes to
stderr. A binary that exits non-zero (a content check failed) or prints something unexpected stops
the whole run with an error.

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

SCENARIOS = ["grow", "burst", "churn"]
DEFAULT_ALLOCS = ["shard", "mimalloc", "jemalloc", "system"]
OPTIONAL_ALLOCS = ["shard-nolp", "tcmalloc"]  # added to the default when their binaries exist
# shard-nolp: shardmm built with SHARD_LARGE_PAGES=0, i.e. without asking for transparent huge pages
# under large blocks, as the peers do not by default; --peer-thp asks the peers for them instead:
PEER_THP_ENV = {
    "system": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},  # glibc >= 2.35: madvise(MADV_HUGEPAGE)
    "jemalloc": {"MALLOC_CONF": "thp:always"},
    "mimalloc": {"MIMALLOC_LARGE_OS_PAGES": "1"},
}  # gperftools' tcmalloc has no such setting
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
BASELINE = "shard"
TIMEOUT_S = 3600  # per process; a hung binary is an error too

# The fields each scenario prints (after its name), in bench/large.c's order; all numbers but `fill`.
FIELDS = {
    "grow": ["ms", "ms1", "msr", "up1", "down1", "moves_up", "moves_down", "moves_up_last",
             "moves_down_last", "steps_up", "steps_down", "doublings", "top_mb", "cycles", "fill",
             "peak_mb", "faults"],
    "burst": ["ms", "slow_ms", "threads", "blocks", "rounds", "allocated", "peak_mb", "faults"],
    "churn": ["ms", "slow_ms", "threads", "blocks", "steps", "allocated", "peak_mb", "faults"],
}
TEXT_FIELDS = {"fill"}

# Rough wall seconds of one process at scale 1 (2 cycles for grow), the slower allocators on a 2-core
# VM, 2026-11 (an allocator that copies to fresh memory at each growth step takes ~14 s per cycle;
# one that remaps, ~0.6 s). For the estimate printed before the first run, refined after it.
ROUGH_S = {"grow": 12.0, "burst": 3.0, "churn": 3.0}


def scenario_command(binary, scenario, args):
    command = [binary, scenario, "-scale", repr(args.scale)]
    if scenario == "grow":
        command += ["-cycles", str(args.cycles), "-fill", args.fill]
    else:
        command += ["-blocks", str(args.blocks)]
    return command


def run_one(command, scenario, env):
    """Runs one process with `env` added to the environment; returns its fields as a dict, or stops
    the runner with an error."""
    words, shown, _ = run_line(command, TIMEOUT_S, dict(os.environ, **env),
                            shlex.join([f"{key}={value}" for key, value in env.items()] + command))
    pairs = [word.partition("=") for word in words[1:]]
    keys = [key for key, _, _ in pairs]
    if not words or words[0] != scenario or keys != FIELDS[scenario]:
        fail(f"{shown} printed {' '.join(words)!r}, expected '{scenario} "
             + " ".join(f"{key}=..." for key in FIELDS[scenario]) + "'")
    result = {}
    for key, _, value in pairs:
        if key in TEXT_FIELDS:
            result[key] = value
            continue
        result[key] = numbers([value], (float,), shown)[0]
    return result


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm large-block benchmark against other allocators.")
    parser.add_argument("--build-dir", default="build",
                        help="directory holding bench/large-<alloc> (default: build)")
    parser.add_argument("--runs", type=int, default=3,
                        help="runs per (scenario, allocator); the median is reported (default: 3)")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplier of grow's top size (1 GB at 1.0) and of the rounds or steps of "
                             "burst and churn (default: 1.0)")
    parser.add_argument("--scenarios", type=comma_list, default=None,
                        help="comma-separated scenarios (default: all: " + ",".join(SCENARIOS) + ")")
    parser.add_argument("--allocs", type=comma_list, default=None,
                        help="comma-separated allocators (default: " + ",".join(DEFAULT_ALLOCS)
                             + ", plus " + " and ".join(OPTIONAL_ALLOCS) + " when their binaries exist)")
    parser.add_argument("--cycles", type=int, default=2,
                        help="grow: cycles (1 MB -> 1 GB -> 1 MB) per process (default: 2)")
    parser.add_argument("--fill", choices=["memset", "page"], default="memset",
                        help="grow: write every new byte (memset, default) or one word per 4 KB page")
    parser.add_argument("--peer-thp", action="store_true",
                        help="ask the peers for transparent huge pages too, through their own settings: "
                             + "; ".join(f"{a}: " + " ".join(f"{k}={v}" for k, v in env.items())
                                         for a, env in PEER_THP_ENV.items()))
    parser.add_argument("--blocks", type=int, default=8,
                        help="burst: blocks per round, churn: live window, per thread (default: 8)")
    args = parser.parse_args()

    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if not args.scale > 0:
        parser.error("--scale must be positive")
    if not 1 <= args.cycles <= 1000:
        parser.error("--cycles must be 1..1000")
    if not 1 <= args.blocks <= 64:
        parser.error("--blocks must be 1..64")
    if args.scenarios is None:
        args.scenarios = list(SCENARIOS)
    unknown = [s for s in args.scenarios if s not in SCENARIOS]
    if unknown or not args.scenarios or len(set(args.scenarios)) != len(args.scenarios):
        parser.error(f"bad --scenarios {args.scenarios}; known: {','.join(SCENARIOS)}")
    if args.allocs is None:
        args.allocs = DEFAULT_ALLOCS + [a for a in OPTIONAL_ALLOCS
                                        if os.path.exists(binary_path(args.build_dir, "large", a))]
    if not args.allocs or len(set(args.allocs)) != len(args.allocs):
        parser.error("--allocs must name each allocator once")
    return args


def thp_mode():
    """The kernel's transparent-huge-page mode (the bracketed word), or 'unknown'."""
    try:
        with open(THP_SETTING) as f:
            text = f.read()
    except OSError:
        return "unknown"
    start, end = text.find("["), text.find("]")
    return text[start + 1:end] if 0 <= start < end else "unknown"


# ---- Tables ----

def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|---" + "|--:" * (len(header) - 1) + "|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in rows]
    return "\n".join(lines)


def plural(count, noun):
    return f"{count:.0f} {noun}" + ("" if round(count) == 1 else "s")


def ratio_cell(med, alloc, key):
    if BASELINE not in med or alloc == BASELINE:
        return "1" if alloc == BASELINE else "-"
    return f"{med[alloc][key] / med[BASELINE][key]:.2f}"


def moves_cell(first, last, cycles):
    """Cycle 1's moves, and the last cycle's after a slash when it differs."""
    if cycles > 1 and round(last) != round(first):
        return f"{first:.0f} / {last:.0f}"
    return f"{first:.0f}"


def grow_table(med, args):
    some = next(iter(med.values()))
    cycles = int(some["cycles"])
    fill = ("every new byte written (memset)" if some["fill"] == "memset"
            else "one 8-byte word written per new 4 KB page")
    title = (f"**grow**: 1 MB to {some['top_mb']:.0f} MB in {some['steps_up']:.0f} reallocs of +1/16 "
             f"({some['doublings']:.0f} doublings), {fill}; back to 1 MB in {some['steps_down']:.0f} "
             f"reallocs of -1/16, nothing touched; {cycles} cycle{'s' if cycles > 1 else ''} per process. "
             f"ms: growth (writes included) + shrink; moves: reallocs that returned another address, "
             f"in cycle 1" + (f" (/ in cycle {cycles}, when different)" if cycles > 1 else ""))
    header = ["allocator", "ms, all cycles", f"peer/{BASELINE}", "cycle 1: growth ms", "cycle 1: shrink ms"]
    if cycles > 1:
        header += ["later cycles: ms each"]
    header += ["moves up", "moves down", "peak RSS MB", "faults"]
    rows = []
    for a in args.allocs:
        m = med[a]
        cells = [a, f"{m['ms']:.0f}", ratio_cell(med, a, "ms"), f"{m['up1']:.0f}", f"{m['down1']:.1f}"]
        if cycles > 1:
            cells += [f"{m['msr']:.0f}"]
        cells += [moves_cell(m["moves_up"], m["moves_up_last"], cycles),
                  moves_cell(m["moves_down"], m["moves_down_last"], cycles),
                  f"{m['peak_mb']:.0f}", f"{m['faults']:.0f}"]
        rows.append(cells)
    return title + "\n\n" + table(header, rows)


def threads_table(scenario, med, args):
    some = next(iter(med.values()))
    if scenario == "burst":
        what = (f"{some['threads']:.0f} threads, each {plural(some['rounds'], 'round')} of "
                f"{plural(some['blocks'], 'block')} of 1-64 MB allocated, written (a byte per 4 KB page), "
                f"freed in random order")
    else:
        what = (f"{some['threads']:.0f} threads, each a window of {plural(some['blocks'], 'live block')} of "
                f"1-64 MB, {plural(some['steps'], 'step')} replacing a random one (written a byte per 4 KB "
                f"page)")
    title = (f"**{scenario}**: {what}; {some['allocated']:.0f} blocks in all. ms: wall time from the "
             f"threads' common start to the last join; slower thread: its own time")
    header = ["allocator", "ms", f"peer/{BASELINE}", "slower thread ms", "peak RSS MB", "faults"]
    rows = [[a, f"{med[a]['ms']:.0f}", ratio_cell(med, a, "ms"), f"{med[a]['slow_ms']:.0f}",
             f"{med[a]['peak_mb']:.0f}", f"{med[a]['faults']:.0f}"] for a in args.allocs]
    return title + "\n\n" + table(header, rows)


def main():
    args = parse_args()
    started = datetime.datetime.now().astimezone()
    binaries = existing({a: binary_path(args.build_dir, "large", a) for a in args.allocs})

    per_run = sum(ROUGH_S[s] * args.scale * (args.cycles / 2 if s == "grow" else 1.0)
                  for s in args.scenarios)
    estimate = per_run * len(args.allocs) * args.runs
    print(f"large.py: {args.runs} runs x {len(args.scenarios)} scenarios x {len(args.allocs)} allocators; "
          f"roughly {duration(estimate)}", file=sys.stderr, flush=True)

    samples = {(s, a): [] for s in args.scenarios for a in args.allocs}
    t_start = time.monotonic()
    for run in range(1, args.runs + 1):
        for scenario in args.scenarios:
            for alloc in args.allocs:
                env = PEER_THP_ENV.get(alloc, {}) if args.peer_thp else {}
                result = run_one(scenario_command(binaries[alloc], scenario, args), scenario, env)
                samples[(scenario, alloc)].append(result)
                extra = (f" moves {result['moves_up']:.0f}/{result['moves_down']:.0f}"
                         if scenario == "grow" else "")
                print(f"[run {run}/{args.runs}] {scenario:<6} {alloc:<10} {result['ms']:9.0f} ms "
                      f"{result['peak_mb']:7.0f} MB {result['faults']:9.0f} faults{extra}",
                      file=sys.stderr, flush=True)
        if run < args.runs:
            spent = time.monotonic() - t_start
            print(f"large.py: {duration(spent)} so far, about {duration(spent / run * (args.runs - run))}"
                  f" to go", file=sys.stderr, flush=True)

    if BASELINE not in args.allocs:
        print(f"large.py: note: {BASELINE} not measured, so no ratios", file=sys.stderr)
    command = shlex.join(["bench/large.py"] + sys.argv[1:])
    thp = ("peers asked for huge pages (" + "; ".join(" ".join(f"{k}={v}" for k, v in env.items())
                                                  for a, env in PEER_THP_ENV.items() if a in args.allocs)
           + ")" if args.peer_thp else "peers in their default settings")
    print(f"`{command}`: median of {args.runs} runs, scale {args.scale:g}, "
          f"{started.strftime('%Y-%m-%d %H:%M %Z')}, transparent huge pages: {thp_mode()}, {thp}; "
          f"each (scenario, allocator) its own process; peak RSS (ru_maxrss) and page faults "
          f"(minor + major) of the whole process; peer/{BASELINE} = ratio of ms (>1: {BASELINE} faster)")
    for scenario in args.scenarios:
        med = {}
        for a in args.allocs:
            runs = samples[(scenario, a)]
            med[a] = {key: (runs[0][key] if key in TEXT_FIELDS
                            else statistics.median(r[key] for r in runs))
                      for key in FIELDS[scenario]}
        print()
        print(grow_table(med, args) if scenario == "grow" else threads_table(scenario, med, args))


if __name__ == "__main__":
    main()
