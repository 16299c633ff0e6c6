#!/usr/bin/env python3
"""What each allocator does about ten memory-safety bugs of a program (bench/catch.c's cases).

    python3 bench/catch.py [--peers build/peers] [--markdown]

Runs build/bench/catch-shard, catch-shard-hardened, catch-mimalloc, catch-jemalloc, catch-tcmalloc,
catch-system (glibc), catch-system with shardmm's full-debug drop-in (build/debug/full) preloaded, and
catch-system with each peer built from source preloaded: the libraries bench/peers writes in --peers,
NAME.so (mimalloc 2.4 and 3.x, snmalloc, rpmalloc) and hardened/NAME.so (mimalloc's secure mode,
snmalloc's checks), a column each, named NAME. Every run is deterministic; one round is enough. Build
first: `ninja bench` (and bench/peers for the peers).
"""
import argparse
import os
import subprocess
import sys

import runner

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def run(binary, preload=None):
    env = dict(os.environ)
    if preload:
        env["LD_PRELOAD"] = preload
    out = subprocess.run([binary], env=env, capture_output=True, text=True, timeout=300).stdout
    rows = {}
    for line in out.splitlines():
        if line.startswith("caught "):
            continue
        name, _, what = line.rpartition(" ")
        rows[name.strip()] = what
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peers", default=runner.peers_dir(os.path.join(ROOT, "build")),
                    help="where bench/peers put the peers built from source (default: build/peers)")
    ap.add_argument("--markdown", action="store_true", help="a Markdown table")
    args = ap.parse_args()
    bench = os.path.join(ROOT, "build", "bench")
    columns = [("glibc", os.path.join(bench, "catch-system"), None),
               ("shardmm", os.path.join(bench, "catch-shard"), None),
               ("shardmm-hardened", os.path.join(bench, "catch-shard-hardened"), None),
               ("shardmm-full-debug", os.path.join(bench, "catch-system"),
                os.path.join(ROOT, "build", "debug", "full", "libshardmm.so"))]
    for name in ("mimalloc", "jemalloc", "tcmalloc"):
        columns.append((name + " (Debian)", os.path.join(bench, "catch-" + name), None))
    peers = {**runner.built_peers(args.peers), **runner.built_peers(os.path.join(args.peers, runner.HARDENED))}
    for name, lib in sorted(peers.items()):
        columns.append((name, os.path.join(bench, "catch-system"), lib))
    results = []
    for name, binary, lib in columns:
        if not os.path.exists(binary):
            sys.exit(f"catch.py: {binary} is missing: run `ninja bench` first")
        results.append((name, run(binary, lib)))
    cases = list(results[0][1].keys())
    if args.markdown:
        print("| case | " + " | ".join(n for n, _ in results) + " |")
        print("|---|" + "---|" * len(results))
        for c in cases:
            print(f"| {c} | " + " | ".join(r.get(c, "?") for _, r in results) + " |")
        print("| **caught** | " + " | ".join(f"**{sum(v == 'caught' for v in r.values())}**" for _, r in results) + " |")
    else:
        for name, r in results:
            caught = sum(v == "caught" for v in r.values())
            print(f"{name:24} caught {caught:2} of {len(r)}   " +
                  " ".join(f"{v[:4]:4}" for v in (r.get(c, "?") for c in cases)))
        print("cases: " + "; ".join(f"{i + 1} {c}" for i, c in enumerate(cases)))


if __name__ == "__main__":
    main()
