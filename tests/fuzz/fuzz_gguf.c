/* fuzz_gguf.c: a GGUF file through the whole model loader (header, metadata,
 * tensor table, shapes, the tokenizer it carries), then a short encode and
 * decode with that tokenizer when it loads. */
#include "fuzz.h"
#include "model.h"
#include "tok.h"

static void fuzz_gguf_init(void) {}

static int fuzz_gguf(const uint8_t *data, size_t size) {
    char path[512];
    if (!fuzz_put("in.gguf", data, size, path, sizeof path)) return 0;
    skv_model *m = NULL;
    if (model_load(path, &m) == 0) {
        int32_t *ids = NULL;
        int n = 0;
        static const char text[] = "Hello, world! 123 <|im_start|>";
        if (m->tok && tok_encode(m->tok, text, sizeof text - 1, 1, 1, &ids, &n) == 0) {
            char *back = tok_decode(m->tok, ids, n, 1);
            free(back);
        }
        free(ids);
        model_free(m);
    }
    return 0;
}

FUZZ_MAIN(gguf)
