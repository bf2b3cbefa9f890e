/* test_gguf: the GGUF reader on the shared models. */
#include "gguf.h"
#include "skv.h"
#include "testhelp.h"

int main(void) {
    const char *p = test_shared("models/stories260k.gguf");
    if (!p) { test_skip("test_gguf: ../shared/models missing"); return test_report("test_gguf"); }
    gguf_file *f;
    int rc = gguf_open(p, &f);
    test_cond("stories260k.gguf opens", rc == 0);
    if (rc) { printf("  %s\n", skv_last_error()); return test_report("test_gguf"); }
    test_cond("version 2 or 3", f->version == 2 || f->version == 3);
    test_cond("architecture is llama", gguf_get_str(f, "general.architecture") &&
                                         strcmp(gguf_get_str(f, "general.architecture"), "llama") == 0);
    const gguf_kv *toks = gguf_find(f, "tokenizer.ggml.tokens");
    test_cond("vocab of 512 strings", toks && toks->type == GGUF_ARRAY && toks->arr_type == GGUF_STRING && toks->n == 512);
    test_cond("token_embd.weight present", gguf_find_tensor(f, "token_embd.weight") != NULL);
    gguf_close(f);
    return test_report("test_gguf");
}
