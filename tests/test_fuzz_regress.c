/* test_fuzz_regress.c: every input that ever crashed a fuzz harness, replayed
 * under the normal (sanitizer) build. The harnesses (tests/fuzz/fuzz_*.c)
 * are included whole with FUZZ_NO_MAIN; tests/fuzz/regress/NAME/ holds the
 * inputs of harness NAME. A replay passes when the harness returns: a
 * sanitizer report or a crash fails the binary. */
#define FUZZ_NO_MAIN
#include "fuzz/fuzz_cli.c"
#include "fuzz/fuzz_csv.c"
#include "fuzz/fuzz_eval.c"
#include "fuzz/fuzz_encode.c"
#include "fuzz/fuzz_gguf.c"
#include "fuzz/fuzz_hf_config.c"
#include "fuzz/fuzz_hf_dir.c"
#include "fuzz/fuzz_safetensors.c"
#include "fuzz/fuzz_tasks.c"
#include "fuzz/fuzz_tokenizer.c"
#include "fuzz/fuzz_trace.c"
#include "testhelp.h"

#include <dirent.h>

typedef struct {
    const char *name;
    void (*init)(void);
    int (*run)(const uint8_t *, size_t);
} harness;

static const harness harnesses[] = {
    {"cli", fuzz_cli_init, fuzz_cli},
    {"csv", fuzz_csv_init, fuzz_csv},
    {"eval", fuzz_eval_init, fuzz_eval},
    {"encode", fuzz_encode_init, fuzz_encode},
    {"gguf", fuzz_gguf_init, fuzz_gguf},
    {"hf_config", fuzz_hf_config_init, fuzz_hf_config},
    {"hf_dir", fuzz_hf_dir_init, fuzz_hf_dir},
    {"safetensors", fuzz_safetensors_init, fuzz_safetensors},
    {"tasks", fuzz_tasks_init, fuzz_tasks},
    {"tokenizer", fuzz_tokenizer_init, fuzz_tokenizer},
    {"trace", fuzz_trace_init, fuzz_trace},
};

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(void) {
    fuzz_setup();
    int total = 0;
    for (size_t h = 0; h < sizeof harnesses / sizeof harnesses[0]; h++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fuzz/regress/%s", harnesses[h].name);
        DIR *d = opendir(dir);
        if (!d) continue;
        char *files[512];
        int n = 0;
        struct dirent *e;
        while ((e = readdir(d)) && n < 512)
            if (e->d_name[0] != '.') files[n++] = strdup(e->d_name);
        closedir(d);
        qsort(files, (size_t)n, sizeof *files, cmp_str);
        harnesses[h].init();
        for (int i = 0; i < n; i++) {
            char path[600];
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            char *data = NULL;
            size_t len = 0;
            int rc = skv_read_file(path, (size_t)64 << 20, &data, &len);
            if (rc == 0) harnesses[h].run((const uint8_t *)data, len);
            char what[700];
            snprintf(what, sizeof what, "fuzz regression %s/%s replays without a crash", harnesses[h].name, files[i]);
            test_cond(what, rc == 0);
            free(data);
            free(files[i]);
            total++;
        }
    }
    test_cond("the regression corpus is not empty", total > 0);
    return test_report("test_fuzz_regress");
}
