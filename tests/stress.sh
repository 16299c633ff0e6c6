#!/usr/bin/env bash
# tests/stress.sh - the stress soak: longer runs of tests/stress.c than tests/run makes, before a change
# is accepted (the seed's rule: 30-second runs on 8 and 16 threads without errors; -large 10 for a change
# to large blocks, -medium 100 for one to medium blocks). Every run below, in this order:
#   release  8 and 16 threads, 16 threads with -large 10, 16 with -medium 100, 64 threads (oversubscribed)
#   debug    16 threads, 16 threads with -large 10 -medium 100 (the library's assertions and checkers)
#   Wine     16 threads, 16 threads with -large 10 -medium 100 (build/win64/stress.exe)
#
# Usage: tests/stress.sh [seconds [seed]]   seconds per run (default 30: about 5 minutes in all); a seed
#        (decimal or 0x hex) repeats runs, else each run takes a new one and prints it.
# Each run's output is printed with its label; the last line is "N passed, N failed" and the exit code is
# the number of failed runs. A run passes when it exits 0 with its summary line ("... errors 0") last.
set -uo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-30}
seed=${2:+-seed $2}
[[ "$seconds" =~ ^[0-9]+$ ]] || { echo "usage: tests/stress.sh [seconds [seed]]"; exit 1; }

ninja build/stress build/debug/stress build/win64/stress.exe || { echo "tests/stress.sh: the build failed"; exit 1; }

passed=0
failed=0
run() { # label command...
  local out status last
  out=$("${@:2}" 2>&1 | tr -d '\r')
  status=${PIPESTATUS[0]}
  printf '%s\n' "$out" | sed "s|^|[$1] |"
  last=$(printf '%s\n' "$out" | tail -n 1)
  if [ "$status" -eq 0 ] && [[ "$last" =~ ^stress:\ .*\ errors\ 0$ ]]; then
    passed=$((passed + 1)); echo "ok $1"
  else
    failed=$((failed + 1)); echo "FAIL $1 (exit status $status)"
  fi
}

# A run takes a little past -seconds to free and check what is left; the limit only catches a hang.
limit=$((seconds * 2 + 120))
release=(timeout "$limit" build/stress -seconds "$seconds" $seed)
debug=(timeout "$limit" build/debug/stress -seconds "$seconds" $seed)
run release-8 "${release[@]}" -threads 8
run release-16 "${release[@]}" -threads 16
run release-16-large-10 "${release[@]}" -threads 16 -large 10
run release-16-medium-100 "${release[@]}" -threads 16 -medium 100
run release-64 "${release[@]}" -threads 64
run debug-16 "${debug[@]}" -threads 16
run debug-16-large-10-medium-100 "${debug[@]}" -threads 16 -large 10 -medium 100

export WINEPREFIX="$PWD/build/wine" WINEDEBUG=-all
wine=/usr/lib/wine/wine64
if [ ! -f "$WINEPREFIX/system.reg" ]; then # the first start creates the prefix (some seconds, once)
  "$wine" wineboot --init >/dev/null 2>&1
fi
win64=(timeout "$limit" "$wine" build/win64/stress.exe -seconds "$seconds" $seed)
run win64-16 "${win64[@]}" -threads 16
run win64-16-large-10-medium-100 "${win64[@]}" -threads 16 -large 10 -medium 100
/usr/lib/wine/wineserver64 -k 2>/dev/null

echo "$passed passed, $failed failed"
exit "$failed"
