#!/bin/sh
# test_bench_quiet: the rules of make bench that need no llama.cpp and no
# quiet machine (tests/bench_lib.sh, and tests/bench.sh run end to end on a
# stand-in skv and llama-bench): the quiet check (load and calibration
# against the recorded quiet figure, with the thresholds the test sets), no
# ratio against a case with a run made under load and one line saying why,
# llama.cpp's better flash-attention mode chosen and said, the min and
# median of the rounds. Prints PASS/FAIL lines.
cd "$(dirname "$0")/.." || exit 1
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
check() { # DESCR CONDITION-STATUS
    if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
has() { printf '%s\n' "$1" | grep -q -- "$2"; }

OUT=$TMP/out; mkdir -p "$OUT"; T=2
BENCH_CORES=2; BENCH_LOADAVG_FILE=$TMP/loadavg; BENCH_CALIB_REF=$TMP/calib
export BENCH_CORES BENCH_LOADAVG_FILE BENCH_CALIB_REF
. tests/bench_lib.sh

# quiet: one task runnable (the reader itself), the first calibration recorded
echo "0.05 0.10 0.10 1/120 4242" >"$BENCH_LOADAVG_FILE"
BENCH_CALIB_MS=100 quiet_check; rc=$?
check "a quiet machine (nothing runnable besides the bench) is quiet, and its calibration becomes the quiet figure" \
    $([ $rc -eq 0 ] && grep -q '^100 ' "$BENCH_CALIB_REF" && echo 0 || echo 1)
BENCH_CALIB_MS=110 quiet_check; rc=$?
check "a calibration 10 % slower than the quiet figure is still quiet (limit 15 %)" \
    $([ $rc -eq 0 ] && has "$QUIET_WHY" "calibration 10 % slower" && echo 0 || echo 1)
BENCH_CALIB_MS=120 quiet_check; rc=$?
check "a calibration 20 % slower is loaded, and the reason says 20 %" \
    $([ $rc -ne 0 ] && has "$QUIET_WHY" "calibration 20 % slower than the quiet figure (120 ms against 100 ms)" && echo 0 || echo 1)
BENCH_CALIB_SLOW=25 BENCH_CALIB_MS=120 quiet_check; rc=$?
check "BENCH_CALIB_SLOW moves the calibration's limit" $([ $rc -eq 0 ] && echo 0 || echo 1)
echo "6.00 5.00 4.00 4/120 4242" >"$BENCH_LOADAVG_FILE"
BENCH_CALIB_MS=90 quiet_check; rc=$?
check "three tasks runnable besides the bench on 2 cores is loaded: 'load 3.0 on 2 cores', the 1-minute average said" \
    $([ $rc -ne 0 ] && has "$QUIET_WHY" "load 3.0 on 2 cores" && has "$QUIET_WHY" "1-minute load average 6.00" && echo 0 || echo 1)
check "a calibration under load never becomes the quiet figure" $(grep -q '^100 ' "$BENCH_CALIB_REF" && echo 0 || echo 1)
echo "0.50 0.50 0.50 2/120 4242" >"$BENCH_LOADAVG_FILE"
BENCH_QUIET_LOAD=0.75 BENCH_CALIB_MS=90 quiet_check; rc=$?
check "BENCH_QUIET_LOAD moves the load's limit; a faster quiet calibration becomes the quiet figure" \
    $([ $rc -eq 0 ] && grep -q '^90 ' "$BENCH_CALIB_REF" && echo 0 || echo 1)
BENCH_CALIB_MS=90 quiet_check; rc=$?
check "one task runnable besides the bench on 2 cores (limit 0.5) is loaded" $([ $rc -ne 0 ] && echo 0 || echo 1)

# the statistics and the flash-attention choice
check "minmed: the min and the median of the rounds" $([ "$(minmed 3 1 2)" = "1.00 2.00" ] && echo 0 || echo 1)
check "best_fa: the mode with the higher median wins (on)" $([ "$(best_fa "1 2 3" "4 5 6")" = on ] && echo 0 || echo 1)
check "best_fa: the mode with the higher median wins (off)" $([ "$(best_fa "7 8 9" "4 5 6")" = off ] && echo 0 || echo 1)

# a row: ratios when every run was quiet, none when one was loaded
echo "0.05 0.10 0.10 1/120 4242" >"$BENCH_LOADAVG_FILE"
export BENCH_CALIB_MS=90
case_begin; side_check skv; side_check llama
row=$(cmp_row "case" "20 30 40" "10 10 20" "1.0x" off)
check "a quiet case prints the ratio of the medians (3.00x), of the mins (2.00x) and paired (2.00x), and fa off" \
    $(has "$row" " off    3.00x    2.00x   2.00x" && echo 0 || echo 1)
echo "3.00 3.00 3.00 3/120 4242" >"$BENCH_LOADAVG_FILE"
side_check "llama.cpp tg128"
row=$(cmp_row "case" "20 30 40" "10 10 20" "1.0x" off)
why=$(case_why_line)
check "a case with one run under load prints its figures but no ratio: 'loaded'" \
    $(has "$row" "loaded" && ! has "$row" "[0-9][.][0-9][0-9]x" && has "$row" " 20.00 " && echo 0 || echo 1)
check "and one line says why: which run, the load on the cores, the calibration" \
    $(has "$why" "loaded: not comparable (1 of 3 runs" && has "$why" "llama.cpp tg128: load 2.0 on 2 cores" &&
      has "$why" "calibration" && echo 0 || echo 1)
check "and one line gives the spread over the case's checks: calibration min, median and max, the load's max" \
    $(has "$why" "Over the case's 3 checks: calibration min 90, median 90, max 90 ms against the quiet figure 90 ms; load at most 2." &&
      echo 0 || echo 1)
echo "0.05 0.10 0.10 1/120 4242" >"$BENCH_LOADAVG_FILE"
BENCH_CALIB_MS=150 side_check "skv again"
why=$(case_why_line)
check "a slow calibration at a quiet load is in the spread: max 150 ms, the median 90, the load's max still 2" \
    $(has "$why" "(2 of 4 runs" && has "$why" "Over the case's 4 checks: calibration min 90, median 90, max 150 ms" &&
      has "$why" "load at most 2." && echo 0 || echo 1)
row=$(cmp_row "case" "20 30 40" "" "1.0x")
check "no llama.cpp: 'not run', no ratio" $(has "$row" "not run" && ! has "$row" "[0-9][.][0-9][0-9]x" && echo 0 || echo 1)

# tests/bench.sh end to end on stand-ins: a skv that prints bench lines and a
# llama-bench that prints CSV (flash attention off 10 tok/s, on 5 tok/s)
mkdir -p "$TMP/shared/configs" "$TMP/bin"
echo '{}' >"$TMP/shared/configs/smollm2-135m.config.json"
cat >"$TMP/bin/skv" <<'EOF'
#!/bin/sh
case $1 in
    synth) while [ $# -gt 1 ]; do [ "$1" = -o ] && : >"$2"; shift; done ;;
    bench) echo "model=x kv=dense threads=2 prompt=1 decode=1 prefill_tok_s=30.0 decode_tok_s=20.00 decode_ms=50.0 dense_roof_tok_s=99.00" ;;
