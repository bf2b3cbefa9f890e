#!/bin/sh
# make bench: prefill and decode speed of skv with 2 threads, side by side
# with llama.cpp run live in the same sitting on the same GGUF files, as
# ratios. llama.cpp's llama-bench comes from `make bench-ref`
# (tests/bench_ref.sh: the llama.cpp source pinned in the npm package
# node-llama-cpp, built CPU-only into build/ref/); LLAMA_BENCH=/path picks
# another build. Without one the llama.cpp column says "not run": a ratio
# against figures from another day and build would not be a measurement.
# Each case runs BENCH_ROUNDS times (default 3), skv and llama.cpp
# interleaved, and prints the min and the median; llama.cpp runs with flash
# attention off and on and keeps its better figure in each round.
# Synthetic models of the SmolLM2-135M shape and of the Llama-3.1-8B shape
# with 2 layers are made once under build/bench/.
set -eu
SKV=${SKV:-./skv}
SHARED=${SKV_SHARED:-../shared}
OUT=build/bench
mkdir -p "$OUT"
T=2
ROUNDS=${BENCH_ROUNDS:-3}
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

synth() { # dtype [config] [layers]
    cfg=${2:-smollm2-135m}; tag=$cfg-$1; lay=""
    if [ -n "${3:-}" ]; then tag=$cfg-${3}l-$1; lay="--layers $3"; fi
    f="$OUT/$tag.gguf"
    [ -f "$f" ] || $SKV synth --config "$SHARED/configs/$cfg.config.json" --dtype "$1" $lay --seed 1 -o "$f" >&2
    echo "$f"
}

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'; }

# minmed V... -> "min median" of the numbers among V ("-" when none)
minmed() {
    printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g | awk '{ v[NR] = $1 }
        END { if (!NR) { print "- -"; exit }
              m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "%.1f %.1f\n", v[1], m }'
}

