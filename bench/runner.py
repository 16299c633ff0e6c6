"""bench/runner.py - what the benchmark runners (bench/run, micro.py, medium.py, large.py, churn.py,
engines.py, shapes.py, stress.py, instr.py, cachesim.py, programs.py, compare.py) share: their common
options and their checks, the columns that preload a library (--peer, the peers bench/peers built,
--variant), the interleaved order of the runs, running one benchmark process (and, for its own peak
RSS, one started apart from the runner: Launched), the run-by-run ratios with their confidence
interval, markdown tables, and the report's end: printed, and with --save written to
bench/results/DATE-COMMIT.md.

The method these implement is written once, in bench/README.md.

Standard library only; the runners import it from their own folder.
"""
import ctypes
import datetime
import math
import os
import platform
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

BASELINE = "shard"  # every ratio is peer / shard
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
# The peers' Debian packages, whose versions a saved report records (glibc: libc6).
PACKAGES = {"mimalloc": "libmimalloc-dev", "jemalloc": "libjemalloc-dev",
            "tcmalloc": "libgoogle-perftools-dev", "system (glibc)": "libc6"}
# Their libraries, for the runners that preload every allocator into one program (engines, stress).
LIBDIR = "/usr/lib/x86_64-linux-gnu"
PACKAGED = {"mimalloc": f"{LIBDIR}/libmimalloc.so.2", "jemalloc": f"{LIBDIR}/libjemalloc.so.2",
            "tcmalloc": f"{LIBDIR}/libtcmalloc.so.4"}


def fail(message):
    sys.exit(f"{os.path.basename(sys.argv[0])}: error: {message}")


def comma_list(text):
    return [item for item in text.split(",") if item]


def binary_path(build_dir, bench, alloc):
    """build/bench/<bench>-<alloc>: one binary per benchmark and allocator (build.ninja)."""
    return os.path.join(build_dir, "bench", f"{bench}-{alloc}")


def existing(binaries):
    """binaries ({allocator: path}) as given, or stop the runner naming the ones not built."""
    missing = [path for path in binaries.values() if not os.path.exists(path)]
    if missing:
        fail("missing binaries (build them first with ninja): " + " ".join(missing))
    return binaries


def preload_env(library):
    """Our environment with `library` preloaded: a program's malloc replaced by the library's."""
    return dict(os.environ, LD_PRELOAD=os.path.abspath(library))


def preload_library(build_dir, alloc):
    """The library that makes `alloc` a program's malloc when preloaded: shardmm's drop-in
    (<build-dir>/libshardmm.so), a knob's build of it (shard-nolp: <build-dir>/nolp/libshardmm.so) or a
    Debian package's; None for the others (system: glibc's own)."""
    if alloc == BASELINE:
        return os.path.join(build_dir, "libshardmm.so")
    if alloc.startswith(BASELINE + "-"):
        return os.path.join(build_dir, alloc[len(BASELINE) + 1:], "libshardmm.so")
    return PACKAGED.get(alloc)


def preload_allocators(args):
    """For the runners that run one program under every allocator (engines, stress), and those whose
    allocators run preloaded into the system build (check_options without --linked): each allocator of
    args.allocs with a library of its own (preload_library) becomes a preloaded column, its library and
    environment put in args.libraries and args.env before the peers'. Stops the runner when such a
    library is missing."""
    libraries = {}
    for alloc in args.allocs:
        library = preload_library(args.build_dir, alloc)
        if library is not None:
            if not os.path.exists(library):
                fail(f"no {library} for {alloc} (build it with ninja, or install it with .ci/install)")
            libraries[alloc] = library
    args.env = {**{alloc: preload_env(library) for alloc, library in libraries.items()}, **args.env}
    args.libraries = {**libraries, **args.libraries}


def peers_dir(build_dir):
    """<build-dir>/peers: where bench/peers puts the peers it built from source."""
    return os.path.join(build_dir, "peers")


HARDENED = "hardened"  # the subfolder of peers_dir with the peers' hardened builds, for catch.py alone


def built_peers(directory):
    """{name: path} of the libraries NAME.so in `directory` (bench/peers's output), by name."""
    try:
        files = sorted(os.listdir(directory))
    except FileNotFoundError:
        return {}
    return {f[:-len(".so")]: os.path.join(directory, f) for f in files
            if f.endswith(".so") and os.path.isfile(os.path.join(directory, f))}


