/* fuzz_csv.c: a trace file through skv export --format csv (trace_export_csv,
 * with --partial and --force): every record decoded into its table's row,
 * the array fields into their long tables, meta.json written, in a scratch
 * folder of the process. */
#include "fuzz.h"
#include "trace.h"

static void fuzz_csv_init(void) {}

static int fuzz_csv(const uint8_t *data, size_t size) {
    char path[512], dir[512];
    if (!fuzz_put("in-csv.skvt", data, size, path, sizeof path)) return 0;
    snprintf(dir, sizeof dir, "%s/csv", fuzz_dir());
    int n = 0;
    trace_export_csv(path, dir, 1, 1, &n);
    return 0;
}

FUZZ_MAIN(csv)
