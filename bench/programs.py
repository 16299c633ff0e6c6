#!/usr/bin/env python3
"""bench/programs.py - real programs from Debian under every allocator, preloaded: shardmm against its peers.

A row is a program and a script of ours, in bench/programs/, shaped like what that runtime does in
production; a column is an allocator, put under the program by LD_PRELOAD:

    python        /usr/bin/python3 objects.py: objects, dicts and strings
    python-json   /usr/bin/python3 roundtrip.py: a JSON round trip
    perl          perl text.pl: hashes, strings and regular expressions
    lua           lua5.4 tables.lua: tables and string building
    ruby          ruby records.rb: structs, strings, arrays and hashes, big growing strings and arrays
    sqlite        sqlite3 :memory: store.sql: inserts, three indexes, group-by, join, update, delete
    redis         redis-server on a unix socket, fed a generated stream of SET/GET/APPEND/INCR, list,
                  hash, set and sorted-set commands by redis-cli --pipe
    xmllint       xmllint --xpath over a generated XML document (about 28 MB at scale 1)
    jq            jq -f report.jq over generated JSON
    gcc           gcc -O2 -c on a generated C file: the control (GCC keeps most of its memory in
                  its own collector's pages, so the allocator should matter least here)

The columns: shard (<build-dir>/libshardmm.so), Debian 12's mimalloc, jemalloc and tcmalloc, system
(glibc's malloc: no preload), then every column of args.env (--variant NAME=LIBRARY, and whatever
else runner.check_options puts there) with its own environment. redis is the exception to "no
preload": Debian's redis-server is linked with libjemalloc, so its system column preloads glibc's
libc.so.6 to put glibc's malloc first; a preloaded malloc takes malloc, free, realloc, calloc and
malloc_usable_size, while redis's calls to jemalloc's own mallctl (statistics) and nallocx (a size
check before a realloc, safe with any malloc) still go to jemalloc.

For every (run, row, column) the runner starts one process (for redis: one server, fed by a client
that runs without a preload), through /bin/sh so that its peak RSS is its own (runner.Launched says why),
and takes from os.wait4 its rusage, which includes its waited-for children (gcc's cc1 and as): the
wall time from start to exit (for redis: the server's CPU time, user + system, from start to
shutdown, so that the client's share of the 2 cores is not counted), the peak RSS (ru_maxrss: the
largest of the process and its children) and the minor page faults. The output of every process
(stdout; for gcc the SHA-256 of the object file; for redis redis-cli's reply count and the DEBUG
DIGEST of the data set) must be the same for every column of a row: a mismatch is an error. The
hash seeds are fixed where the runtime allows it (PYTHONHASHSEED, PERL_HASH_SEED) so that every
run does the same work. The generated inputs are written to <build-dir>/programs/scale-<scale>/,
only when their content changes, before the first run.

The report: median ms, peer/shard of time (the run-by-run ratio with its 95 % interval from 6
runs on), median peak RSS in MB and median minor faults, then the verdicts of time and the rows
where shard's peak RSS is above the lowest. The method (interleaving, rotation, medians, ratios,
verdicts, --variant, --save): bench/README.md. Run from the repository's root. --install installs
the programs and Debian's peers with apt-get first (root); CI does not run this benchmark.

Standard library only.
"""

import argparse
import hashlib
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import runner
from runner import BASELINE

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "programs")
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PRELOADS = {"mimalloc": f"{LIBDIR}/libmimalloc.so.2", "jemalloc": f"{LIBDIR}/libjemalloc.so.2",
            "tcmalloc": f"{LIBDIR}/libtcmalloc.so.4"}  # as engines.py; shard's is <build-dir>/libshardmm.so
