#!/bin/sh
# make figures: every figure in README.md and docs/, made from the demo model
# (samples/) so they stay true to the code. Deterministic: greedy decoding,
# fixed seeds. About 3 minutes on 2 cores.
set -eu
SKV=${SKV:-./skv}
M=samples/model/skv-demo.gguf
P=samples/prompts/needle.txt
D=build/figures
mkdir -p "$D"
# ShadowKV stepping through the demo needle prompt (the inspector's preset)
$SKV run -m $M -f $P -n 16 --kv shadowkv --rank 16 --budget 64 --outliers 4 --local 4 --oracle \
    --trace "$D/run.skvt" --force >/dev/null 2>&1
$SKV export --trace "$D/run.skvt" --view spectrum --layer 2 -o docs/fig-spectrum.png --force
$SKV export --trace "$D/run.skvt" --view selection --layer 3 --head 1 -o docs/fig-selection.png --force
# The six policies on one needle sweep, and the case ShadowKV missed and Quest found (docs/PEERS.md)
$SKV needle -m $M --kv dense,shadowkv,quest,freekv,specache,tailorkv --lengths 1024,2048,4000 \
    --depths 0:100:25 --runs 3 --budget 256 --rank 16 --outliers 4 --local 4 --kv-opt sink=32 --kv-opt window=32 \
    --kv-opt start=32 --kv-opt recent=32 --png docs/fig-niah-peers.png --trace "$D/needle.skvt" --trace-case 35 \
    --force >/dev/null 2>"$D/needle.err"
$SKV export --trace "$D/needle.skvt" --view needle --layer 3 --head 1 --step 0 -o docs/fig-needle-case.png --force
echo "figures: docs/fig-spectrum.png docs/fig-selection.png docs/fig-niah-peers.png docs/fig-needle-case.png"
