/* test_convert: `skv convert` and convert_write_gguf. The HF directory of
 * mini-smollm becomes an f32 and an f16 GGUF that load with the same config,
 * tokenize the same and give the same logits; its q/k rows come out exactly
 * as llama.cpp laid out the bf16 GGUF of the same weights. GGUF sources
 * (f32, q8_0, and stories260k's SentencePiece vocabulary) convert without a
 * permutation. Refusals: an existing output (left byte-identical), a bad
 * --type, a missing source, a pre-tokenizer no GGUF name reproduces. */
#include "convert.h"
#include "model.h"
#include "quant.h"
#include "session.h"
#include "skv.h"
#include "testhelp.h"
#include "tok.h"
#include "tok_impl.h"

#include <dirent.h>
#include <sys/wait.h>

/* Runs skv with args; the exit status (-1 on a signal), output in out. */
static int run(const char *args, char *out, size_t cap) {
    return test_sh(out, cap, "%s %s", test_skv_bin(), args);
}

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Expects exit status want_rc, exactly one line of output, containing want. */
static void expect_cli(const char *what, const char *args, int want_rc, const char *want) {
    char out[8192], msg[512];
    int rc = run(args, out, sizeof out);
    snprintf(msg, sizeof msg, "%s: exit %d (want %d), one line mentioning '%s'", what, rc, want_rc, want);
    int ok = rc == want_rc && lines(out) == 1 && strstr(out, want) != NULL;
    test_cond(msg, ok);
    if (!ok) printf("  got: %s", out);
}

static char *slurp(const char *path, size_t *len) {
    char *buf = NULL;
    *len = 0;
    if (skv_read_file(path, (size_t)1 << 30, &buf, len)) return NULL;
    return buf;
}

/* The last logits of a prefill over ids; malloc'd, NULL on failure. */
static float *logits_of(skv_model *m, const int32_t *ids, int n) {
    session_opts o;
    session_opts_default(&o);
    skv_session *s = NULL;
    float *out = NULL;
    if (!session_new(m, &o, &s) && !session_prefill(s, ids, n, NULL, NULL)) {
        out = malloc(sizeof(float) * m->cfg.vocab);
        if (out) memcpy(out, session_logits(s), sizeof(float) * m->cfg.vocab);
    } else {
        printf("  %s\n", skv_last_error());
    }
    session_free(s);
    return out;
}

static const char *prompts[] = {
    "Hello world, this is a test.",
    "The year 2024 had 366 days; pi is 3.14159 and 1000000 > 999.",
    "caf\xc3\xa9 na\xc3\xafve \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x99\x82 \xc3\x9cn\xc3\xaf" "c\xc3\xb6" "d\xc3\xa9 \xd9\xa3\xd9\xa4",
    "<|im_start|>user\nWhat is 12*34?<|im_end|>\n<|im_start|>assistant\n",
    "  leading spaces\n\n\ttabs and   runs   ",
};

/* Same ids from both tokenizers for every prompt, with and without special parsing. */
static int same_tokens(const skv_model *a, const skv_model *b) {
    for (size_t i = 0; i < sizeof prompts / sizeof prompts[0]; i++)
        for (int sp = 0; sp < 2; sp++) {
            int32_t *x = NULL, *y = NULL;
            int nx = 0, ny = 0;
            int ra = tok_encode(a->tok, prompts[i], strlen(prompts[i]), 0, sp, &x, &nx);
            int rb = tok_encode(b->tok, prompts[i], strlen(prompts[i]), 0, sp, &y, &ny);
            int same = ra == 0 && rb == 0 && nx == ny && nx > 0 && !memcmp(x, y, sizeof(int32_t) * nx);
            free(x);
            free(y);
            if (!same) {
                printf("  prompt %zu (special %d) tokenizes differently\n", i, sp);
                return 0;
            }
        }
    return 1;
}

static int same_config(const model_config *a, const model_config *b) {
    return a->n_layers == b->n_layers && a->dim == b->dim && a->n_heads == b->n_heads &&
           a->n_kv_heads == b->n_kv_heads && a->head_dim == b->head_dim && a->ffn_dim == b->ffn_dim &&
           a->vocab == b->vocab && a->ctx_train == b->ctx_train && a->norm_eps == b->norm_eps &&
           a->rope_theta == b->rope_theta && a->rope_dim == b->rope_dim && a->qkv_bias == b->qkv_bias &&
           a->tied_embd == b->tied_embd && a->bos == b->bos && a->eos == b->eos && !strcmp(a->name, b->name);
}

