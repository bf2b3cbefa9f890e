/* fuzz_encode.c: arbitrary text (any bytes, invalid UTF-8 included) encoded
 * and decoded by every tokenizer family skv has at hand: the demo model's
 * (samples/), and from ../shared (or $SKV_SHARED) when present the
 * SentencePiece-style llama tokenizer (stories260k), the byte-level BPE with
 * the smollm pre-tokenizer (mini-smollm GGUF) and the HF tokenizer.json of
 * mini-smollm-hf. The first byte of the input picks the tokenizer and
 * whether special tokens are parsed. Decoding the ids must give back the
 * text for tokenizers that are lossless on it; that is not asserted here
 * (byte fallback differs by family), only that nothing crashes. */
#include "fuzz.h"
#include "gguf.h"
#include "tok.h"

static tok_vocab *toks[4];
static int n_toks;

static void add_gguf(const char *path) {
    gguf_file *f = NULL;
    tok_vocab *v = NULL;
    if (access(path, R_OK) || gguf_open(path, &f)) return;
    if (tok_load_gguf(f, &v) == 0) toks[n_toks++] = v;
    gguf_close(f);
}

static void fuzz_encode_init(void) {
    const char *sh = getenv("SKV_SHARED");
    char p[1024];
    if (!sh || !*sh) sh = "../shared";
    add_gguf("samples/model/skv-demo.gguf");
    snprintf(p, sizeof p, "%s/models/stories260k.gguf", sh);
    add_gguf(p);
    snprintf(p, sizeof p, "%s/models/mini-smollm-f32.gguf", sh);
    add_gguf(p);
    snprintf(p, sizeof p, "%s/models/mini-smollm-hf/tokenizer.json", sh);
    tok_vocab *v = NULL;
    if (!access(p, R_OK) && tok_load_hf(p, &v) == 0) toks[n_toks++] = v;
}

static int fuzz_encode(const uint8_t *data, size_t size) {
    if (!size || !n_toks) return 0;
    tok_vocab *v = toks[(data[0] >> 1) % n_toks];
    int special = data[0] & 1;
    int32_t *ids = NULL;
    int n = 0;
    if (tok_encode(v, (const char *)data + 1, size - 1, 1, special, &ids, &n) == 0) {
        free(tok_decode(v, ids, n, special));
        char buf[64];
        for (int i = 1; i < n; i++) tok_piece(v, ids[i - 1], ids[i], special, buf, sizeof buf);
    }
    free(ids);
    return 0;
}

FUZZ_MAIN(encode)
