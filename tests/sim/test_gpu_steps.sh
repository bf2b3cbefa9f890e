#!/bin/sh
# test_gpu_steps.sh: gpu-check's steps (tests/gpu/run.sh) at tiny sizes, with
# `skv` built on the CUDA simulator ($(BUILD)/sim/skv, tests/cusim): a traced
# ShadowKV run on --backend cuda and its timeline PNG, dense and ShadowKV
# benches from one prefill at batch 1 and 10 (forks and batches on the
# device), the largest batch a small device fits, run, and a --parallel run,
# and the projections' bench (tests/gpu/bench_proj on the simulator). Each step under a timeout that kills; each
# must run on cuda, not fall back to the CPU. The bench runs as gpu-check's
# do, with SKV_CUDA_COUNT=1: after each bench line the backend's own count of
# that run's launches and host syncs a step, which must agree with the
# simulator's count of the same steps (launches, graph launches, the
# kernels a step's graph captured and library calls equal; syncs at most the
# simulator's, which adds the blocking copies): each step one graph launch
# and no kernel launched alone (the step graphs, on by default); and
# tests/gpu/summary.sh makes its table of them. A plain run's prefill count
# (cuda_count_prefill) holds one host sync a prompt chunk, none a layer;
# ShadowKV's compression adds at most 3 a layer and 1 once.
SIM=${SKV_SIM_BIN:-$(dirname "${SKV_BIN:-build/skv}")/sim/skv}
pass=0 fail=0
ok() { echo "PASS $1"; pass=$((pass + 1)); }
ko() { echo "FAIL $1"; fail=$((fail + 1)); }
if [ ! -x "$SIM" ]; then
    echo "FAIL test_gpu_steps: no simulated skv at $SIM (make $SIM)"
    exit 1
fi
T=$(mktemp -d "${TMPDIR:-/tmp}/skv-gpusteps.XXXXXX")
trap 'rm -rf "$T"' EXIT
CFG=samples/default-model.config.json
# step NAME CAP CMD...: runs CMD (output to $T/NAME.log) under a timeout
step() {
    name=$1 cap=$2
    shift 2
    timeout -k 5 "$cap" "$@" > "$T/$name.log" 2>&1
    rc=$?
    if grep -q 'running on cpu' "$T/$name.log"; then
        ko "$name: fell back to the CPU: $(grep -m1 'running on cpu' "$T/$name.log")"
    elif [ $rc -ne 0 ]; then
        ko "$name: exit $rc: $(grep -m1 -i 'cusim\|error\|fail\|skv' "$T/$name.log")"
    else
        ok "$name on the simulated GPU"
    fi
    return $rc
}
"$SIM" synth --config "$CFG" --dtype f32 --layers 2 --seed 7 -o "$T/small.gguf" --force > /dev/null 2>&1 ||
    { echo "FAIL test_gpu_steps: synth failed"; exit 1; }
step traced-step 120 "$SIM" run --backend cuda -m "$T/small.gguf" --kv shadowkv --budget 64 --rank 16 --outliers 2 \
    -f "$CFG" -n 4 --trace "$T/gpu.trace"
step timeline-png 60 "$SIM" export --trace "$T/gpu.trace" --view timeline --step 2 -o "$T/timeline.png"
if [ -s "$T/timeline.png" ] && grep -q 'cuda' "$T/traced-step.log" "$T/gpu.trace" 2>/dev/null; then
    ok "the traced step's timeline PNG was written, from a cuda run"
else
    ko "the traced step's timeline PNG ($(ls -l "$T/timeline.png" 2>&1))"
fi
step bench 240 env SKV_CUDA_COUNT=1 "$SIM" bench --backend cuda -m "$T/small.gguf" --prompt-tokens 300 -c 340 -n 4 \
    --kv dense,shadowkv --budget 64 --rank 16 --outliers 2 --parallel 1,10