def peer_versions(directory):
    """{file: [peer and version, commit, source, how it was built]} of directory/VERSIONS, the
    tab-separated lines bench/peers writes (file relative to `directory`); {} without the file."""
    entries = {}
    try:
        with open(os.path.join(directory, "VERSIONS")) as f:
            for line in f:
                fields = line.rstrip("\n").split("\t")
                if len(fields) == 5 and not line.startswith("#"):
                    entries[fields[0]] = fields[1:]
    except FileNotFoundError:
        pass
    return entries


def duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ---- options ----

def add_options(parser, runs=None, scale_help=None, linked=False):
    """The options the runners share: --build-dir, --allocs, the preloaded columns (--peer, --no-peers,
    --variant) and --save always; --runs when `runs` (its default) is given, --scale when `scale_help` is;
    --linked when `linked` (a runner whose allocators run preloaded into the system build by default:
    check_options)."""
    parser.add_argument("--build-dir", default="build",
                        help="directory holding bench/<benchmark>-<alloc> (default: build)")
    if runs is not None:
        parser.add_argument("--runs", type=int, default=runs,
                            help=f"runs per cell and allocator; the median is reported (default: {runs})")
    if scale_help is not None:
        parser.add_argument("--scale", type=float, default=1.0, help=scale_help)
    parser.add_argument("--allocs", type=comma_list, default=None,
                        help="comma-separated allocators (default: every one built)")
    parser.add_argument("--peer", action="append", default=[], metavar="NAME=LIBRARY",
                        help="one more peer column: the system build with LIBRARY (another allocator's "
                             "preloadable library) preloaded, compared with shard; repeatable")
    parser.add_argument("--no-peers", action="store_true",
                        help="no column for each peer built from source, <build-dir>/peers/NAME.so (bench/peers), "
                             "which are added by default")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=LIBRARY",
                        help="one more column: the system build with LIBRARY (a libshardmm.so, say an "
                             "older build) preloaded, compared with shard like a peer; repeatable")
    if linked:
        parser.add_argument("--linked", action="store_true",
                            help="run each allocator of --allocs in its own build, linked with it, rather "
                                 "than the system build with its library preloaded as the peers run (the "
                                 "default: one binary for every column)")
    parser.add_argument("--save", action="store_true",
                        help="also write the report to bench/results/DATE-COMMIT.md, with the command line, "
                             "the machine and the allocators' versions")


def named_libraries(parser, specs, option):
    """{name: library} of the NAME=LIBRARY values of `option`, each name once and each file there."""
    libraries = {}
    for spec in specs:
        name, sep, library = spec.partition("=")
        if not sep or not name or not library or name in libraries:
            parser.error(f"{option} {spec!r}: NAME=LIBRARY with a new name")
        if not os.path.isfile(library):
            parser.error(f"{option} {spec!r}: no file {library}")
        libraries[name] = library
    return libraries


def check_options(parser, args, defaults, optional=(), bench=None, known=None, preload=True):
    """Checks the shared options after parse_args. args.allocs: as given, or `defaults` plus those of
    `optional` whose binary of `bench` is built; each named once and, with `known`, one of those.
    The columns that preload a library, after the allocators: the peers (those of --peer and, unless
    --no-peers, each <build-dir>/peers/NAME.so, a --peer of the same name replacing it), then the
    variants; args.libraries: {column: its library}, args.peers: the peers' names, args.env: {column: the
    environment that preloads its library}. preload=False (a program that cannot preload a Linux library):
    no such column, and --peer or --variant is an error."""
    if getattr(args, "runs", 1) < 1:
        parser.error("--runs must be at least 1")
    if not getattr(args, "scale", 1.0) > 0:
        parser.error("--scale must be positive")
    if args.allocs is None:
        args.allocs = list(defaults) + [a for a in optional
                                        if os.path.exists(binary_path(args.build_dir, bench, a))]
    if not args.allocs or len(set(args.allocs)) != len(args.allocs):
        parser.error("--allocs must name each allocator once")
    unknown = [a for a in args.allocs if known is not None and a not in known]
    if unknown:
        parser.error(f"unknown allocators {unknown}; known: {','.join(known)}")
    if not preload and (args.peer or args.variant):
        parser.error("--peer and --variant preload a Linux library: not here")
    found = {} if args.no_peers or not preload else built_peers(peers_dir(args.build_dir))
    peers = {**found, **named_libraries(parser, args.peer, "--peer")}
    variants = named_libraries(parser, args.variant, "--variant")
    clash = sorted({name for name in [*peers, *variants] if name in args.allocs or (name in peers and name in variants)})
    if clash:
        parser.error(f"--peer / --variant names {clash}: each column needs a name of its own")
    args.libraries = {**peers, **variants}
    args.peers = list(peers)
    args.env = {name: preload_env(library) for name, library in args.libraries.items()}
    # One binary for every column, the peers' way: the builds of a benchmark for each allocator differ in
    # code layout, and a linked build's C library keeps glibc's malloc for itself; both moved cells, by
    # up to twice (bench/results/2026-12-07-loop-alignment.md).
    if getattr(args, "linked", True) is False:
        preload_allocators(args)


