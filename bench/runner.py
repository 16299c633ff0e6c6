"""bench/runner.py - what the benchmark runners (bench/run, micro.py, medium.py, large.py, churn.py,
instr.py, cachesim.py) share: their common options and their checks, the interleaved order of the runs,
running one benchmark process, the run-by-run ratios with their confidence interval, markdown tables,
and the report's end: printed, and with --save written to bench/results/DATE-COMMIT.md.

The method these implement is written once, in bench/README.md.

Standard library only; the runners import it from their own folder.
"""
import datetime
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time

BASELINE = "shard"  # every ratio is peer / shard
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "bench", "results")
# The peers' Debian packages, whose versions a saved report records (glibc: libc6).
PACKAGES = {"mimalloc": "libmimalloc-dev", "jemalloc": "libjemalloc-dev",
            "tcmalloc": "libgoogle-perftools-dev", "system (glibc)": "libc6"}


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


def duration(seconds):
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# ---- options ----

def add_options(parser, runs=None, scale_help=None, variants=True):
    """The options the runners share: --build-dir, --allocs and --save always; --runs when `runs` (its
    default) is given, --scale when `scale_help` is, --variant unless variants=False."""
    parser.add_argument("--build-dir", default="build",
                        help="directory holding bench/<benchmark>-<alloc> (default: build)")
    if runs is not None:
        parser.add_argument("--runs", type=int, default=runs,
                            help=f"runs per cell and allocator; the median is reported (default: {runs})")
    if scale_help is not None:
        parser.add_argument("--scale", type=float, default=1.0, help=scale_help)
    parser.add_argument("--allocs", type=comma_list, default=None,
                        help="comma-separated allocators (default: every one built)")
    if variants:
        parser.add_argument("--variant", action="append", default=[], metavar="NAME=LIBRARY",
                            help="one more column: the system build with LIBRARY (a libshardmm.so, say an "
                                 "older build) preloaded, compared with shard like a peer; repeatable")
    parser.add_argument("--save", action="store_true",
                        help="also write the report to bench/results/DATE-COMMIT.md, with the command line, "
                             "the machine and the allocators' versions")


def check_options(parser, args, defaults, optional=(), bench=None, known=None):
    """Checks the shared options after parse_args. args.allocs: as given, or `defaults` plus those of
    `optional` whose binary of `bench` is built; each named once and, with `known`, one of those.
    args.env: {variant name: the environment that preloads its library} (empty without --variant)."""
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
    args.env = {}
    for spec in getattr(args, "variant", []):
        name, sep, library = spec.partition("=")
        if not sep or not name or not library or name in args.allocs or name in args.env:
            parser.error(f"--variant {spec!r}: NAME=LIBRARY with a new name")
        if not os.path.isfile(library):
            parser.error(f"--variant {spec!r}: no file {library}")
        args.env[name] = dict(os.environ, LD_PRELOAD=os.path.abspath(library))


def columns(args, bench, path=binary_path):
    """The columns of the report, the allocators then the variants, and the binary of each, checked to
    exist: path(build_dir, bench, alloc), and for a variant the system build (its library preloaded)."""
    binaries = existing({a: path(args.build_dir, bench, a) for a in args.allocs + ["system"] * bool(args.env)})
    binaries.update({name: binaries["system"] for name in args.env})
    return args.allocs + list(args.env), binaries


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
    """allocs, starting at the k-th: the order rotates from cell to cell and run to run, so that no
    allocator always runs first (after the runner's own work) or always after the same one."""
    k %= len(allocs)
    return allocs[k:] + allocs[:k]


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


def preload_shown(command, env):
    """The command as a shell would run it, with the LD_PRELOAD of a variant in front."""
    prefix = f"LD_PRELOAD={env['LD_PRELOAD']} " if env and "LD_PRELOAD" in env else ""
    return prefix + shlex.join(command)


def numbers(words, kinds, shown):
    """words converted by kinds (float, int, ...), or stop the runner naming the command."""
    try:
        return tuple(kind(word) for kind, word in zip(kinds, words))
    except ValueError:
        fail(f"{shown} printed a non-number: {' '.join(words)!r}")


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


def versions():
    """The peers' and glibc's Debian package versions (dpkg-query), or why not."""
    found = []
    for what, package in PACKAGES.items():
        version = _output(["dpkg-query", "-W", "-f=${Version}", package])
        found.append(f"{what} {version} ({package})" if version else f"{what}: {package} not installed")
    return "; ".join(found)


def finish(report_lines, args, started, title):
    """Prints the report (stdout) and, with --save, writes it to bench/results/DATE-COMMIT.md (DATE of
    the run's start), after a heading, the command line, the machine and the versions; a second report
    of the same date and commit goes below the first in the same file."""
    report = "\n".join(report_lines) + "\n"
    print(report, end="", flush=True)  # first: a failure to save loses nothing
    if not getattr(args, "save", False):
        return None
    os.makedirs(RESULTS, exist_ok=True)
    commit = commit_name()
    path = os.path.join(RESULTS, f"{started.strftime('%Y-%m-%d')}-{commit}.md")
    head = f"# {started.strftime('%Y-%m-%d')}, {commit}\n\n" if not os.path.exists(path) else "\n"
    section = (f"{head}## {title}, {stamp(started)}\n\n"
               f"Command: `{command_line()}`\n\n"
               f"Machine: {machine()}\n\n"
               f"Versions: {versions()}\n\n{report}")
    with open(path, "a") as f:
        f.write(section)
    print(f"bench/{os.path.basename(sys.argv[0])}: saved the report in {os.path.relpath(path)}", file=sys.stderr)
    return path
