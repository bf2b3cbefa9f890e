#!/bin/sh
# make bench: prefill and decode speed of skv with 2 threads, side by side
# with llama.cpp run live in the same sitting on the same GGUF files, as
# ratios that cannot flatter skv:
#  - llama.cpp runs with flash attention off and on (llama-bench -fa 0,1;
#    llama-batched-bench -fa off and -fa on), and the mode with the better
#    median is the reference; each row says which won (fa).
#  - before each side's run the machine is checked quiet (tests/bench_lib.sh:
#    the tasks runnable besides the bench, and a calibration loop against
#    this machine's quiet figure in build/bench/quiet-calib). A case with a
#    run made under load prints its figures marked "loaded", no ratio, and
#    one line saying why.
#  - each case runs BENCH_ROUNDS rounds (default 3, at least 3 for a ratio),
#    skv and llama.cpp interleaved; each side's min and median, the ratio of
#    the medians and of the mins, and the paired ratio.
# llama.cpp's tools come from `make bench-ref` (tests/bench_ref.sh: the
# llama.cpp source pinned in the npm package node-llama-cpp, built CPU-only
# into build/ref/); LLAMA_BENCH=/path and LLAMA_BATCHED=/path pick other
# builds. Without them the llama.cpp column says "not run" and why: a ratio
# against figures from another day and build would not be a measurement.
# Synthetic models of the SmolLM2-135M shape and of the Llama-3.1-8B shape
# with 2 layers are made once under build/bench/ (BENCH_OUT: another folder).
set -eu
SKV=${SKV:-./skv}
SHARED=${SKV_SHARED:-../shared}
OUT=${BENCH_OUT:-build/bench}
mkdir -p "$OUT"
T=2
ROUNDS=${BENCH_ROUNDS:-3}
. "$(dirname "$0")/bench_lib.sh"
# BENCH_ONLY=a,b runs some of the parts: engine (beside llama.cpp), shadowkv
# (ShadowKV against dense), policies (the six side by side), batch (Table 3:
# batched decode beside llama-batched-bench), probes.
want() { case ",${BENCH_ONLY:-engine,shadowkv,policies,batch,probes}," in *",$1,"*) return 0 ;; esac; return 1; }
for part in $(echo "${BENCH_ONLY:-}" | tr ',' ' '); do
    case $part in
        engine | shadowkv | policies | batch | probes) ;;
        *) echo "bench: BENCH_ONLY: no part '$part' (the parts: engine, shadowkv, policies, batch, probes)" >&2; exit 2 ;;
    esac
done
if [ -z "${LLAMA_BENCH:-}" ] && [ -x build/ref/llama-bench ]; then LLAMA_BENCH=build/ref/llama-bench; fi
LLAMA_BENCH=${LLAMA_BENCH:-}
if [ -z "${LLAMA_BATCHED:-}" ] && [ -x build/ref/llama-batched-bench ]; then LLAMA_BATCHED=build/ref/llama-batched-bench; fi
LLAMA_BATCHED=${LLAMA_BATCHED:-}
# Why llama.cpp is not run, when make bench-ref could not make it usable.
REF_WHY=$(cat build/ref/unusable 2>/dev/null || echo "make bench-ref builds it from the pinned source")
[ "$ROUNDS" -ge 3 ] || echo "bench: BENCH_ROUNDS=$ROUNDS: fewer than 3 rounds; the min and median are of $ROUNDS"
echo "bench: the machine: $BENCH_CORES cores; each timed run is preceded by a quiet check (load and calibration;"
echo "       the quiet figure in $QUIET_REF)"

synth() { # dtype [config] [layers]
    cfg=${2:-smollm2-135m}; tag=$cfg-$1; lay=""
    if [ -n "${3:-}" ]; then tag=$cfg-${3}l-$1; lay="--layers $3"; fi
    f="$OUT/$tag.gguf"
    [ -f "$f" ] || $SKV synth --config "$SHARED/configs/$cfg.config.json" --dtype "$1" $lay --seed 1 -o "$f" >&2
    echo "$f"
}

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

