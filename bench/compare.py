#!/usr/bin/env python3
"""bench/compare.py - one command of your choosing, run again and again with each of several
allocators preloaded in turn: the check a report cites after a sweep, when one cell is looked at closely
(a shape, a scenario, a real program) or a scratch build of shardmm is weighed against main.

    bench/compare.py [--runs N] [--metric wall|ms|shapes] [--cpu CPU] [--settle SECONDS] [--raw]
                     [--env NAME:VAR=VALUE ...] NAME=LIBRARY [NAME=LIBRARY ...] -- COMMAND [ARG ...]

Each NAME=LIBRARY is a column: COMMAND under LD_PRELOAD=LIBRARY (`-` for none: glibc's malloc). The
first is the base every ratio divides by: other/base, above 1 where the base is faster, as in every
report. A run measures every column once, in the order runner.rotated gives (each column first as
often as any other, the rest shuffled), so that the machine's drift and one library's effect on the
next spread over all of them. A run's figure is, by --metric:
  wall    the process's wall time, ms (default)
  ms      the sum of the `ms=` numbers the command prints (bench/app.c, bench/large.c)
  shapes  the sum of the times in its `shapes NAME MS MB FAULTS ERRORS` lines (bench/shapes.c)
and its peak RSS is that of the process and its waited-for children (ru_maxrss; runner.Launched starts
it apart from the runner, whose own peak would otherwise be its floor). The report is a markdown
table: each column's median, the median of its run-by-run ratios to the base with the runs the base
won and, from 6 runs, the 95 % interval of that median (runner.median_interval), the verdict (faster or
slower where the interval lies wholly on one side of 1, else tie; said of the base), and the median
peak. --env sets a variable for one column only (say NAME:SHARDMM_HUGE_PAGES=0 with the base's
library), --cpu pins every process to one CPU (as taskset would), --raw prints every run's figures
too. --settle waits that long before every process: on a virtual machine whose hypervisor takes back
the memory its guest frees (virtio-balloon's free page reporting, 1-3 s after the free), a process
started at once is served the last one's memory, still backed, and one started after the wait is
served memory the host backs again at its first touch, 2 MB huge pages most of all
(bench/results/2026-12-06-settled-runs.md). A process that exits with a status other than 0 stops
the run.

Standard library only, with runner.py beside it.
"""
import argparse
import os
import re
import shlex
import shutil
import statistics
import sys
import tempfile
import time

import runner

TIMEOUT_S = 600  # per process: a hung command is an error


def parse_columns(parser, specs, env_specs):
    """{name: (library or None, {variable: value})} in the order given."""
    columns = {}
    for spec in specs:
        name, sep, library = spec.partition("=")
        if not sep or not name or not library:
            parser.error(f"not NAME=LIBRARY: {spec!r}")
        if name in columns:
            parser.error(f"column {name} given twice")
        if library != "-" and not os.path.isfile(library):
            parser.error(f"no such library: {library}")
        columns[name] = (None if library == "-" else os.path.abspath(library), {})
    for spec in env_specs:
        name, sep, setting = spec.partition(":")
        variable, eq, value = setting.partition("=")
        if not sep or not eq or not variable:
            parser.error(f"not NAME:VARIABLE=VALUE: {spec!r}")
        if name not in columns:
            parser.error(f"--env names no column: {name}")
        columns[name][1][variable] = value
    return columns


def figure(metric, output, shown):
    """The run's time in ms from the command's output, by the metric (not wall)."""
    if metric == "ms":
        values = re.findall(r"\bms=([0-9.]+)", output)
    else:
        values = [line.split()[2] for line in output.splitlines()
                  if line.startswith("shapes ") and len(line.split()) >= 4]
    if not values:
        runner.fail(f"{shown} printed no {'ms=' if metric == 'ms' else 'shapes'} figure")
    return sum(float(v) for v in values)


