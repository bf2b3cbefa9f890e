#!/bin/sh
# pack.sh (make gpu-check): what a device machine needs for tests/gpu/run.sh,
# in two files under build/gpu-check/:
#   skv-gpu.tar.xz  bin/ (skv, the CUDA backend's libskv-cuda.so, which skv
#                   loads from beside itself, and the GPU tests and
#                   bench_proj of
#                   build-gpu/, a portable x86-64-v3 build with OpenBLAS
#                   GEMMs), lib/ (every shared library ldd lists for them
#                   except the C library and the CUDA libraries the box
#                   has), configs/, run.sh and summary.sh
#   gpu-check.sh    unpacks the bundle beside itself and runs run.sh
# The bundle must stay under 20 MiB (a device call carries little); a larger
# one, or a missing 8B config, is an error.
# Environment: SKV_SHARED (default ../shared), SKV_GPU_BIN (the build folder,
# default build-gpu), SKV_GPU_PACK (the output folder, default
# build/gpu-check), SKV_GPU_PACK_CPU=1 (the CPU fallback's pack, for
# tests/test_gpu_check.py: the 8B config is not needed, and the size limit is
# SKV_GPU_PACK_MAX_MIB, for a sanitizer build's larger binaries),
# SKV_GPU_PACK_XZ (xz's preset, default 9; the test packs faster).
set -eu
SHARED=${SKV_SHARED:-../shared}
BIN=${SKV_GPU_BIN:-build-gpu}
P=${SKV_GPU_PACK:-build/gpu-check}
CPU=${SKV_GPU_PACK_CPU:-0}
MAX_MIB=20
[ "$CPU" = 1 ] && MAX_MIB=${SKV_GPU_PACK_MAX_MIB:-20}
CFG8B=$SHARED/configs/llama-3.1-8b.config.json
if [ "$CPU" != 1 ] && [ ! -f "$CFG8B" ]; then
    echo "gpu-check: $CFG8B not found: the benches need the Llama-3.1-8B shape (set SKV_SHARED)" >&2
    exit 1
fi
for f in "$BIN/skv" "$BIN/libskv-cuda.so" "$BIN/tests/gpu/test_cuda_ops" "$BIN/tests/gpu/test_cuda_model" \
    "$BIN/tests/gpu/bench_proj"; do
    [ -x "$f" ] || { echo "gpu-check: $f not built" >&2; exit 1; }
done
S=$P/stage
rm -rf "$S"
mkdir -p "$S/bin" "$S/lib" "$S/configs"
cp "$BIN/skv" "$BIN/libskv-cuda.so" "$BIN/tests/gpu/test_cuda_ops" "$BIN/tests/gpu/test_cuda_model" \
    "$BIN/tests/gpu/bench_proj" "$S/bin/"
strip --strip-debug "$S"/bin/*
cp tests/gpu/run.sh tests/gpu/summary.sh "$S/"
cp samples/default-model.config.json "$S/configs/"
[ -f "$CFG8B" ] && cp "$CFG8B" "$S/configs/"
for b in "$S"/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u | while read -r lib; do
    case $(basename "$lib") in
    libc.so* | libm.so* | ld-linux* | libpthread.so* | libdl.so* | librt.so* | libcuda* | libcublas* | libcusolver* | \
        libcusparse* | libnvJitLink*) ;;
    *) cp -L "$lib" "$S/lib/" ;;
    esac
done
tar -C "$S" -cf - . | xz -T2 -"${SKV_GPU_PACK_XZ:-9}" > "$P/skv-gpu.tar.xz.tmp"
mv "$P/skv-gpu.tar.xz.tmp" "$P/skv-gpu.tar.xz"
cat > "$P/gpu-check.sh.tmp" << 'EOF'
#!/bin/sh
# gpu-check.sh (made by skv's make gpu-check): unpacks skv-gpu.tar.xz, which
# lies beside it, into $SKV_GPU_WORK (default ./skv-gpu beside it) and runs
# its run.sh, which writes everything to $OUT (default ./out beside it).
set -u
here=$(cd "$(dirname "$0")" && pwd)
W=${SKV_GPU_WORK:-$here/skv-gpu}
mkdir -p "$W" && xz -dc "$here/skv-gpu.tar.xz" | tar -C "$W" -xf - || {
    echo "gpu-check: cannot unpack $here/skv-gpu.tar.xz into $W" >&2
    exit 2
}
OUT=${OUT:-$here/out}
export OUT
exec sh "$W/run.sh"
EOF
mv "$P/gpu-check.sh.tmp" "$P/gpu-check.sh"
chmod 0755 "$P/gpu-check.sh"
rm -rf "$S"
kib=$(($(wc -c < "$P/skv-gpu.tar.xz") / 1024))
if [ "$kib" -ge $((MAX_MIB * 1024)) ]; then
    echo "gpu-check: the bundle is $kib KiB, over the $MAX_MIB MiB a device call carries" >&2
    rm -f "$P/skv-gpu.tar.xz" "$P/gpu-check.sh"
    exit 1
fi
echo "gpu-check: $P/skv-gpu.tar.xz ($kib KiB) and $P/gpu-check.sh; on the device: OUT=DIR sh gpu-check.sh"