# llama MODEL PROMPT GEN DEPTH -> "OFF ON": llama-bench's tokens/s with flash
# attention off and on (avg_ts and flash_attn, read by column name; "-" for a
# mode that failed)
llama() {
    "$LLAMA_BENCH" -m "$1" -p "$2" -n "$3" -d "$4" -t $T -r 1 -fa 0,1 -o csv 2>/dev/null | awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); if (h == "avg_ts") c = i; if (h == "flash_attn") f = i }
                  next }
        c && f { v = $c; gsub(/"/, "", v); m = $f; gsub(/"/, "", m); if (m + 0 == 1) on = v; else if (m + 0 == 0) off = v }
        END { printf "%s %s\n", off != "" ? sprintf("%.2f", off) : "-", on != "" ? sprintf("%.2f", on) : "-" }'
}

# bench_line MODEL PROMPT DECODE [flags] -> the raw `skv bench` line
bench_line() {
    bl_m=$1; bl_p=$2; bl_n=$3; shift 3
    $SKV bench -m "$bl_m" -t $T --prompt-tokens "$bl_p" -n "$bl_n" -c $((bl_p + bl_n + 8)) "$@"
}

# sk_opts CTX [BUDGET] -> ShadowKV's bench options at a CTX-token context:
# rank 48, chunk 8, outliers 0.3% of the chunks (at least 1), and the budget
# (default 1.56% of CTX, a multiple of the chunk)
sk_opts() {
    so_b=${2:-$(( ($1 * 156 / 10000 + 7) / 8 * 8 ))}
    so_o=$(( $1 / 8 * 3 / 1000 )); [ "$so_o" -ge 1 ] || so_o=1
    echo "--kv shadowkv --rank 48 --chunk 8 --budget $so_b --outliers $so_o"
}

# skv_run MODEL PROMPT DECODE [flags] -> "prefill_tok_s decode_tok_s dense_roof_tok_s" of one run
skv_run() {
    line=$(bench_line "$@")
    echo "$(echo "$line" | field prefill_tok_s) $(echo "$line" | field decode_tok_s) $(echo "$line" | field dense_roof_tok_s)"
}

RESULTS=$OUT/ratios.txt
: >"$RESULTS"

# lrow LABEL SKV OFF ON TARGET [ROOF]: a row against llama.cpp's better
# flash-attention mode (OFF, ON: its rounds' values in each mode), printed
# and recorded
lrow() {
    if [ -z "$LLAMA_BENCH" ]; then line=$(cmp_row "$1" "$2" "" "$5" "-" "${6:-}")
    else
        fa=$(best_fa "$3" "$4")
        if [ "$fa" = on ]; then v=$4; else v=$3; fi
        line=$(cmp_row "$1" "$2" "$v" "$5" "$fa" "${6:-}")
    fi
    echo "$line"; echo "$line" >>"$RESULTS"
}

