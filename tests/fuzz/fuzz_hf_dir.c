/* fuzz_hf_dir.c: a whole HF directory through model_load. The input holds
 * three parts, each after a little-endian u32 length (the last takes the
 * rest): config.json, tokenizer.json and model.safetensors. */
#include "fuzz.h"
#include "model.h"

static void fuzz_hf_dir_init(void) {
    char d[512];
    snprintf(d, sizeof d, "%s/hf", fuzz_dir());
    mkdir(d, 0700);
}

static int fuzz_hf_dir(const uint8_t *data, size_t size) {
    static const char *const names[3] = {"hf/config.json", "hf/tokenizer.json", "hf/model.safetensors"};
    char path[512];
    for (int i = 0; i < 3; i++) {
        size_t len = i < 2 ? fuzz_u32(&data, &size) : size;
        if (len > size) len = size;
        if (!fuzz_put(names[i], data, len, path, sizeof path)) return 0;
        data += len;
        size -= len;
    }
    snprintf(path, sizeof path, "%s/hf", fuzz_dir());
    skv_model *m = NULL;
    if (model_load(path, &m) == 0) model_free(m);
    return 0;
}

FUZZ_MAIN(hf_dir)