GLIBC = f"{LIBDIR}/libc.so.6"  # preloaded as redis's system column (the docstring says why)
KNOWN = ["shard", "mimalloc", "jemalloc", "tcmalloc", "system"]
# The Debian packages --install installs: the peers', then each program's (the program, its package).
PEER_PACKAGES = ["libmimalloc2.0", "libjemalloc2", "libgoogle-perftools4"]
PROGRAMS = {"/usr/bin/python3": "python3", "/usr/bin/perl": "perl", "/usr/bin/lua5.4": "lua5.4",
            "/usr/bin/ruby": "ruby", "/usr/bin/sqlite3": "sqlite3", "/usr/bin/redis-server": "redis-server",
            "/usr/bin/redis-cli": "redis-tools", "/usr/bin/xmllint": "libxml2-utils", "/usr/bin/jq": "jq",
            "/usr/bin/gcc": "gcc"}
TIMEOUT_S = 300  # per process; a hung program is an error too
ROWS = ["python", "python-json", "perl", "lua", "ruby", "sqlite", "redis", "xmllint", "jq", "gcc"]
# The programs each row runs (they must exist).
NEEDS = {"python": ["/usr/bin/python3"], "python-json": ["/usr/bin/python3"], "perl": ["/usr/bin/perl"],
         "lua": ["/usr/bin/lua5.4"], "ruby": ["/usr/bin/ruby"], "sqlite": ["/usr/bin/sqlite3"],
         "redis": ["/usr/bin/redis-server", "/usr/bin/redis-cli"], "xmllint": ["/usr/bin/xmllint"],
         "jq": ["/usr/bin/jq"], "gcc": ["/usr/bin/gcc"]}
# Rough seconds of one run of each row under glibc at scale 1 on the 2-core VM when it is quiet
# (2026-12; redis: the wall time of the whole row), for the estimate printed before the first run.
ROUGH_S = {"python": 1.2, "python-json": 0.9, "perl": 1.0, "lua": 1.2, "ruby": 1.7, "sqlite": 1.2,
           "redis": 1.5, "xmllint": 1.0, "jq": 1.5, "gcc": 1.5}
# Environment each row adds to its column's: fixed hash seeds, so every run does the same work.
ROW_ENV = {"python": {"PYTHONHASHSEED": "0"}, "python-json": {"PYTHONHASHSEED": "0"},
           "perl": {"PERL_HASH_SEED": "0", "PERL_PERTURB_KEYS": "0"}}
SQLITE_ROWS = 300000  # orders inserted by store.sql at scale 1
REDIS_READY_S = 10  # how long the server may take to answer PING


# ---- the generated inputs ----

def write_if_changed(path, data):
    """Writes data (bytes) to path unless the file already holds exactly that."""
    try:
        with open(path, "rb") as f:
            if f.read() == data:
                return
    except OSError:
        pass
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def catalog_xml(scale):
    """xmllint's input: a catalog of items with attributes, nested elements, escaped text, inline
    markup, CDATA and comments; about 28 MB at scale 1."""
    rng = random.Random(25)
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet",
             "kilo", "lima", "mike", "november", "oscar", "papa"]
    parts = ['<?xml version="1.0" encoding="UTF-8"?>\n<catalog version="2">\n']
    for i in range(max(1, round(60000 * scale))):
        text = " ".join(rng.choice(words) for _ in range(rng.randrange(4, 40)))
        tags = "".join(f"<tag>{rng.choice(words)}</tag>" for _ in range(rng.randrange(1, 6)))
        parts.append(
            f'<item id="i{i}" price="{rng.randrange(100, 100000) / 100:.2f}" category="c{rng.randrange(40)}">\n'
            f"  <name>{words[i % 16].title()} &amp; {words[(i * 7) % 16]} #{i}</name>\n"
            f"  <description>{text} <em>{words[i % 16]}</em> &lt;{i % 97}&gt; {text[: i % 50]}</description>\n"
            f"  <tags>{tags}</tags>\n"
            f"  <stock warehouse=\"w{i % 7}\" count=\"{rng.randrange(1000)}\"/>\n"
            + (f"  <notes><![CDATA[{text} <raw> & {i}]]></notes>\n" if i % 4 == 0 else "")
            + (f"  <!-- revision {i % 13} -->\n" if i % 5 == 0 else "")
            + "</item>\n")
    parts.append("</catalog>\n")
    return "".join(parts).encode()


