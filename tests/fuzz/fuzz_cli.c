/* fuzz_cli.c: the command line's list and number parsers. The first byte
 * picks one: needle lengths, needle depths, a --kv list of policies, a
 * --kv-opt KEY=VALUE, or a whole generation command line (the rest split at
 * spaces; options that read or write files are dropped). */
#include "cli.h"
#include "compare.h"
#include "fuzz.h"
#include "kv.h"
#include "needle.h"

static void fuzz_cli_init(void) {}

static int fuzz_cli(const uint8_t *data, size_t size) {
    if (!size) return 0;
    int mode = data[0] % 5;
    char *s = fuzz_str(data + 1, size - 1);
    if (!s) return 0;
    if (mode == 0) {
        int *v = NULL, n = 0;
        if (needle_parse_lengths(s, &v, &n) == 0) free(v);
    } else if (mode == 1) {
        float *v = NULL;
        int n = 0;
        if (needle_parse_depths(s, &v, &n) == 0) free(v);
    } else if (mode == 2) {
        char names[COMPARE_MAX][32];
        compare_parse(s, names, COMPARE_MAX);
    } else if (mode == 3) {
        kv_opts o;
        kv_opts_default(&o);
        kv_opts_set_pair(&o, s);
    } else {
        char *argv[64];
        int argc = 0;
        argv[argc++] = "skv";
        for (char *t = strtok(s, " "); t && argc < 63; t = strtok(NULL, " ")) {
            if (!strcmp(t, "-f") || !strcmp(t, "--file") || !strcmp(t, "--trace") || !strcmp(t, "help")) continue;
            argv[argc++] = t;
        }
        argv[argc] = NULL;
        cli_gen g;
        cli_gen_default(&g);
        for (int i = 1; i < argc; i++)
            if (cli_gen_option(&g, argc, argv, &i) != 1) break;
        cli_gen_free(&g);
    }
    free(s);
    return 0;
}

FUZZ_MAIN(cli)
