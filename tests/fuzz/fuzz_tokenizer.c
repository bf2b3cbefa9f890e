/* fuzz_tokenizer.c: a tokenizer.json through the HF tokenizer loader (model,
 * vocabulary, merges, added tokens, pre-tokenizer regexes), then an encode
 * and decode of a fixed text with it when it loads. */
#include "fuzz.h"
#include "tok.h"

static void fuzz_tokenizer_init(void) {}

static int fuzz_tokenizer(const uint8_t *data, size_t size) {
    char path[512];
    if (!fuzz_put("tokenizer.json", data, size, path, sizeof path)) return 0;
    tok_vocab *v = NULL;
    if (tok_load_hf(path, &v) == 0) {
        static const char text[] = "The quick brown fox, 1234 caf\xc3\xa9  \n\t<|im_end|> don't";
        int32_t *ids = NULL;
        int n = 0;
        if (tok_encode(v, text, sizeof text - 1, 1, 1, &ids, &n) == 0) free(tok_decode(v, ids, n, 1));
        free(ids);
        tok_free(v);
    }
    return 0;
}

FUZZ_MAIN(tokenizer)
