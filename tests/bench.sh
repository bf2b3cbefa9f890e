#!/bin/sh
# make bench: prefill and decode speed of skv with 2 threads, side by side
# with llama.cpp run live in the same sitting on the same GGUF files, as
# ratios. llama.cpp is not a dependency: point LLAMA_BENCH at a llama-bench
# binary (built CPU-only from llama.cpp's source) and its figures are
# measured right after skv's; without it the llama.cpp column says "not run"
# (a ratio against figures from another day and build would not be a
# measurement). Synthetic SmolLM2-135M-shaped models are made once under
# build/bench/.
set -eu
SKV=${SKV:-./skv}
SHARED=${SKV_SHARED:-../shared}
OUT=build/bench
mkdir -p "$OUT"
T=2

synth() { # dtype
    f="$OUT/smollm2-135m-$1.gguf"
    [ -f "$f" ] || $SKV synth --config "$SHARED/configs/smollm2-135m.config.json" --dtype "$1" --seed 1 -o "$f" >&2
    echo "$f"
}

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

# bench MODEL PROMPT DECODE [extra flags...] -> "prefill_tok_s decode_tok_s"
bench() {
    m=$1; p=$2; n=$3; shift 3
    line=$($SKV bench -m "$m" -t $T --prompt-tokens "$p" -n "$n" --repeat 2 "$@")
    echo "$(echo "$line" | field prefill_tok_s) $(echo "$line" | field decode_tok_s)"
}

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2fx", a / b; else printf "-" }'; }

row() { # label ours ref
    printf '%-44s %12s %12s %8s\n' "$1" "$2" "$3" "$(ratio "$2" "$3")"
}