# engine_case LABEL MODEL: pp512, pp4096, tg128 and tg32 after a 4096-token
# prompt, ROUNDS rounds; in each round every skv run is followed at once by
# llama.cpp's run of the same case (flash attention off, then on), each run
# after a quiet check, so the two sides of a ratio see the same machine.
# After the 4K prompt skv runs twice: with its default f32 cache, and with an
# f16 cache (--f16-kv), the cache type llama-bench uses by default: the
# like-for-like row.
engine_case() {
    label=$1; m=$2
    case_begin
    s512=""; s4k=""; sdec=""; sdech=""; stg=""; rdec=""; rdech=""; rtg=""
    a512=""; b512=""; a4k=""; b4k=""; adec=""; bdec=""; atg=""; btg=""
    r=0
    while [ $r -lt "$ROUNDS" ]; do
        side_check "skv pp512"; set -- $(skv_run "$m" 512 0); s512="$s512 $1"
        if [ -n "$LLAMA_BENCH" ]; then side_check "llama.cpp pp512"; set -- $(llama "$m" 512 0 0); a512="$a512 $1"; b512="$b512 $2"; fi
        side_check "skv pp4096 + tg32"; set -- $(skv_run "$m" 4096 32); s4k="$s4k $1"; sdec="$sdec $2"; rdec="$rdec $3"
        if [ -n "$LLAMA_BENCH" ]; then
            side_check "llama.cpp pp4096"; set -- $(llama "$m" 4096 0 0); a4k="$a4k $1"; b4k="$b4k $2"
            side_check "llama.cpp tg32 at depth 4096"; set -- $(llama "$m" 0 32 4096); adec="$adec $1"; bdec="$bdec $2"
        fi
        side_check "skv tg32 after 4K, f16 cache"; set -- $(skv_run "$m" 4096 32 --f16-kv); sdech="$sdech $2"; rdech="$rdech $3"
        side_check "skv tg128"; set -- $(skv_run "$m" 1 128); stg="$stg $2"; rtg="$rtg $3"
        if [ -n "$LLAMA_BENCH" ]; then side_check "llama.cpp tg128"; set -- $(llama "$m" 0 128 0); atg="$atg $1"; btg="$btg $2"; fi
        r=$((r + 1))
    done
    lrow "$label pp512" "$s512" "$a512" "$b512" "1.0x"
    lrow "$label pp4096" "$s4k" "$a4k" "$b4k" "1.0x"
    lrow "$label tg128" "$stg" "$atg" "$btg" "1.2x" "$rtg"
    lrow "$label tg32 after 4K, skv f32 cache" "$sdec" "$adec" "$bdec" "-" "$rdec"
    lrow "$label tg32 after 4K, f16 caches" "$sdech" "$adec" "$bdec" "1.2x" "$rdech"
    if case_loaded; then case_why_line | tee -a "$RESULTS"; fi
}

HEAD=$(cmp_head "case (tok/s, $T threads, $ROUNDS rounds)")
if want engine; then
    echo "== engine: skv and llama.cpp interleaved on the same files, $ROUNDS rounds; ratio = skv median / llama.cpp median,"
    echo "   of mins = skv min / llama.cpp min, paired = the median of each round's skv / llama.cpp (back to back);"
    echo "   fa: llama.cpp's flash-attention mode with the better median (both run each round), its figures shown =="
    echo "   roof: the decode tok/s this machine's memory read bandwidth allows (weights + KV per step / read GB/s;"
    echo "   the KV in f32, or in f16 on the f16-cache rows); llama-bench keeps its cache in f16 (its default)"
    if [ -n "$LLAMA_BENCH" ]; then
        echo "llama.cpp: $LLAMA_BENCH ($(cat build/ref/commit 2>/dev/null || echo "commit unknown"); -fa 0,1 each round)"
    else
        echo "llama.cpp: not run ($REF_WHY; or set LLAMA_BENCH=/path/to/llama-bench)"
    fi
    echo "$HEAD"
    if [ -f "$SHARED/configs/smollm2-135m.config.json" ]; then
        engine_case "SmolLM2-135M f32" "$(synth f32)"
        engine_case "SmolLM2-135M q8_0" "$(synth q8_0)"
        engine_case "Llama-3.1-8B 2 layers q8_0" "$(synth q8_0 llama-3.1-8b 2)"
    else
        echo "(skipped: $SHARED/configs missing)"
    fi
fi