/* Every element of two tensors equal after dequantization. */
static int same_values(const skv_tensor *a, const skv_tensor *b) {
    if (a->rows != b->rows || a->cols != b->cols) return 0;
    float *x = malloc(sizeof(float) * a->cols), *y = malloc(sizeof(float) * a->cols);
    int same = x && y;
    for (int r = 0; r < a->rows && same; r++) {
        quant_dequant_row(a->type, (const uint8_t *)a->data + ggml_row_size(a->type, a->cols) * r, x, a->cols);
        quant_dequant_row(b->type, (const uint8_t *)b->data + ggml_row_size(b->type, b->cols) * r, y, b->cols);
        same = !memcmp(x, y, sizeof(float) * a->cols);
    }
    free(x);
    free(y);
    return same;
}

/* Converts src to out (f32) and checks config, tokens and logits against src. */
static void roundtrip_gguf(const char *label, const char *src, const char *out, double tol) {
    char msg[512];
    skv_model *a = NULL, *b = NULL;
    convert_opts o = {.type = GGML_F32};
    convert_info info;
    int rc = model_load(src, &a);
    if (!rc) rc = convert_write_gguf(a, out, &o, &info);
    if (!rc) rc = model_load(out, &b);
    snprintf(msg, sizeof msg, "%s: converts and loads back", label);
    test_cond(msg, rc == 0);
    if (rc) { printf("  %s\n", skv_last_error()); goto done; }
    snprintf(msg, sizeof msg, "%s: no permutation for an adjacent-pair source, same rope mode", label);
    test_cond(msg, !info.permuted && a->cfg.rope_mode == b->cfg.rope_mode);
    snprintf(msg, sizeof msg, "%s: same config and tokenizer (%s)", label, tok_pre_name(b->tok));
    test_cond(msg, same_config(&a->cfg, &b->cfg) && !strcmp(tok_pre_name(a->tok), tok_pre_name(b->tok)) &&
                   tok_n_vocab(a->tok) == tok_n_vocab(b->tok) && tok_add_bos(a->tok) == tok_add_bos(b->tok));
    const char *p = "Once upon a time, 42 cats sat.";
    int32_t *x = NULL, *y = NULL;
    int nx = 0, ny = 0;
    int add_bos = tok_add_bos(a->tok);
    tok_encode(a->tok, p, strlen(p), add_bos, 1, &x, &nx);
    tok_encode(b->tok, p, strlen(p), add_bos, 1, &y, &ny);
    snprintf(msg, sizeof msg, "%s: same %d prompt ids", label, nx);
    test_cond(msg, nx > 0 && nx == ny && !memcmp(x, y, sizeof(int32_t) * nx));
    float *la = nx ? logits_of(a, x, nx) : NULL, *lb = nx ? logits_of(b, x, nx) : NULL;
    double err = la && lb ? test_rel_l2(lb, la, a->cfg.vocab) : 1;
    snprintf(msg, sizeof msg, "%s: logits rel L2 %.2e <= %.0e", label, err, tol);
    test_cond(msg, la && lb && err <= tol);
    free(la);
    free(lb);
    free(x);
    free(y);
done:
    model_free(a);
    model_free(b);
}

/* Writes dir/name with text in place of from (first occurrence) in src's file. */
static int write_replaced(const char *src, const char *dst, const char *from, const char *to) {
    size_t len;
    char *buf = slurp(src, &len);
    char *at = buf ? strstr(buf, from) : NULL;
    FILE *f = at ? fopen(dst, "wb") : NULL;
    if (!f) { free(buf); return -1; }
    fwrite(buf, 1, (size_t)(at - buf), f);
    fputs(to, f);
    fwrite(at + strlen(from), 1, len - (size_t)(at - buf) - strlen(from), f);
    fclose(f);
    free(buf);
    return 0;
}

static int leftover_temps(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        n += strstr(e->d_name, ".convert-") != NULL || strstr(e->d_name, ".tmp-") != NULL;
    if (d) closedir(d);
    return n;
}

