#!/bin/sh
# Remakes docs/fig-chrome-trace.png: a compare trace of the demo model
# exported with `skv export --format chrome` and opened in speedscope's web
# UI (its npm package's static build) by headless Chromium, served from
# 127.0.0.1. Needs ./skv (or SKV=...), chromium (apt-get install chromium: not
# in make deps, only this figure uses it), npm and python3; speedscope 1.25.0
# is fetched once with npm pack into build/chrome-fig/. Run from the root:
#     sh tests/chrome_figure.sh
set -eu
SKV=${SKV:-./skv}
D=build/chrome-fig
OUT=${OUT:-docs/fig-chrome-trace.png}
fail() { echo "chrome_figure: $*" >&2; exit 1; }
for tool in chromium npm python3; do
    command -v $tool >/dev/null 2>&1 || fail "$tool not found"
done
[ -x "$SKV" ] || fail "$SKV not found (make, or SKV=path/to/skv)"
mkdir -p "$D"
if [ ! -f "$D/package/dist/release/index.html" ]; then
    (cd "$D" && npm pack --silent speedscope@1.25.0 >/dev/null && tar xzf speedscope-1.25.0.tgz) ||
        fail "npm pack speedscope@1.25.0 failed"
fi
WWW="$D/package/dist/release"
"$SKV" run -f samples/prompts/default.txt -n 40 --kv shadowkv,quest --budget 3% --trace "$D/compare.skvt" --force \
    >/dev/null 2>"$D/run.log" || fail "skv run failed: $(tail -n 1 "$D/run.log")"
"$SKV" export "$D/compare.skvt" --format chrome "$WWW/skv-trace.json" --force >/dev/null
PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$WWW" "$PORT" >/dev/null 2>&1 &
SERVER=$!
PROFILE=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null; rm -rf "$PROFILE"' EXIT
sleep 1
timeout -k 10 120 chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-background-networking \
    --disable-component-update --disable-sync --user-data-dir="$PROFILE" --hide-scrollbars \
    --window-size=1400,800 --virtual-time-budget=20000 --screenshot="$OUT" \
    "http://127.0.0.1:$PORT/index.html#profileURL=skv-trace.json&title=skv%20compare%20trace" >/dev/null 2>&1 ||
    fail "chromium failed"
echo "$OUT"