def columns(args, bench, path=binary_path):
    """The columns of the report, the allocators then the peers and variants, and the binary of each,
    checked to exist: path(build_dir, bench, alloc), and for a peer, a variant or an allocator that runs
    preloaded (check_options) the system build (its library preloaded)."""
    own = [a for a in args.allocs if a not in args.env]
    binaries = existing({a: path(args.build_dir, bench, a) for a in own + ["system"] * bool(args.env)})
    binaries.update({name: binaries["system"] for name in args.env})
    return args.allocs + [name for name in args.env if name not in args.allocs], binaries


def choose(parser, given, known, what):
    """The rows or scenarios to run: `given` (a list, or None for all of `known`), each known and once."""
    chosen = list(known) if given is None else given
    unknown = [c for c in chosen if c not in known]
    if unknown or not chosen or len(set(chosen)) != len(chosen):
        parser.error(f"bad --{what} {chosen}; known: {','.join(known)}")
    return chosen


# ---- running ----

def interleaved(runs, cells):
    """(run, cell index, cell) in the order the runners measure: run after run, each cell in turn;
    the caller runs every allocator for the cell, in rotated(allocs, run + index) order."""
    for run in range(runs):
        for index, cell in enumerate(cells):
            yield run, index, cell


def rotated(allocs, k):
    """allocs in the order of the k-th turn: the (k mod n)-th first, so that each runs first as often
    as any other, then the rest shuffled by k (the same order on every call). A plain rotation kept
    the cyclic order, in which each allocator always ran after the same one: one that leaves the
    machine's memory in 4 KB pieces slowed the huge pages of the next, always the same
    (bench/results/2026-12-04-order.md)."""
    first = k % len(allocs)
    rest = allocs[first + 1:] + allocs[:first]
    random.Random(f"rotated {k}").shuffle(rest)
    return [allocs[first]] + rest


class Progress:
    """The count of processes run and the time the rest will take at the pace so far, for the
    progress line on stderr."""

    def __init__(self, total):
        self.total, self.done, self.t0 = total, 0, time.monotonic()

    def step(self):
        self.done += 1
        left = (time.monotonic() - self.t0) / self.done * (self.total - self.done)
        return f"[{self.done}/{self.total}, about {duration(left)} left]"


def run_line(command, timeout_s, env=None, shown=None, statuses=(0,)):
    """Runs one benchmark process and returns (its output's words, a printable command, its exit
    status), or stops the runner with an error: not started, over the time limit, or an exit status
    not in `statuses` (its stderr is passed on). env: the whole environment, or None for ours.
    Carriage returns (Wine) are dropped."""
    shown = shown or shlex.join(command)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        fail(f"{shown} did not finish within {timeout_s} s")
    except OSError as e:
        fail(f"cannot run {command[0]}: {e}")
    if done.returncode not in statuses:
        sys.stderr.write(done.stderr)
        fail(f"{shown} exited with status {done.returncode}")
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
    return done.stdout.replace("\r", "").split(), shown, done.returncode


class NotUnderValgrind(Exception):
    """A peer that fails under valgrind (snmalloc 0.7.5: valgrind cannot give it the 256 GB of address
    space it reserves at start): instr.py and cachesim.py leave its column out, say why, and go on."""


def valgrind_reason(status, stderr):
    """Why a program failed under valgrind: its exit status and its own first line of stderr
    (valgrind's lines, ==PID== and --PID--, left out)."""
    own = next((line for line in stderr.splitlines() if line.strip() and not re.match(r"(==|--)\d+(==|--)", line)), "")
    return f"exit status {status}" + (f": {own.strip().rstrip('.')}" if own else "")


def valgrind_failures(failed):
    """The report's note on the peers left out ({column: reason}); none when none was."""
    if not failed:
        return []
    return ["", "Left out, failed under valgrind: " + "; ".join(f"{a} ({why})" for a, why in failed.items()) + "."]


def preload_shown(command, env):
    """The command as a shell would run it, with the LD_PRELOAD of a peer or variant in front."""
    prefix = f"LD_PRELOAD={env['LD_PRELOAD']} " if env and "LD_PRELOAD" in env else ""
    return prefix + shlex.join(command)