/* Removes the plain files and links in dir, then dir (no recursion). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    char p[1200];
    while (d && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        unlink(p);
    }
    if (d) closedir(d);
    rmdir(dir);
}

int main(void) {
    /* tok_pre_gguf_name on hand-built lists. */
    tok_pre *p = NULL;
    tok_pre_new("hf", &p);
    tok_pre_add(p, "\\p{N}", 0, "test");
    tok_pre_add(p, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", 0, "test");
    const char *nm = tok_pre_gguf_name(p);
    test_cond("Digits(individual) + ByteLevel regexes are GGUF 'smollm'", nm && !strcmp(nm, "smollm"));
    tok_pre_free(p);
    tok_pre_new("hf", &p);
    tok_pre_add(p, "\\p{N}+", 0, "test");
    tok_pre_add(p, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", 0, "test");
    test_cond("Digits(grouped) + ByteLevel matches no GGUF name", tok_pre_gguf_name(p) == NULL);
    tok_pre_free(p);
    tok_pre_new("hf", &p);
    tok_pre_add(p, "\\p{N}", 1, "test");
    tok_pre_add(p, "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+", 0, "test");
    test_cond("a literal split is not the regex of the same text", tok_pre_gguf_name(p) == NULL);
    tok_pre_free(p);

    const char *hf = test_shared("models/mini-smollm-hf");
    if (!hf) {
        test_skip("test_convert: ../shared/models/mini-smollm-hf missing, conversions skipped");
        return test_report("test_convert");
    }
    const char *dir = test_tmpdir("convert");
    char f32[1024], f16[1024], msg[512], args[4096], out[8192];
    snprintf(f32, sizeof f32, "%s/smollm-f32.gguf", dir);
    snprintf(f16, sizeof f16, "%s/smollm-f16.gguf", dir);
    unlink(f32);
    unlink(f16);

    /* HF -> f32 GGUF. */
    skv_model *mh = NULL, *mg = NULL, *mf = NULL;
    int rc = model_load(hf, &mh);
    test_cond("HF source loads", rc == 0);
    if (rc) { printf("  %s\n", skv_last_error()); return test_report("test_convert"); }
    const char *pre = tok_pre_gguf_name(mh->tok->pre);
    test_cond("the HF tokenizer's pre-tokenizer is GGUF 'smollm'", pre && !strcmp(pre, "smollm"));
    test_cond("default type for a bf16 source is f32", convert_default_type(mh) == GGML_F32);
    convert_opts o32 = {.type = GGML_F32}, o16 = {.type = GGML_F16};
    convert_info info;
    rc = convert_write_gguf(mh, f32, &o32, &info);
    test_cond("HF -> f32 GGUF writes", rc == 0);
    if (rc) printf("  %s\n", skv_last_error());
    snprintf(msg, sizeof msg, "written as llama, %d tensors, q/k permuted, %llu bytes", info.n_tensors,
             (unsigned long long)info.bytes);
    test_cond(msg, !rc && !strcmp(info.arch, "llama") && info.n_tensors == 2 + 9 * mh->cfg.n_layers &&
                   info.permuted && info.bytes > 0);
    rc = rc ? rc : model_load(f32, &mg);
    test_cond("the f32 GGUF loads", rc == 0 && mg);
    if (!mg) { printf("  %s\n", skv_last_error()); model_free(mh); return test_report("test_convert"); }
    test_cond("same config (adjacent-pair rope instead of rotate-half)",
              same_config(&mh->cfg, &mg->cfg) && mh->cfg.rope_mode == ROPE_NEOX && mg->cfg.rope_mode == ROPE_ADJACENT &&
                  !strcmp(mg->cfg.arch, "llama") && !strcmp(mg->format, "gguf"));
    test_cond("tokenizer: gpt2 'smollm', same vocabulary, BOS, EOS, add_bos",
              tok_kind(mg->tok) == TOK_BPE && !strcmp(tok_pre_name(mg->tok), "smollm") &&
                  tok_n_vocab(mg->tok) == mh->cfg.vocab && tok_bos(mg->tok) == tok_bos(mh->tok) &&
                  tok_eos(mg->tok) == tok_eos(mh->tok) && tok_add_bos(mg->tok) == tok_add_bos(mh->tok));
    test_cond("same ids for every prompt (digits, unicode, special tokens, spaces)", same_tokens(mh, mg));
    test_cond("weights f32, tied embedding kept tied", mg->tok_embd.type == GGML_F32 && mg->cfg.tied_embd &&
                                                           mg->output.data == mg->tok_embd.data);

    /* Q/K rows exactly where llama.cpp put them in the bf16 GGUF of the same weights. */
    const char *bf = test_shared("models/mini-smollm-bf16.gguf");
    skv_model *mb = NULL;
    if (bf && model_load(bf, &mb) == 0) {
        int same = 1;
        for (int l = 0; l < mg->cfg.n_layers && same; l++)
            same = same_values(&mg->layers[l].wq, &mb->layers[l].wq) &&
                   same_values(&mg->layers[l].wk, &mb->layers[l].wk) &&
                   same_values(&mg->layers[l].wv, &mb->layers[l].wv) &&
                   same_values(&mg->layers[l].w_down, &mb->layers[l].w_down);
        test_cond("q/k/v/down rows equal llama.cpp's bf16 GGUF of the same weights, every layer", same);
        model_free(mb);
    } else {
        test_skip("mini-smollm-bf16.gguf missing: llama.cpp layout comparison skipped");
    }

    /* Logits over a prompt with digits, unicode and a special token. */
    const char *lp = "<|im_start|>user\nThe year 2024 had 366 days; caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac. Once upon a time";
    int32_t *ids = NULL;
    int n = 0;
    tok_encode(mh->tok, lp, strlen(lp), 0, 1, &ids, &n);
    float *lh = logits_of(mh, ids, n), *lg = logits_of(mg, ids, n);
    double e32 = lh && lg ? test_rel_l2(lg, lh, mh->cfg.vocab) : 1;
    snprintf(msg, sizeof msg, "f32 GGUF logits vs HF over %d tokens: rel L2 %.2e <= 1e-5", n, e32);
    test_cond(msg, lh && lg && e32 <= 1e-5);
    printf("  rel L2 (f32) = %.3e\n", e32);

    /* HF -> f16 GGUF. */
    rc = convert_write_gguf(mh, f16, &o16, &info);
    if (!rc) rc = model_load(f16, &mf);
    test_cond("HF -> f16 GGUF writes and loads", rc == 0);
    if (rc) printf("  %s\n", skv_last_error());
    if (mf) {
        test_cond("f16: matrices f16, norms f32", mf->tok_embd.type == GGML_F16 && mf->layers[0].wq.type == GGML_F16 &&
                                                      mf->out_norm.type == GGML_F32 && same_config(&mh->cfg, &mf->cfg));
        float *lf = logits_of(mf, ids, n);
        double e16 = lf && lh ? test_rel_l2(lf, lh, mh->cfg.vocab) : 1;
        snprintf(msg, sizeof msg, "f16 GGUF logits vs HF: rel L2 %.2e <= 1e-2", e16);
        test_cond(msg, lf && e16 <= 1e-2);
        printf("  rel L2 (f16) = %.3e\n", e16);
        test_cond("default type for an f16 model is f16", convert_default_type(mf) == GGML_F16);
        free(lf);
        model_free(mf);
    }
    free(lh);
    free(lg);
    free(ids);

    /* Refusals through the library: existing output, bad type. */
    size_t len0, len1;
    char *before = slurp(f32, &len0);
    rc = convert_write_gguf(mh, f32, &o32, &info);
    char *after = slurp(f32, &len1);
    test_cond("an existing output is refused without force and left byte-identical",
              rc == SKV_EIO && strstr(skv_last_error(), "exists") && before && after && len0 == len1 &&
                  !memcmp(before, after, len0));
    free(after);
    convert_opts oq = {.type = GGML_Q8_0};
    snprintf(args, sizeof args, "%s/q8.gguf", dir);
    test_cond("output type q8_0 is refused", convert_write_gguf(mh, args, &oq, &info) == SKV_EINVAL &&
                                                 access(args, F_OK) != 0);
    model_free(mg);

    /* GGUF sources: f32 (as is), q8_0 (dequantized), SentencePiece stories260k. */
    const char *gf = test_shared("models/mini-smollm-f32.gguf");
    if (gf) {
        snprintf(args, sizeof args, "%s/from-f32.gguf", dir);
        unlink(args);
        roundtrip_gguf("GGUF f32 -> GGUF", gf, args, 1e-6);
    }
    const char *q8 = test_shared("models/mini-smollm-q8_0.gguf");
    if (q8) {
        snprintf(args, sizeof args, "%s/from-q8.gguf", dir);
        unlink(args);
        skv_model *a = NULL, *b = NULL;
        rc = model_load(q8, &a);
        if (!rc) rc = convert_write_gguf(a, args, &o32, &info);
        if (!rc) rc = model_load(args, &b);
        test_cond("GGUF q8_0 -> f32 converts and loads", rc == 0);
        if (!rc)
            test_cond("q8_0 weights dequantized exactly (layer 0 q, k, gate; embedding)",
                      b->layers[0].wq.type == GGML_F32 && same_values(&a->layers[0].wq, &b->layers[0].wq) &&
                          same_values(&a->layers[0].wk, &b->layers[0].wk) &&
                          same_values(&a->layers[0].w_gate, &b->layers[0].w_gate) &&
                          same_values(&a->tok_embd, &b->tok_embd));
        model_free(a);
        model_free(b);
    }
    const char *st = test_shared("models/stories260k.gguf");
    if (st) {
        snprintf(args, sizeof args, "%s/stories.gguf", dir);
        unlink(args);
        roundtrip_gguf("stories260k (SentencePiece) -> GGUF", st, args, 1e-6);
    }
    model_free(mh);

    /* The command line. */
    snprintf(args, sizeof args, "convert %s -o %s", hf, f32);
    expect_cli("existing output without --force", args, 1, "exists");
    after = slurp(f32, &len1);
    test_cond("... and the file is byte-identical", before && after && len0 == len1 && !memcmp(before, after, len0));
    free(after);
    free(before);
    snprintf(args, sizeof args, "convert %s -o %s --force", hf, f32);
    expect_cli("--force replaces it and prints one summary line", args, 0, "llama, 38 tensors, f32");
    snprintf(args, sizeof args, "convert -m %s -o %s --force", hf, f32);
    expect_cli("-m SRC, as the other commands take a model, works too", args, 0, "llama, 38 tensors, f32");
    snprintf(args, sizeof args, "convert -m %s %s -o %s/x.gguf", hf, hf, dir);
    expect_cli("-m SRC and a second source are refused", args, 2, "more than one source");
    snprintf(args, sizeof args, "convert %s -o %s/x.gguf --type q4_0", hf, dir);
    expect_cli("bad --type", args, 2, "--type expects f32 or f16");
    snprintf(args, sizeof args, "convert /nonexistent/model-dir -o %s/x.gguf", dir);
    expect_cli("missing source", args, 1, "/nonexistent/model-dir");
    snprintf(args, sizeof args, "convert %s", hf);
    expect_cli("no -o", args, 2, "no -o");
    expect_cli("no source", "convert -o x.gguf", 2, "no source");
    snprintf(args, sizeof args, "convert %s -o %s/x.gguf --bogus", hf, dir);
    expect_cli("unknown option", args, 2, "unknown option '--bogus'");
    snprintf(args, sizeof args, "convert %s -o", hf);
    expect_cli("-o without a value", args, 2, "-o needs a value");
    rc = run("convert --help", out, sizeof out);
    test_cond("convert --help exits 0", rc == 0 && strstr(out, "usage: skv convert"));
    rc = run("--help", out, sizeof out);
    test_cond("skv --help lists convert", rc == 0 && strstr(out, "convert"));

    /* A pre-tokenizer no GGUF name reproduces: one line naming the tokenizer, no file. */
    char bad[1024], path[1200];
    snprintf(bad, sizeof bad, "%s/bad-pre-hf", dir);
    mkdir(bad, 0700);
    static const char *const files[] = {"config.json", "model.safetensors"};
    for (int i = 0; i < 2; i++) {
        char from[1200];
        snprintf(from, sizeof from, "%s/%s", hf, files[i]);
        snprintf(path, sizeof path, "%s/%s", bad, files[i]);
        unlink(path);
        char *real = realpath(from, NULL);
        if (real) { (void)symlink(real, path); free(real); }
    }
    char tj[1200], tb[1200];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", hf);
    snprintf(tb, sizeof tb, "%s/tokenizer.json", bad);
    if (write_replaced(tj, tb, "\"individual_digits\": true", "\"individual_digits\": false") == 0) {
        snprintf(args, sizeof args, "convert %s -o %s/bad.gguf", bad, dir);
        expect_cli("a pre-tokenizer with no GGUF name is refused", args, 1, "matches no llama.cpp tokenizer.ggml.pre");
        snprintf(path, sizeof path, "%s/bad.gguf", dir);
        test_cond("... and nothing is written", access(path, F_OK) != 0);
    } else {
        test_skip("could not write the modified tokenizer.json");
    }
    test_cond("no temporary files left beside the outputs", leftover_temps(dir) == 0);
    remove_tree(bad);
    remove_tree(dir);
    return test_report("test_convert");
}