if want shadowkv && [ -f "$SHARED/configs/smollm2-135m.config.json" ]; then
    F32=$(synth f32)
    echo
    echo "== ShadowKV vs dense decode, SmolLM2-135M shape f32: budget 1.56% of context, rank 48, chunk 8, outliers 0.3% of chunks =="
    echo "   (ShadowKV's step by stage, ms: select = landmark scores, softmax, top-k; rebuild = the misses'"
    echo "    value fetch and key rebuild; attend = sparse attention; rest = weights, norms; hit % of its chunk cache)"
    printf '%-8s %14s %14s %8s %22s %7s %8s %7s %7s %6s\n' "context" "dense ms/step" "shadowkv ms" "speedup" \
        "compress % of prefill" "select" "rebuild" "attend" "rest" "hit %"
    for ctx in 4096 8192 16384; do
        case_begin
        side_check "dense at $ctx"; d=$(bench_line "$F32" $ctx 16 | field decode_ms)
        side_check "shadowkv at $ctx"; sline=$(bench_line "$F32" $ctx 16 $(sk_opts $ctx))
        s=$(echo "$sline" | field decode_ms)
        pc=$(echo "$sline" | field compress_pct)
        sp=$(ratio "$d" "$s"); ! case_loaded || sp=loaded
        printf '%-8s %14s %14s %8s %22s %7s %8s %7s %7s %6s\n' "$ctx" "$d" "$s" "$sp" "$pc" \
            "$(echo "$sline" | field select_ms)" "$(echo "$sline" | field rebuild_ms)" \
            "$(echo "$sline" | field attend_ms)" "$(echo "$sline" | field rest_ms)" "$(echo "$sline" | field hit_pct)"
        ! case_loaded || case_why_line
        [ $ctx -ne 4096 ] || pc4k=$pc
    done
    # Sparse attention should make decode speed nearly independent of the
    # context: ShadowKV at 16K against skv's own dense decode at 512, ROUNDS
    # rounds of each interleaved (64 steps a run), ratio of the medians and
    # the paired ratio (the median of the rounds' dense / ShadowKV).
    d512=""; s16=""; r=0
    case_begin
    while [ $r -lt "$ROUNDS" ]; do
        side_check "dense at 512"; d512="$d512 $(bench_line "$F32" 512 64 | field decode_ms)"
        side_check "shadowkv at 16K"; s16="$s16 $(bench_line "$F32" 16384 64 $(sk_opts 16384) | field decode_ms)"
        r=$((r + 1))
    done
    pr=$(paired "$d512" "$s16")
    set -- $(minmed $s16) $(minmed $d512)
    rm_=$(ratio "$4" "$2"); rn=$(ratio "$3" "$1"); ! case_loaded || { rm_=loaded; rn=loaded; pr=loaded; }
    line=$(printf "$CMP_FMT" "ShadowKV ms/step at 16K / dense ms/step at 512" "$1" "$2" "$3" "$4" "-" "$rm_" "$rn" "$pr" \
        "0.8x" "")
    echo "(ms per decode step, $ROUNDS rounds of 64 steps: ShadowKV 16K min and median, then dense 512 min and median;"
    echo " the ratios: dense / ShadowKV)"
    echo "$line"; echo "$line" >>"$RESULTS"
    if case_loaded; then case_why_line | tee -a "$RESULTS"; fi
    line=$(printf "$CMP_FMT" "ShadowKV setup, % of a 4K prefill" "-" "$pc4k%" "-" "-" "-" "-" "-" "-" "<=5%" "")
    echo "$line"; echo "$line" >>"$RESULTS"
fi

