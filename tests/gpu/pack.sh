#!/bin/sh
# pack.sh (make gpu-pack): gathers what tests/gpu/run.sh needs on a device
# machine into build/gpu-pack/: the binaries of build-gpu/ (a portable
# x86-64-v3 build with OpenBLAS GEMMs, so the folder stays under the 64 MiB
# a device call carries), every shared library ldd lists except the C
# library and the CUDA libraries the box has, the model configs and run.sh.
set -eu
SHARED=${SKV_SHARED:-../shared}
P=build/gpu-pack
rm -rf "$P"
mkdir -p "$P/bin" "$P/lib" "$P/configs"
cp build-gpu/skv build-gpu/tests/gpu/test_cuda_ops build-gpu/tests/gpu/test_cuda_model "$P/bin/"
strip --strip-debug "$P"/bin/*
cp tests/gpu/run.sh "$P/"
cp samples/default-model.config.json "$P/configs/"
[ -f "$SHARED/configs/llama-3.1-8b.config.json" ] && cp "$SHARED/configs/llama-3.1-8b.config.json" "$P/configs/"
for b in "$P"/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
        libc.so*|libm.so*|ld-linux*|libpthread.so*|libdl.so*|librt.so*|libcuda*|libcublas*|libcusolver*|libcusparse*|libnvJitLink*) ;;
        *) cp -L "$lib" "$P/lib/" ;;
    esac
done
echo "gpu-pack: $P, $(du -sm "$P" | cut -f1) MiB ($(ls "$P/lib" | wc -l) libraries)"