n=$(grep -c 'decode_tok_s=' "$T/bench.log")
if [ "$n" -ge 4 ]; then ok "bench: $n lines with decode_tok_s (dense and shadowkv at batch 1 and 10)"
else ko "bench: $n lines with decode_tok_s, expected 4: $(tail -3 "$T/bench.log")"; fi
# each bench line followed by its run's count line, and the two counts agree
bad=$(awk '
    function val(key) { return match(" " $0, " " key "=[^ ]*") ? substr(" " $0, RSTART + length(key) + 2, RLENGTH - length(key) - 2) : "" }
    /decode_tok_s=/ { if (want) print "no count line after: " prev; want = 1; prev = $0; runs++; next }
    /^cuda_count:/ {
        if (!want) next
        want = 0
        if (val("graph_nodes_step") + 0 < 1 || val("syncs_step") + 0 < 1 || val("layers") != 2 ||
            val("launches_step") != 0 || val("graph_launches_step") != 1 ||
            val("launches_step") != val("sim_launches_step") || val("lib_calls_step") != val("sim_lib_calls_step") ||
            val("graph_launches_step") != val("sim_graph_launches_step") ||
            val("graph_nodes_step") != val("sim_graph_nodes_step") || val("syncs_step") + 0 > val("sim_syncs_step") + 0 ||
            val("calls_layer") != sprintf("%.1f", (val("launches_step") + val("graph_nodes_step") + val("lib_calls_step")) / 2))
            print "counts disagree: " $0
        else good++
    }
    END { if (want) print "no count line after: " prev; if (good != runs || !runs) print good " of " runs " runs counted" }
' "$T/bench.log")
ex=$(grep -m1 '^cuda_count:' "$T/bench.log")
if [ -z "$bad" ]; then ok "SKV_CUDA_COUNT=1: each bench run's step one graph launch, its kernels and host syncs as the simulator counts them: $ex"
else ko "SKV_CUDA_COUNT=1: $bad"; fi
# the source's prefill time without the recording for the forks, and the
# decode's without its first step (the step graph's capture), each said apart
nrec=$(grep -c ' parallel=[0-9]* .* prefill_record_s=[0-9][0-9.]* warmup_ms=[0-9][0-9.]*' "$T/bench.log")
if [ "$nrec" -eq "$n" ]; then ok "bench --parallel: each line gives the prefill's recording and the first step's time apart"
else ko "bench --parallel: $nrec of $n lines with prefill_record_s and warmup_ms: $(grep -m1 'decode_tok_s=' "$T/bench.log")"; fi
{ echo "step=bench layers=0"; cat "$T/bench.log"; } > "$T/bench.txt"
sh tests/gpu/summary.sh "$T/bench.txt" > "$T/table.txt" 2>&1
# (launch/st and host_sync/st integers; launch/lay and calls/lay, with the
# library calls, as the count line says them)
rows=$(awk '($1 == "dense" || $1 == "shadowkv") && $6 ~ /^[0-9]+$/ && $9 ~ /^[0-9]+$/ && $7 ~ /^[0-9.]+$/ &&
    $8 ~ /^[0-9.]+$/ && $8 + 0 >= $7 + 0' "$T/table.txt" | wc -l)
# the batch of 10 (over k_matvec's 8 rows) runs its projections through
# k_matmma, one launch for the matrices of one input as k_matvec's: its
# kernels and calls a layer are its policy's at batch 1, with no library call
wide=$(awk '($1 == "dense" || $1 == "shadowkv") && $3 == 1 { one[$1] = $7 }
    ($1 == "dense" || $1 == "shadowkv") && $3 == 10 && ($1 in one) && $7 == one[$1] && $8 == $7' "$T/table.txt" | wc -l)
if grep -q '^== figures beside their targets' "$T/table.txt" && [ "$rows" -eq "$n" ] && [ "$wide" -eq 2 ]; then
    ok "summary.sh: a row a bench run with its launches, calls and syncs ($rows rows; the 2 batches of 10 count the launches and calls a layer of batch 1)"
else ko "summary.sh: $rows rows with counts of $n, $wide batches of 10 at batch 1's launches and calls a layer: $(cat "$T/table.txt")"; fi
# --parallel max on a device sized for 2.5 sequences beside the fork's peak:
# the fit counts a fork's transient (its replayed prefill, dense, before it
# compresses) once beside what each keeps, so 2 fit and run; counted as
# kept bytes alone it said 14 and ran out of device memory. The device's
# size comes from a first run on 1 GiB: what it takes anyway (the weights,
# the source) is 1 GiB less the free bytes the bench reads.
FB="$SIM bench --backend cuda -m $T/small.gguf --prompt-tokens 300 -c 340 -n 2 --kv shadowkv --budget 64 --rank 16 --outliers 2"
SKV_CUSIM_DEVICE_BYTES=1073741824 step fit-probe 120 $FB --parallel fit
D2=$(awk 'function val(k) { return match(" " $0, " " k "=[^ ]*") ? substr(" " $0, RSTART + length(k) + 2, RLENGTH - length(k) - 2) : "" }
    /max_parallel=/ && val("fork_peak_bytes") > 0 {
        printf "%.0f", 1073741824 - val("device_free_bytes") / 0.9 + (2.5 * val("device_bytes_seq") + val("fork_peak_bytes")) / 0.9 }' \
    "$T/fit-probe.log")
if [ -n "$D2" ] && SKV_CUSIM_DEVICE_BYTES=$D2 step fit-max 180 $FB --parallel max &&
    grep -q 'max_parallel=2 .*bound=device' "$T/fit-max.log" && grep -q ' parallel=2 .*decode_tok_s=' "$T/fit-max.log"; then
    ok "bench --parallel max on a $D2-byte device: 2 sequences fit beside a fork's peak, and ran"
else
    ko "bench --parallel max on a device for 2.5 sequences beside a fork's peak (${D2:-no size: $(cat "$T/fit-probe.log")}): $(tail -2 "$T/fit-max.log" 2>&1)"
fi
# the prefill's own count (cuda_count_prefill, a plain run: no recording):
# a dense prompt of 641 tokens in chunks of 128 makes one host sync a chunk
# (its logits) and one upload of the RoPE tables, none a layer; the
# backend's launches and library calls are the simulator's
step prefill-count 120 env SKV_CUDA_COUNT=1 "$SIM" run --backend cuda -m "$T/small.gguf" --kv dense -f "$CFG" -n 2 -b 128
pre=$(grep -o 'cuda_count_prefill:.*' "$T/prefill-count.log")
if echo "$pre" | awk 'function val(k) { return match(" " $0, " " k "=[^ ]*") ? substr(" " $0, RSTART + length(k) + 2, RLENGTH - length(k) - 2) : "" }
    { ok = val("chunks") + 0 == 6 && val("layers") + 0 == 2 && val("syncs") + 0 == val("chunks") + 1 && val("launches") + 0 > 0 &&
        val("launches") == val("sim_launches") && val("lib_calls") == val("sim_lib_calls") && val("syncs") + 0 <= val("sim_syncs") + 0 }
    END { exit !(NR == 1 && ok) }'; then
    ok "SKV_CUDA_COUNT=1: a dense prefill of 6 chunks and 2 layers: one host sync a chunk and the RoPE upload, counted as the simulator counts: $pre"
else ko "SKV_CUDA_COUNT=1: the prefill's count line: ${pre:-none: $(tail -3 "$T/prefill-count.log")}"; fi
# ShadowKV's compression at the end of that prefill: 3 host syncs a layer (the
# SVD's norms, info and eigenvalues in one copy; the chunk minima; one
# upload of the layer's indices and empty chunk caches) and 1 once (the RoPE
# tables in one upload); it made 7 a layer and 2 once (the SVD's 2, 3 small
# uploads, 2 for the tables)
step prefill-count-sk 180 env SKV_CUDA_COUNT=1 "$SIM" run --backend cuda -m "$T/small.gguf" --kv shadowkv --budget 64 \
    --rank 16 --outliers 2 -f "$CFG" -n 2 -b 128
psk=$(grep -o 'cuda_count_prefill:.*' "$T/prefill-count-sk.log")
if echo "$psk" | awk 'function val(k) { return match(" " $0, " " k "=[^ ]*") ? substr(" " $0, RSTART + length(k) + 2, RLENGTH - length(k) - 2) : "" }
    { ok = val("chunks") + 0 == 6 && val("layers") + 0 == 2 && val("syncs") + 0 <= val("chunks") + 1 + 3 * val("layers") + 1 &&
        val("syncs") + 0 <= val("sim_syncs") + 0 }
    END { exit !(NR == 1 && ok) }'; then
    ok "SKV_CUDA_COUNT=1: ShadowKV's prefill adds at most 3 host syncs a layer and 1 once to the chunks' (2 layers): $psk"
else ko "SKV_CUDA_COUNT=1: ShadowKV's prefill count: ${psk:-none: $(tail -3 "$T/prefill-count-sk.log")}"; fi
step parallel 180 "$SIM" run --backend cuda -m "$T/small.gguf" --kv shadowkv --budget 64 --rank 16 --outliers 2 \
    -f "$CFG" -n 3 --parallel 2
# gpu-check's proj-bench: bench_proj on the simulator at a tiny shape, the
# backend's kernels, k_matmma two chunks ahead (--prefetch 2), then cuBLAS (--cublas), into summary.sh's
# second table; and the switch itself, counted: a decode step of one
# sequence under SKV_CUDA_GEMM_ROWS=0 makes library calls, where it makes none
PB=$(dirname "$SIM")/tests/gpu/bench_proj
PO="--dim 128 --kv 32 --ffn 256 --reps 2 --flush-mib 1" # a simulated L2 flush of 128 MiB takes minutes
step proj-bench 180 sh -c "'$PB' $PO --n 1,9,40 > '$T/proj.txt' && '$PB' --prefetch 2 $PO --n 9,40 >> '$T/proj.txt' &&
    '$PB' --cublas $PO --n 9,40 >> '$T/proj.txt'"
{ echo "step=proj-bench layers=1"; cat "$T/proj.txt"; } > "$T/proj-bench.txt"
sh tests/gpu/summary.sh "$T/proj-bench.txt" > "$T/proj-table.txt" 2>&1
prow=$(awk '/^== one layer.s decode projections/ { on = 1; next } on && $1 ~ /^[0-9]+$/' "$T/proj-table.txt")
pf2=$(echo "$prow" | awk '($1 == 9 || $1 == 40) && $2 == "k_matmma" && $5 ~ /^[0-9.]+$/ && $6 ~ /^[0-9]+$/' | wc -l)
if echo "$prow" | grep -q '^ *1  *k_matvec .* - *- *- *- *-$' && echo "$prow" | grep -Eq '^ *9  *k_matmma .* [0-9]+\.[0-9]{2}$' &&
    echo "$prow" | grep -Eq '^ *40  *k_matmma .* [0-9]+\.[0-9]{2}$' && [ "$pf2" -eq 2 ]; then
    ok "proj-bench: bench_proj's lines make summary.sh's table, batches 9 and 40 on k_matmma beside two chunks ahead and cuBLAS"
else ko "proj-bench: summary.sh's projections table: $(cat "$T/proj-table.txt" "$T/proj.txt")"; fi
step gemm-rows 120 env SKV_CUDA_COUNT=1 SKV_CUDA_GEMM_ROWS=0 "$SIM" bench --backend cuda -m "$T/small.gguf" \
    --prompt-tokens 100 -c 120 -n 3 --kv dense --parallel 1
lib=$(awk '/^cuda_count:/ { if (match($0, / lib_calls_step=[0-9]+/)) print substr($0, RSTART + 16, RLENGTH - 16); exit }' "$T/gemm-rows.log")
if [ "${lib:-0}" -gt 0 ]; then ok "SKV_CUDA_GEMM_ROWS=0: one sequence's decode step projects through cuBLAS ($lib library calls a step)"
else ko "SKV_CUDA_GEMM_ROWS=0: no library call counted: $(grep -m1 '^cuda_count:' "$T/gemm-rows.log")"; fi
echo "test_gpu_steps: $pass passed, $fail failed, 0 skipped"
[ $fail -eq 0 ]