# The six policies side by side at one budget (256 tokens attended per KV
# head), each with its defaults scaled to it: ShadowKV rank 48 and outliers
# 0.3% of chunks as above, FreeKV sink = window = 32, TailorKV start =
# recent = 32 with layer 0 quantized (its published map), SpeCache 2 bits.
# Bytes per step: fetched from slow memory, and read from resident memory
# (Quest's whole cost). BENCH_PEER_CTX overrides the contexts.
if want policies && [ -f "$SHARED/configs/smollm2-135m.config.json" ]; then
    F32=$(synth f32)
    echo
    echo "== KV policies, SmolLM2-135M shape f32, budget 256 tokens: decode ms/step (speedup vs dense) and KV bytes per step =="
    printf '%-8s %-9s %12s %8s %16s %16s\n' "context" "policy" "ms/step" "vs dense" "fetched B/step" "read B/step"
    for ctx in ${BENCH_PEER_CTX:-4096 8192 16384}; do
        d=""; dq=1
        for pol in dense shadowkv quest freekv specache tailorkv; do
            case $pol in
                shadowkv) opts=$(sk_opts $ctx 256) ;;
                freekv) opts="--kv freekv --budget 256 --kv-opt sink=32 --kv-opt window=32" ;;
                tailorkv) opts="--kv tailorkv --budget 256 --kv-opt start=32 --kv-opt recent=32 --kv-opt qlayers=1" ;;
                *) opts="--kv $pol --budget 256" ;;
            esac
            case_begin; side_check "$pol at $ctx"
            line=$(bench_line "$F32" $ctx 16 $opts)
            ms=$(echo "$line" | field decode_ms)
            [ -n "$d" ] || { d=$ms; ! case_loaded || dq=0; }
            sp=$(ratio "$d" "$ms"); if case_loaded || [ $dq -eq 0 ]; then sp=loaded; fi
            printf '%-8s %-9s %12s %8s %16s %16s\n' "$ctx" "$pol" "$ms" "$sp" \
                "$(echo "$line" | field fetch_bytes_step)" "$(echo "$line" | field read_bytes_step)"
            ! case_loaded || echo "   $pol at $ctx: loaded: not comparable: $QUIET_WHY"
        done
    done
fi

