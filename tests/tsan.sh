#!/bin/sh
# make tsan: the inspector's threads under ThreadSanitizer. A live session
# (the engine on the worker thread, probe events through the ring, the UI
# thread draining them into the store and drawing every view) runs to the
# end while the UI switches views as fast as keys arrive; then a compare
# session (three policies in lockstep) does the same. Any TSan report fails.
# OpenMP runs one thread (SKV_THREADS=1): libgomp is not instrumented, and
# the threads checked here are the worker, the UI and the probe bus.
set -eu
BIN=${SKV_TSAN_BIN:-build-tsan/skv}
D=$(mktemp -d "${TMPDIR:-/tmp}/skv-tsan.XXXXXX")
SOCK="$D/tmux.sock"
trap 'tmux -S "$SOCK" kill-server >/dev/null 2>&1 || true; rm -rf "$D"' EXIT
M=build/default-model.gguf
[ -f "$M" ] || { echo "tsan: $M is missing (run make first)"; exit 1; }
P="The quick brown fox jumps over the lazy dog. A needle hides in a haystack of words; the inspector shows which chunks each head selects at every step."
fail=0
session() { # name args...
    name=$1; shift
    tmux -S "$SOCK" new-session -d -s "$name" -x 120 -y 40 \
        "cd '$PWD' && TSAN_OPTIONS='halt_on_error=0 exitcode=66 log_path=$D/tsan-$name' SKV_THREADS=1 OMP_NUM_THREADS=1 $BIN inspect -m $M -p '$P' $* ; echo EXITED \$?; sleep 600"
    i=0
    until tmux -S "$SOCK" capture-pane -p -t "$name" | grep -q "live: idle"; do
        i=$((i + 1)); [ $i -lt 600 ] || { echo "tsan: $name: the prefill did not finish"; fail=1; return; }
        sleep 0.2
    done
    tmux -S "$SOCK" send-keys -t "$name" r
    # the UI reads at full speed: views switch while the engine runs; the
    # run has ${SKV_TSAN_MINUTES:-20} minutes to end (a slow, loaded host
    # takes long under TSan), counted in time, not in rounds
    k=0
    deadline=$(( $(date +%s) + 60 * ${SKV_TSAN_MINUTES:-20} ))
    while ! tmux -S "$SOCK" capture-pane -p -t "$name" | grep -Eq "steps 48 \||end of generation"; do
        tmux -S "$SOCK" send-keys -t "$name" Tab Tab Down Right BTab
        k=$((k + 1))
        [ "$(date +%s)" -lt "$deadline" ] || { echo "tsan: $name: the run did not finish in ${SKV_TSAN_MINUTES:-20} minutes"; fail=1; break; }
    done
    tmux -S "$SOCK" send-keys -t "$name" q
    i=0
    until tmux -S "$SOCK" capture-pane -p -t "$name" | grep -q "EXITED"; do
        i=$((i + 1)); [ $i -lt 300 ] || break
        sleep 0.2
    done
    status=$(tmux -S "$SOCK" capture-pane -p -t "$name" | sed -n 's/.*EXITED \([0-9]*\).*/\1/p' | tail -1)
    echo "tsan: $name: exit status ${status:-?}, $k rounds of view switches while running"
    [ "${status:-1}" = 0 ] || fail=1
}
session live --kv shadowkv --rank 8 --budget 32 --outliers 2 --local 2 --oracle -n 48
session compare --kv dense,shadowkv,quest --rank 8 --budget 32 --outliers 2 --local 2 --oracle -n 48
if ls "$D"/tsan-* >/dev/null 2>&1; then
    echo "tsan: ThreadSanitizer reports:"
    cat "$D"/tsan-*
    fail=1
fi
[ $fail = 0 ] && echo "tsan: clean (no ThreadSanitizer report)"
exit $fail