# What xmllint evaluates: counts and sums over the whole tree, and the length of all its text, which
# libxml2 builds into one buffer that grows to the size of the text.
XPATH = ("concat(count(//item), ' ', count(//tag), ' ', sum(//item/@price), ' ', sum(//stock/@count), ' ', "
         "count(//item[@category = 'c7']), ' ', string-length(string(/catalog)))")


def events_json(scale):
    """jq's input: an array of events with a user object, tags and items; about 10 MB at scale 1."""
    rng = random.Random(26)
    countries = ["de", "fr", "nl", "es", "it", "pl", "se", "pt", "ie", "at", "be", "dk"]
    parts = []
    for i in range(max(1, round(25000 * scale))):
        name = f"user{rng.randrange(5000)}"
        items = ",".join(f'{{"sku":"SKU-{rng.randrange(9973):05d}","qty":{rng.randrange(1, 9)},'
                         f'"price":{rng.randrange(50, 50000) / 100:.2f}}}' for _ in range(rng.randrange(1, 8)))
        tags = ",".join(f'"t{rng.randrange(60)}"' for _ in range(rng.randrange(0, 6)))
        parts.append(f'{{"id":{i},"ts":"2026-12-{1 + i % 28:02d}T{i % 24:02d}:{i % 60:02d}:00Z",'
                     f'"user":{{"name":"{name}","email":"{name}@example.org","country":"{rng.choice(countries)}"}},'
                     f'"amount":{rng.randrange(1, 1000000) / 100:.2f},"tags":[{tags}],"items":[{items}],'
                     f'"payload":{{"agent":"client/{i % 9}","retries":{i % 4},"ok":{"true" if i % 6 else "false"}}}}}')
    return ("[\n" + ",\n".join(parts) + "\n]\n").encode()


def resp(*words):
    """One command in the redis protocol (RESP), as redis-cli --pipe sends it."""
    out = [f"*{len(words)}\r\n".encode()]
    for word in words:
        data = word.encode() if isinstance(word, str) else word
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


