/* cmd_synth.c: `skv synth`: a random-weight GGUF of a real model's shape
 * from its config.json, for benchmarks and GPU tests. */
#include "cli.h"
#include "hf_config.h"
#include "skv.h"
#include "synth.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void help(FILE *o) {
    fprintf(o, "usage: skv synth --config CONFIG.json [--dtype f32|f16|bf16|q8_0|q4_0] [--layers N] [--ctx N]\n"
               "                 [--key-rank R] [--seed S] -o OUT.gguf [--force]\n\n"
               "Writes a model of the config's shape (llama, mistral, qwen2; llama3 rope scaling)\n"
               "with seeded random weights, key projections of planted rank R (default\n"
               "n_kv_heads*head_dim/4) and a byte-level vocabulary. The file is marked as random\n"
               "weights. An existing OUT is kept unless --force.\n");
}

static int parse_pos(const char *flag, const char *v, long long hi, long long *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (!*v || *end || errno || x < 0 || x > hi) {
        fprintf(stderr, "skv synth: %s expects an integer in [0, %lld], got '%s'\n", flag, hi, v);
        return -1;
    }
    *out = x;
    return 0;
}

int cmd_synth(int argc, char **argv) {
    const char *config = NULL, *out = NULL, *dtype = "f32";
    long long layers = 0, seed = -1, ctx = 0, key_rank = 0;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { help(stdout); return 0; }
        if (!strcmp(a, "--force")) { force = 1; continue; }
        if (!v) return cli_usage_error("synth", "'%s' needs a value or is unknown", a);
        i++;
        if (!strcmp(a, "--config")) config = v;
        else if (!strcmp(a, "-o") || !strcmp(a, "--output")) out = v;
        else if (!strcmp(a, "--dtype")) dtype = v;
        else if (!strcmp(a, "--layers")) { if (parse_pos(a, v, 1024, &layers)) return 2; }
        else if (!strcmp(a, "--seed")) { if (parse_pos(a, v, (1LL << 62), &seed)) return 2; }
        else if (!strcmp(a, "--ctx")) { if (parse_pos(a, v, 1 << 24, &ctx)) return 2; }
        else if (!strcmp(a, "--key-rank")) { if (parse_pos(a, v, 1 << 16, &key_rank)) return 2; }
        else return cli_usage_error("synth", "unknown option '%s'", a);
    }
    if (!config) return cli_usage_error("synth", "no --config CONFIG.json");
    if (!out) return cli_usage_error("synth", "no -o OUT.gguf");
    if (seed < 0) seed = 1;   /* the same weights every time unless asked otherwise */
    synth_opts o = {.seed = (uint64_t)seed, .key_rank = (int)key_rank};
    if (!strcmp(dtype, "f32")) o.dtype = GGML_F32;
    else if (!strcmp(dtype, "f16")) o.dtype = GGML_F16;
    else if (!strcmp(dtype, "bf16")) o.dtype = GGML_BF16;
    else if (!strcmp(dtype, "q8_0")) o.dtype = GGML_Q8_0;
    else if (!strcmp(dtype, "q4_0")) o.dtype = GGML_Q4_0;
    else return cli_usage_error("synth", "--dtype expects f32, f16, bf16, q8_0 or q4_0, got '%s'", dtype);
    if (cli_check_output("synth", out, force)) return 1;
    model_config c;
    if (hf_load_config(config, &c)) return cli_fail();
    if (layers) c.n_layers = (int)layers;
    if (ctx) c.ctx_train = (int)ctx;
    if (model_config_check(&c, config)) return cli_fail();
    if (synth_write(&c, &o, out)) return cli_fail();
    fprintf(stderr, "skv synth: wrote %s (%s, %d layers, %s, seed %lld)\n", out, c.name, c.n_layers, dtype, seed);
    return 0;
}
