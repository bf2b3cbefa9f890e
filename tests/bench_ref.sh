#!/bin/sh
# make bench-ref: builds llama.cpp's llama-bench and llama-batched-bench,
# CPU-only and tuned for this CPU, into build/ref/: the peer `make bench`
# measures beside skv.
#
# The source is the llama.cpp snapshot that the npm package node-llama-cpp
# ships as a git bundle (llama/gitRelease.bundle). Both are pinned: the
# package version and its sha1 (as the registry lists it), and the commit
# the bundle must hold. `npm pack` fetches the package once into build/ref/
# (a registry download, like make deps; nothing else downloads); later runs
# reuse the built binaries. Needs npm, git, cmake, a C++ compiler and ./skv
# (for the smoke model).
#
# The native build (-DGGML_NATIVE=ON) crashes on q8_0 models on Intel CPUs
# with AMX (SIGSEGV after "set_n_threads"). So both tools are smoke-run on a
# one-layer q8_0 model from `skv synth`; when a run dies, and the CPU has
# AMX, the tools are rebuilt with the CPU's ISA flags named one by one and
# AMX left out, and smoke-run again. On any failure this prints one line
# saying why, writes it to build/ref/unusable (make bench prints it in
# place of llama.cpp's figures) and exits 1.
set -eu
PKG=node-llama-cpp
VER=3.22.1
SHA1=e908932762f21939024263d58f1d6dc3e88b23e6
COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
REF=build/ref
SKV=${SKV:-./skv}
SHARED=${SKV_SHARED:-../shared}
TOOLS="llama-bench llama-batched-bench"

mkdir -p "$REF"
fail() {
    echo "bench-ref: $*" >&2
    echo "$*" >"$REF/unusable.tmp" && mv "$REF/unusable.tmp" "$REF/unusable"
    for t in $TOOLS; do rm -f "$REF/$t"; done
    exit 1
}

ready() { # the tools are built from COMMIT and passed the smoke run
    [ "$(cat "$REF/commit" 2>/dev/null)" = "$COMMIT" ] || return 1
    for t in $TOOLS; do [ -x "$REF/$t" ] || return 1; done
}
if ready; then exit 0; fi
rm -f "$REF/commit"

for tool in npm git cmake c++; do
    command -v $tool >/dev/null 2>&1 || fail "$tool not found (llama.cpp is built from node-llama-cpp@$VER's source with npm, git, cmake and c++)"
done
[ -x "$SKV" ] || fail "$SKV not built (make skv first: it makes the smoke model)"
CFG=$SHARED/configs/smollm2-135m.config.json
[ -f "$CFG" ] || fail "$CFG missing (the smoke model is made from it)"

TGZ=$REF/$PKG-$VER.tgz
if [ ! -f "$TGZ" ]; then
    (cd "$REF" && npm pack --silent "$PKG@$VER" >/dev/null 2>npm.log) ||
        fail "npm pack $PKG@$VER failed ($(tail -n 1 "$REF/npm.log" 2>/dev/null))"
fi
got=$(sha1sum "$TGZ" | cut -d' ' -f1)
[ "$got" = "$SHA1" ] || { rm -f "$TGZ"; fail "$TGZ has sha1 $got, not the pinned $SHA1"; }

SRC=$REF/llama.cpp
if [ "$(git -C "$SRC" rev-parse HEAD 2>/dev/null)" != "$COMMIT" ]; then
    rm -rf "$REF/package" "$SRC"
    tar -xzf "$TGZ" -C "$REF" package/llama/gitRelease.bundle || fail "no llama/gitRelease.bundle in $TGZ"
    git clone --quiet "$REF/package/llama/gitRelease.bundle" "$SRC" 2>/dev/null || fail "cannot clone the bundle in $TGZ"
    rm -rf "$REF/package"
    head=$(git -C "$SRC" rev-parse HEAD)
    [ "$head" = "$COMMIT" ] || fail "the bundle holds llama.cpp $head, not the pinned $COMMIT"
fi

