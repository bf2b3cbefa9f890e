#!/bin/sh
# Runs every test binary given, prints its output, and closes with one line
# "N passed, N failed" (plus skipped). Exits non-zero if any check failed or
# any binary crashed.
pass=0; fail=0; skip=0; crashed=0
for t in "$@"; do
    out=$("$t" 2>&1); rc=$?
    printf '%s\n' "$out"
    p=$(printf '%s\n' "$out" | grep -c '^PASS ')
    f=$(printf '%s\n' "$out" | grep -c '^FAIL ')
    s=$(printf '%s\n' "$out" | grep -c '^SKIP ')
    pass=$((pass + p)); fail=$((fail + f)); skip=$((skip + s))
    if [ $rc -ne 0 ] && [ "$f" -eq 0 ]; then
        echo "FAIL $t exited with status $rc"; fail=$((fail + 1)); crashed=1
    fi
done
echo "$pass passed, $fail failed, $skip skipped"
[ $fail -eq 0 ] && [ $crashed -eq 0 ]