# Table 3 of the paper, on this machine: for each model shape and context,
# the largest batch of dense (f16 cache, as llama.cpp's) and of ShadowKV
# (values in the file tier) under BENCH_MEM_GIB (default 20, at most 70% of
# the memory free), the best tok/s over batches BENCH_BATCH_SIZES (default
# 1,8,32; the largest that fits is said, not run: ShadowKV's file tier at
# 469 sequences paged 44 GB of values from disk, 68 s a step), ms a step,
# the resident bytes a sequence, and the ratios: to skv's dense, and to
# llama-batched-bench run live at the same context (a shared prompt, -pps
# with a unified cache: the prompt's KV is stored once and read once a step
# for all sequences, a cheaper step than distinct contexts'). llama.cpp runs
# at batch 1 and 8 (or dense's best batch past 8), with flash attention off
# and on, and its better mode's better batch is the yardstick.
# Each policy forks its own prefill (skv bench --kv dense --f16-kv, then
# --kv shadowkv, each with --parallel 1,8,32,fit): a fork of the same
# policy's recorded prefill is bit-exact, while a fork of dense --f16-kv's
# prefill into ShadowKV would carry the f16 cache's rounding (rel L2 2.4e-4).
# ROUNDS rounds, interleaved: skv dense, llama.cpp -fa off, skv ShadowKV,
# llama.cpp -fa on, each after a quiet check. BENCH_BATCH_CASES lists
# config:context pairs; BENCH_BATCH_STEPS decode steps (default 4).
batch_case() { # CONFIG CTX
    cfg=$1; ctx=$2; steps=${BENCH_BATCH_STEPS:-4}
    [ -f "$SHARED/configs/$cfg.config.json" ] || { echo "($cfg: $SHARED/configs/$cfg.config.json missing)"; return; }
    m=$(synth q8_0 "$cfg")
    # ShadowKV's options at this context
    sk=$(sk_opts "$ctx")
    # pick LOG POLICY B FIELD: a field of the line for (policy, batch B)
    pick() { grep "kv=$2 .* parallel=$3 " "$1" | head -n 1 | field "$4"; }
    bmax() { sed -n "s/^kv=$2 max_parallel=\([0-9]*\).*bound=\([a-z]*\).*/\1 \2/p" "$1" | head -n 1; }
    # best LOG POLICY -> "B tok/s ms" of the batch run with the most tok/s
    best() { grep "kv=$2 .* parallel=[0-9]* prefill" "$1" | awk '{ b = $0; sub(/.* parallel=/, "", b); sub(/ .*/, "", b)
        t = $0; sub(/.*decode_tok_s=/, "", t); sub(/ .*/, "", t); m = $0; sub(/.*decode_ms=/, "", m); sub(/ .*/, "", m)
        if (t + 0 > bt) { bt = t + 0; bb = b; bm = m } } END { if (bb != "") print bb, bt, bm }'; }
    # lt LOG B: llama-batched-bench's decode tok/s at batch B
    lt() { v=$(sed -n "s/.*\"pl\": $2,.*\"speed_tg\": \([0-9.]*\).*/\1/p" "$1" | head -n 1 | awk '{ printf "%.2f", $1 }')
           echo "${v:--}"; }
    max2() { awk -v a="$1" -v b="$2" 'BEGIN { if (a !~ /^[0-9.]+$/) a = 0; if (b !~ /^[0-9.]+$/) b = 0
        m = a > b ? a : b; if (m > 0) printf "%.2f", m; else print "-" }'; }
    # llama_run FA LOG: llama-batched-bench at batch 1 and lB; 1 on failure (lwhy says why)
    llama_run() {
        "$LLAMA_BATCHED" -m "$m" -c $((ctx + lB * steps + 64)) -npp "$ctx" -ntg "$steps" -npl "1,$lB" -pps -kvu \
            -fa "$1" -t $T --output-format jsonl >"$2" 2>"$2.err" && return 0
        lwhy="llama-batched-bench -fa $1 failed: $(tail -n 1 "$2.err")"; return 1
    }
    case_begin
    dmax=""; dBs=""; smax=""; sBs=""; s1=""; s8ms=""; s1ms=""; lB=""; lwhy=""
    l1off=""; lboff=""; lxoff=""; l1on=""; lbon=""; lxon=""
    r=0
    while [ $r -lt "$ROUNDS" ]; do
        dlog=$OUT/batch-$cfg-$ctx-dense-$r.txt; slog=$OUT/batch-$cfg-$ctx-shadowkv-$r.txt
        side_check "skv dense, round $((r + 1))"
        if ! $SKV bench -m "$m" -t $T --prompt-tokens "$ctx" -n "$steps" -c $((ctx + steps + 8)) --kv dense --f16-kv \
            --parallel "${BENCH_BATCH_SIZES:-1,8,32},fit" --mem "$MEM" >"$dlog" 2>&1; then
            echo "$cfg $ctx: skv bench (dense) failed: $(tail -n 1 "$dlog")"; return
        fi
        set -- $(best "$dlog" dense); dBs="$dBs ${1:--}"; dmax="$dmax ${2:--}"
        # llama.cpp's batch beside dense's best: 8, or dense's best batch past 8 (fixed by round 1)
        if [ -z "$lB" ]; then lB=8; [ "${1:-1}" -le 8 ] || lB=$1; fi
        if [ -n "$LLAMA_BATCHED" ]; then
            side_check "llama.cpp -fa off, round $((r + 1))"
            llog=$OUT/batch-llama-$cfg-$ctx-off-$r.txt
            if llama_run off "$llog"; then a=$(lt "$llog" 1); b=$(lt "$llog" "$lB"); else a=-; b=-; fi
            l1off="$l1off $a"; lboff="$lboff $b"; lxoff="$lxoff $(max2 "$a" "$b")"
        fi
        rm -f "$OUT/batch-values.bin"
        side_check "skv shadowkv, round $((r + 1))"
        if ! $SKV bench -m "$m" -t $T --prompt-tokens "$ctx" -n "$steps" -c $((ctx + steps + 8)) $sk \
            --offload-file "$OUT/batch-values.bin" --parallel "${BENCH_BATCH_SIZES:-1,8,32},fit" --mem "$MEM" \
            >"$slog" 2>&1; then
            echo "$cfg $ctx: skv bench (shadowkv) failed: $(tail -n 1 "$slog")"; return
        fi
        rm -f "$OUT/batch-values.bin"
        set -- $(best "$slog" shadowkv); sBs="$sBs ${1:--}"; smax="$smax ${2:--}"
        s1="$s1 $(pick "$slog" shadowkv 1 decode_tok_s)"
        s8ms="$s8ms $(pick "$slog" shadowkv 8 decode_ms)"; s1ms="$s1ms $(pick "$slog" shadowkv 1 decode_ms)"
        if [ -n "$LLAMA_BATCHED" ]; then
            side_check "llama.cpp -fa on, round $((r + 1))"
            llog=$OUT/batch-llama-$cfg-$ctx-on-$r.txt
            if llama_run on "$llog"; then a=$(lt "$llog" 1); b=$(lt "$llog" "$lB"); else a=-; b=-; fi
            l1on="$l1on $a"; lbon="$lbon $b"; lxon="$lxon $(max2 "$a" "$b")"
        fi
        r=$((r + 1))
    done
    dlog=$OUT/batch-$cfg-$ctx-dense-0.txt; slog=$OUT/batch-$cfg-$ctx-shadowkv-0.txt
    set -- $(bmax "$dlog" dense); bd=${1:--}; bdb=${2:--}
    set -- $(bmax "$slog" shadowkv); bs=${1:--}; bound=${2:--}
    dres=$(pick "$dlog" dense 1 resident_bytes_seq); sres=$(pick "$slog" shadowkv 1 resident_bytes_seq)
    mib() { awk -v b="$1" 'BEGIN { if (b ~ /^[0-9.]+$/) printf "%.1f", b / 1048576; else print "-" }'; }
    med() { set -- $(minmed "$@"); echo "$2"; }
    echo "$cfg $ctx: dense f16: fit B $bd (bound: $bdb), best B over the rounds:$dBs, $(mib "$dres") MiB a sequence;"\
" ShadowKV: fit B $bs (bound: $bound), best B:$sBs, $(mib "$sres") MiB a sequence (resident)"
    [ "$bound" != disk ] || echo "   (ShadowKV's batch bound by the free disk its offload files may take, not memory)"
    [ "$bound" != cap ] && [ "$bdb" != cap ] || echo "   (cap: memory would hold more than the 4096 sequences skv bench stops at)"
    # each row against llama.cpp's better mode for it (fa says which)
    pm() { if [ "$(best_fa "$1" "$2")" = on ]; then echo "$2"; else echo "$1"; fi; }
    if [ -n "$LLAMA_BATCHED" ]; then
        echo "   llama.cpp, median tok/s at batch 1 / $lB / the better of the two: -fa off $(med $l1off) / $(med $lboff) /"\
" $(med $lxoff); -fa on $(med $l1on) / $(med $lbon) / $(med $lxon)"
        [ -z "$lwhy" ] || echo "   llama.cpp: $lwhy"
        lb=$(pm "$lboff" "$lbon"); lx=$(pm "$lxoff" "$lxon"); l1=$(pm "$l1off" "$l1on")
        fb=$(best_fa "$lboff" "$lbon"); fx=$(best_fa "$lxoff" "$lxon"); f1=$(best_fa "$l1off" "$l1on")
    else
        echo "   llama.cpp: not run ($REF_WHY)"
        lb=""; lx=""; l1=""; fb=-; fx=-; f1=-
    fi
    {
        cmp_row "$cfg $ctx: dense f16 at its best B / llama.cpp at B=$lB" "$dmax" "$lb" "1.0x" "$fb"
        cmp_row "$cfg $ctx: ShadowKV at its best B / llama.cpp's best" "$smax" "$lx" "2.5x" "$fx"
        cmp_row "$cfg $ctx: ShadowKV batch 1 / llama.cpp batch 1" "$s1" "$l1" \
            "$([ "$ctx" -ge 32768 ] && echo 6x || echo -)" "$f1"
        cmp_row "$cfg $ctx: ShadowKV at its best B / dense f16 at its best B" "$smax" "$dmax" "-" "-"
        cmp_row "$cfg $ctx: ShadowKV ms/step at B=8 / at B=1 (lower is better)" "$s8ms" "$s1ms" "<=3x" "-"
        printf '%-72s %9s %9s %9s %9s %4s %8s\n' "$cfg $ctx: resident bytes a sequence, dense f16 / ShadowKV" "-" "$dres" \
            "-" "$sres" "-" "$(ratio "$dres" "$sres")"
        if case_loaded; then case_why_line; fi
    } | tee -a "$BATCH_RESULTS"
}

