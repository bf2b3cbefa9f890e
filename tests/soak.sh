#!/bin/sh
# A soak run, not in CI: a 16K-token ShadowKV generation with every probe on
# (oracle included) recorded to a trace, and the peak RSS reported every 1K
# generated tokens beside the KV growth accounted for (generated tokens stay
# dense: layers x KV heads x head_dim x 2 (K, V) x 4 bytes each, in the four
# copies a run with --oracle keeps).
# Memory should stay flat once prefill is done, apart from that growth.
# Usage: sh tests/soak.sh [TOKENS] (default 16384). Needs ./skv (make).
set -eu
N=${1:-16384}
SKV=${SKV:-./skv}
D=build/soak
mkdir -p "$D"
cfg="$D/model.json"
sed 's/"max_position_embeddings": [0-9]*/"max_position_embeddings": 20480/; s/skv-default-random/skv-soak/' \
    samples/default-model.config.json > "$cfg"
M="$D/model.gguf"
[ -f "$M" ] || $SKV synth --config "$cfg" --dtype f32 --seed 7 -o "$M" --force >/dev/null
head -c 2000 samples/haystack.txt > "$D/prompt.txt"
T="$D/soak.skvt"
rm -f "$T"
$SKV run -m "$M" -f "$D/prompt.txt" -n "$N" -c $((N + 4096)) --kv shadowkv --rank 16 --budget 256 --outliers 4 \
    --local 4 --oracle --trace "$T" >"$D/out.txt" 2>"$D/err.txt" &
pid=$!
# bytes of K and V per generated token (the config's shape: 6 layers, 2 KV
# heads of 32), times the copies --oracle keeps: ShadowKV's generated rows,
# its own exact rows for its oracle, the oracle wrapper's copy and the dense
# twin's cache
per_tok=$((6 * 2 * 32 * 2 * 4 * 4))
printf '%8s %12s %12s %14s %16s\n' "tokens" "RSS MiB" "peak MiB" "KV growth MiB" "peak - KV MiB"
next=0 base=""
while kill -0 $pid 2>/dev/null; do
    steps=$($SKV trace info "$T" 2>/dev/null | sed -n 's/^ *step  *\([0-9]*\)$/\1/p' | head -1)
    steps=${steps:-0}
    if [ "$steps" -ge "$next" ]; then
        rss=$(sed -n 's/^VmRSS:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/$pid/status 2>/dev/null || echo 0)
        hwm=$(sed -n 's/^VmHWM:[[:space:]]*\([0-9]*\) kB/\1/p' /proc/$pid/status 2>/dev/null || echo 0)
        kv=$(awk -v s="$steps" -v b="$per_tok" 'BEGIN { printf "%.2f", s * b / 1048576 }')
        [ -n "$base" ] || base=$hwm
        awk -v s="$steps" -v r="$rss" -v h="$hwm" -v k="$kv" \
            'BEGIN { printf "%8d %12.1f %12.1f %14.2f %16.1f\n", s, r / 1024, h / 1024, k, h / 1024 - k }'
        next=$((next + 1024))
    fi
    sleep 3
done
wait $pid
tail -4 "$D/err.txt"
$SKV trace info "$T" | tail -3