# llama MODEL PROMPT GEN -> llama-bench's tokens/s for that test ("not run"
# without LLAMA_BENCH). Its CSV output is read by column name (avg_ts).
llama() {
    if [ -z "${LLAMA_BENCH:-}" ] || [ ! -x "$LLAMA_BENCH" ]; then echo "not run"; return; fi
    "$LLAMA_BENCH" -m "$1" -p "$2" -n "$3" -t $T -r 3 -o csv 2>/dev/null | awk -F, '
        NR == 1 { for (i = 1; i <= NF; i++) { h = $i; gsub(/"/, "", h); if (h == "avg_ts") c = i } next }
        c { v = $c; gsub(/"/, "", v); print v; exit }' | grep . || echo "failed"
}

echo "== engine: prefill and decode tok/s, $T threads (ratio = skv / llama.cpp, both run now) =="
[ -n "${LLAMA_BENCH:-}" ] || echo "(llama.cpp: not run; set LLAMA_BENCH=/path/to/llama-bench to measure it beside skv)"
printf '%-44s %12s %12s %8s\n' "case" "skv" "llama.cpp" "ratio"
if [ -f "$SHARED/models/mini-smollm-f32.gguf" ]; then
    set -- $(bench "$SHARED/models/mini-smollm-f32.gguf" 512 128)
    M="$SHARED/models/mini-smollm-f32.gguf"
    row "mini-smollm-f32 prefill pp512" "$1" "$(llama "$M" 512 0)"
    row "mini-smollm-f32 decode tg128" "$2" "$(llama "$M" 0 128)"
else
    echo "(skipped mini-smollm-f32: $SHARED/models missing)"
fi
if [ -f "$SHARED/configs/smollm2-135m.config.json" ]; then
    F32=$(synth f32); F16=$(synth f16); Q8=$(synth q8_0)
    set -- $(bench "$F32" 512 64);  row "SmolLM2-135M f32 prefill pp512" "$1" "$(llama "$F32" 512 0)"
                                    row "SmolLM2-135M f32 decode tg64" "$2" "$(llama "$F32" 0 64)"
    set -- $(bench "$F16" 16 64);   row "SmolLM2-135M f16 decode tg64" "$2" "$(llama "$F16" 0 64)"
    set -- $(bench "$Q8" 512 64);   row "SmolLM2-135M q8_0 prefill pp512" "$1" "$(llama "$Q8" 512 0)"
                                    row "SmolLM2-135M q8_0 decode tg64" "$2" "$(llama "$Q8" 0 64)"
    set -- $(bench "$F32" 4096 32); row "SmolLM2-135M f32 prefill pp4096" "$1" "$(llama "$F32" 4096 0)"
                                    row "SmolLM2-135M f32 decode after a 4K prompt" "$2" "n/a"
    set -- $(bench "$Q8" 4096 32);  row "SmolLM2-135M q8_0 decode after a 4K prompt" "$2" "n/a"
else
    echo "(skipped SmolLM2-135M: $SHARED/configs missing)"
fi

# bench_line MODEL PROMPT DECODE [flags] -> the raw `skv bench` line
bench_line() { m=$1; p=$2; n=$3; shift 3; $SKV bench -m "$m" -t $T --prompt-tokens "$p" -n "$n" -c $((p + n + 8)) "$@"; }

if [ -f "$SHARED/configs/smollm2-135m.config.json" ]; then
    F32=$(synth f32)
    echo
    echo "== ShadowKV vs dense decode, SmolLM2-135M shape f32: budget 1.56% of context, rank 48, chunk 8, outliers 0.3% of chunks =="
    printf '%-8s %14s %14s %8s %22s\n' "context" "dense ms/step" "shadowkv ms" "speedup" "compress % of prefill"
    for ctx in 4096 8192 16384; do
        budget=$(( (ctx * 156 / 10000 + 7) / 8 * 8 ))
        outl=$(( ctx / 8 * 3 / 1000 )); [ "$outl" -ge 1 ] || outl=1
        d=$(bench_line "$F32" $ctx 16 | field decode_ms)
        sline=$(bench_line "$F32" $ctx 16 --kv shadowkv --rank 48 --chunk 8 --budget $budget --outliers $outl)
        s=$(echo "$sline" | field decode_ms)
        pc=$(echo "$sline" | field compress_pct)
        printf '%-8s %14s %14s %8s %22s\n' "$ctx" "$d" "$s" "$(ratio "$d" "$s")" "$pc"
    done
fi

# The six policies side by side at one budget (256 tokens attended per KV
# head), each with its defaults scaled to it: ShadowKV rank 48 and outliers
# 0.3% of chunks as above, FreeKV sink = window = 32, TailorKV start =
# recent = 32 with layer 0 quantized (its published map), SpeCache 2 bits.
# Bytes per step: fetched from slow memory, and read from resident memory
# (Quest's whole cost). BENCH_PEER_CTX overrides the contexts.
if [ -f "$SHARED/configs/smollm2-135m.config.json" ]; then
    F32=$(synth f32)
    echo
    echo "== KV policies, SmolLM2-135M shape f32, budget 256 tokens: decode ms/step (speedup vs dense) and KV bytes per step =="
    printf '%-8s %-9s %12s %8s %16s %16s\n' "context" "policy" "ms/step" "vs dense" "fetched B/step" "read B/step"
    for ctx in ${BENCH_PEER_CTX:-4096 8192 16384}; do
        outl=$(( ctx / 8 * 3 / 1000 )); [ "$outl" -ge 1 ] || outl=1
        d=""
        for pol in dense shadowkv quest freekv specache tailorkv; do
            case $pol in
                shadowkv) extra="--rank 48 --chunk 8 --outliers $outl" ;;
                freekv) extra="--kv-opt sink=32 --kv-opt window=32" ;;
                tailorkv) extra="--kv-opt start=32 --kv-opt recent=32 --kv-opt qlayers=1" ;;
                *) extra="" ;;
            esac
            line=$(bench_line "$F32" $ctx 16 --kv $pol --budget 256 $extra)
            ms=$(echo "$line" | field decode_ms)
            [ -n "$d" ] || d=$ms
            printf '%-8s %-9s %12s %8s %16s %16s\n' "$ctx" "$pol" "$ms" "$(ratio "$d" "$ms")" \
                "$(echo "$line" | field fetch_bytes_step)" "$(echo "$line" | field read_bytes_step)"
        done
    done
fi

if [ -x build-noprobes/skv ] && [ -f "$SHARED/models/mini-smollm-f32.gguf" ]; then
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