if want batch; then
    avail_gib=$(awk '/^MemAvailable:/ { printf "%.1f", $2 / 1048576 * 0.7 }' /proc/meminfo)
    MEM=$(awk -v a="${BENCH_MEM_GIB:-20}" -v b="$avail_gib" 'BEGIN { print (b > 0 && b < a) ? b : a }')
    BATCH_RESULTS=$OUT/batch-ratios.txt
    : >"$BATCH_RESULTS"
    echo
    echo "== Table 3: batched decode, q8_0 weights, $T threads, up to $MEM GiB, $ROUNDS rounds: each policy's largest batch"
    echo "   that fits (fit B) and its best tok/s (B x steps / time) over batches ${BENCH_BATCH_SIZES:-1,8,32}, beside"
    echo "   llama-batched-bench (-pps -kvu: one shared prompt, its KV stored and read once for all sequences) at batch 1"
    echo "   and 8 (or dense's best batch past 8), flash attention off and on: the mode with the better median is the"
    echo "   reference (fa). ShadowKV: budget 1.56% of the context, rank 48, chunk 8, values in the file tier (a file per"
    echo "   sequence). Each policy decodes forks of its own prefill (exact) =="
    if [ -n "$LLAMA_BATCHED" ]; then
        echo "llama.cpp: $LLAMA_BATCHED ($(cat build/ref/commit 2>/dev/null || echo "commit unknown"), $(cat build/ref/variant 2>/dev/null || echo "build unknown"))"
    else
        echo "llama.cpp: not run ($REF_WHY; or set LLAMA_BATCHED=/path/to/llama-batched-bench)"
    fi
    cmp_head "Table 3 (tok/s unless said)"
    for c in ${BENCH_BATCH_CASES:-smollm2-135m:4096 smollm2-135m:16384 smollm2-135m:32768 llama-3.2-1b:32768}; do
        batch_case "${c%%:*}" "${c#*:}"
    done
    rm -f "$OUT/batch-values.bin"
