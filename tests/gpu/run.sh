#!/bin/sh
# run.sh: every check and measurement of the CUDA backend that needs a GPU,
# in one call on the device machine, within a time budget it cannot overrun.
# `make gpu-check` packs it with everything it needs (build/gpu-check/:
# skv-gpu.tar.xz and gpu-check.sh, which unpacks the bundle and runs this);
# on the box:
#     OUT=/some/dir sh gpu-check.sh
# Environment:
#   OUT                where the results go (default ./out): at most 8 files,
#                      each cut to 16 MiB
#   SKV_GPU_BUDGET     seconds for everything (default 510: done within 9 min
#                      even if a step hangs, so that with the machine's
#                      start the call fits a 15-minute device budget; each
#                      step has its own timeout, never past what is left)
#   SKV_GPU_CHECK_CPU  1: the CPU fallback with tiny sizes, to try the script
#                      where no GPU is (tests/test_gpu_check.py)
#   SKV_GPU_CHECK_HANG a step's name: that step hangs instead (tests the timeouts)
# Models are synthesized on the box (../shared does not travel): random
# weights change no speed, and the tests compare the GPU with the CPU on the
# same weights. The 8B model is written in the background while the tests run.
# Order: device info; the op tests (every kernel against its CPU twin); the
# whole-model tests (CPU vs GPU logits) on a small model and on the
# Llama-3.1-8B shape with 2 layers; one layer's projections at batches 1 to
# 64, the backend's kernels beside cuBLAS; a traced decode step and its timeline PNG;
# then the benches, dense and ShadowKV, each from its own prefill, at
# batches of 1, 4 and the largest that fits, with the backend's own count of
# launches and host syncs a decode step (SKV_CUDA_COUNT=1): at 122K on one
# layer of the 8B shape (its prefill: the prefill attention's speed and
# ShadowKV's prefill overhead) and on two (the second layer's time, to
# project the whole model's tok/s); on the whole 8B shape at 8K and 32K;
# 122K on the whole model only when the prefill speed measured at 8K and 32K
# says it fits; then compute-sanitizer on the op tests if time remains.
# Results: run.log (every step's output), summary.txt (a line a step: ok,
# FAILED rc, TIMED OUT, skipped, with seconds; the bench lines; then the
# table of figures beside their targets in ../shared/GPU.md, made by
# summary.sh), bench.txt, gpu.trace, timeline.png, sanitizer.log.
set -u
cd "$(dirname "$0")"
HERE=$PWD
OUT=${OUT:-out}
mkdir -p "$OUT" || { echo "run.sh: cannot make $OUT" >&2; exit 2; }
OUT=$(cd "$OUT" && pwd)
BUDGET=${SKV_GPU_BUDGET:-510}
CPU=${SKV_GPU_CHECK_CPU:-0}
START=$(date +%s)
DEADLINE=$((START + BUDGET))
RESERVE=5 # kept back for the summary and the cut of the files
LOG=$OUT/run.log
SUM=$OUT/summary.txt
: > "$LOG"
: > "$SUM"
: > "$OUT/bench.txt"
export LD_LIBRARY_PATH="$HERE/lib:${LD_LIBRARY_PATH:-}"
SKV=$HERE/bin/skv
FAILS=0

now() { date +%s; }
say() { echo "$*" | tee -a "$LOG"; }
# note NAME STATUS SECONDS: a line of the summary
note() { printf '%-22s %-34s %4ss\n' "$1" "$2" "$3" | tee -a "$SUM" >> "$LOG"; }

# step NAME CAP CMD...: runs CMD under a timeout of CAP seconds, or of what
# is left of the budget when that is less; output into the log. Returns CMD's
# status (124: timed out; 125: no time left to start it). A process that
# does not die after its SIGKILL (stuck in the driver) is left behind, so
# the script still ends on time.
step() {
    name=$1 cap=$2
    shift 2
    left=$(($DEADLINE - $(now) - RESERVE))
    t=$cap
    [ "$left" -lt "$t" ] && t=$left
    if [ "$t" -lt 3 ]; then
        note "$name" "skipped: no time left" 0
        return 125
    fi
    [ "${SKV_GPU_CHECK_HANG:-}" = "$name" ] && set -- sleep 100000
    echo "== $name (timeout ${t}s): $*" >> "$LOG"
    t0=$(now)
    timeout -k 3 "$t" "$@" >> "$LOG" 2>&1 &
    pid=$!
    hard=$((t0 + t + 8))
    while kill -0 "$pid" 2>/dev/null && [ "$(now)" -le "$hard" ]; do sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then
        rc=124
        note "$name" "TIMED OUT after ${t}s (left running)" $(($(now) - t0))
    else
        wait "$pid"
        rc=$?
        case $rc in
        0) note "$name" ok $(($(now) - t0)) ;;
        124 | 137) rc=124; note "$name" "TIMED OUT after ${t}s" $(($(now) - t0)) ;;
        *) note "$name" "FAILED (exit $rc)" $(($(now) - t0)) ;;
        esac
    fi
    [ "$rc" -ne 0 ] && FAILS=$((FAILS + 1))
    return "$rc"
}