def numbers(words, kinds, shown):
    """words converted by kinds (float, int, ...), or stop the runner naming the command."""
    try:
        return tuple(kind(word) for kind, word in zip(kinds, words))
    except ValueError:
        fail(f"{shown} printed a non-number: {' '.join(words)!r}")


# ---- a process of its own, for its peak RSS (programs.py, compare.py) ----

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>


def become_subreaper():
    """Makes the runner the reaper of its orphaned descendants (prctl PR_SET_CHILD_SUBREAPER), so that
    it can wait4 the programs Launched starts as its grandchildren (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        fail(f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(ctypes.get_errno())}")


class Launched:
    """A program started through /bin/sh, which forks it in the background (env's LD_PRELOAD set
    for the program alone, not for sh) with its stdout sent to the file `output`, prints its pid
    and exits; the program, orphaned, is reaped by the runner (become_subreaper) with os.wait4.
    Why not a child of the runner: at exec, Linux keeps the peak RSS of the memory the process ran
    in before as a floor of its ru_maxrss, and a child of the runner (which subprocess starts with
    vfork) runs in the runner's memory, so every program would report at least the runner's own
    peak (programs.py's: 270 MB after writing its inputs); a child of sh starts from sh's megabyte. Its stdin is
    /dev/null (sh's rule for background commands), its stderr a temporary file, read on failure;
    a timer kills it after timeout_s seconds."""

    LAUNCH = ('output=$1 preload=$2; shift 2; '
              '{ [ -z "$preload" ] || export LD_PRELOAD="$preload"; exec "$@" >"$output"; } & echo $!')

    def __init__(self, command, env, output, timeout_s):
        self.shown = preload_shown(command, env)
        self.errors = tempfile.TemporaryFile()
        try:
            shell = subprocess.Popen(["/bin/sh", "-c", self.LAUNCH, "sh", output, env.get("LD_PRELOAD", "")] + command,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self.errors,
                                     env={k: v for k, v in env.items() if k != "LD_PRELOAD"})
        except OSError as e:
            fail(f"cannot run /bin/sh: {e}")
        pid = shell.communicate()[0].decode().strip()
        if shell.returncode != 0 or not pid.isdigit():
            fail(f"/bin/sh did not start {self.shown}")
        self.pid = int(pid)
        self.timer = threading.Timer(timeout_s, self.kill)
        self.timer.start()

    def kill(self):
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def reap(self):
        """Waits for the program; returns its rusage, or stops the runner with an error (its stderr
        passed on) when it failed or was killed."""
        try:
            _, status, usage = os.wait4(self.pid, 0)
        except ChildProcessError:
            fail(f"{self.shown} (pid {self.pid}) was reaped by another process before the runner")
        self.timer.cancel()
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            self.errors.seek(0)
            sys.stderr.write(self.errors.read().decode(errors="replace"))
            killed = " (killed after the time limit?)" if code < 0 else ""
            fail(f"{self.shown} exited with status {code}{killed}")
        self.errors.close()
        return usage


# ---- ratios ----

def median_interval(values, level=0.95):
    """A distribution-free confidence interval of the median of `values` (the sign-test interval): with
    k the largest count such that P(Binomial(n, 1/2) <= k) <= (1 - level) / 2, the (k+1)-th smallest and
    the (k+1)-th largest value. None when n is too small for the level (fewer than 6 values at 95 %)."""
    x = sorted(values)
    n = len(x)
    tail, k, cumulative = (1 - level) / 2, -1, 0.0
    for i in range(n + 1):
        cumulative += math.comb(n, i) / 2 ** n
        if cumulative > tail:
            break
        k = i
    return None if k < 0 else (x[k], x[n - 1 - k])


def paired(peer, base):
    """peer against shard run by run (two lists of one quantity, in run order): (the median of the
    ratios peer/shard, the runs shard won, the runs, the 95 % interval of that median or None)."""
    ratios = [p / max(b, 1e-9) for p, b in zip(peer, base)]
    return statistics.median(ratios), sum(r > 1 for r in ratios), len(ratios), median_interval(ratios)


def pair_text(pair, interval=True):
    """ "1.04 (11/15) 1.012-1.071": the median ratio, the runs shard won and, with interval=True and 6
    runs or more, the interval, to three places so that a bound just above 1 shows as such."""
    median, won, runs, bounds = pair
    text = f"{median:.2f} ({won}/{runs})"
    if interval and bounds:
        text += f" {bounds[0]:.3f}-{bounds[1]:.3f}"
    return text


def verdict(pair):
    """faster / slower when the interval of the median ratio peer/shard lies above / below 1, else tie."""
    bounds = pair[3]
    if bounds is None:
        return "tie"
    return "faster" if bounds[0] > 1 else "slower" if bounds[1] < 1 else "tie"


RATIO_NOTE = (f"peer/{BASELINE}: the median of the run-by-run ratios (> 1: {BASELINE} faster), the runs "
              f"{BASELINE} won and, from 6 runs, the 95 % interval of that median (bench/README.md)")


# ---- the report ----

def markdown_table(header, rows):
    """A markdown table as lines: the first column left-aligned, the others right-aligned."""
    return (["| " + " | ".join(header) + " |", "|---" + "|--:" * (len(header) - 1) + "|"]
            + ["| " + " | ".join(cells) + " |" for cells in rows])


def command_line():
    """How the runner was called, for the report: bench/<runner> and its arguments."""
    return shlex.join(["bench/" + os.path.basename(sys.argv[0])] + sys.argv[1:])


def started_at():
    return datetime.datetime.now().astimezone()


def stamp(started):
    return started.strftime("%Y-%m-%d %H:%M %Z")


def _output(command):
    try:
        done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def commit_name():
    """The short hash of HEAD, with -dirty when the work tree has uncommitted changes (bench/results/,
    where saved reports go, aside)."""
    head = _output(["git", "rev-parse", "--short", "HEAD"]) or "nocommit"
    changes = _output(["git", "status", "--porcelain", "--", ".", ":!bench/results"])
    return head + ("-dirty" if changes else "")


def machine():
    """nproc, the processor's model name and the kernel, as far as they can be read."""
    model = "unknown processor"
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), model)
    except OSError:
        pass
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{cpus} processors (nproc), {model}; {platform.system()} {platform.release()} {platform.version()}"