# build DIR FLAGS...: configures and builds both tools into $SRC/DIR
build() {
    dir=$SRC/$1; shift
    cmake -S "$SRC" -B "$dir" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
          -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF "$@" >"$REF/cmake.log" 2>&1 ||
        fail "cmake configure failed (see $REF/cmake.log)"
    cmake --build "$dir" --target $TOOLS -j "${JOBS:-2}" >"$REF/build.log" 2>&1 ||
        fail "the llama.cpp build failed (see $REF/build.log)"
}

# smoke DIR: both tools on the one-layer q8_0 model; prints why they failed
# ("" when they ran). A tool killed by a signal reports it as "signal N".
SMOKE=$REF/smoke-q8_0.gguf
[ -f "$SMOKE" ] || "$SKV" synth --config "$CFG" --dtype q8_0 --layers 1 --seed 1 -o "$SMOKE" >/dev/null 2>"$REF/smoke.log" ||
    fail "$SKV synth could not make the smoke model (see $REF/smoke.log)"
smoke() {
    bin=$SRC/$1/bin
    # with the flash-attention flags make bench gives (this version: llama-bench
    # -fa 0,1, a list; llama-batched-bench -fa on|off|auto)
    for run in "llama-bench -m $SMOKE -p 16 -n 2 -t 2 -r 1 -fa 0,1" \
               "llama-batched-bench -m $SMOKE -c 128 -npp 16 -ntg 2 -npl 1,2 -t 2 -fa off" \
               "llama-batched-bench -m $SMOKE -c 128 -npp 16 -ntg 2 -npl 1,2 -t 2 -fa on"; do
        set +e
        timeout -k 10 300 "$bin"/$run >"$REF/smoke.log" 2>&1
        rc=$?
        set -e
        if [ $rc -ne 0 ]; then
            t=${run%% *}
            if [ $rc -eq 124 ]; then echo "$t hung on a q8_0 model (killed after 300 s)"
            elif [ $rc -gt 128 ]; then echo "$t died with signal $((rc - 128)) on a q8_0 model"
            else echo "$t failed (exit $rc) on a q8_0 model: $(tail -n 1 "$REF/smoke.log")"; fi
            return 0
        fi
    done
}

echo "bench-ref: building $TOOLS from llama.cpp ${COMMIT%"${COMMIT#???????}"} (node-llama-cpp@$VER), CPU-only, -DGGML_NATIVE=ON" >&2
build build -DGGML_NATIVE=ON
why=$(smoke build)
dir=build
if [ -n "$why" ]; then
    if grep -qw amx_int8 /proc/cpuinfo 2>/dev/null || grep -qw amx_tile /proc/cpuinfo 2>/dev/null; then
        echo "bench-ref: the native build: $why; rebuilding without AMX" >&2
        # The CPU's ISA extensions named one by one, AMX left out.
        flags=$(grep -m1 '^flags' /proc/cpuinfo)
        has() { case " ${flags#*:} " in *" $1 "*) echo ON ;; *) echo OFF ;; esac; }
        build build-noamx -DGGML_NATIVE=OFF -DGGML_SSE42="$(has sse4_2)" -DGGML_AVX="$(has avx)" \
            -DGGML_AVX2="$(has avx2)" -DGGML_FMA="$(has fma)" -DGGML_F16C="$(has f16c)" -DGGML_BMI2="$(has bmi2)" \
            -DGGML_AVX_VNNI="$(has avx_vnni)" -DGGML_AVX512="$(has avx512bw)" -DGGML_AVX512_VBMI="$(has avx512vbmi)" \
            -DGGML_AVX512_VNNI="$(has avx512_vnni)" -DGGML_AVX512_BF16="$(has avx512_bf16)" \
            -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
        why2=$(smoke build-noamx)
        [ -z "$why2" ] || fail "not run: the native build: $why; the build without AMX: $why2"
        dir=build-noamx
    else
        fail "not run: $why"
    fi
fi
# The tools find their shared libraries through their RUNPATH into the build tree.
for t in $TOOLS; do ln -sf "llama.cpp/$dir/bin/$t" "$REF/$t"; done
echo "$dir" >"$REF/variant"
echo "$COMMIT" >"$REF/commit"
rm -f "$REF/unusable"
echo "bench-ref: $(for t in $TOOLS; do printf '%s ' "$REF/$t"; done)ready ($dir)" >&2
