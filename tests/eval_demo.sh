#!/bin/sh
# make eval-demo: runs skv eval --suite demo into build/eval-demo (resumable:
# a second run only redraws), then puts its leaderboard between the markers
# of docs/EVAL.md and its figures into docs/ (eval-heatmap.png,
# eval-budget.png). About 13 minutes on a quiet 2-core machine; not in CI.
set -eu
OUT=${EVAL_OUT:-build/eval-demo}
/usr/bin/time -f '%e s wall' -o "$OUT.time" ./skv eval --suite demo --out "$OUT" -m samples/model/skv-demo.gguf \
    --haystack samples/haystack.txt || { echo "eval-demo: skv eval failed" >&2; exit 1; }
cp "$OUT/heatmap.png" docs/eval-heatmap.png
cp "$OUT/budget.png" docs/eval-budget.png
{
    sed -n '/^Model /,$p' "$OUT/leaderboard.md" | sed 's/^## /### /'
    echo
    echo '![Accuracy per task and length, one panel per policy](eval-heatmap.png)'
    echo
    echo '![Accuracy against budget at 4000 tokens](eval-budget.png)'
} > "$OUT/section.md"
awk 'FNR == NR { t = t $0 "\n"; next } /<!-- eval-demo begin -->/ { print; printf "%s", t; skip = 1; next } \
     /<!-- eval-demo end -->/ { skip = 0 } !skip' "$OUT/section.md" docs/EVAL.md > docs/EVAL.md.tmp
mv docs/EVAL.md.tmp docs/EVAL.md
echo "docs/EVAL.md: leaderboard updated ($(cat "$OUT.time"))"
