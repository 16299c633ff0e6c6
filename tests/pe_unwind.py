#!/usr/bin/env python3
"""tests/pe_unwind.py EXE_OR_DLL...: the function table (.pdata) of a Windows x64 image is whole.

Windows finds the unwind data of a return address by a binary search of the image's function table, so
the table must be sorted by start address with no two entries overlapping, and each entry must start
where a function starts. A garbled table (GNU ld -r once moved the entries of all but an object's
first section; gen/build.py has the flag that avoids it) breaks C++ exceptions thrown through the
allocator, a debugger's stack and a crash dump, yet most programs run on. Reads `objdump -p` and
`nm` of the mingw-w64 binutils; prints the first problems and exits 1 when there are any.
"""
import re
import subprocess
import sys

TOOLS = "x86_64-w64-mingw32-"


def problems(image):
    starts = set()
    for line in subprocess.run([TOOLS + "nm", image], capture_output=True, text=True, check=True).stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[1] in "tT":
            starts.add(int(parts[0], 16))
    dump = subprocess.run([TOOLS + "objdump", "-p", image], capture_output=True, text=True, check=True).stdout
    if "The Function Table" not in dump:
        return ["no function table"]
    table = dump[dump.index("The Function Table"):]
    found, previous_end = [], 0
    entries = re.findall(r"^ [0-9a-f]+:\s+([0-9a-f]+) ([0-9a-f]+) ([0-9a-f]+)$", table, re.M)
    for begin, end, _ in entries:
        begin, end = int(begin, 16), int(end, 16)
        if begin < previous_end:
            found.append(f"entry {begin:#x}-{end:#x} starts before the previous one ends ({previous_end:#x})")
        elif begin not in starts:
            found.append(f"entry {begin:#x}-{end:#x} starts where no function starts")
        previous_end = max(previous_end, end)
    if not entries:
        found.append("an empty function table")
    return found


def main():
    bad = 0
    for image in sys.argv[1:]:
        found = problems(image)
        for p in found[:5]:
            print(f"{image}: {p}")
        if len(found) > 5:
            print(f"{image}: ... {len(found)} problems in all")
        bad |= bool(found)
    return bad


if __name__ == "__main__":
    sys.exit(main())
