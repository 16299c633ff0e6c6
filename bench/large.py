#!/usr/bin/env python3
"""bench/large.py - runner of the large-block benchmark (bench/large.c): shardmm against its peers.

Runs <build-dir>/bench/large-system with each allocator's library preloaded (shard-nolp's is
build/nolp/libshardmm.so), as the peers run (--linked: large-<alloc>, the binary built for each allocator
from bench/large.c), as a process of its own for every (run, scenario, allocator):

    large-system <scenario> -scale <scale> [-cycles K -fill F | -blocks B]

Scenarios (bench/large.c says exactly what each does):
    grow   a buffer grown from 1 MB to 1 GB in steps of 1/16 of its size, new bytes written, then shrunk
           back to 1 MB, twice in a process: time, moves (realloc gave another address), peak RSS
    burst  two threads, each allocating rounds of 8 (--blocks) blocks of 1-64 MB, writing them a byte
           per page, and freeing them in a random order
    churn  the same on a window of 8 live blocks per thread, one random block replaced per step

Allocators: shard (shardmm, which asks for transparent huge pages under large blocks), mimalloc,
jemalloc, system (glibc), and when built, shard-nolp (shardmm without huge pages, as the peers run
by default) and tcmalloc; then the peers built from source (build/peers/*.so) and those of --peer,
preloaded into large-system. --peer-thp asks the peers for huge pages through their own settings, for
the comparison on equal terms (a peer built from source by its name's first word: mimalloc-3.4.3 as
mimalloc; snmalloc and rpmalloc have no such setting); the header line says which way the tables were
made, and the kernel's huge-page mode.

Each process prints one line, "<scenario> key=value ..."; the runner prints one markdown table per
scenario on stdout, an allocator per row, with the medians of each quantity and peer/shard of time.
Progress goes to stderr. A binary that exits non-zero (a content check failed) or prints something
unexpected stops the whole run with an error.

The method (interleaving, medians, run-by-run ratios and their intervals, page faults beside time,
the peers built from source, --peer, --variant, --save): bench/README.md.

Standard library only.
"""

import argparse
import os
import shlex
import statistics
import sys

import runner
from runner import BASELINE

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


def thp_setting(args, alloc):
    """With --peer-thp, the settings that ask `alloc` for huge pages, or {}: a peer built from source
    (or given by --peer) by its name's first word, a variant (a shardmm build) none."""
    kind = alloc.split("-")[0] if alloc in args.peers else alloc
    return PEER_THP_ENV.get(kind, {}) if args.peer_thp else {}
THP_SETTING = "/sys/kernel/mm/transparent_hugepage/enabled"
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
    """Runs one process in the environment `env` (ours when None); returns its fields as a dict, or
    stops the runner with an error."""
    extra = {k: v for k, v in (env or {}).items() if os.environ.get(k) != v}
    words, shown, _ = runner.run_line(command, TIMEOUT_S, env,
                                      shlex.join([f"{key}={value}" for key, value in extra.items()] + command))
    pairs = [word.partition("=") for word in words[1:]]
    keys = [key for key, _, _ in pairs]
    if not words or words[0] != scenario or keys != FIELDS[scenario]:
        runner.fail(f"{shown} printed {' '.join(words)!r}, expected '{scenario} "
                    + " ".join(f"{key}=..." for key in FIELDS[scenario]) + "'")
    result = {}
    for key, _, value in pairs:
        if key in TEXT_FIELDS:
            result[key] = value
            continue
        result[key] = runner.numbers([value], (float,), shown)[0]
    return result


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run the shardmm large-block benchmark against other allocators.")
    runner.add_options(parser, runs=3,
                       scale_help="multiplier of grow's top size (1 GB at 1.0) and of the rounds or steps of "
                                  "burst and churn (default: 1.0)", linked=True)
    parser.add_argument("--scenarios", type=runner.comma_list, default=None,
                        help="comma-separated scenarios (default: all: " + ",".join(SCENARIOS) + ")")
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
    if not 1 <= args.cycles <= 1000:
        parser.error("--cycles must be 1..1000")
    if not 1 <= args.blocks <= 64:
        parser.error("--blocks must be 1..64")
    runner.check_options(parser, args, DEFAULT_ALLOCS, OPTIONAL_ALLOCS, "large")
    args.scenarios = runner.choose(parser, args.scenarios, SCENARIOS, "scenarios")
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

