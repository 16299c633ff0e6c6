#!/usr/bin/env python3
"""tests/test_extras.py - glibc's malloc extras of the drop-in, seen from a real program: python3 under
LD_PRELOAD=build/libshardmm.so calls mallinfo2, mallinfo and malloc_trim through ctypes while it
allocates and frees bytearrays, and compares them with shard_get_stats (which the drop-in exports too).

    tests/test_extras.py        runs the checks in a child python3 with the preload; prints "ok NAME" or
                                "FAIL NAME" per check and, last, "N passed, N failed"

The checks (port/malloc_extras.c has the mapping they read):
  preloaded          mallinfo2, mallinfo and malloc_trim of the process are libshardmm.so's
  mallinfo2-fields   with nothing allocated between (shard_get_stats the same before and after), every
                     field of mallinfo2 is the mapping's of shard_get_stats, and mallinfo's the same in ints
  uordblks-follows   200 bytearrays of 100 KB (medium blocks) raise uordblks by their size, at least, and
                     by less than 2 MB more; deleting them takes it back to within 1 MB of where it was
  hblkhd-follows     20 bytearrays of 4 MB (large blocks) raise hblks by 20 and hblkhd by 80 MB at least;
                     deleting them takes both back
  malloc-trim        after that, malloc_trim(0) returns 1 and the large-block cache is empty
Python's small objects come from its own arenas (mmap), so the program's other allocations between the
calls are few and small; the bounds leave room for them and nothing else.

Standard library only. The statistics' field names are read from include/shardmm.h.
"""
import ctypes
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "build", "libshardmm.so")
HEADER = os.path.join(ROOT, "include", "shardmm.h")
KB, MB = 1 << 10, 1 << 20
SMALL_PAGE = 64 * KB
MALLINFO_FIELDS = ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                   "keepcost")


class Mallinfo2(ctypes.Structure):
    _fields_ = [(f, ctypes.c_size_t) for f in MALLINFO_FIELDS]


class Mallinfo(ctypes.Structure):
    _fields_ = [(f, ctypes.c_int) for f in MALLINFO_FIELDS]


def stats_fields():
    """The size_t fields of shard_stats, in order, from the header."""
    with open(HEADER) as f:
        text = f.read()
    body = re.search(r"typedef struct shard_stats \{(.*?)\} shard_stats;", text, re.S).group(1)
    body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
    return re.findall(r"size_t\s+(\w+);", body)


def make_blocks(count, size):
    """count bytearrays of size bytes, each with its index at both ends (no name outlives the call)."""
    blocks = [bytearray(size) for _ in range(count)]
    for i in range(count):
        blocks[i][0] = blocks[i][-1] = i & 255
    return blocks


def intact(blocks, size):
    return all(len(blocks[i]) == size and blocks[i][0] == blocks[i][-1] == i & 255 for i in range(len(blocks)))


