# bench_lib.sh: the pieces of tests/bench.sh that decide what it may print,
# sourced by it and by tests/test_bench_quiet.sh (which needs no llama.cpp):
# the quiet check made before every timed run, the statistics of the rounds
# (min, median, ratios), the choice of llama.cpp's better flash-attention
# mode, and the comparison row that prints no ratio against a run made
# under load. POSIX sh; the caller sets OUT (a folder) and T (threads).

# ---- statistics --------------------------------------------------------------

# ratio A B -> "A/Bx", or "-" unless both are numbers and B > 0
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'; }

# minmed V... -> "min median" of the numbers among V ("- -" when none)
minmed() { spread "$@" | awk '$1 == "-" { print "- -"; next } { printf "%.2f %.2f\n", $1, $2 }'; }

# spread V... -> "min median max" of the numbers among V ("- - -" when none)
spread() {
    printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 }
        END { if (!NR) { print "- - -"; exit }
              m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.10g %.10g %.10g\n", v[1], m, v[NR] }'
}

# paired A B -> the median over rounds of A_i / B_i, A and B being the
# rounds' values in order ("-" unless both have every round). Each pair ran
# back to back, so a change in the host's load between rounds moves both
# sides of a pair alike; the ratio of the medians does not pair them.
paired() {
    awk -v a="$1" -v b="$2" 'BEGIN {
        na = split(a, x, " "); nb = split(b, y, " ")
        if (!na || na != nb) { print "-"; exit }
        for (i = 1; i <= na; i++) {
            if (x[i] !~ /^[0-9.]+$/ || y[i] !~ /^[0-9.]+$/ || y[i] + 0 <= 0) { print "-"; exit }
            r[i] = x[i] / y[i]
        }
        for (i = 2; i <= na; i++) for (j = i; j > 1 && r[j - 1] > r[j]; j--) { t = r[j]; r[j] = r[j - 1]; r[j - 1] = t }
        printf "%.2fx\n", na % 2 ? r[(na + 1) / 2] : (r[na / 2] + r[na / 2 + 1]) / 2 }'
}

# best_fa OFF_VALUES ON_VALUES -> "off" or "on": the flash-attention mode of
# llama.cpp with the higher median over the rounds (tok/s; "off" on a tie,
# "-" when neither has a figure)
best_fa() {
    set -- "$(minmed $1)" "$(minmed $2)"
    awk -v a="${1#* }" -v b="${2#* }" 'BEGIN { if (a !~ /^[0-9.]+$/) a = -1; if (b !~ /^[0-9.]+$/) b = -1
        if (a < 0 && b < 0) print "-"; else if (b > a) print "on"; else print "off" }'
}

# ---- is the machine quiet? ------------------------------------------------------
# Before each side's run the bench looks at two things:
#  - the load: the tasks runnable besides the bench (the 4th field of
#    /proc/loadavg, less the shell reading it), the mean of 10 samples over 1 s,
#    against the cores: over BENCH_QUIET_LOAD (default 0.25) a core is
#    loaded. (Not the 1-minute load average alone: the bench's own runs of
#    the last minute are in it; it is said beside.)
#  - a calibration: T copies at once of a fixed single-thread loop, the best
#    of 3 tries, against the best this machine did when the load was quiet
#    (recorded in $OUT/quiet-calib, with the host and CPU it was taken on);
#    over BENCH_CALIB_SLOW percent (default 15) slower is loaded.
# The test overrides: BENCH_LOADAVG_FILE (a file in /proc/loadavg's format),
# BENCH_CALIB_MS (the calibration's result, ms), BENCH_CORES.

BENCH_CORES=${BENCH_CORES:-$(nproc 2>/dev/null || echo 1)}
QUIET_REF=${BENCH_CALIB_REF:-$OUT/quiet-calib}

