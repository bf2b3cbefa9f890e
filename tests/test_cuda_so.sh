#!/bin/sh
# test_cuda_so: the CUDA backend is a shared object skv loads at run time
# (libskv-cuda.so, kernels/backend.c), so a CPU-only skv starts where the
# CUDA libraries are absent: skv links none of them (ldd); a copy of skv
# without the object beside it lists the backends, says in one line why
# cuda is not available, runs a short CPU generation and falls back from
# --backend cuda with one notice; an object whose own libraries are missing
# (a stand-in linked against a library then removed) is refused with the
# missing library named; in the build, the object loads (its `available`
# runs: here without a GPU it says so). Each command under a timeout.
# Skips in a build without the CUDA backend. Prints PASS/FAIL/SKIP lines.
cd "$(dirname "$0")/.." || exit 1
SKV=${SKV_BIN:-build/skv}
BIN=$(dirname "$SKV")
fails=0
check() { # DESCR OK(0/1) [DETAIL]
    if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1${3:+: $3}"; fails=$((fails + 1)); fi
}
if [ ! -f "$BIN/libskv-cuda.so" ]; then
    echo "SKIP test_cuda_so: $BIN has no libskv-cuda.so (a build without nvcc)"
    exit 0
fi
for tool in ldd timeout cc; do
    command -v $tool > /dev/null 2>&1 || { echo "SKIP test_cuda_so: $tool not found"; exit 0; }
done
T=$(mktemp -d "${TMPDIR:-/tmp}/skv-cudaso.XXXXXX")
trap 'rm -rf "$T"' EXIT
unset LD_LIBRARY_PATH
ok() { [ "$1" ] && echo 0 || echo 1; }

# skv links no CUDA library; the object does
libs=$(ldd "$SKV" 2>&1 | grep -E 'libcudart|libcublas|libcusolver|libcuda\.' | tr -s ' \t' ' ')
check "ldd $SKV lists no CUDA library" "$(ok "$([ -z "$libs" ] && echo y)")" "$libs"
so=$(ldd "$BIN/libskv-cuda.so" 2>&1 | grep -o -E 'libcudart|libcublas\.|libcusolver\.' | sort -u | wc -l)
check "libskv-cuda.so links cudart, cuBLAS and cuSOLVER ($so of 3)" "$(ok "$([ "$so" -eq 3 ] && echo y)")"

# in the build: the object loads, and cuda's line is the device check's
timeout -k 5 60 "$SKV" info --backends > "$T/built.txt" 2>&1
line=$(grep -A1 '^  cuda' "$T/built.txt" | tail -1)
check "in the build, cuda loads from libskv-cuda.so (its own device check answers: $line)" \
    "$(ok "$(echo "$line" | grep -v 'libskv-cuda.so' | grep -q -E 'available' && echo y)")" "$(cat "$T/built.txt")"

# skv alone in a folder: no object beside it, none in the library path
mkdir -p "$T/alone"
cp "$SKV" "$T/alone/skv"
timeout -k 5 60 "$T/alone/skv" info --backends > "$T/alone.txt" 2>&1
rc=$?
why=$(grep -A1 '^  cuda' "$T/alone.txt" | tail -1 | sed 's/^ *//')
check "without the object: skv info --backends runs (exit $rc) and lists cpu as available" \
    "$(ok "$([ $rc -eq 0 ] && grep -A1 '^  cpu' "$T/alone.txt" | grep -q '^ *available$' && echo y)")" \
    "$(cat "$T/alone.txt")"
check "without the object: cuda is not available, in one line saying why: \"$why\"" \
    "$(ok "$(echo "$why" | grep -q '^not available here: libskv-cuda.so not found' && echo y)")"
"$T/alone/skv" synth --config samples/default-model.config.json --dtype f32 --layers 2 --seed 3 \
    -o "$T/tiny.gguf" --force > "$T/synth.txt" 2>&1
timeout -k 5 120 "$T/alone/skv" run -m "$T/tiny.gguf" -p "hello there" -n 4 -t 2 > "$T/run.txt" 2> "$T/run.err"
rc=$?
check "without the object: a short CPU skv run generates (exit $rc)" \
    "$(ok "$([ $rc -eq 0 ] && [ -f "$T/tiny.gguf" ] && echo y)")" "$(tail -3 "$T/run.err")"
timeout -k 5 120 "$T/alone/skv" run --backend cuda -m "$T/tiny.gguf" -p "hello there" -n 2 -t 2 \
    > "$T/run2.txt" 2> "$T/run2.err"
rc=$?
n=$(grep -c 'cannot run here' "$T/run2.err")
check "without the object: --backend cuda runs on cpu (exit $rc) with one notice naming the object ($n)" \
    "$(ok "$([ $rc -eq 0 ] && [ "$n" -eq 1 ] && grep 'cannot run here' "$T/run2.err" | grep -q 'libskv-cuda.so' &&
        echo y)")" "$(cat "$T/run2.err")"

# an object beside skv whose own library is missing (as libcudart is on a
# machine without CUDA): a stand-in built against a library then removed
mkdir -p "$T/nolib"
cp "$SKV" "$T/nolib/skv"
echo 'int skv_gone_dep(void) { return 1; }' > "$T/dep.c"
echo 'int skv_gone_dep(void); int skv_uses_dep(void) { return skv_gone_dep(); }' > "$T/so.c"
if cc -shared -fPIC -o "$T/libskvgonedep.so" "$T/dep.c" &&
    cc -shared -fPIC -o "$T/nolib/libskv-cuda.so" "$T/so.c" -L"$T" -lskvgonedep; then
    rm -f "$T/libskvgonedep.so"
    timeout -k 5 60 "$T/nolib/skv" info --backends > "$T/nolib.txt" 2>&1
    rc=$?
    why=$(grep -A1 '^  cuda' "$T/nolib.txt" | tail -1 | sed 's/^ *//')
    check "an object whose library is missing: cuda not available (exit $rc), the library named in one line: \"$why\"" \
        "$(ok "$([ $rc -eq 0 ] && echo "$why" | grep -q 'libskv-cuda.so does not load: libskvgonedep.so: cannot open' &&
            echo y)")" "$(cat "$T/nolib.txt")"
    # an object that loads but holds no backend table
    cc -shared -fPIC -o "$T/nolib/libskv-cuda.so" "$T/dep.c"
    why=$(timeout -k 5 60 "$T/nolib/skv" info --backends 2>&1 | grep -A1 '^  cuda' | tail -1 | sed 's/^ *//')
    check "an object without the backend's table is refused: \"$why\"" \
        "$(ok "$(echo "$why" | grep -q 'not this build' && echo y)")"
else
    check "cc builds the stand-in objects" 1
fi
echo "test_cuda_so: $fails failed"
[ $fails -eq 0 ]
