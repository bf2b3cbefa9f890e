#!/bin/sh
# make figures: every figure in README.md and docs/, made from the demo model
# (samples/) so they stay true to the code. Deterministic: greedy decoding,
# fixed seeds, one thread for the sweeps (so sums add in one order).
set -eu
SKV=${SKV:-./skv}
M=samples/model/skv-demo.gguf
P=samples/prompts/needle.txt
D=${FIGURES_DIR:-build/figures}  # the traces behind the figures
O=${FIGURES_OUT:-docs}           # where the figures go (tests/test_figures.sh: a scratch folder)
mkdir -p "$D" "$O"
# ShadowKV stepping through the demo needle prompt (the inspector's preset)
$SKV run -m $M -f $P -n 16 --kv shadowkv --rank 16 --budget 64 --outliers 4 --local 4 --oracle \
    --trace "$D/run.skvt" --force >/dev/null 2>&1
$SKV export --trace "$D/run.skvt" --view spectrum --layer 2 -o $O/fig-spectrum.png --force
$SKV export --trace "$D/run.skvt" --view selection --layer 3 --head 1 -o $O/fig-selection.png --force
# The six policies on one needle sweep (no probes: the heatmap needs only the
# answers), then the case ShadowKV missed and Quest found run alone with its
# probes (--case replays it as the sweep ran it; docs/PEERS.md)
# (FIGURES_LENGTHS, FIGURES_RUNS, FIGURES_CASE: a smaller sweep for
# tests/test_figures.sh under the sanitizers; the docs' figures use the defaults)
SWEEP="--kv dense,shadowkv,quest,freekv,specache,tailorkv --lengths ${FIGURES_LENGTHS:-1024,2048,4000} --depths 0:100:25 --runs ${FIGURES_RUNS:-3}
    --budget 256 --rank 16 --outliers 4 --local 4 --kv-opt sink=32 --kv-opt window=32 --kv-opt start=32
    --kv-opt recent=32"
$SKV needle -m $M $SWEEP --png $O/fig-niah-peers.png --force >/dev/null 2>"$D/needle.err"
$SKV needle -m $M $SWEEP --case ${FIGURES_CASE:-35} --trace "$D/needle.skvt" --force >/dev/null 2>>"$D/needle.err"
$SKV export --trace "$D/needle.skvt" --view needle --layer 3 --head 1 --step 0 -o $O/fig-needle-case.png --force
echo "figures: $O/fig-spectrum.png $O/fig-selection.png $O/fig-niah-peers.png $O/fig-needle-case.png"