# load_now -> the mean runnable tasks besides the bench over 1 s
load_now() {
    lf=${BENCH_LOADAVG_FILE:-/proc/loadavg}
    i=0; s=0
    while [ $i -lt 10 ]; do
        # read by the shell itself (a command substitution would add its own
        # subshell and cut to the count, which made an idle machine read 0.9)
        read -r _ _ _ r _ < "$lf"; r=${r%/*}
        s=$((s + r - 1)); i=$((i + 1))
        [ -n "${BENCH_LOADAVG_FILE:-}" ] || sleep 0.1
    done
    awk -v s="$s" 'BEGIN { v = s / 10; printf "%.1f\n", (v < 0 ? 0 : v) }'
}

# calib_ms -> the calibration's time in ms (the slowest of the T copies, the
# best of 3 tries)
calib_ms() {
    if [ -n "${BENCH_CALIB_MS:-}" ]; then echo "$BENCH_CALIB_MS"; return; fi
    best=0
    for try in 1 2 3; do
        t0=$(date +%s%N)
        j=0
        while [ $j -lt "${T:-1}" ]; do
            awk 'BEGIN { for (i = 0; i < 2000000; i++) s += i % 7; exit s < 0 }' &
            j=$((j + 1))
        done
        wait
        t=$((($(date +%s%N) - t0) / 1000000))
        if [ "$best" -eq 0 ] || [ "$t" -lt "$best" ]; then best=$t; fi
    done
    echo "$best"
}

# the key a quiet figure is valid for: this host, its CPU, T copies
calib_key() { echo "$(uname -n)|$(sed -n 's/^model name[^:]*: *//p' /proc/cpuinfo 2>/dev/null | head -n 1)|T=${T:-1}" | tr ' ' '_'; }

# quiet_check: 0 when the machine is quiet, 1 when loaded; QUIET_WHY says
# what was seen either way ("load 0.1 on 2 cores, calibration 3% slow").
# A quiet load records the calibration as the quiet figure when it is the
# first for this key or faster than the recorded one.
quiet_check() {
    ld=$(load_now)
    cm=$(calib_ms)
    key=$(calib_key)
    ref=""
    if [ -f "$QUIET_REF" ]; then ref=$(awk -v k="$key" '$2 == k { print $1; exit }' "$QUIET_REF"); fi
    lmax=$(awk -v c="$BENCH_CORES" -v f="${BENCH_QUIET_LOAD:-0.25}" 'BEGIN { printf "%.2f", c * f }')
    busy=$(awk -v l="$ld" -v m="$lmax" 'BEGIN { print ((l > m) ? 1 : 0) }')
    la=$(cut -d' ' -f1 "${BENCH_LOADAVG_FILE:-/proc/loadavg}")
    if [ "$busy" -eq 0 ] && { [ -z "$ref" ] || [ "$cm" -lt "$ref" ]; }; then
        { [ -f "$QUIET_REF" ] && awk -v k="$key" '$2 != k' "$QUIET_REF"; echo "$cm $key"; } >"$QUIET_REF.tmp"
        mv "$QUIET_REF.tmp" "$QUIET_REF"
        [ -n "$ref" ] || ref=$cm
    fi
    if [ -n "$ref" ]; then
        slow=$(awk -v c="$cm" -v r="$ref" 'BEGIN { printf "%.0f", (r > 0 ? (c - r) / r * 100 : 0) }')
        cal="calibration $slow % slower than the quiet figure ($cm ms against $ref ms)"
        late=$(awk -v s="$slow" -v m="${BENCH_CALIB_SLOW:-15}" 'BEGIN { print ((s > m) ? 1 : 0) }')
    else
        cal="calibration $cm ms, no quiet figure recorded yet to compare it with"
        late=0
    fi
    QUIET_CALIB_MS=$cm; QUIET_LOAD=$ld; QUIET_FIGURE=$ref
    QUIET_WHY="load $ld on $BENCH_CORES cores (tasks runnable besides the bench, mean over 1 s; at most $lmax is quiet;\
 1-minute load average $la), $cal (at most ${BENCH_CALIB_SLOW:-15} % is quiet)"
    [ "$busy" -eq 0 ] && [ "$late" -eq 0 ]
}

# ---- a case's runs: quiet or not --------------------------------------------------
# case_begin before a case's runs; side_check before each side's run (a
# loaded one marks the whole case); case_loaded says whether any was.
# Every check's calibration and load are kept (CASE_CALIBS, CASE_LOADS) for
# the spread case_why_line gives.
case_begin() { CASE_LOADED=0; CASE_WHY=""; CASE_RUNS=0; CASE_LOADED_RUNS=0; CASE_CALIBS=""; CASE_LOADS=""; }
side_check() {
    CASE_RUNS=$((CASE_RUNS + 1))
    if [ -n "${BENCH_NO_QUIET_CHECK:-}" ]; then return 0; fi
    if quiet_check; then q=0; else q=1; fi
    CASE_CALIBS="$CASE_CALIBS $QUIET_CALIB_MS"; CASE_LOADS="$CASE_LOADS $QUIET_LOAD"
    if [ $q -ne 0 ]; then
        CASE_LOADED=1; CASE_LOADED_RUNS=$((CASE_LOADED_RUNS + 1))
        [ -n "$CASE_WHY" ] || CASE_WHY="$1: $QUIET_WHY"
    fi
}
case_loaded() { [ "$CASE_LOADED" -eq 1 ]; }
# the one line that says why a case's rows carry no ratio
case_why_line() {
    echo "   loaded: not comparable ($CASE_LOADED_RUNS of $CASE_RUNS runs of this case were made under load; no ratio is"
    echo "   printed against them). The first: $CASE_WHY"
    # the spread over all the case's checks: a slow calibration at a load
    # near 0 points to CPU taken outside this machine, not to a process on it
    set -- $(spread $CASE_CALIBS)
    echo "   Over the case's $CASE_RUNS checks: calibration min $1, median $2, max $3 ms against the quiet figure" \
        "${QUIET_FIGURE:--} ms; load at most $(spread $CASE_LOADS | cut -d' ' -f3)."
}

# cmp_row LABEL SKV_VALUES OTHER_VALUES TARGET [FA] [ROOF_VALUES]: one row of
# a comparison: each side's min and median over the rounds, the ratio of the
# medians and of the mins, the paired ratio, the target; FA says which of
# llama.cpp's flash-attention modes the other side's values are ("-" when
# the other side is skv or not llama.cpp). With OTHER_VALUES empty the other
# side was not run: "not run", no ratio. When the case was loaded no ratio
# is printed: "loaded" in their place (case_why_line says why).
CMP_FMT='%-72s %9s %9s %9s %9s %4s %8s %8s %7s %6s %7s'
cmp_head() { printf "$CMP_FMT\n" "$1" "skv min" "median" "ref min" "median" "fa" "ratio" "of mins" "paired" "target" "roof"; }
cmp_row() {
    set -- "$1" "$2" "${3:-}" "${4:--}" "${5:--}" "${6:-}"
    s=$(minmed $2); o=$(minmed $3); roof=$(minmed $6); roof=${roof#* }
    if [ -z "$3" ]; then rm_="not run"; rn="-"; pr="-"
    elif case_loaded; then rm_="loaded"; rn="loaded"; pr="loaded"
    else rm_=$(ratio "${s#* }" "${o#* }"); rn=$(ratio "${s% *}" "${o% *}"); pr=$(paired "$2" "$3"); fi
    om=${o% *}; od=${o#* }
    [ -n "$3" ] || { om="-"; od="not run"; }
    printf "$CMP_FMT\n" "$1" "${s% *}" "${s#* }" "$om" "$od" "$5" "$rm_" "$rn" "$pr" "$4" "$roof"
}