# The shapes: the 8B config on a GPU; the small demo config, tiny, on the CPU.
if [ "$CPU" = 1 ]; then
    BE=cpu
    BIG_CFG=configs/default-model.config.json BIG_DT=f32
    CTXS="128 256" CTX_BIG=1024 NDEC=4 NDEC_BIG=3
    PAR_DENSE=1,4,fit PAR_SK=1,4,fit PAR_LONG_SK=1,4,fit PAR_2L=1,4
    SKOPT="--rank 16 --budget 32 --outliers 2"
    TRACE_OPT="--rank 16 --budget 32"
    DENSE_OPT="--f16-kv"
else
    BE=cuda
    BIG_CFG=configs/llama-3.1-8b.config.json BIG_DT=bf16
    CTXS="8192 32768" CTX_BIG=122880 NDEC=32 NDEC_BIG=8
    # batches: 1, 4 and the largest that fits, run for dense (max) and said
    # for ShadowKV (fit: its pinned values take about 1 s a GB to allocate);
    # at 122K also 14, the batch of ../shared/GPU.md's ShadowKV figures
    PAR_DENSE=1,4,max PAR_SK=1,4,fit PAR_LONG_SK=1,4,14,fit PAR_2L=1,4,14
    SKOPT="" # the paper's settings: rank 160, chunk 8, budget 2048, 48 outliers
    TRACE_OPT="--rank 32 --budget 64"
    # dense at its best, the baseline ShadowKV is held to: a half-precision
    # cache (PyTorch's SDPA figures read bf16; an f32 cache reads twice the
    # bytes a step)
    DENSE_OPT="--f16-kv"
fi
PROJ_OPT="--reps 20" # the 8B shape; on the CPU fallback bench_proj finds no device and says so

say "skv gpu-check: budget ${BUDGET}s, backend $BE, results in $OUT"
step device 30 sh -c "(nvidia-smi || echo 'nvidia-smi: not found'); uname -a; nproc; free -g; \
    '$SKV' --version; '$SKV' info --backends"
if [ "$CPU" != 1 ] && "$SKV" info --backends 2>&1 | grep -A1 '^  cuda' | grep -q 'not available'; then
    say "run.sh: no usable CUDA device here (skv info --backends above says why); nothing else run"
    note device-usable "FAILED (no CUDA device)" 0
    exit 1
fi

# the full-size model, written in the background while the tests run
BIG=$HERE/big.gguf
if [ ! -f "$BIG" ]; then
    echo "== synth-big (background): $SKV synth --config $BIG_CFG --dtype $BIG_DT" >> "$LOG"
    ( timeout -k 3 $((BUDGET / 2)) "$SKV" synth --config "$BIG_CFG" --dtype "$BIG_DT" --seed 1 -o "$BIG.part" \
        > "$OUT/.synth.log" 2>&1 && mv "$BIG.part" "$BIG" ) &
    SYNTH_PID=$!
else
    SYNTH_PID=
fi

step synth-small 60 "$SKV" synth --config configs/default-model.config.json --dtype f32 --seed 7 -o small.gguf --force
step synth-2layer 90 "$SKV" synth --config "$BIG_CFG" --dtype "$BIG_DT" --layers 2 --seed 1 -o big-2l.gguf --force

step op-tests 120 bin/test_cuda_ops ||
    step op-tests-sync 120 env SKV_CUDA_SYNC=1 bin/test_cuda_ops  # again, a sync after each launch: names the kernel