def plural(count, noun):
    return f"{count:.0f} {noun}" + ("" if round(count) == 1 else "s")


def ratio_cell(runs, alloc):
    """peer/shard of the processes' ms, run by run (runner.paired); 1 for shard, - without shard."""
    if BASELINE not in runs or alloc == BASELINE:
        return "1" if alloc == BASELINE else "-"
    return runner.pair_text(runner.paired([r["ms"] for r in runs[alloc]], [r["ms"] for r in runs[BASELINE]]))


def moves_cell(first, last, cycles):
    """Cycle 1's moves, and the last cycle's after a slash when it differs."""
    if cycles > 1 and round(last) != round(first):
        return f"{first:.0f} / {last:.0f}"
    return f"{first:.0f}"


def grow_table(med, runs, allocs):
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
    for a in allocs:
        m = med[a]
        cells = [a, f"{m['ms']:.0f}", ratio_cell(runs, a), f"{m['up1']:.0f}", f"{m['down1']:.1f}"]
        if cycles > 1:
            cells += [f"{m['msr']:.0f}"]
        cells += [moves_cell(m["moves_up"], m["moves_up_last"], cycles),
                  moves_cell(m["moves_down"], m["moves_down_last"], cycles),
                  f"{m['peak_mb']:.0f}", f"{m['faults']:.0f}"]
        rows.append(cells)
    return [title, ""] + runner.markdown_table(header, rows)


def threads_table(scenario, med, runs, allocs):
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
    rows = [[a, f"{med[a]['ms']:.0f}", ratio_cell(runs, a), f"{med[a]['slow_ms']:.0f}",
             f"{med[a]['peak_mb']:.0f}", f"{med[a]['faults']:.0f}"] for a in allocs]
    return [title, ""] + runner.markdown_table(header, rows)


def main():
    args = parse_args()
    started = runner.started_at()
    allocs, binaries = runner.columns(args, "large")

    per_run = sum(ROUGH_S[s] * args.scale * (args.cycles / 2 if s == "grow" else 1.0)
                  for s in args.scenarios)
    print(f"large.py: {args.runs} runs x {len(args.scenarios)} scenarios x {len(allocs)} allocators; "
          f"roughly {runner.duration(per_run * len(allocs) * args.runs)}", file=sys.stderr, flush=True)

    samples = {(s, a): [] for s in args.scenarios for a in allocs}
    progress = runner.Progress(args.runs * len(args.scenarios) * len(allocs))
    for run, index, scenario in runner.interleaved(args.runs, args.scenarios):
        for alloc in runner.rotated(allocs, run + index):
            env = args.env.get(alloc)
            if thp_setting(args, alloc):
                env = dict(env or os.environ, **thp_setting(args, alloc))
            result = run_one(scenario_command(binaries[alloc], scenario, args), scenario, env)
            samples[(scenario, alloc)].append(result)
            extra = f" moves {result['moves_up']:.0f}/{result['moves_down']:.0f}" if scenario == "grow" else ""
            print(f"{progress.step()} run {run + 1} {scenario:<6} {alloc:<10} {result['ms']:9.0f} ms "
                  f"{result['peak_mb']:7.0f} MB {result['faults']:9.0f} faults{extra}", file=sys.stderr, flush=True)

    if BASELINE not in allocs:
        print(f"large.py: note: {BASELINE} not measured, so no ratios", file=sys.stderr)
    settings = {" ".join(f"{k}={v}" for k, v in thp_setting(args, a).items()) for a in allocs} - {""}
    thp = (f"peers asked for huge pages ({'; '.join(sorted(settings))})" if args.peer_thp
           else "peers in their default settings")
    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, scale {args.scale:g}, "
             f"{runner.stamp(started)}, transparent huge pages: {thp_mode()}, {thp}; each (scenario, "
             f"allocator) its own process; peak RSS (ru_maxrss) and page faults (minor + major) of the whole "
             f"process; {runner.RATIO_NOTE}, of ms"]
    for scenario in args.scenarios:
        runs = {a: samples[(scenario, a)] for a in allocs}
        med = {a: {key: (runs[a][0][key] if key in TEXT_FIELDS else statistics.median(r[key] for r in runs[a]))
                   for key in FIELDS[scenario]} for a in allocs}
        lines.append("")
        lines += grow_table(med, runs, allocs) if scenario == "grow" else threads_table(scenario, med, runs, allocs)
    runner.finish(lines, args, started, "bench/large.py")


if __name__ == "__main__":
    main()
