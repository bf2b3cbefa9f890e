/* cmd_convert.c: `skv convert SRC -o OUT.gguf`: any model skv can load (an HF
 * directory or a GGUF file) written as a standard llama.cpp GGUF. */
#include "cli.h"
#include "convert.h"
#include "model.h"
#include "skv.h"

#include <string.h>
#include <sys/stat.h>

static void help(FILE *o) {
    fprintf(o, "usage: skv convert SRC -o OUT.gguf [--type f32|f16] [--name NAME] [--force]\n"
               "       (-m SRC, as the other commands take a model, works too)\n\n"
               "Writes SRC (an HF directory: config.json, *.safetensors, tokenizer.json; or a GGUF\n"
               "file) as a llama.cpp GGUF that skv and llama.cpp load: llama (mistral too) or qwen2,\n"
               "Q/K rows in adjacent-pair RoPE order for llama, llama3 rope scaling as rope_freqs,\n"
               "the byte-level BPE tokenizer under its llama.cpp pre-tokenizer name.\n"
               "--type: the matrices' type (default: f16 when every source matrix is f16, else\n"
               "f32, so nothing is rounded); quantized sources are dequantized. Norms and biases\n"
               "stay f32. --name sets general.name (default: the source's name, else its file or\n"
               "folder name). An existing OUT is kept unless --force.\n");
}

int cmd_convert(int argc, char **argv) {
    const char *src = NULL, *out = NULL, *type = NULL, *name = NULL;
    int force = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { help(stdout); return 0; }
        if (!strcmp(a, "--force")) { force = 1; continue; }
        int model = !strcmp(a, "-m") || !strcmp(a, "--model");
        if (model || !strcmp(a, "-o") || !strcmp(a, "--output") || !strcmp(a, "--type") || !strcmp(a, "--name")) {
            if (i + 1 >= argc) return cli_usage_error("convert", "%s needs a value", a);
            if (!strcmp(a, "--type")) type = argv[++i];
            else if (!strcmp(a, "--name")) name = argv[++i];
            else if (!model) out = argv[++i];
            else if (src) return cli_usage_error("convert", "more than one source ('%s' and '%s')", src, argv[i + 1]);
            else src = argv[++i];
            continue;
        }
        if (a[0] == '-' && a[1]) return cli_usage_error("convert", "unknown option '%s'", a);
        if (src) return cli_usage_error("convert", "more than one source ('%s' and '%s')", src, a);
        src = a;
    }
    if (!src) return cli_usage_error("convert", "no source: give an HF directory or a GGUF file");
    if (!out) return cli_usage_error("convert", "no -o OUT.gguf");
    if (name && (!name[0] || strlen(name) > 128))
        return cli_usage_error("convert", "--name expects 1 to 128 characters");
    convert_opts o = {.force = force, .name = name};
    if (type && !strcmp(type, "f32")) o.type = GGML_F32;
    else if (type && !strcmp(type, "f16")) o.type = GGML_F16;
    else if (type) return cli_usage_error("convert", "--type expects f32 or f16, got '%s'", type);
    if (cli_check_output("convert", out, force)) return 1; /* before the (slow) load */
    skv_model *m;
    if (model_load(src, &m)) return cli_fail();
    if (!type) o.type = convert_default_type(m);
    convert_info info;
    int rc = convert_write_gguf(m, out, &o, &info);
    model_free(m);
    if (rc) return cli_fail();
    printf("skv convert: wrote %s (%s, %d tensors, %s, %llu bytes%s)\n", out, info.arch, info.n_tensors,
           ggml_type_name(o.type), (unsigned long long)info.bytes,
           info.permuted ? ", q/k rows permuted to adjacent-pair rope" : "");
    return 0;
}