def run_once(command, env, metric, shown, work):
    """(ms, peak MB) of one process of command in env, started by runner.Launched so that its peak RSS
    is its own, or stop the run."""
    output = os.path.join(work, "stdout")
    start = time.monotonic()
    usage = runner.Launched(command, env, output, TIMEOUT_S).reap()
    wall_ms = (time.monotonic() - start) * 1000
    if metric == "wall":
        return wall_ms, usage.ru_maxrss / 1024
    with open(output, errors="replace") as f:
        return figure(metric, f.read().replace("\r", ""), shown), usage.ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(
        description="Run one command under each of several preloaded allocators in turn, interleaved, and "
                    "print the medians, the ratios to the first with their 95 % intervals, and peaks.",
        usage="bench/compare.py [options] NAME=LIBRARY [NAME=LIBRARY ...] -- COMMAND [ARG ...]")
    parser.add_argument("--runs", type=int, default=11, help="runs of every column (default: 11)")
    parser.add_argument("--metric", choices=("wall", "ms", "shapes"), default="wall",
                        help="what a run's time is (default: wall; see the file's opening comment)")
    parser.add_argument("--cpu", type=int, help="pin every process to this CPU")
    parser.add_argument("--env", action="append", default=[], metavar="NAME:VAR=VALUE",
                        help="an environment variable for column NAME only; repeatable")
    parser.add_argument("--settle", type=float, default=0, metavar="SECONDS",
                        help="wait this long before every process (default: 0; see the opening comment)")
    parser.add_argument("--raw", action="store_true", help="print every run's figures too")
    parser.add_argument("columns", nargs="+", metavar="NAME=LIBRARY")
    argv = sys.argv[1:]
    if "--" not in argv:
        parser.parse_args(argv)  # --help, or an error of its own
        parser.error("the command goes after --")
    cut = argv.index("--")
    args = parser.parse_args(argv[:cut])
    command = argv[cut + 1:]
    if not command:
        parser.error("no command after --")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.settle < 0:
        parser.error("--settle must not be negative")
    if len(args.columns) < 2:
        parser.error("two columns at least: the base and one to compare with it")
    columns = parse_columns(parser, args.columns, args.env)
    names = list(columns)
    ms = {n: [] for n in names}
    peak = {n: [] for n in names}
    if args.cpu is not None:
        try:
            os.sched_setaffinity(0, {args.cpu})  # the processes inherit it
        except (OSError, ValueError) as e:
            parser.error(f"--cpu {args.cpu}: {e}")
    runner.become_subreaper()
    work = tempfile.mkdtemp(prefix="shardmm-compare-")
    progress = runner.Progress(args.runs * len(names))
    try:
        for run in range(args.runs):
            for name in runner.rotated(names, run):
                library, variables = columns[name]
                env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
                env.update(variables)
                if library:
                    env["LD_PRELOAD"] = library
                shown = " ".join([f"{k}={shlex.quote(v)}" for k, v in variables.items()]
                                 + ([f"LD_PRELOAD={library}"] if library else []) + [shlex.join(command)])
                time.sleep(args.settle)
                t, p = run_once(command, env, args.metric, shown, work)
                ms[name].append(t)
                peak[name].append(p)
                print(f"\r{progress.step()} run {run + 1} {name:<16} {t:9.1f} ms ", end="", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(file=sys.stderr)
    base = names[0]
    rows = []
    for name in names:
        pair = runner.paired(ms[name], ms[base])
        rows.append([name, f"{statistics.median(ms[name]):.1f}",
                     "-" if name == base else runner.pair_text(pair),
                     "-" if name == base else runner.verdict(pair),
                     f"{statistics.median(peak[name]):.1f}"])
    lines = [f"`{runner.command_line()}`", "",
             *runner.markdown_table(["column", "median ms", f"column/{base}", f"{base} is", "peak MB"], rows), "",
             f"column/{base}: the median of the run-by-run ratios (> 1: {base} faster), the runs {base} "
             f"won and, from 6 runs, the 95 % interval of that median; {args.runs} runs, metric {args.metric}"
             + (f", {args.settle:g} s settled before each process." if args.settle else ".")]
    if args.raw:
        lines += ["", "Runs (ms, in run order):", ""]
        lines += [f"- {name}: " + " ".join(f"{t:.1f}" for t in ms[name]) for name in names]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