step model-small 60 env SKV_GPU_MODEL=small.gguf bin/test_cuda_model
step model-2layer 90 env SKV_GPU_MODEL=big-2l.gguf bin/test_cuda_model
# one layer's decode projections at batches 1 to 64 (8B shape): the
# backend's kernels (k_matvec, k_matmma), k_matmma with two chunks loaded
# ahead (--prefetch 2: SKV_CUDA_MM_PREFETCH=2), then cuBLAS on the same
# shapes (--cublas: SKV_CUDA_GEMM_ROWS=0); a "proj" line a batch into the summary
step proj-bench 60 sh -c "bin/bench_proj $PROJ_OPT > '$OUT/.proj.txt' && \
    bin/bench_proj --prefetch 2 $PROJ_OPT --n 9,16,32,64 >> '$OUT/.proj.txt' && \
    bin/bench_proj --cublas $PROJ_OPT --n 8,9,16,32,64 >> '$OUT/.proj.txt'"
cat "$OUT/.proj.txt" 2>/dev/null | tee -a "$LOG" >> "$SUM"
{ echo "step=proj-bench layers=1"; grep '^proj ' "$OUT/.proj.txt" 2>/dev/null; } >> "$OUT/bench.txt" # for summary.sh's table
rm -f "$OUT/.proj.txt"

rm -f "$OUT/gpu.trace" "$OUT/timeline.png"
step traced-step 60 "$SKV" run --backend $BE -m big-2l.gguf --kv shadowkv $TRACE_OPT -f configs/default-model.config.json \
    -n 4 --trace "$OUT/gpu.trace" &&
    step timeline-png 30 "$SKV" export --trace "$OUT/gpu.trace" --view timeline --step 2 -o "$OUT/timeline.png"

# bench_step NAME CAP MODEL CTX LAYERS ARGS...: skv bench of MODEL (LAYERS: 1
# or 2 for a cut model, 0 the whole) at CTX prompt tokens as step NAME, with
# the CUDA backend's counts of each decode run (SKV_CUDA_COUNT=1: launches,
# graph launches and host syncs a step); a "step=" marker and its lines straight into
# bench.txt (a line a policy and batch, as each ends), then into the
# summary; the rest of its output into the log
bench_step() {
    bname=$1 bcap=$2 bmodel=$3 bctx=$4 blayers=$5
    shift 5
    echo "step=$bname layers=$blayers" >> "$OUT/bench.txt"
    b0=$(wc -l < "$OUT/bench.txt")
    step "$bname" "$bcap" sh -c "SKV_CUDA_COUNT=1 exec '$SKV' bench --backend $BE -m '$bmodel' --prompt-tokens $bctx \
        -c $((bctx + NDEC + 16)) $* >> '$OUT/bench.txt'"
    brc=$?
    sed -n "$((b0 + 1)),\$p" "$OUT/bench.txt" | tee -a "$LOG" >> "$SUM"
    return $brc
}
# bench CTX POLICY CAP: the whole model at CTX, batches of 1, 4 and the
# largest that fits (PAR_DENSE, PAR_SK), each policy from its own prefill
bench() {
    [ -f "$BIG" ] || { note "bench-$1-$2" "skipped: no model" 0; return 1; }
    opts="--parallel $PAR_DENSE $DENSE_OPT"
    [ "$2" = shadowkv ] && opts="--parallel $PAR_SK $SKOPT"
    bench_step "bench-$1-$2" "$3" "$BIG" "$1" 0 -n $NDEC --kv $2 $opts
}
# prefill seconds at ctx on the whole model, from its bench line (empty when
# none): its prefill, and the recording for the forks said apart
pre_secs() {
    awk -v n="$1" '/^step=/ { whole = / layers=0/ } whole && $0 ~ "prompt=" n " " { print; exit }' "$OUT/bench.txt" |
        awk -v n="$1" '{ p = r = 0
            if (match($0, / prefill_tok_s=[0-9.]+/)) p = substr($0, RSTART + 15, RLENGTH - 15) + 0
            if (match($0, / prefill_record_s=[0-9.]+/)) r = substr($0, RSTART + 18, RLENGTH - 18) + 0
            if (p > 0) printf "%.1f\n", n / p + r }'
}