esac
EOF
cat >"$TMP/bin/llama-bench" <<'EOF'
#!/bin/sh
echo '"build_commit","flash_attn","n_prompt","avg_ts"'
echo '"abc","0","1","10.000000"'
echo '"abc","1","1","5.000000"'
EOF
chmod +x "$TMP/bin/skv" "$TMP/bin/llama-bench"
run_bench() {
    env SKV="$TMP/bin/skv" LLAMA_BENCH="$TMP/bin/llama-bench" SKV_SHARED="$TMP/shared" BENCH_OUT="$TMP/bench" \
        BENCH_ONLY=engine BENCH_ROUNDS=3 sh tests/bench.sh 2>&1
}
echo "0.05 0.10 0.10 1/120 4242" >"$BENCH_LOADAVG_FILE"
out=$(run_bench)
rows=$(printf '%s\n' "$out" | grep -c "^SmolLM2-135M f32 pp512 .* off  *3.00x  *3.00x  *3.00x")
check "make bench on a quiet machine: llama.cpp's better mode (fa off) and the ratios, each row once and in the targets" \
    $([ "$rows" -eq 2 ] && ! has "$out" "loaded" && echo 0 || echo 1)
echo "4.10 4.00 3.00 3/120 4242" >"$BENCH_LOADAVG_FILE"
out=$(run_bench)
check "make bench on a loaded machine prints no llama.cpp ratio, and says why (load 2.0 on 2 cores)" \
    $(! printf '%s\n' "$out" | grep "^SmolLM2\|^Llama" | grep -q "[0-9][.][0-9][0-9]x" && has "$out" "loaded: not comparable" &&
      has "$out" "load 2.0 on 2 cores" && echo 0 || echo 1)
if [ $fails -eq 0 ]; then echo "test_bench_quiet: all passed"; else echo "test_bench_quiet: $fails failed"; fi
[ $fails -eq 0 ]