def redis_commands(scale):
    """redis's input: a stream of commands shaped like a cache and a session store. Strings set,
    read, appended to and overwritten with other sizes (a few of 16-128 KB), counters, lists pushed,
    ranged and popped, hashes that grow past the compact encoding, sets, sorted sets, and deletes of
    a third of the keys followed by new ones; every value is made from a seeded generator."""
    rng = random.Random(27)
    keys = max(10, round(60000 * scale))
    filler = bytes(range(33, 127)) * 1400
    out = []

    def value(size):
        start = rng.randrange(94)
        return filler[start:start + size]

    for i in range(keys):
        out.append(resp("SET", f"key:{i}", value(rng.choice((8, 24, 60, 200, 500, 1500)))))
    for rnd in range(3):
        for i in range(keys):
            k = rng.randrange(keys)
            choice = i % 10
            if choice < 3:
                out.append(resp("GET", f"key:{k}"))
            elif choice == 3:
                out.append(resp("APPEND", f"key:{k}", value(rng.randrange(1, 300))))
            elif choice == 4:
                out.append(resp("INCRBY", f"counter:{k % 1000}", str(k % 17)))
            elif choice == 5:
                out.append(resp("LPUSH", f"list:{k % 300}", value(rng.randrange(10, 120))))
                if k % 4 == 0:
                    out.append(resp("LRANGE", f"list:{k % 300}", "0", "9"))
                if k % 3 == 0:
                    out.append(resp("RPOP", f"list:{k % 300}"))
            elif choice == 6:
                out.append(resp("HSET", f"session:{k % 2000}", f"field{k % 211}", value(rng.randrange(4, 90))))
                if k % 5 == 0:
                    out.append(resp("HGETALL", f"session:{k % 2000}"))
                if k % 7 == 0:
                    out.append(resp("HDEL", f"session:{k % 2000}", f"field{(k * 3) % 211}"))
            elif choice == 7:
                out.append(resp("SADD", f"set:{k % 500}", f"member{k}"))
                out.append(resp("ZADD", f"board:{k % 100}", str(k % 9973), f"player{k}"))
            elif choice == 8:
                out.append(resp("SET", f"key:{k}", value(rng.choice((16, 100, 700, 3000)))))
            elif k % 200 == 0:
                out.append(resp("SET", f"blob:{k % 40}", value(rng.randrange(16384, 131072))))
            else:
                out.append(resp("ZRANGE", f"board:{k % 100}", "0", "4", "WITHSCORES"))
        for i in range(rnd, keys, 3):
            out.append(resp("DEL", f"key:{i}"))
        for i in range(keys // 3):
            out.append(resp("SET", f"key:{keys * (rnd + 1) + i}", value(rng.choice((8, 40, 300, 900)))))
    return b"".join(out)


def unit_c(scale):
    """gcc's input: functions with loops, switches, structs and inline helpers, enough to keep
    gcc -O2 busy for about a second at scale 1."""
    parts = ["/* Generated by bench/programs.py for its gcc row; not to be edited. */\n",
             "#include <stddef.h>\n\n"]
    for k in range(max(1, round(70 * scale))):
        cases = "".join(f"        case {c}: s += r->a[(i + {c}) & 15] * {c + k % 5 + 1}; r->a[i & 15] ^= s; break;\n"
                        for c in range(8))
        parts.append(
            f"struct rec{k} {{ int a[16]; double d; struct rec{k} *next; }};\n"
            f"static inline unsigned mix{k}(unsigned x) {{ x ^= x >> {k % 13 + 3}; x *= 2654435761u; "
            f"return x ^ (x >> {k % 7 + 5}); }}\n"
            f"int func{k}(struct rec{k} *r, int n, const double *w) {{\n"
            f"    int s = {k};\n"
            f"    for (int i = 0; i < n; i++) {{\n"
            f"        switch ((i * {k % 11 + 1} + s) & 7) {{\n{cases}        }}\n"
            f"        if (s > {k * 100 + 7}) s = (int)mix{k}((unsigned)s);\n"
            f"        for (struct rec{k} *p = r->next; p; p = p->next) p->d += w[i & 31] * r->a[i & 15];\n"
            f"    }}\n"
            f"    double acc = 0;\n"
            f"    for (size_t j = 0; j < 16; j++) acc += r->a[j] * w[j] + mix{k}((unsigned)j);\n"
            f"    return s + (int)acc;\n"
            f"}}\n\n")
    return "".join(parts).encode()


GENERATED = {"xmllint": ("catalog.xml", catalog_xml), "jq": ("events.json", events_json),
             "redis": ("commands.resp", redis_commands), "gcc": ("unit.c", unit_c)}


def prepare(rows, data, scale):
    """Writes the generated inputs of `rows` to `data` (write_if_changed)."""
    os.makedirs(data, exist_ok=True)
    for row in rows:
        if row in GENERATED:
            name, make = GENERATED[row]
            write_if_changed(os.path.join(data, name), make(scale))


# ---- one measurement ----

class Sample:
    """One process's measurement: seconds (wall, or the redis server's CPU), peak RSS in MB, minor
    page faults, and the output that must agree across the columns."""

    def __init__(self, seconds, usage, output):
        self.seconds, self.output = seconds, output
        self.mb = usage.ru_maxrss / 1024  # Linux: KB
        self.faults = usage.ru_minflt


def without_preload():
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


def run_program(command, env, work):
    """Runs one program to its end; returns (wall seconds, rusage, stdout)."""
    output = os.path.join(work, "stdout")
    t0 = time.perf_counter()
    usage = runner.Launched(command, env, output, TIMEOUT_S).reap()
    seconds = time.perf_counter() - t0
    with open(output, "rb") as f:
        return seconds, usage, f.read().decode(errors="replace")


def script(name):
    return os.path.join(SCRIPTS, name)


def run_redis(env, data, work):
    """One redis-server on a unix socket in `work`: fed data/commands.resp by redis-cli --pipe, asked
    for DEBUG DIGEST and shut down. Returns a Sample: the server's CPU seconds, its rusage, and the
    client's reply count with the digest as the output."""
    sock = os.path.join(work, "redis.sock")
    if os.path.exists(sock):
        os.unlink(sock)
    server = ["/usr/bin/redis-server", "--port", "0", "--unixsocket", sock, "--unixsocketperm", "700",
              "--save", "", "--appendonly", "no", "--dir", work, "--enable-debug-command", "local"]
    process = runner.Launched(server, env, os.devnull, TIMEOUT_S)
    client_env = without_preload()

    def cli(*words, stdin_path=None, statuses=(0,)):
        with open(stdin_path or os.devnull, "rb") as stdin:
            done = subprocess.run(["/usr/bin/redis-cli", "-s", sock] + list(words), stdin=stdin,
                                  capture_output=True, env=client_env, timeout=TIMEOUT_S)
        if done.returncode not in statuses:
            sys.stderr.write(done.stderr.decode(errors="replace"))
            process.kill()
            runner.fail(f"redis-cli {' '.join(words)} exited with status {done.returncode} (server: {process.shown})")
        return done.stdout.decode(errors="replace").strip()

    deadline = time.monotonic() + REDIS_READY_S
    while not (os.path.exists(sock) and cli("PING", statuses=(0, 1)) == "PONG"):
        if os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            process.reap()  # stops the runner with the server's exit status and stderr
            runner.fail(f"{process.shown} exited before answering PING")
        if time.monotonic() > deadline:
            process.kill()
            runner.fail(f"{process.shown} did not answer PING within {REDIS_READY_S} s")
        time.sleep(0.02)
    piped = cli("--pipe", stdin_path=os.path.join(data, "commands.resp")).splitlines()[-1]
    digest = cli("DEBUG", "DIGEST")
    keys = cli("DBSIZE")
    cli("SHUTDOWN", "NOSAVE", statuses=(0, 1))  # the server closes the connection as it stops
    usage = process.reap()
    return Sample(usage.ru_utime + usage.ru_stime, usage, f"{piped}; keys {keys}; digest {digest}")


def run_one(row, env, data, work, scale):
    """One measurement of one row under the environment `env` (its column's, plus ROW_ENV)."""
    env = dict(env, **ROW_ENV.get(row, {}))
    if row == "redis":
        return run_redis(env, data, work)
    scale_text = repr(scale)
    if row in ("python", "python-json"):
        command = ["/usr/bin/python3", "-s", script("objects.py" if row == "python" else "roundtrip.py"), scale_text]
    elif row == "perl":
        command = ["/usr/bin/perl", script("text.pl"), scale_text]
    elif row == "lua":
        command = ["/usr/bin/lua5.4", script("tables.lua"), scale_text]
    elif row == "ruby":
        command = ["/usr/bin/ruby", script("records.rb"), scale_text]
    elif row == "sqlite":
        rows = max(10, round(SQLITE_ROWS * scale))
        command = ["/usr/bin/sqlite3", "-bail", ":memory:", f".parameter set @n {rows}",
                   f'.read "{script("store.sql")}"']
    elif row == "xmllint":
        command = ["/usr/bin/xmllint", "--xpath", XPATH, os.path.join(data, "catalog.xml")]
    elif row == "jq":
        command = ["/usr/bin/jq", "-c", "-f", script("report.jq"), os.path.join(data, "events.json")]
    else:  # gcc
        obj = os.path.join(work, "unit.o")
        command = ["/usr/bin/gcc", "-O2", "-c", os.path.join(data, "unit.c"), "-o", obj]
    seconds, usage, output = run_program(command, env, work)
    if row == "gcc":
        with open(obj, "rb") as f:
            output += "object sha256 " + hashlib.sha256(f.read()).hexdigest()
    return Sample(seconds, usage, output)


# ---- options and columns ----

def install(rows):
    """apt-get install of the peers' and the rows' packages (root, Debian's registry)."""
    packages = PEER_PACKAGES + sorted({PROGRAMS[p] for row in rows for p in NEEDS[row]})
    command = ["apt-get", "install", "-y"] + packages
    print(f"programs.py: {' '.join(command)}", file=sys.stderr, flush=True)
    if subprocess.run(command).returncode != 0:
        runner.fail(f"{' '.join(command)} failed")


def check_programs(rows):
    missing = sorted({p for row in rows for p in NEEDS[row] if not os.access(p, os.X_OK)})
    if missing:
        packages = sorted({PROGRAMS[p] for p in missing})
        runner.fail(f"missing {' '.join(missing)}: run bench/programs.py --install, or apt-get install -y "
                    + " ".join(packages))


def parse_args():
    parser = argparse.ArgumentParser(
        description="Run real programs (Python, Perl, Lua, Ruby, SQLite, Redis, xmllint, jq, gcc) under "
                    "shardmm and other allocators, preloaded.")
    runner.add_options(parser, runs=6, scale_help="multiplier of each script's work and of the generated inputs "
                                                  "(default: 1.0, 0.3-3 s per program under glibc)")
    parser.add_argument("--programs", type=runner.comma_list, default=None,
                        help="comma-separated rows (default: all: " + ",".join(ROWS) + ")")
    parser.add_argument("--install", action="store_true",
                        help="first apt-get install the programs of the rows and Debian's peers (as root)")
    args = parser.parse_args()
    defaults = [a for a in KNOWN if a not in PRELOADS or os.path.exists(PRELOADS[a]) or args.install]
    runner.check_options(parser, args, defaults, known=KNOWN)
    args.programs = runner.choose(parser, args.programs, ROWS, "programs")
    return args


def environments(args):
    """{column: the whole environment of its processes}, the allocators then args.env's columns."""
    base = without_preload()
    env = {}
    for alloc in args.allocs:
        library = os.path.join(args.build_dir, "libshardmm.so") if alloc == "shard" else PRELOADS.get(alloc)
        if library is None:
            env[alloc] = base
        elif not os.path.exists(library):
            hint = "ninja build/libshardmm.so" if alloc == "shard" else "bench/programs.py --install"
            runner.fail(f"no {library} for {alloc} (run {hint})")
        else:
            env[alloc] = dict(base, LD_PRELOAD=os.path.abspath(library))
    env.update(args.env)
    return env


def column_env(envs, column, row):
    """The environment of (row, column): redis's system column preloads glibc (the docstring says why)."""
    if row == "redis" and column == "system":
        return dict(envs[column], LD_PRELOAD=GLIBC)
    return envs[column]


# ---- the report ----

def report(args, started, allocs, samples):
    median = {key: (statistics.median(s.seconds for s in values) * 1000, statistics.median(s.mb for s in values),
                    statistics.median(s.faults for s in values)) for key, values in samples.items()}
    peers = [a for a in allocs if a != BASELINE] if BASELINE in allocs else []
    if not peers:
        print(f"programs.py: note: {BASELINE} not measured, so no ratio columns", file=sys.stderr)
    pairs = {(row, p): runner.paired([s.seconds for s in samples[(row, p)]],
                                     [s.seconds for s in samples[(row, BASELINE)]])
             for row in args.programs for p in peers}
    lines = [f"`{runner.command_line()}`: median of {args.runs} runs, scale {args.scale:g}, {runner.stamp(started)}; "
             f"ms of wall time from start to exit (redis: CPU time of the server, user + system), peak RSS in MB "
             f"(ru_maxrss, children included), minor page faults" +
             (f"; {runner.RATIO_NOTE}, of time" if peers else ""), ""]
    rows = [[row] + [f"{median[(row, a)][0]:.0f}" for a in allocs]
            + [runner.pair_text(pairs[(row, p)]) for p in peers] for row in args.programs]
    lines += runner.markdown_table(["program"] + [f"{a} ms" for a in allocs] + [f"{p}/{BASELINE}" for p in peers], rows)
    lines.append("")
    rows = [[row] + [f"{median[(row, a)][1]:.1f}" for a in allocs] for row in args.programs]
    lines += runner.markdown_table(["program"] + [f"{a} MB" for a in allocs], rows)
    lines.append("")
    rows = [[row] + [f"{median[(row, a)][2]:.0f}" for a in allocs] for row in args.programs]
    lines += runner.markdown_table(["program"] + [f"{a} faults" for a in allocs], rows)
    if peers:
        lines += ["", "Verdicts:", ""]
        if args.runs < 6:
            lines.append(f"- (with {args.runs} runs no ratio has an interval, so every pair is a tie)")
        for p in peers:
            counts = {v: sum(runner.verdict(pairs[(row, p)]) == v for row in args.programs)
                      for v in ("faster", "tie", "slower")}
            lines.append(f"- {BASELINE} against {p} in time: faster in {counts['faster']}, tie in {counts['tie']}, "
                         f"slower in {counts['slower']} of {len(args.programs)} programs")
        above = []
        for row in args.programs:
            lowest = min(peers, key=lambda p: median[(row, p)][1])
            if median[(row, BASELINE)][1] > median[(row, lowest)][1]:
                above.append(f"{row} {median[(row, BASELINE)][1]:.1f} MB against {lowest} "
                             f"{median[(row, lowest)][1]:.1f} MB")
        lines.append(f"- peak RSS: {BASELINE} the lowest in {len(args.programs) - len(above)} of "
                     f"{len(args.programs)} programs" + (f"; above the lowest: {'; '.join(above)}" if above else ""))
    lines += ["", "Programs: " + program_versions(args.programs)]
    return lines


def program_versions(rows):
    """The Debian versions of the rows' packages, for the report."""
    found = []
    for package in sorted({PROGRAMS[p] for row in rows for p in NEEDS[row]}):
        done = subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True, text=True)
        found.append(f"{package} {done.stdout.strip() if done.returncode == 0 else '(not installed)'}")
    return ", ".join(found)


