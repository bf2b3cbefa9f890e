#!/bin/sh
# test_bench_cli: skv bench's batch bound and its Ctrl-C, on the demo model
# (seconds): --parallel fit names what set the largest batch (cap when the
# 4096 limit did, memory when --mem did) and says a cap on stderr; a batch
# over --mem is refused in one line; a cross-policy fork says its figures
# are approximate; a policy under its floor says so once; Ctrl-C says it stops after the step in flight, prints
# the partial line and exits 130; a second Ctrl-C quits at once. Prints
# PASS/FAIL/SKIP lines.
cd "$(dirname "$0")/.." || exit 1
SKV=${SKV_BIN:-./skv}
M=samples/model/skv-demo.gguf
if [ ! -x "$SKV" ] || [ ! -f "$M" ]; then echo "SKIP test_bench_cli: $SKV or $M missing"; exit 0; fi
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
fails=0
check() { # DESCR STATUS: on a failure the run's stderr, shortened
    if [ "$2" -eq 0 ]; then echo "PASS $1"; return; fi
    echo "FAIL $1"; fails=$((fails + 1)); tail -n 3 "$TMP/e" 2>/dev/null | sed 's/^/    stderr: /'
}
B="$SKV bench -m $M --prompt-tokens 64 -n 2"

timeout -k 5 120 $B --parallel fit --mem 1000 >"$TMP/o" 2>"$TMP/e"; rc=$?
check "--parallel fit with --mem over what 4096 sequences take: bound=cap, and stderr says --mem would hold more" \
    $([ $rc -eq 0 ] && grep -q "max_parallel=4096 .*bound=cap" "$TMP/o" &&
      grep -q "would hold [0-9]* sequences; fit stops at the cap of 4096" "$TMP/e" && echo 0 || echo 1)
timeout -k 5 120 $B --parallel fit --mem 0.2 >"$TMP/o" 2>"$TMP/e"; rc=$?
n=$(sed -n 's/.*max_parallel=\([0-9]*\).*/\1/p' "$TMP/o")
check "--parallel fit under a small --mem: bound=memory, fewer than 4096, no cap said" \
    $([ $rc -eq 0 ] && grep -q "bound=memory" "$TMP/o" && [ "${n:-4096}" -lt 4096 ] && ! grep -q cap "$TMP/e" &&
      echo 0 || echo 1)