# llama MODEL PROMPT GEN DEPTH -> llama-bench's best tokens/s over flash
# attention off and on (avg_ts, read by column name); "-" when it failed.
llama() {
    "$LLAMA_BENCH" -m "$1" -p "$2" -n "$3" -d "$4" -t $T -r 1 -fa 0,1 -o csv 2>/dev/null | awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); if (h == "avg_ts") c = i } next }
        c { v = $c; gsub(/"/, "", v); if (v + 0 > best) best = v + 0 }
        END { if (best > 0) printf "%.2f\n", best; else print "-" }'
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

# engine_case LABEL MODEL: pp512, pp4096, tg128 and tg32 after a 4096-token
# prompt, ROUNDS rounds; in each round every skv run is followed at once by
# llama.cpp's run of the same case, so the two sides of a ratio see the same
# load. After the 4K prompt skv runs twice: with its default f32 cache, and
# with an f16 cache (--f16-kv), the cache type llama-bench uses by default:
# the like-for-like row.
engine_case() {
    label=$1; m=$2
    s512=""; s4k=""; sdec=""; sdech=""; stg=""; l512=""; l4k=""; ldec=""; ltg=""; rdec=""; rdech=""; rtg=""
    r=0
    while [ $r -lt "$ROUNDS" ]; do
        set -- $(skv_run "$m" 512 0);   s512="$s512 $1"
        [ -z "$LLAMA_BENCH" ] || l512="$l512 $(llama "$m" 512 0 0)"
        set -- $(skv_run "$m" 4096 32); s4k="$s4k $1"; sdec="$sdec $2"; rdec="$rdec $3"
        [ -z "$LLAMA_BENCH" ] || l4k="$l4k $(llama "$m" 4096 0 0)"
        [ -z "$LLAMA_BENCH" ] || ldec="$ldec $(llama "$m" 0 32 4096)"
        set -- $(skv_run "$m" 4096 32 --f16-kv); sdech="$sdech $2"; rdech="$rdech $3"
        set -- $(skv_run "$m" 1 128);   stg="$stg $2"; rtg="$rtg $3"
        [ -z "$LLAMA_BENCH" ] || ltg="$ltg $(llama "$m" 0 128 0)"
        r=$((r + 1))
    done
    row "$label pp512" "$s512" "$l512" "1.0x"
    row "$label pp4096" "$s4k" "$l4k" "1.0x"
    row "$label tg128" "$stg" "$ltg" "1.2x" "$rtg"
    row "$label tg32 after 4K, skv f32 cache" "$sdec" "$ldec" "-" "$rdec"
    row "$label tg32 after 4K, f16 caches" "$sdech" "$ldec" "1.2x" "$rdech"
}

# row LABEL SKV_VALUES LLAMA_VALUES TARGET [ROOF_VALUES]: prints and records
# one line; ROOF is the tok/s the machine's read bandwidth allows a dense
# decode of this model (skv bench's dense_roof_tok_s, the median of the rounds).
row() {
    roof=$(minmed ${5:-}); roof=${roof#* }
    pr=$(paired "$2" "${3:-}")
    set -- "$1" "$(minmed $2)" "$(minmed ${3:-})" "$4"
    sm=${2#* }; lm=${3#* }
    [ -n "$LLAMA_BENCH" ] || { lm="not run"; pr="-"; }
    line=$(printf '%-58s %9s %9s %9s %9s %8s %7s %7s %7s' "$1" "${2% *}" "$sm" "${3% *}" "$lm" "$(ratio "$sm" "$lm")" \
        "$pr" "$4" "$roof")
    echo "$line"
    echo "$line" >>"$RESULTS"
}

HEAD=$(printf '%-58s %9s %9s %9s %9s %8s %7s %7s %7s' "case (tok/s, $T threads, $ROUNDS rounds)" "skv min" "median" \
    "llama min" "median" "ratio" "paired" "target" "roof")
if want engine; then
    echo "== engine: skv and llama.cpp interleaved on the same files; ratio = skv median / llama.cpp median;"
    echo "   paired = the median of each round's skv / llama.cpp, the two runs of a round back to back =="
    echo "   roof: the decode tok/s this machine's memory read bandwidth allows (weights + KV per step / read GB/s;"
    echo "   the KV in f32, or in f16 on the f16-cache rows); llama-bench keeps its cache in f16 (its default)"
    if [ -n "$LLAMA_BENCH" ]; then
        echo "llama.cpp: $LLAMA_BENCH ($(cat build/ref/commit 2>/dev/null || echo "commit unknown"); best of flash attention off/on per round)"
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
        d=$(bench_line "$F32" $ctx 16 | field decode_ms)
        sline=$(bench_line "$F32" $ctx 16 $(sk_opts $ctx))
        s=$(echo "$sline" | field decode_ms)
        pc=$(echo "$sline" | field compress_pct)
        printf '%-8s %14s %14s %8s %22s %7s %8s %7s %7s %6s\n' "$ctx" "$d" "$s" "$(ratio "$d" "$s")" "$pc" \
            "$(echo "$sline" | field select_ms)" "$(echo "$sline" | field rebuild_ms)" \
            "$(echo "$sline" | field attend_ms)" "$(echo "$sline" | field rest_ms)" "$(echo "$sline" | field hit_pct)"
        [ $ctx -ne 4096 ] || pc4k=$pc
    done
    # Sparse attention should make decode speed nearly independent of the
    # context: ShadowKV at 16K against skv's own dense decode at 512, ROUNDS
    # rounds of each interleaved (64 steps a run), ratio of the medians and
    # the paired ratio (the median of the rounds' dense / ShadowKV).
    d512=""; s16=""; r=0
    while [ $r -lt "$ROUNDS" ]; do
        d512="$d512 $(bench_line "$F32" 512 64 | field decode_ms)"
        s16="$s16 $(bench_line "$F32" 16384 64 $(sk_opts 16384) | field decode_ms)"
        r=$((r + 1))
    done
    pr=$(paired "$d512" "$s16")
    set -- $(minmed $s16) $(minmed $d512)
    line=$(printf '%-58s %9s %9s %9s %9s %8s %7s %7s' "ShadowKV ms/step at 16K / dense ms/step at 512" "$1" "$2" "$3" "$4" \
        "$(ratio "$4" "$2")" "$pr" "0.8x")
    echo "(ms per decode step, $ROUNDS rounds of 64 steps: ShadowKV 16K min and median, then dense 512 min and median)"
    echo "$line"; echo "$line" >>"$RESULTS"
    line=$(printf '%-58s %9s %9s %9s %9s %8s %7s %7s' "ShadowKV setup, % of a 4K prefill" "-" "$pc4k%" "-" "-" "-" "-" "<=5%")
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
        d=""
        for pol in dense shadowkv quest freekv specache tailorkv; do
            case $pol in
                shadowkv) opts=$(sk_opts $ctx 256) ;;
                freekv) opts="--kv freekv --budget 256 --kv-opt sink=32 --kv-opt window=32" ;;
                tailorkv) opts="--kv tailorkv --budget 256 --kv-opt start=32 --kv-opt recent=32 --kv-opt qlayers=1" ;;
                *) opts="--kv $pol --budget 256" ;;
            esac
            line=$(bench_line "$F32" $ctx 16 $opts)
            ms=$(echo "$line" | field decode_ms)
            [ -n "$d" ] || d=$ms
            printf '%-8s %-9s %12s %8s %16s %16s\n' "$ctx" "$pol" "$ms" "$(ratio "$d" "$ms")" \
                "$(echo "$line" | field fetch_bytes_step)" "$(echo "$line" | field read_bytes_step)"
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
# at batch 1 and 8 (or dense's best batch past 8), and its better
# throughput is the yardstick. The batch-1 rows are
# the everyday question (ShadowKV at depth against llama.cpp at depth), and
# ShadowKV's batch 8 against its batch 1 shows the weights read once a step.
# One prefill a case, forked to every policy and batch (skv bench --kv
# dense,shadowkv --parallel 1,8,max). BENCH_BATCH_CASES lists config:context
# pairs; BENCH_BATCH_STEPS decode steps (default 4).
batch_case() { # CONFIG CTX
    cfg=$1; ctx=$2; steps=${BENCH_BATCH_STEPS:-4}
    [ -f "$SHARED/configs/$cfg.config.json" ] || { echo "($cfg: $SHARED/configs/$cfg.config.json missing)"; return; }
    m=$(synth q8_0 "$cfg")
    rm -f "$OUT/batch-values.bin"
    log=$OUT/batch-$cfg-$ctx.txt
    # ShadowKV's options at this context, less its --kv
    sk=$(sk_opts "$ctx"); sk=${sk#--kv shadowkv }
    if ! $SKV bench -m "$m" -t $T --prompt-tokens "$ctx" -n "$steps" -c $((ctx + steps + 8)) --kv dense,shadowkv $sk \
        --f16-kv --offload-file "$OUT/batch-values.bin" --parallel "${BENCH_BATCH_SIZES:-1,8,32},fit" --mem "$MEM" \
        >"$log" 2>&1; then
        echo "$cfg $ctx: skv bench failed: $(tail -n 1 "$log")"
        return
    fi
    # pick POLICY B FIELD: a field of the line for (policy, batch B)
    pick() { grep "kv=$1 .* parallel=$2 " "$log" | head -n 1 | field "$3"; }
    bmax() { sed -n "s/^kv=$1 max_parallel=\([0-9]*\).*bound=\([a-z]*\).*/\1 \2/p" "$log" | head -n 1; }
    # best POLICY -> "B tok/s ms" of the batch run with the most tok/s
    best() { grep "kv=$1 .* parallel=[0-9]* prefill" "$log" | awk '{ b = $0; sub(/.* parallel=/, "", b); sub(/ .*/, "", b)
        t = $0; sub(/.*decode_tok_s=/, "", t); sub(/ .*/, "", t); m = $0; sub(/.*decode_ms=/, "", m); sub(/ .*/, "", m)
        if (t + 0 > bt) { bt = t + 0; bb = b; bm = m } } END { if (bb != "") print bb, bt, bm }'; }
    set -- $(bmax dense); bd=${1:-}; set -- $(bmax shadowkv); bs=${1:-}; bound=${2:-}
    set -- $(best dense); dB=${1:-}; dmax=${2:-}; dmaxms=${3:-}
    set -- $(best shadowkv); sB=${1:-}; smax=${2:-}; smaxms=${3:-}
    dres=$(pick dense 1 resident_bytes_seq); sres=$(pick shadowkv 1 resident_bytes_seq)
    s1=$(pick shadowkv 1 decode_tok_s); s8ms=$(pick shadowkv 8 decode_ms); s1ms=$(pick shadowkv 1 decode_ms)
    # llama.cpp at batch 1, 8 and dense's best batch when larger (each a prefill of its own)
    lB=8; [ "${dB:-1}" -le 8 ] || lB=$dB
    l1="-"; lb="-"; lbest="-"; lwhy=""
    if [ -n "$LLAMA_BATCHED" ] && [ -n "$bd" ]; then
        llog=$OUT/batch-llama-$cfg-$ctx.txt
        if "$LLAMA_BATCHED" -m "$m" -c $((ctx + lB * steps + 64)) -npp "$ctx" -ntg "$steps" -npl "1,$lB" -pps -kvu \
            -t $T --output-format jsonl >"$llog" 2>"$llog.err"; then
            lt() { sed -n "s/.*\"pl\": $1,.*\"speed_tg\": \([0-9.]*\).*/\1/p" "$llog" | head -n 1 |
                   awk '{ printf "%.2f", $1 }'; }
            l1=$(lt 1); lb=$(lt "$lB"); l1=${l1:--}; lb=${lb:--}
            lbest=$(awk -v a="$l1" -v b="$lb" 'BEGIN { if (a !~ /^[0-9.]+$/) a = 0; if (b !~ /^[0-9.]+$/) b = 0
                m = a > b ? a : b; if (m > 0) printf "%.2f", m; else print "-" }')
        else
            lwhy="llama-batched-bench failed: $(tail -n 1 "$llog.err")"
        fi
    else
        lwhy="not run ($REF_WHY)"
    fi
    mib() { awk -v b="$1" 'BEGIN { if (b ~ /^[0-9.]+$/) printf "%.1f", b / 1048576; else print "-" }'; }
    printf '%-14s %6s %-9s %-7s %6s %6s %8s %10s %8s %8s %11s %9s\n' "$cfg" "$ctx" dense memory "$bd" "$dB" "$dmax" \
        "$dmaxms" "$(mib "$dres")" "1.00x" "$lbest" "$(ratio "$dmax" "$lbest")"
    printf '%-14s %6s %-9s %-7s %6s %6s %8s %10s %8s %8s %11s %9s\n' "$cfg" "$ctx" shadowkv "file" "$bs" "$sB" "$smax" \
        "$smaxms" "$(mib "$sres")" "$(ratio "$smax" "$dmax")" "$lbest" "$(ratio "$smax" "$lbest")"
    [ -z "$lwhy" ] || echo "   llama.cpp: $lwhy"
    [ "$bound" != disk ] || echo "   (ShadowKV's batch bound by the free disk its offload files may take, not memory)"
    {
        batch_row "$cfg $ctx: dense at its best B=$dB / llama.cpp at B=$lB" "$dmax" "$lb" "1.0x"
        batch_row "$cfg $ctx: ShadowKV at its best B=$sB / llama.cpp's best" "$smax" "$lbest" "2.5x"
        batch_row "$cfg $ctx: ShadowKV batch 1 / llama.cpp batch 1 (decode at depth)" "$s1" "$l1" \
            "$([ "$ctx" -ge 32768 ] && echo 6x || echo -)"
        batch_row "$cfg $ctx: ShadowKV ms/step at B=8 / at B=1 (lower is better)" "$s8ms" "$s1ms" "<=3x"
        batch_row "$cfg $ctx: resident bytes a sequence, dense f16 / ShadowKV" "$dres" "$sres" "-"
    } >>"$BATCH_RESULTS"
}

# batch_row LABEL A B TARGET: "label  A  B  A/B  target"
batch_row() { printf '%-72s %10s %10s %8s %6s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")" "$4"; }

if want batch; then
    avail_gib=$(awk '/^MemAvailable:/ { printf "%.1f", $2 / 1048576 * 0.7 }' /proc/meminfo)
    MEM=$(awk -v a="${BENCH_MEM_GIB:-20}" -v b="$avail_gib" 'BEGIN { print (b > 0 && b < a) ? b : a }')
    BATCH_RESULTS=$OUT/batch-ratios.txt
    : >"$BATCH_RESULTS"
    echo
    echo "== Table 3: batched decode, q8_0 weights, $T threads, up to $MEM GiB: each policy's largest batch that fits"
    echo "   (fit B) and its best tok/s (B x steps / time) over batches ${BENCH_BATCH_SIZES:-1,8,32} (best B), beside"
    echo "   llama-batched-bench (-pps -kvu: one shared prompt, its KV stored and read once for all sequences; the"
    echo "   best of batch 1 and 8, or dense's best batch past 8). ShadowKV: budget 1.56% of the context, rank 48, chunk 8, values"
    echo "   in the file tier (a file per sequence) =="
    if [ -n "$LLAMA_BATCHED" ]; then
        echo "llama.cpp: $LLAMA_BATCHED ($(cat build/ref/commit 2>/dev/null || echo "commit unknown"), $(cat build/ref/variant 2>/dev/null || echo "build unknown"))"
    else
        echo "llama.cpp: not run ($REF_WHY; or set LLAMA_BATCHED=/path/to/llama-batched-bench)"
    fi
    printf '%-14s %6s %-9s %-7s %6s %6s %8s %10s %8s %8s %11s %9s\n' shape context policy tier "fit B" "best B" "tok/s" \
        "ms/step" "MiB/seq" "vs dense" "llama tok/s" "vs llama"
    for c in ${BENCH_BATCH_CASES:-smollm2-135m:4096 smollm2-135m:16384 smollm2-135m:32768 llama-3.2-1b:32768}; do
        batch_case "${c%%:*}" "${c#*:}"
    done
    rm -f "$OUT/batch-values.bin"
    echo
    printf '%-72s %10s %10s %8s %6s\n' "Table 3's ratios" "skv" "vs" "ratio" "target"
    cat "$BATCH_RESULTS"
fi

if want probes && [ -x build-noprobes/skv ] && [ -f "$SHARED/models/mini-smollm-f32.gguf" ]; then
    echo
    echo "== probe overhead with probes off: ./skv (probe points compiled in, nobody listening) vs probes compiled out =="
    M="$SHARED/models/mini-smollm-f32.gguf"
    best_on=0; best_off=0
    for i in 1 2 3; do
        on=$(SKV=./skv bench_line "$M" 512 256 --kv shadowkv --rank 32 --budget 64 --outliers 2 | field decode_tok_s)
        off=$(SKV=build-noprobes/skv bench_line "$M" 512 256 --kv shadowkv --rank 32 --budget 64 --outliers 2 | field decode_tok_s)
        best_on=$(awk -v a="$best_on" -v b="$on" 'BEGIN { print (b > a ? b : a) }')
        best_off=$(awk -v a="$best_off" -v b="$off" 'BEGIN { print (b > a ? b : a) }')
    done
    awk -v on="$best_on" -v off="$best_off" 'BEGIN { printf "mini-smollm-f32 shadowkv decode: %.1f tok/s with probe points, %.1f without: overhead %.2f%%\n", on, off, (off - on) / off * 100 }'
fi

echo
echo "== the targets (docs/PERFORMANCE.md): every ratio measured above, in this run =="
echo "$HEAD"
cat "$RESULTS"
