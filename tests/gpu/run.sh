#!/bin/sh
# run.sh: every check and measurement of the CUDA backend that needs a GPU,
# in one call on the device machine. `make gpu-pack` builds what travels
# (build/gpu-pack/: bin/ with skv and the GPU tests, lib/ with the shared
# libraries ldd lists that the box lacks, configs/, this script); on the
# box, from that folder:
#     sh run.sh            # log and figures into ./out (or $OUT)
# It needs the CUDA 13 runtime, cuBLAS and cuSOLVER of the box. Models are
# synthesized on the box (../shared does not travel): random weights change
# no speed, and the tests compare the GPU with the CPU on the same weights.
# Steps: device info; the op tests (every kernel against its CPU twin); the
# whole-model test (CPU vs GPU logits) on a small model and on the
# Llama-3.1-8B shape with 2 layers; decode throughput of the dense path on
# the full 8B shape at 60K and 122K tokens; a timeline of one decode step.
set -u
cd "$(dirname "$0")"
OUT=${OUT:-out}
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/lib:${LD_LIBRARY_PATH:-}"
SKV=bin/skv
log() { echo "== $*"; }
if $SKV info --backends | grep -A1 '^  cuda' | grep -q 'not available'; then
    $SKV info --backends
    echo "run.sh: no usable CUDA device here; nothing run (the models and benches are for a GPU machine)"
    exit 1
fi
{
    log "device"
    nvidia-smi || echo "nvidia-smi: not found"
    $SKV --version
    $SKV info --backends
    log "models (synthesized here, seeded)"
    [ -f small.gguf ] || $SKV synth --config configs/default-model.config.json --dtype f32 --seed 7 -o small.gguf
    [ -f l8b-2l.gguf ] || $SKV synth --config configs/llama-3.1-8b.config.json --dtype bf16 --layers 2 --seed 1 -o l8b-2l.gguf
    log "op tests: every CUDA kernel against its CPU twin"
    bin/test_cuda_ops
    log "whole model: CPU vs GPU logits"
    SKV_GPU_MODEL=small.gguf bin/test_cuda_model
    SKV_GPU_MODEL=l8b-2l.gguf bin/test_cuda_model
    log "decode throughput, dense and ShadowKV, Llama-3.1-8B shape (bf16 weights, f32 KV), batch 1"
    [ -f l8b.gguf ] || $SKV synth --config configs/llama-3.1-8b.config.json --dtype bf16 --seed 1 -o l8b.gguf
    for ctx in 61440 122880; do
        $SKV bench --backend cuda -m l8b.gguf --prompt-tokens $ctx -n 32 -c $((ctx + 64)) || echo "bench at $ctx failed"
        # ShadowKV with the paper's settings: rank 160, chunk 8, budget 2048, 48 outliers
        $SKV bench --backend cuda --kv shadowkv -m l8b.gguf --prompt-tokens $ctx -n 32 -c $((ctx + 64)) ||
            echo "shadowkv bench at $ctx failed"
    done
    log "a traced decode step on the GPU (timeline spans from CUDA events)"
    $SKV run --backend cuda -m l8b-2l.gguf --kv shadowkv --rank 32 --budget 64 -f configs/default-model.config.json -n 4 \
        --trace "$OUT/gpu.trace" --force &&
        $SKV export --trace "$OUT/gpu.trace" --view timeline --step 2 -o "$OUT/timeline.png" --force
} 2>&1 | tee "$OUT/run.log"