def versions(args):
    """The peers' and glibc's Debian package versions (dpkg-query), or why not; then the lines of
    <build-dir>/peers/VERSIONS (bench/peers) of the libraries the columns preloaded and of the programs
    in args.programs (stress.py's test-stress)."""
    found = []
    for what, package in PACKAGES.items():
        version = _output(["dpkg-query", "-W", "-f=${Version}", package])
        found.append(f"{what} {version} ({package})" if version else f"{what}: {package} not installed")
    built = built_by_peers(args)
    used = [os.path.realpath(p) for p in list(args.libraries.values()) + getattr(args, "programs", [])]
    for file, (what, commit, _, how) in sorted(built[path] for path in set(used) if path in built):
        found.append(f"{file}: {what}, {commit}, built from source: {how}")
    return "; ".join(found)


def built_by_peers(args):
    """{real path: (file, [peer and version, commit, source, how])} of <build-dir>/peers/VERSIONS."""
    directory = peers_dir(args.build_dir)
    return {os.path.realpath(os.path.join(directory, file)): (file, fields)
            for file, fields in peer_versions(directory).items()}


def library_lines(args):
    """The report's last paragraph: the library each column preloads (args.libraries), with the
    version and commit of those bench/peers built; none without such columns."""
    if not args.libraries:
        return []
    built = built_by_peers(args)
    parts = []
    for name, library in args.libraries.items():
        _, fields = built.get(os.path.realpath(library), (None, None))
        parts.append(f"`{name}` {library}" + (f" ({fields[0]}, {fields[1][:len('commit ') + 12]})" if fields else ""))
    return ["", "Libraries preloaded (LD_PRELOAD), by column: " + "; ".join(parts) + "."]


def finish(report_lines, args, started, title):
    """Prints the report (stdout): report_lines, then the library of each preloaded column
    (library_lines). With --save, writes it to bench/results/DATE-COMMIT.md (DATE of the run's start),
    after a heading, the command line, the machine and the versions; a second report of the same date and
    commit goes below the first in the same file. Returns the report's text."""
    report = "\n".join(report_lines + library_lines(args)) + "\n"
    print(report, end="", flush=True)  # first: a failure to save loses nothing
    if not getattr(args, "save", False):
        return report
    os.makedirs(RESULTS, exist_ok=True)
    commit = commit_name()
    path = os.path.join(RESULTS, f"{started.strftime('%Y-%m-%d')}-{commit}.md")
    head = f"# {started.strftime('%Y-%m-%d')}, {commit}\n\n" if not os.path.exists(path) else "\n"
    section = (f"{head}## {title}, {stamp(started)}\n\n"
               f"Command: `{command_line()}`\n\n"
               f"Machine: {machine()}\n\n"
               f"Versions: {versions(args)}\n\n{report}")
    with open(path, "a") as f:
        f.write(section)
    print(f"bench/{os.path.basename(sys.argv[0])}: saved the report in {os.path.relpath(path)}", file=sys.stderr)
    return report
