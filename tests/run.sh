#!/bin/sh
# Runs every test binary given, prints its output, and closes with one line
# "N passed, N failed" (plus skipped). Exits non-zero if any check failed or
# any binary crashed.
#
# Tests run SKV_TEST_JOBS at a time (default: the online CPUs, at most 4;
# 1 runs them in turn, in the order given). Each one's output is printed
# whole when it ends, never interleaved with another's, followed by its wall
# time ("TIME <test> S s"); the tally at the end reads every test's result
# in the order given. With more than one job, OMP_WAIT_POLICY is passive
# unless set (below).
#
# Each test runs under `timeout -k 10 N` (N = $SKV_TEST_TIMEOUT seconds,
# default 900: the slowest test takes about 6 min alone on 2 busy cores, more
# under ASan). A test still running after N s gets SIGTERM, and SIGKILL 10 s
# later, with every process it started (timeout signals its process group);
# it then counts as one failure, "FAIL <test> timed out after N s", and the
# suite goes on.
#
# Each test gets its own TMPDIR, removed when it passes; a failing test's is
# kept under the caller's TMPDIR (or /tmp) and named in its output, for a look
# at what it wrote.
limit=${SKV_TEST_TIMEOUT:-900}
case $limit in '' | *[!0-9]*) echo "SKV_TEST_TIMEOUT must be whole seconds, not '$limit'" >&2; exit 2 ;; esac
jobs=${SKV_TEST_JOBS:-$(n=$(getconf _NPROCESSORS_ONLN 2>/dev/null || echo 1); [ "$n" -gt 4 ] && n=4; echo "$n")}
case $jobs in '' | *[!0-9]* | 0) echo "SKV_TEST_JOBS must be a whole number of at least 1, not '$jobs'" >&2; exit 2 ;; esac
# One test: its output and exit status into $dir/N.out and N.rc, printed under a lock when it ends.
if [ "${1-}" = --one ]; then
    dir=$2; n=$3; t=$4
    t0=$(date +%s)
    mkdir "$dir/$n.tmp"
    TMPDIR="$dir/$n.tmp" timeout -k 10 "$limit" "$t" >"$dir/$n.out" 2>&1 </dev/null; rc=$?
    secs=$(($(date +%s) - t0))
    f=$(grep -c '^FAIL ' "$dir/$n.out")
    # 124: timeout's SIGTERM ended it; 137 (SIGKILL) after the limit: -k's kill
    if [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ $secs -ge "$limit" ]; }; then
        echo "FAIL $t timed out after $limit s" >>"$dir/$n.out"; echo crash >"$dir/$n.rc"
    elif [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $t exited with status $rc" >>"$dir/$n.out"; echo crash >"$dir/$n.rc"
    else
        echo ok >"$dir/$n.rc"
    fi
    if [ "$(cat "$dir/$n.rc")" = ok ] && [ "$f" -eq 0 ]; then
        rm -rf "$dir/$n.tmp"
    elif [ -n "$(ls -A "$dir/$n.tmp")" ] && keep=$(mktemp -d "${TMPDIR:-/tmp}/skv-failed.XXXXXX"); then
        mv "$dir/$n.tmp" "$keep/$(basename "$t")" && echo "NOTE $t's scratch files kept in $keep/$(basename "$t")" >>"$dir/$n.out"
    fi
    echo "TIME $t $secs s" >>"$dir/$n.out"
    flock "$dir/print.lock" cat "$dir/$n.out"
    exit 0
fi

[ $# -eq 0 ] && { echo "0 passed, 0 failed, 0 skipped"; exit 0; }
# Side by side, a test's OpenMP threads sleep when idle instead of spinning
# (libgomp spins by default, and two tests' spinning threads on the same
# cores took the 2-core CI from 24 to 32 minutes); unless the caller chose.
if [ "$jobs" -gt 1 ] && [ -z "${OMP_WAIT_POLICY:-}" ]; then OMP_WAIT_POLICY=passive; export OMP_WAIT_POLICY; fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/skv-tests.XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
trap 'exit 130' INT TERM

n=0
for t in "$@"; do n=$((n + 1)); printf '%s %s\n' "$n" "$t"; done |
    xargs -P "$jobs" -L 1 sh "$0" --one "$dir"
pass=0; fail=0; skip=0; crashed=0; n=0
for t in "$@"; do
    n=$((n + 1))
    if [ ! -f "$dir/$n.rc" ]; then
        echo "FAIL $t did not run"; fail=$((fail + 1)); crashed=1; continue
    fi
    pass=$((pass + $(grep -c '^PASS ' "$dir/$n.out")))
    fail=$((fail + $(grep -c '^FAIL ' "$dir/$n.out")))
    skip=$((skip + $(grep -c '^SKIP ' "$dir/$n.out")))
    [ "$(cat "$dir/$n.rc")" = ok ] || crashed=1
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ $crashed -eq 0 ]