def main():
    args = parse_args()
    if args.install:
        install(args.programs)
    check_programs(args.programs)
    started = runner.started_at()
    envs = environments(args)
    allocs = list(envs)
    data = os.path.join(args.build_dir, "programs", f"scale-{args.scale:g}")
    print(f"programs.py: writing the generated inputs to {data}", file=sys.stderr, flush=True)
    prepare(args.programs, data, args.scale)
    per_run = sum(ROUGH_S[row] * max(args.scale, 0.1) for row in args.programs)
    print(f"programs.py: {args.runs} runs x {len(args.programs)} programs x {len(allocs)} allocators; roughly "
          f"{runner.duration(per_run * len(allocs) * args.runs)}", file=sys.stderr, flush=True)

    runner.become_subreaper()
    work = tempfile.mkdtemp(prefix="shardmm-programs-")
    try:
        samples = {(row, a): [] for row in args.programs for a in allocs}
        outputs = {}
        progress = runner.Progress(args.runs * len(args.programs) * len(allocs))
        for run, index, row in runner.interleaved(args.runs, args.programs):
            for alloc in runner.rotated(allocs, run + index):
                sample = run_one(row, column_env(envs, alloc, row), data, work, args.scale)
                samples[(row, alloc)].append(sample)
                first = outputs.setdefault(row, (alloc, sample.output))
                if first[1] != sample.output:
                    runner.fail(f"{row}: the outputs disagree; {first[0]}: {first[1].strip()!r}, "
                                f"{alloc}: {sample.output.strip()!r}")
                print(f"{progress.step()} run {run + 1} {row:<11} {alloc:<9} {sample.seconds * 1000:8.0f} ms "
                      f"{sample.mb:7.1f} MB {sample.faults:8d} faults", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    runner.finish(report(args, started, allocs, samples), args, started, "bench/programs.py")


if __name__ == "__main__":
    main()
