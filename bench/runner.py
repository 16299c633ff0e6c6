"""bench/runner.py - what the benchmark runners (micro.py, medium.py, large.py, ...) share: their error
exit, comma-separated options, where a benchmark binary is, durations for the progress line, running
one benchmark process (a time limit, its exit status and its one line of output), and the confidence
interval of a median ratio.

Standard library only; the runners import it from their own folder.
"""
import math
import os
import shlex
import subprocess
import sys


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


def numbers(words, kinds, shown):
    """words converted by kinds (float, int, ...), or stop the runner naming the command."""
    try:
        return tuple(kind(word) for kind, word in zip(kinds, words))
    except ValueError:
        fail(f"{shown} printed a non-number: {' '.join(words)!r}")


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
