#!/usr/bin/env python3
"""bench/instr.py - instructions per small malloc, free and realloc on the owner thread, counted exactly
with valgrind's callgrind, for shardmm (NASM and pure-C fast paths) and its peers.

Runs <build-dir>/bench/instr-<alloc> <row> (bench/instr.c) under
    valgrind --tool=callgrind --callgrind-out-file=<tmp>
(the peers built from source, build/peers/*.so, and those of --peer and --variant: instr-system with the
library preloaded) and reads the call graph from the output file: for each function measure_* of bench/instr.c, the
inclusive instruction count of its calls into the allocator (malloc, free, realloc, whatever the
allocator's functions are called) divided by the number of those calls. So the count is what the
allocator's entry point and everything it calls executed, the PLT jump excepted (the same one for
every allocator), and nothing of the benchmark's own loop. Counting is deterministic: one run each.

Prints a markdown table on stdout: per row and allocator, instructions per call ("malloc + free" for
the burst and pair rows). A peer that fails under valgrind is left out, with the reason below the
table (snmalloc: it reserves more address space than valgrind gives). Progress goes to stderr.
Standard library only.
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

import runner
from runner import comma_list, fail

ROWS = ["burst-16", "burst-64", "pair-32", "pair-4000", "alone-32", "realloc-in-class"]
DEFAULT_ALLOCS = ["shard", "shard-purec", "mimalloc", "system"]
OPTIONAL_ALLOCS = ["tcmalloc", "jemalloc"]  # added when their binaries exist
TIMEOUT_S = 600


def read_callgraph(path):
    """{(caller, callee): [calls, inclusive instructions]} from a callgrind output file (event Ir)."""
    names = {}

    def name(token):
        m = re.match(r"\((\d+)\)(?: (.*))?$", token)
        if not m:
            return token
        if m.group(2) is not None:
            names[m.group(1)] = m.group(2)
        return names[m.group(1)]

    edges = collections.defaultdict(lambda: [0, 0])
    caller = callee = None
    pending_calls = None
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                caller = name(line[3:])
            elif line.startswith("cfn="):
                callee = name(line[4:])
            elif line.startswith("calls="):
                pending_calls = int(line[6:].split()[0])
            elif pending_calls is not None and line and (line[0].isdigit() or line[0] in "+-*"):
                edge = edges[(caller, callee)]
                edge[0] += pending_calls
                edge[1] += int(line.split()[-1])
                pending_calls = None
    return edges


def per_call(edges, caller, kind):
    """Instructions per call of caller's calls into the allocator's `kind` function (malloc/free/realloc)."""
    calls = instructions = 0
    for (a, b), (n, ir) in edges.items():
        # gcc may clone a measure_* function (measure_free.constprop.0); _dl_*: the first call's binding
        if a is None or a.split(".")[0] != caller or b.startswith("_dl_"):
            continue
        is_free = "free" in b
        is_realloc = "realloc" in b
        if (kind == "free") == is_free and (kind == "realloc") == is_realloc:
            calls += n
            instructions += ir
    if calls == 0:
        fail(f"no calls from {caller} to a {kind} function in the call graph")
    return instructions / calls


def measure(binary, row, env=None, peer=False):
    """(the counts, their cell) of one row; for a `peer` that fails under valgrind, NotUnderValgrind."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "callgrind.out")
        command = ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, binary, row]
        shown = runner.preload_shown(command, env)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        except (OSError, subprocess.TimeoutExpired) as e:
            fail(f"{shown}: {e}")
        if done.returncode != 0 and peer:
            raise runner.NotUnderValgrind(runner.valgrind_reason(done.returncode, done.stderr))
        if done.returncode != 0 or done.stdout.split()[:1] != [row]:
            sys.stderr.write(done.stderr)
            fail(f"{shown} exited with status {done.returncode}, printed {done.stdout!r}")
        edges = read_callgraph(out)
    if row.startswith("burst"):
        m, f = per_call(edges, "measure_malloc", "malloc"), per_call(edges, "measure_free", "free")
        return (m, f), f"{m:.1f} + {f:.1f}"
    if row.startswith("pair") or row.startswith("alone"):
        m, f = per_call(edges, "measure_pair", "malloc"), per_call(edges, "measure_pair", "free")
        return (m, f), f"{m:.1f} + {f:.1f} = {m + f:.1f}"
    r = per_call(edges, "measure_realloc", "realloc")
    return (r,), f"{r:.1f}"


def main():
    parser = argparse.ArgumentParser(description="Count instructions per malloc/free/realloc under callgrind.")
    runner.add_options(parser)
    parser.add_argument("--rows", type=comma_list, default=None,
                        help="comma-separated rows (default: all: " + ",".join(ROWS) + ")")
    args = parser.parse_args()
    runner.check_options(parser, args, DEFAULT_ALLOCS, OPTIONAL_ALLOCS, "instr")
    rows = runner.choose(parser, args.rows, ROWS, "rows")
    allocs, binaries = runner.columns(args, "instr")
    started = runner.started_at()
    cells, failed = {}, {}
    for row in rows:
        for alloc in [a for a in allocs if a not in failed]:
            try:
                cells[(row, alloc)] = measure(binaries[alloc], row, args.env.get(alloc), alloc in args.peers)[1]
            except runner.NotUnderValgrind as e:
                failed[alloc] = str(e)
            print(f"{row:<17} {alloc:<12} {cells.get((row, alloc), failed.get(alloc))}", file=sys.stderr, flush=True)
    allocs = [a for a in allocs if a not in failed]
    lines = [f"`{runner.command_line()}`: instructions per call under callgrind (malloc + free for burst and "
             f"pair rows), {runner.stamp(started)}", ""]
    lines += runner.markdown_table(["row"] + allocs, [[row] + [cells[(row, a)] for a in allocs] for row in rows])
    lines += runner.valgrind_failures(failed)
    runner.finish(lines, args, started, "bench/instr.py")


if __name__ == "__main__":
    main()
