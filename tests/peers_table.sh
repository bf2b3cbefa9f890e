#!/bin/sh
# make peers-table: the table of docs/PEERS.md, measured on the demo model.
# For each policy at two budgets (3% of the prompt and 256 tokens attended
# per KV head, each policy's defaults scaled to the budget):
#  - needle retrieval (skv needle) over the same lengths, depths and values;
#  - mass recall, output error and tokens attended (skv run --oracle on the
#    demo needle prompt, 16 decode steps), and the bytes resident.
# Prints the markdown table on stdout; the Makefile puts it into
# docs/PEERS.md between its markers. RUNS, LENGTHS and DEPTHS override the
# sweep.
set -eu
SKV=${SKV:-./skv}
M=${M:-samples/model/skv-demo.gguf}
OUT=${OUT:-build/peers}
RUNS=${RUNS:-2}
LENGTHS=${LENGTHS:-1k,2k,4000}
DEPTHS=${DEPTHS:-0:100:25}
POLICIES="shadowkv quest freekv specache tailorkv"
mkdir -p "$OUT"

# flags BUDGET POLICY: the policy's defaults scaled to the budget
flags() {
    case "$1:$2" in
        3%:shadowkv) echo "--rank 16 --outliers 4 --local 4" ;;
        3%:quest) echo "--page 8" ;;
        3%:freekv) echo "--page 8 --kv-opt sink=8 --kv-opt window=8" ;;
        3%:tailorkv) echo "--kv-opt start=8 --kv-opt recent=8" ;;
        256:shadowkv) echo "--rank 16 --outliers 4 --local 4" ;;
        256:quest) echo "--page 16" ;;
        256:freekv) echo "--page 16 --kv-opt sink=32 --kv-opt window=32" ;;
        256:tailorkv) echo "--kv-opt start=32 --kv-opt recent=32" ;;
        *) echo "" ;;
    esac
}

# retrieved JSON METHOD -> the method's retrieval percent over the sweep
retrieved() {
    awk -v m="\"$2\":" '/"retrieved_percent"/ { on = 1; next } on && /}/ { exit } on && $1 == m { gsub(",", "", $2); printf "%.0f\n", $2 }' "$1"
}

echo "| budget | policy | needle retrieval % | mass recall % | output error % | tokens attended / query head (prompt + generated) | resident MiB (dense) |"
echo "|---|---|---|---|---|---|---|"
for budget in 3% 256; do
    tag=$(echo "$budget" | tr -d %)
    json="$OUT/needle-$tag.json"
    all=""
    for p in $POLICIES; do all="$all $(flags "$budget" "$p")"; done
    # shellcheck disable=SC2086
    $SKV needle -m "$M" --lengths "$LENGTHS" --depths "$DEPTHS" --runs "$RUNS" --budget "$budget" \
        --kv "dense,$(echo $POLICIES | tr ' ' ',')" $all --json "$json" --force >/dev/null 2>"$OUT/needle-$tag.log"
    dense=$(retrieved "$json" dense)
    for p in $POLICIES; do
        # shellcheck disable=SC2086
        log=$($SKV run -m "$M" -f samples/prompts/needle.txt -n 16 --kv "$p" --budget "$budget" $(flags "$budget" "$p") \
              --oracle 2>&1 >/dev/null)
        recall=$(echo "$log" | sed -n 's/.*oracle: mass recall \([0-9.]*\)%.*/\1/p')
        err=$(echo "$log" | sed -n 's/.*output error \([0-9.]*\)% (max.*/\1/p')
        tok=$(echo "$log" | sed -n 's/.*units: \([0-9.]*\) tokens attended in full precision per query head (\([0-9.]*\) prompt + \([0-9.]*\) generated).*/\1 (\2 + \3)/p')
        res=$(echo "$log" | sed -n 's/.*KV bytes: resident \([0-9.]*\) MiB.*vs dense \([0-9.]*\) MiB.*/\1 (\2)/p')
        echo "| $budget | $p | $(retrieved "$json" "$p") (dense $dense) | $recall | $err | $tok | $res |"
    done
done