fi

if want probes && [ -x build-noprobes/skv ] && [ -f "$SHARED/models/mini-smollm-f32.gguf" ]; then
    echo
    echo "== probe overhead with probes off: ./skv (probe points compiled in, nobody listening) vs probes compiled out =="
    M="$SHARED/models/mini-smollm-f32.gguf"
    best_on=0; best_off=0
    case_begin
    for i in 1 2 3; do
        side_check "probes on, round $i"
        on=$(SKV=./skv bench_line "$M" 512 256 --kv shadowkv --rank 32 --budget 64 --outliers 2 | field decode_tok_s)
        side_check "probes off, round $i"
        off=$(SKV=build-noprobes/skv bench_line "$M" 512 256 --kv shadowkv --rank 32 --budget 64 --outliers 2 | field decode_tok_s)
        best_on=$(awk -v a="$best_on" -v b="$on" 'BEGIN { print (b > a ? b : a) }')
        best_off=$(awk -v a="$best_off" -v b="$off" 'BEGIN { print (b > a ? b : a) }')
    done
    if case_loaded; then
        echo "mini-smollm-f32 shadowkv decode: $best_on tok/s with probe points, $best_off without: overhead loaded"
        case_why_line
    else
        awk -v on="$best_on" -v off="$best_off" 'BEGIN { printf "mini-smollm-f32 shadowkv decode: %.1f tok/s with probe points, %.1f without: overhead %.2f%%\n", on, off, (off - on) / off * 100 }'
    fi
fi

echo
echo "== the targets (docs/PERFORMANCE.md): every ratio measured above, in this run =="
echo "$HEAD"
cat "$RESULTS"
if want batch; then cat "$BATCH_RESULTS"; fi
