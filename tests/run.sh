#!/bin/sh
# Runs every test binary given, prints its output, and closes with one line
# "N passed, N failed" (plus skipped). Exits non-zero if any check failed or
# any binary crashed.
#
# Each test runs under `timeout -k 10 N` (N = $SKV_TEST_TIMEOUT seconds,
# default 900: the slowest test takes about 6 min alone on 2 busy cores, more
# under ASan). A test still running after N s gets SIGTERM, and SIGKILL 10 s
# later, with every process it started (timeout signals its process group);
# it then counts as one failure, "FAIL <test> timed out after N s", and the
# suite goes on. Each test's wall time follows its output ("TIME <test> S s").
limit=${SKV_TEST_TIMEOUT:-900}
case $limit in '' | *[!0-9]*) echo "SKV_TEST_TIMEOUT must be whole seconds, not '$limit'" >&2; exit 2 ;; esac
pass=0; fail=0; skip=0; crashed=0
for t in "$@"; do
    t0=$(date +%s)
    out=$(timeout -k 10 "$limit" "$t" 2>&1); rc=$?
    secs=$(($(date +%s) - t0))
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | grep -c '^PASS ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    # 124: timeout's SIGTERM ended it; 137 (SIGKILL) after the limit: -k's kill
    if [ $rc -eq 124 ] || { [ $rc -eq 137 ] && [ $secs -ge "$limit" ]; }; then
        echo "FAIL $t timed out after $limit s"; fail=$((fail + 1)); crashed=1
    elif [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $t exited with status $rc"; fail=$((fail + 1)); crashed=1
    fi
    echo "TIME $t $secs s"
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ $crashed -eq 0 ]
