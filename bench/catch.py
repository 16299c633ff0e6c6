#!/usr/bin/env python3
"""What each allocator does about ten memory-safety bugs of a program (bench/catch.c's cases).

    python3 bench/catch.py [--peers build/peers] [--markdown]

Runs build/bench/catch-shard, catch-shard-hardened, catch-mimalloc, catch-jemalloc, catch-tcmalloc,
catch-system (glibc), catch-system with shardmm's full-debug drop-in (build/debug/full) preloaded, and
with each library found under --peers preloaded (mimalloc, its
secure build, snmalloc and its checks build, rpmalloc, built from source as bench/results describes).
Every run is deterministic; one round is enough. Build first: `ninja bench`.
"""
import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# (column name, path relative to --peers) of the peers built from source, when present.
PEER_LIBS = [
    ("mimalloc-2.4.1", "mimalloc-v2.4.1/out/libmimalloc.so"),
    ("mimalloc-2.4.1-secure", "mimalloc-v2.4.1/out-secure/libmimalloc-secure.so"),
    ("mimalloc-3.4.3", "mimalloc-v3.4.3/out/libmimalloc.so"),
    ("snmalloc-0.7.5", "snmalloc-0.7.5/out/libsnmallocshim.so"),
    ("snmalloc-0.7.5-checks", "snmalloc-0.7.5/out/libsnmallocshim-checks.so"),
    ("rpmalloc-2.0.1", "rpmalloc-2.0.1/librpmalloc.so"),
]


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
    ap.add_argument("--peers", default=os.path.join(ROOT, "build", "peers"))
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
    for name, rel in PEER_LIBS:
        lib = os.path.join(args.peers, rel)
        if os.path.exists(lib):
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