class Child:
    """The checks, in the preloaded process."""

    def __init__(self):
        self.passed = self.failed = 0
        self.libc = ctypes.CDLL(None)
        self.libc.mallinfo2.restype = Mallinfo2
        self.libc.mallinfo.restype = Mallinfo
        self.libc.malloc_trim.argtypes = [ctypes.c_size_t]
        self.libc.malloc_trim.restype = ctypes.c_int
        self.Stats = type("Stats", (ctypes.Structure,), {"_fields_": [(f, ctypes.c_size_t) for f in stats_fields()]})
        self.libc.shard_get_stats.argtypes = [ctypes.POINTER(self.Stats)]
        self.libc.shard_get_stats.restype = None

    def record(self, name, ok, detail=""):
        if ok:
            self.passed += 1
            print("ok", name, flush=True)
        else:
            self.failed += 1
            print("  " + name + ": " + detail, file=sys.stderr, flush=True)
            print("FAIL", name, flush=True)

    def stats(self):
        s = self.Stats()
        self.libc.shard_get_stats(ctypes.byref(s))
        return {f: getattr(s, f) for f, _ in s._fields_}

    def mallinfo2(self):
        m = self.libc.mallinfo2()
        return {f: getattr(m, f) for f in MALLINFO_FIELDS}

    @staticmethod
    def expected(s):
        """mallinfo2 as port/malloc_extras.c maps shard_get_stats."""
        arena = s["committed"] - s["live_large_committed"]
        uord = s["live_small_bytes"] + s["live_medium_bytes"]
        fsm = s["small_pages_free"] * SMALL_PAGE
        return {"arena": arena, "ordblks": s["medium_arenas_empty"] - s["medium_arenas_decommitted"] + s["large_cached"],
                "smblks": s["small_pages_free"], "hblks": s["live_large"], "hblkhd": s["live_large_committed"],
                "usmblks": s["committed_peak"], "fsmblks": fsm, "uordblks": uord, "fordblks": arena - uord,
                "keepcost": fsm + s["large_cached_bytes"]}

    def quiet_pair(self):
        """mallinfo2 and the statistics with nothing allocated between (tried up to 20 times), or None."""
        for _ in range(20):
            before = self.stats()
            m = self.mallinfo2()
            after = self.stats()
            if all(before[f] == after[f] for f in before if f not in ("os_calls", "atomic_ops", "lock_acquisitions")):
                return m, after
        return None

    def check_preloaded(self):
        ranges = []
        with open("/proc/self/maps") as f:
            for line in f:
                if line.rstrip().endswith("/libshardmm.so"):
                    lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
                    ranges.append((lo, hi))
        outside = [name for name in ("mallinfo2", "mallinfo", "malloc_trim")
                   if not any(lo <= ctypes.cast(getattr(self.libc, name), ctypes.c_void_p).value < hi
                              for lo, hi in ranges)]
        self.record("preloaded", ranges and not outside,
                    f"libshardmm.so mapped at {ranges}; not in it: {outside}")

    def check_fields(self):
        pair = self.quiet_pair()
        if pair is None:
            self.record("mallinfo2-fields", False, "the statistics changed around every one of 20 calls")
            return
        m, s = pair
        want = self.expected(s)
        wrong = {f: (m[f], want[f]) for f in MALLINFO_FIELDS if m[f] != want[f]}
        mi = self.libc.mallinfo()
        m2 = self.mallinfo2()
        ints = {f: (getattr(mi, f), m2[f]) for f in MALLINFO_FIELDS if getattr(mi, f) != min(m2[f], 2**31 - 1)}
        self.record("mallinfo2-fields", not wrong and not ints,
                    f"mallinfo2 (got, mapped from shard_get_stats): {wrong}; mallinfo against mallinfo2: {ints}")

    def check_medium(self):
        count, size = 200, 100 * KB
        m0 = self.mallinfo2()
        blocks = make_blocks(count, size)
        m1 = self.mallinfo2()
        kept = intact(blocks, size)
        del blocks
        m2 = self.mallinfo2()
        grew = m1["uordblks"] - m0["uordblks"]
        back = m2["uordblks"] - m0["uordblks"]
        self.record("uordblks-follows", kept and count * size <= grew < count * size + 2 * MB and abs(back) < MB,
                    f"uordblks {m0['uordblks']} -> {m1['uordblks']} (+{grew}) with {count} bytearrays of {size} bytes, "
                    f"{m2['uordblks']} after deleting them; contents intact: {kept}")

    def check_large(self):
        count, size = 20, 4 * MB
        m0 = self.mallinfo2()
        blocks = make_blocks(count, size)
        m1 = self.mallinfo2()
        kept = intact(blocks, size)
        del blocks
        m2 = self.mallinfo2()
        ok = (kept and m1["hblks"] - m0["hblks"] == count and m1["hblkhd"] - m0["hblkhd"] >= count * size and
              m2["hblks"] == m0["hblks"] and m2["hblkhd"] == m0["hblkhd"])
        self.record("hblkhd-follows", ok,
                    f"hblks {m0['hblks']} -> {m1['hblks']} -> {m2['hblks']}, hblkhd {m0['hblkhd']} -> {m1['hblkhd']} "
                    f"-> {m2['hblkhd']} for {count} bytearrays of {size} bytes, made and deleted; "
                    f"contents intact: {kept}")
        before = self.stats()
        r = self.libc.malloc_trim(0)
        after = self.stats()
        self.record("malloc-trim", r == 1 and after["large_cached"] == 0 and after["committed"] < before["committed"],
                    f"malloc_trim(0) = {r} after deleting them: committed {before['committed']} -> "
                    f"{after['committed']}, cached large blocks {before['large_cached']} -> {after['large_cached']}")

    def run(self):
        self.check_preloaded()
        self.check_fields()
        self.check_medium()
        self.check_large()
        print(f"{self.passed} passed, {self.failed} failed", flush=True)
        return 1 if self.failed else 0


def main():
    if sys.argv[1:] == ["--child"]:
        return Child().run()
    if not os.path.exists(LIB):
        print(f"tests/test_extras.py: {LIB} is missing (ninja builds it)")
        print("0 passed, 1 failed")
        return 1
    # Debian's python3, as tests/preload takes: a python3 earlier on PATH may be a wrapper script.
    python = "/usr/bin/python3" if os.access("/usr/bin/python3", os.X_OK) else sys.executable
    env = dict(os.environ, LD_PRELOAD=LIB)
    env.pop("PYTHONMALLOC", None)
    child = subprocess.run([python, os.path.abspath(__file__), "--child"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=120)
    out = child.stdout.rstrip("\n")
    print(out)
    last = out.splitlines()[-1] if out else ""
    if not re.fullmatch(r"\d+ passed, \d+ failed", last):
        print(f"FAIL child (exit status {child.returncode}, no summary line)")
        print("0 passed, 1 failed")
        return 1
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
