#!/bin/sh
# make fuzz: runs every harness for $1 seconds on its corpus (seeds from
# seeds.sh, plus the committed regression inputs). Prints executions, exec/s
# and coverage per harness; exits non-zero at the first crash (its input is
# left as build-fuzz/crash-NAME-*; add it to tests/fuzz/regress/NAME/).
set -eu
SECS=${1:-60}
sh tests/fuzz/seeds.sh
fail=0
printf '%-12s %12s %10s %8s %8s\n' harness executions exec/s cov ft
for b in build-fuzz/fuzz_*; do
    case $b in *.d) continue ;; esac
    h=${b#build-fuzz/fuzz_}
    mkdir -p "build-fuzz/corpus/$h" "tests/fuzz/regress/$h"
    log="build-fuzz/fuzz-$h.log"
    if ! SKV_THREADS=1 "$b" -max_total_time="$SECS" -rss_limit_mb=3072 -timeout=30 -max_len=65536 \
            -artifact_prefix="build-fuzz/crash-$h-" -print_final_stats=1 \
            "build-fuzz/corpus/$h" "tests/fuzz/regress/$h" >"$log" 2>&1; then
        fail=1
        echo "fuzz_$h: CRASH (see $log and build-fuzz/crash-$h-*)"
        grep -m 5 -E "ERROR|runtime error|SUMMARY" "$log" || true
        continue
    fi
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
    cov=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -n 's/.*cov: \([0-9]*\).*/\1/p')
    ft=$(grep -E '^#[0-9]+' "$log" | tail -1 | sed -n 's/.*ft: \([0-9]*\).*/\1/p')
    printf '%-12s %12s %10s %8s %8s\n' "$h" "${runs:-?}" "${speed:-?}" "${cov:-?}" "${ft:-?}"
done
# the Python trace reader: a bounded mutation loop of its own
if ! tests/fuzz/fuzz_skvtrace.py "$SECS"; then
    fail=1
fi
exit $fail