# the fork's peak (the rise of the resident bytes while it was made, beyond
# what it keeps) is said and fitted beside the batch: B sequences and it
# within --mem
check "--parallel fit says the fork's peak, and B sequences beside it fit in --mem" \
    $(awk 'function val(k) { return match(" " $0, " " k "=[^ ]*") ? substr(" " $0, RSTART + length(k) + 2, RLENGTH - length(k) - 2) : "" }
        /max_parallel=/ { seen = 1; ok = val("fork_peak_bytes") ~ /^[0-9]+$/ &&
            val("max_parallel") * val("per_seq_bytes") + val("fork_peak_bytes") <= val("mem_bytes") }
        END { print seen && ok ? 0 : 1 }' "$TMP/o")
# with --offload-file each fork's values go to a file of their own: the disk
# (four fifths of its free bytes) is a pool beside the memory, and the cap's
# line names the pool that holds the fewest (it once said --mem for the disk's)
timeout -k 5 120 $SKV bench -m $M --prompt-tokens 512 -n 2 --kv shadowkv --budget 8 --rank 16 --local 4 --outliers 4 \
    --offload-file "$TMP/off.bin" --parallel fit --mem 1000 >"$TMP/o" 2>"$TMP/e"; rc=$?
avail=$(df -B1 --output=avail "$TMP" | tail -n 1)
check "--parallel fit with --offload-file: the disk bounds the batch, or the cap's line names the pool with the fewest" \
    $([ $rc -eq 0 ] && awk -v avail="$avail" -v err="$(cat "$TMP/e")" '
        function val(k) { return match(" " $0, " " k "=[^ ]*") ? substr(" " $0, RSTART + length(k) + 2, RLENGTH - length(k) - 2) : "" }
        /max_parallel=/ { seen = 1; f = val("file_bytes_seq"); disk = 0.8 * avail / f; mem = val("mem_bytes") / val("per_seq_bytes")
            if (f + 0 <= 0) ok = 0
            else if (val("bound") == "disk") ok = val("max_parallel") < 4096
            else if (val("bound") != "cap") ok = 0
            else if (disk < mem / 2) ok = index(err, "the free disk (four fifths of it) would hold") > 0
            else if (mem < disk / 2) ok = index(err, "--mem would hold") > 0
            else ok = 1 }
        END { print seen && ok ? 0 : 1 }' "$TMP/o" || echo 1)
# a policy under its floor selects nothing: the timing says so, once over the repeats
timeout -k 5 120 $B --kv quest --budget 20 --repeat 2 >"$TMP/o" 2>"$TMP/e"; rc=$?
check "a bench of quest under its floor (budget 20, pages of 16) says it selects no page, once over 2 repeats" \
    $([ $rc -eq 0 ] && [ "$(grep -c "quest: a budget of 20 tokens is under 2 pages of 16" "$TMP/e")" -eq 1 ] &&
      grep -q "kv=quest" "$TMP/o" && echo 0 || echo 1)
timeout -k 5 120 $B --parallel 4000 --mem 0.05 >"$TMP/o" 2>"$TMP/e"; rc=$?
check "a batch over --mem is refused in one line naming the GiB" \
    $([ $rc -ne 0 ] && [ "$(cat "$TMP/o" "$TMP/e" | wc -l)" -eq 1 ] && grep -q "GiB" "$TMP/e" && echo 0 || echo 1)
timeout -k 5 120 $B --kv dense,shadowkv --f16-kv --budget 64 --rank 16 --parallel 2 >"$TMP/o" 2>"$TMP/e"; rc=$?
check "a fork of dense --f16-kv's prefill into shadowkv says its figures are approximate, before its line" \
    $([ $rc -eq 0 ] && grep -q "^note: kv=shadowkv forks dense's recorded prefill (with an f16 cache).*approximate" "$TMP/o" &&
      [ "$(grep -n '^note:' "$TMP/o" | cut -d: -f1)" -lt "$(grep -n 'kv=shadowkv threads' "$TMP/o" | cut -d: -f1)" ] &&
      ! grep -q "^note:" "$TMP/e" && echo 0 || echo 1)
timeout -k 5 120 $B --kv shadowkv --budget 64 --rank 16 --parallel 2 >"$TMP/o" 2>&1
check "a policy benched alone forks its own prefill: no note" $(! grep -q "^note:" "$TMP/o" && echo 0 || echo 1)

# Ctrl-C: a batch of B for N steps, long enough on a fast, quiet machine too
# that progress lines come out (from 2 s into a part), stopped once the first
# is out
# skv runs without timeout(1) around it, which would pass a Ctrl-C on to the
# process group as well (a second signal) and SIGKILL it 5 s later (-k); a
# watchdog kills it after 300 s instead.
start() { # B N
    rm -f "$TMP/o" "$TMP/e"; : >"$TMP/e"
    $SKV bench -m $M --prompt-tokens 64 -n $2 --parallel $1 >"$TMP/o" 2>"$TMP/e" &
    pid=$!
    (trap 'kill $s 2>/dev/null; exit 0' TERM; sleep 300 & s=$!; wait $s; kill -KILL $pid 2>/dev/null) >/dev/null 2>&1 &
    dog=$!
    waitfor "parallel=$1: step"
}
stop_dog() { kill $dog 2>/dev/null; wait $dog 2>/dev/null; }
waitfor() { i=0; while [ $i -lt 1200 ] && ! grep -q "$1" "$TMP/e"; do sleep 0.1; i=$((i + 1)); done; }
start 1024 2000
kill -INT $pid 2>/dev/null
wait $pid; rc=$?; stop_dog
check "Ctrl-C in a batch: 'stopping after the decode step (or prefill chunk) in flight', the partial line, exit 130" \
    $([ $rc -eq 130 ] && grep -q "stopping after the decode step (or prefill chunk) in flight (Ctrl-C again to quit now)" \
      "$TMP/e" && grep -q "parallel=1024 .* partial=1" "$TMP/o" && grep -q "interrupted: 1 batch run measured" "$TMP/e" &&
      echo 0 || echo 1)
check "progress lines said how far it was while it ran (the sequence alone, then the batch's steps)" \
    $(grep -q "kv=dense parallel=1024: step [0-9]* of 2000, .* s a step, about [0-9]* s left" "$TMP/e" && echo 0 || echo 1)
# the second once the first is said, within the step in flight (a batch of
# 4096: a step of a second or so on a quiet machine, more on a loaded one)
start 4096 2000
kill -INT $pid 2>/dev/null
waitfor "stopping after"
kill -INT $pid 2>/dev/null
wait $pid; rc=$?; stop_dog
check "a second Ctrl-C quits at once (exit 130, no summary)" \
    $([ $rc -eq 130 ] && ! grep -q "interrupted:" "$TMP/e" && echo 0 || echo 1)
if [ $fails -eq 0 ]; then echo "test_bench_cli: all passed"; else echo "test_bench_cli: $fails failed"; fi
[ $fails -eq 0 ]
