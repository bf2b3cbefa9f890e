#!/bin/sh
# test_figures: make figures is deterministic. tests/figures.sh runs twice
# into two scratch folders (FIGURES_OUT, FIGURES_DIR; docs/ is not touched)
# and the four figures come out byte for byte the same; each is a PNG of
# the size its export asks for. The needle sweep is cut to one length and
# one run (FIGURES_LENGTHS, FIGURES_RUNS, FIGURES_CASE; the same commands
# and code paths) so that the test takes under a minute under the
# sanitizers instead of 7; SKV_FIGURES_FULL=1 runs the docs' sweep. The committed docs/ figures are made on
# one machine; another CPU (AVX2 or AVX-512) may round a sum differently,
# so they are not compared here. Prints PASS/FAIL lines.
cd "$(dirname "$0")/.." || exit 1
SKV=${SKV_BIN:-./build/skv}
if [ ! -f samples/model/skv-demo.gguf ]; then echo "SKIP the demo model samples/model/skv-demo.gguf is missing"; exit 0; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
check() { # DESCR STATUS
    if [ "$2" -eq 0 ]; then echo "PASS $1"; else echo "FAIL $1"; fails=$((fails + 1)); fi
}
before=$(cat docs/fig-*.png 2>/dev/null | cksum)
for r in a b; do
    if [ "${SKV_FIGURES_FULL:-0}" = 1 ]; then
        SKV=$SKV FIGURES_OUT=$TMP/$r FIGURES_DIR=$TMP/$r/traces sh tests/figures.sh >"$TMP/$r.log" 2>&1
    else
        SKV=$SKV FIGURES_OUT=$TMP/$r FIGURES_DIR=$TMP/$r/traces FIGURES_LENGTHS=1024 FIGURES_RUNS=1 FIGURES_CASE=2 \
            sh tests/figures.sh >"$TMP/$r.log" 2>&1
    fi
    rc=$?
    check "make figures' script runs to the end (round $r)" $rc
    [ $rc -eq 0 ] || { sed 's/^/  /' "$TMP/$r.log" | tail -5; sed 's/^/  needle: /' "$TMP/$r/traces/needle.err" 2>/dev/null | tail -5; }
done
for f in fig-spectrum.png fig-selection.png fig-niah-peers.png fig-needle-case.png; do
    ok=1
    [ -s "$TMP/a/$f" ] && [ -s "$TMP/b/$f" ] && cmp -s "$TMP/a/$f" "$TMP/b/$f" && ok=0
    check "$f: made twice, byte for byte the same" $ok
    # a PNG: the signature, then an IHDR with a nonzero width and height
    sig=$(od -An -tx1 -N8 "$TMP/a/$f" 2>/dev/null | tr -d ' \n')
    wh=$(od -An -tu1 -j16 -N8 "$TMP/a/$f" 2>/dev/null | awk '{print ($1*16777216+$2*65536+$3*256+$4) "x" ($5*16777216+$6*65536+$7*256+$8)}')
    check "$f is a PNG ($wh)" $([ "$sig" = 89504e470d0a1a0a ] && [ "${wh#0x}" = "$wh" ] && [ "${wh%x0}" = "$wh" ] && echo 0 || echo 1)
done
check "docs/' figures are untouched by the test" $([ "$(cat docs/fig-*.png 2>/dev/null | cksum)" = "$before" ] && echo 0 || echo 1)
exit $([ $fails -eq 0 ] && echo 0 || echo 1)
