#!/bin/sh
# coverage.sh DIR: the line coverage of make test, from a build made with
# --coverage into DIR (make coverage: BUILD=build-cov). Reads the .gcno and
# .gcda files gcov left there for the project's own C sources (engine,
# probes, views, tui, kernels; not the tests, not the CUDA files, which the
# simulator compiles apart) and writes DIR/coverage.txt:
#   - one line per source file, the least covered first: percent of lines run,
#     lines, file;
#   - every function the suite never called, by file: a path no test takes,
#     or dead code.
# Prints the total and the count of functions never called. gcov ships with gcc.
set -eu
DIR=${1:-build-cov}
[ -d "$DIR" ] || { echo "coverage.sh: no $DIR (make coverage builds it)" >&2; exit 2; }
command -v gcov >/dev/null 2>&1 || { echo "coverage.sh: gcov not found (it comes with gcc)" >&2; exit 2; }
OUTF=$DIR/coverage.txt
TMP=$(mktemp -d "${TMPDIR:-/tmp}/skv-cov.XXXXXX")
trap 'rm -rf "$TMP"' EXIT INT TERM
: > "$TMP/files"
: > "$TMP/uncalled"
for g in $(find "$DIR" -name '*.gcno' -not -path "$DIR/tests/*" -not -path "$DIR/sim/*" | sort); do
    rel=${g#"$DIR"/}
    src=${rel%.gcno}.c
    [ -f "$src" ] || continue
    # -n: no .gcov files; -f: per-function summaries before the file's
    gcov -n -f -o "$(dirname "$g")" "$src" 2>/dev/null | awk -v F="$src" -v FILES="$TMP/files" -v UN="$TMP/uncalled" '
        /^Function / { fn = $2; gsub("\047", "", fn); next }
        /^File / { file = $2; gsub("\047", "", file); fn = ""; next }
        /^Lines executed:/ {
            split($2, a, ":"); pct = a[2]; sub("%", "", pct); n = $4
            if (fn != "") { if (pct + 0 == 0) print F, fn >> UN; fn = "" }
            else if (file == F) { printf "%6.2f %6d %s\n", pct, n, F >> FILES; file = "" }
        }'
done
if [ ! -s "$TMP/files" ]; then
    echo "coverage.sh: no coverage data under $DIR (run make coverage)" >&2
    exit 1
fi
total=$(awk '{ run += $1 * $2 / 100; all += $2 } END { printf "%.1f%% of %d lines", 100 * run / all, all }' "$TMP/files")
nun=$(wc -l < "$TMP/uncalled" | tr -d ' ')
{
    echo "line coverage of make test: $total (least covered first)"
    sort -n "$TMP/files"
    echo
    echo "functions never called ($nun):"
    sort "$TMP/uncalled" | awk '{ printf "  %s %s\n", $1, $2 }'
} > "$OUTF.tmp"
mv "$OUTF.tmp" "$OUTF"
echo "coverage: $total; $nun functions never called; $OUTF"
