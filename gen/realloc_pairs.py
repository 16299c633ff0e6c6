#!/usr/bin/env python3
"""Pairs of sizes (from, to) for the realloc tests: two tables, both exhaustive over their boundaries.

realloc_pairs - at the boundaries of the small size classes. For every class c (with prev the class
below it, 0 below the first) the sizes prev+1, c-1, c, c+1, c/4-1, c/4 and c/4+1 - the edges of the
class and of the in-place rule (a small block stays in place while the new size is within its class
and not below a quarter of it) - those in 1..16384, plus 16385, 16400 and 20000 to cross into the
blocks above 16 KB. Used by tests/test_small.c and tests/test_medium.c.

realloc_large_pairs - at the boundaries of the large blocks (above 1 MB, tests/test_large.c), from
their rules: a fresh block of n bytes commits need(n) = round_up(n + 32, 4 KB) (a 32-byte header) in
a reservation of R(n) = round_up(need + min(need, 1 GB), 64 KB) counted from the header (while the
address space is unlimited), or to 2 MB instead of 64 KB where the platform gives large pages (Linux).
In place it shrinks (decommitting the tail when the new need is below half of what is committed) and
grows up to R; beyond R it moves. The sizes, each for the edge it stands at:
  - a small (1000) and a medium (100000) size and 1 MB, the largest medium one: into and out of the
    large range;
  - 1 MB + 1, the smallest large size; 1 MB + 4064 and 1 MB + 4065, where need is exactly 1 MB + 4 KB
    and where it takes the next page;
  - 4 MB - 32 (committing 4 MB) with 2 MB - 32 (need exactly half of that: kept) and 2 MB - 4128
    (need a page below half: the tail is decommitted);
  - 2 MB + 64 KB - 32 (need exactly the reservation of 1 MB + 1, and of 1 MB + 4065: in place) and
    2 MB + 64 KB - 31 (a page beyond: moves);
  - 8 MB - 32 (need 8 MB: a reservation of exactly 16 MB) and 8 MB - 31 (need a page more: 16 MB
    + 64 KB, rounded up); 16 MB - 32 and 16 MB + 64 KB - 32 (need exactly those reservations: in
    place) and 16 MB - 31 and 16 MB + 64 KB - 31 (a page beyond: moves);
  - 32 MB - 32 and 64 MB - 32 (each needs exactly the reservation of the one before: in place), and
    64 MB (a page beyond: moves), the largest;
  - with 2 MB reservations: 4 MB - 32 (above) and 4 MB - 31 (need exactly the reservation of 1 MB + 1,
    and a page beyond), and 18 MB - 32 and 18 MB - 31 (exactly the reservation of 8 MB - 31, and a page
    beyond).
Every ordered pair of distinct sizes of that set with at least one large size is emitted.

No randomness: the output is the same on every run. Run `python3 gen/realloc_pairs.py` to rewrite
tests/realloc_pairs.h (written only when it changes); gen/check.py compares it.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from sizeclasses import CLASSES, SMALL_MAX, write_if_changed  # noqa: E402

OUTPUT = "tests/realloc_pairs.h"
ABOVE_SMALL = (SMALL_MAX + 1, 16400, 20000)
PAIRS_PER_LINE = 8
SIZES_PER_LINE = 9

KB = 1 << 10
MB = 1 << 20
GB = 1 << 30
MEDIUM_MAX = MB
LARGE_HEADER = 32
LARGE_PAGE = 4 * KB
LARGE_RESERVE_GRANULE = 64 * KB
LARGE_HEADROOM_MAX = GB


def sizes():
    """The sorted, deduplicated set of boundary sizes of the small classes."""
    out = set()
    prev = 0
    for c in CLASSES:
        for n in (prev + 1, c - 1, c, c + 1, c // 4 - 1, c // 4, c // 4 + 1):
            if 1 <= n <= SMALL_MAX:
                out.add(n)
        prev = c
    out.update(ABOVE_SMALL)
    return sorted(out)


def pairs():
    s = sizes()
    return [(a, b) for a in s for b in s if a != b]


def round_up(n, to):
    return (n + to - 1) // to * to


def need(n):
    """Bytes a fresh large block of n bytes commits, its header included."""
    return round_up(n + LARGE_HEADER, LARGE_PAGE)


def reservation(n, granule=LARGE_RESERVE_GRANULE):
    """The reservation of a fresh large block of n bytes, counted from its header; granule 2 MB where
    the platform gives large pages."""
    c = need(n)
    return round_up(c + min(c, LARGE_HEADROOM_MAX), granule)


def with_need(c):
    """The largest size whose need is c (c a multiple of the page)."""
    return c - LARGE_HEADER


def large_sizes():
    """The sorted boundary sizes around and in the large range (see the module comment)."""
    r_least = with_need(reservation(MEDIUM_MAX + 1))   # 2 MB + 64 KB - 32: need == the smallest reservation
    half_of = with_need(4 * MB)                         # commits 4 MB
    r_16 = with_need(reservation(with_need(8 * MB)))    # 16 MB - 32: need == a reservation of exactly 16 MB
    r_18 = with_need(reservation(with_need(8 * MB) + 1, 2 * MB))  # 18 MB - 32: that of 8 MB - 31, 2 MB rule
    out = {
        1000, 100000, MEDIUM_MAX,
        MEDIUM_MAX + 1, with_need(MEDIUM_MAX + LARGE_PAGE), with_need(MEDIUM_MAX + LARGE_PAGE) + 1,
        half_of, with_need(need(half_of) // 2), with_need(need(half_of) // 2 - LARGE_PAGE),
        r_least, r_least + 1,
        with_need(8 * MB), with_need(8 * MB) + 1,
        r_16, r_16 + 1,
        with_need(reservation(with_need(8 * MB) + 1)), with_need(reservation(with_need(8 * MB) + 1)) + 1,
        with_need(reservation(r_16)), with_need(reservation(with_need(reservation(r_16)))),
        64 * MB,
        with_need(reservation(MEDIUM_MAX + 1, 2 * MB)) + 1,
        r_18, r_18 + 1,
    }
    # The edges the set stands for, checked against the rules as written above.
    assert r_least == 2 * MB + 64 * KB - 32 and reservation(with_need(MEDIUM_MAX + LARGE_PAGE) + 1) == 2 * MB + 64 * KB
    assert reservation(with_need(8 * MB)) == 16 * MB and reservation(with_need(8 * MB) + 1) == 16 * MB + 64 * KB
    assert r_16 == 16 * MB - 32 and reservation(r_16) == 32 * MB and with_need(reservation(r_16)) == 32 * MB - 32
    assert reservation(32 * MB - 32) == 64 * MB and need(64 * MB) == 64 * MB + LARGE_PAGE
    assert reservation(MEDIUM_MAX + 1, 2 * MB) == 4 * MB and half_of == 4 * MB - 32
    assert r_18 == 18 * MB - 32
    return sorted(out)


def large_pairs():
    s = large_sizes()
    return [(a, b) for a in s for b in s if a != b and max(a, b) > MEDIUM_MAX]


def table(name, count_name, p):
    lines = [f"static const unsigned {name}[{count_name}][2] __attribute__((unused)) = {{\n"]
    for i in range(0, len(p), PAIRS_PER_LINE):
        lines.append("    " + ", ".join(f"{{{a}, {b}}}" for a, b in p[i:i + PAIRS_PER_LINE]) + ",\n")
    lines.append("};\n")
    return lines


def output():
    s = sizes()
    p = pairs()
    ls = large_sizes()
    lp = large_pairs()
    lines = ["/* Generated by gen/realloc_pairs.py (python3 gen/realloc_pairs.py); do not edit. */\n",
             "/* realloc_pairs: every ordered pair of distinct sizes at the small class boundaries (prev+1, c-1,\n",
             " * c, c+1, c/4-1, c/4, c/4+1 of every class c, in 1..16384) and 16385, 16400, 20000.\n",
             " * realloc_large_pairs: every ordered pair of distinct sizes at the boundaries of the large blocks\n",
             " * (the module comment of gen/realloc_pairs.py names the edge of each), at least one of them large:\n"]
    for i in range(0, len(ls), SIZES_PER_LINE):
        end = ". */" if i + SIZES_PER_LINE >= len(ls) else ","
        lines.append(" * " + ", ".join(str(n) for n in ls[i:i + SIZES_PER_LINE]) + end + "\n")
    lines += ["#ifndef REALLOC_PAIRS_H\n#define REALLOC_PAIRS_H\n\n",
              f"#define REALLOC_SIZE_COUNT {len(s)}\n",
              f"#define REALLOC_PAIR_COUNT {len(p)}\n",
              f"#define REALLOC_LARGE_SIZE_COUNT {len(ls)}\n",
              f"#define REALLOC_LARGE_PAIR_COUNT {len(lp)}\n\n"]
    lines += table("realloc_pairs", "REALLOC_PAIR_COUNT", p)
    lines.append("\n")
    lines += table("realloc_large_pairs", "REALLOC_LARGE_PAIR_COUNT", lp)
    lines.append("\n#endif\n")
    return "".join(lines)


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if write_if_changed(root, OUTPUT, output()):
        print("wrote", OUTPUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())
