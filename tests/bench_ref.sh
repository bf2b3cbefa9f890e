#!/bin/sh
# make bench-ref: builds llama.cpp's llama-bench, CPU-only and tuned for this
# CPU, into build/ref/, the peer `make bench` measures beside skv.
#
# The source is the llama.cpp snapshot that the npm package node-llama-cpp
# ships as a git bundle (llama/gitRelease.bundle). Both are pinned: the
# package version and its sha1 (as the registry lists it), and the commit
# the bundle must hold. `npm pack` fetches the package once into build/ref/
# (a registry download, like make deps; nothing else downloads); later runs
# reuse the built binary. Needs npm, git, cmake and a C++ compiler. On any
# failure it prints one line saying why and exits 1; make bench then runs
# without the peer and says so.
set -eu
PKG=node-llama-cpp
VER=3.22.1
SHA1=e908932762f21939024263d58f1d6dc3e88b23e6
COMMIT=de3ff815ea7d559ee917f063901b8986f038abc6
REF=build/ref
BIN=$REF/llama-bench

fail() { echo "bench-ref: $*" >&2; exit 1; }

if [ -x "$BIN" ] && [ "$(cat "$REF/commit" 2>/dev/null)" = "$COMMIT" ]; then
    exit 0
fi
for tool in npm git cmake c++; do
    command -v $tool >/dev/null 2>&1 || fail "$tool not found (llama.cpp is built from node-llama-cpp@$VER's source with npm, git, cmake and c++)"
done
mkdir -p "$REF"
TGZ=$REF/$PKG-$VER.tgz
if [ ! -f "$TGZ" ]; then
    (cd "$REF" && npm pack --silent "$PKG@$VER" >/dev/null 2>npm.log) ||
        fail "npm pack $PKG@$VER failed ($(tail -n 1 "$REF/npm.log" 2>/dev/null))"
fi
got=$(sha1sum "$TGZ" | cut -d' ' -f1)
[ "$got" = "$SHA1" ] || { rm -f "$TGZ"; fail "$TGZ has sha1 $got, not the pinned $SHA1"; }

SRC=$REF/llama.cpp
rm -rf "$REF/package" "$SRC"
tar -xzf "$TGZ" -C "$REF" package/llama/gitRelease.bundle || fail "no llama/gitRelease.bundle in $TGZ"
git clone --quiet "$REF/package/llama/gitRelease.bundle" "$SRC" 2>/dev/null || fail "cannot clone the bundle in $TGZ"
head=$(git -C "$SRC" rev-parse HEAD)
[ "$head" = "$COMMIT" ] || fail "the bundle holds llama.cpp $head, not the pinned $COMMIT"

echo "bench-ref: building llama-bench from llama.cpp ${COMMIT%"${COMMIT#???????}"} (node-llama-cpp@$VER), CPU-only, -DGGML_NATIVE=ON" >&2
cmake -S "$SRC" -B "$SRC/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DLLAMA_CURL=OFF \
      -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TESTS=OFF >"$REF/cmake.log" 2>&1 ||
    fail "cmake configure failed (see $REF/cmake.log)"
cmake --build "$SRC/build" --target llama-bench -j "${JOBS:-2}" >"$REF/build.log" 2>&1 ||
    fail "the llama-bench build failed (see $REF/build.log)"
# llama-bench finds its shared libraries through its RUNPATH into the build tree.
ln -sf "llama.cpp/build/bin/llama-bench" "$BIN"
"$BIN" --help >/dev/null 2>&1 || fail "the built $BIN does not run"
echo "$COMMIT" >"$REF/commit"
rm -rf "$REF/package"
echo "bench-ref: $BIN ready" >&2