# The long context first, on one and two layers of the shape (the whole
# model's 122K prefill does not fit the budget): each policy from its own
# prefill (the prefill attention on tensor cores, target within 2x of
# PyTorch SDPA's 311 ms a layer at 122,880 on an H100, and ShadowKV's
# prefill overhead, target 6% or less), decode at batches of 1 and 4, and
# the largest that fits one layer said (fit); the two-layer run gives the
# second layer's step time, so the summary projects the whole model's tok/s.
step synth-1layer 60 "$SKV" synth --config "$BIG_CFG" --dtype "$BIG_DT" --layers 1 --seed 1 -o big-1l.gguf --force
if [ -f big-1l.gguf ]; then
    bench_step "bench-$CTX_BIG-1l-dense" 75 big-1l.gguf "$CTX_BIG" 1 -n $NDEC_BIG --kv dense --parallel 1,4,fit $DENSE_OPT
    bench_step "bench-$CTX_BIG-1l-shadowkv" 90 big-1l.gguf "$CTX_BIG" 1 -n $NDEC_BIG --kv shadowkv \
        --parallel $PAR_LONG_SK $SKOPT
else
    note "bench-$CTX_BIG-1l" "skipped: no model" 0
fi
if [ -f big-2l.gguf ]; then
    bench_step "bench-$CTX_BIG-2l" 120 big-2l.gguf "$CTX_BIG" 2 -n $NDEC_BIG --kv dense,shadowkv --parallel $PAR_2L $SKOPT $DENSE_OPT
else
    note "bench-$CTX_BIG-2l" "skipped: no model" 0
fi

# wait for the background model (never past the budget)
if [ -n "$SYNTH_PID" ]; then
    while kill -0 "$SYNTH_PID" 2>/dev/null && [ "$(now)" -lt $((DEADLINE - RESERVE)) ]; do sleep 0.5; done
    cat "$OUT/.synth.log" >> "$LOG" 2>/dev/null
    rm -f "$OUT/.synth.log"
fi
if [ -f "$BIG" ]; then
    note synth-big ok $(($(now) - START))
else
    note synth-big "FAILED (not written in time)" $(($(now) - START))
    FAILS=$((FAILS + 1))
fi

set -- $CTXS
bench "$1" dense 60
bench "$1" shadowkv 75
bench "$2" dense 90
bench "$2" shadowkv 100
p1=$(pre_secs "$1")
p2=$(pre_secs "$2")
if [ -n "$p1" ] && [ -n "$p2" ]; then
    # t(n) = a n + b n^2 through both points, at CTX_BIG, with a quarter more for the decode and the forks
    est=$(awk -v n1="$1" -v n2="$2" -v t1="$p1" -v t2="$p2" -v n="$CTX_BIG" 'BEGIN {
        b = (t2 / n2 - t1 / n1) / (n2 - n1); if (b < 0) b = 0; a = t1 / n1 - b * n1; if (a < 0) a = 0;
        printf "%d\n", 1.25 * (a * n + b * n * n) + 10 }')
    left=$(($DEADLINE - $(now) - RESERVE - 30))
    say "bench-$CTX_BIG: prefill ${p1}s at $1, ${p2}s at $2: about ${est}s needed, ${left}s left"
    if [ "$est" -le "$left" ]; then
        bench_step "bench-$CTX_BIG" "$left" "$BIG" "$CTX_BIG" 0 -n $NDEC_BIG --kv dense,shadowkv --parallel 1,4 $SKOPT $DENSE_OPT
    else
        note "bench-$CTX_BIG" "skipped: needs ~${est}s, ${left}s left" 0
    fi
else
    note "bench-$CTX_BIG" "skipped: no prefill speed measured" 0
fi

# compute-sanitizer on the op tests, in what is left
if command -v compute-sanitizer > /dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
    CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    step sanitizer $(($DEADLINE - $(now))) sh -c "'$CS' --tool memcheck --leak-check full bin/test_cuda_ops > '$OUT/sanitizer.log' 2>&1; \
        rc=\$?; tail -5 '$OUT/sanitizer.log'; exit \$rc"
else
    note sanitizer "skipped: compute-sanitizer not found" 0
fi

# the figures beside their targets
sh "$HERE/summary.sh" "$OUT/bench.txt" "$CTX_BIG" | tee -a "$LOG" >> "$SUM"

# no file over 16 MiB, nothing but the results
rm -f "$OUT/.synth.log"
for f in "$OUT"/*; do
    [ -f "$f" ] || continue
    if [ "$(wc -c < "$f")" -gt 16777216 ]; then
        truncate -s 16776000 "$f"
        echo "run.sh: $(basename "$f") cut to 16 MiB" >> "$SUM"
    fi
done
say "run.sh: $FAILS step(s) not ok, $(($(now) - START))s of ${BUDGET}s"
cat "$SUM"
[ "$FAILS" -eq 0 ]
