/* test_tok: the tokenizers against llama.cpp's ids in ../shared/reference,
 * plus hand-made cases for the pre-tokenizer regexes, special-token
 * splitting, byte fallback, tokenizer.json variants and errors, and a timing
 * of a ~100K-character encode.
 *
 * Decoding is checked to give back every reference prompt exactly: SPM drops
 * the space it put in front of the text, BPE is byte-level, and no prompt
 * holds invalid UTF-8 (which BPE would turn into U+FFFD, as llama.cpp does). */
#include "gguf.h"
#include "skv.h"
#include "testhelp.h"
#include "tok.h"
#include "tok_impl.h"

#include <cJSON.h>
#include <dirent.h>

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    if (b) b[n] = 0;
    if (len) *len = (size_t)n;
    return b;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Loads the tokenizer of a reference model name: models/NAME.gguf, or
 * models/NAME/tokenizer.json. */
static tok_vocab *load_model(const char *name) {
    char rel[512];
    snprintf(rel, sizeof rel, "models/%s.gguf", name);
    const char *p = test_shared(rel);
    tok_vocab *v = NULL;
    if (p) {
        gguf_file *f;
        if (gguf_open(p, &f) == 0) {
            if (tok_load_gguf(f, &v)) printf("  %s\n", skv_last_error());
            gguf_close(f);
        } else
            printf("  %s\n", skv_last_error());
        return v;
    }
    snprintf(rel, sizeof rel, "models/%s/tokenizer.json", name);
    if ((p = test_shared(rel)) && tok_load_hf(p, &v)) printf("  %s\n", skv_last_error());
    return v;
}

static int ids_equal(const int32_t *a, int na, const cJSON *arr, const char *what) {
    int n = cJSON_GetArraySize(arr);
    int same = n == na;
    int i = 0;
    const cJSON *x;
    cJSON_ArrayForEach(x, arr) {
        if (i >= na || a[i] != (int32_t)x->valuedouble) {
            if (same || i < na) printf("  %s: first difference at %d: ours %d, reference %d (ours %d ids, reference %d)\n",
                                       what, i, i < na ? a[i] : -1, (int)x->valuedouble, na, n);
            same = 0;
            break;
        }
        i++;
    }
    return same;
}

/* Every reference file: ids, decode, greedy continuation text. */
static void test_references(void) {
    const char *ref_dir = test_shared("reference");
    if (!ref_dir) { test_skip("test_tok: ../shared/reference missing, reference checks skipped"); return; }
    char dir[1024]; /* test_shared's buffers are reused: keep a copy */
    snprintf(dir, sizeof dir, "%s", ref_dir);
    DIR *d = opendir(dir);
    if (!d) { test_skip("test_tok: cannot list ../shared/reference"); return; }
    char *names[512];
    int nn = 0;
    struct dirent *e;
    while ((e = readdir(d)) && nn < 512) {
        size_t l = strlen(e->d_name);
        if (l > 5 && strcmp(e->d_name + l - 5, ".json") == 0) names[nn++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)nn, sizeof names[0], cmp_str);
    char cur[256] = "";
    tok_vocab *v = NULL;
    int checked = 0;
    for (int i = 0; i < nn; i++) {
        char model[256], path[2048], what[512];
        snprintf(model, sizeof model, "%s", names[i]);
        *strchr(model, '.') = 0;
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        if (strcmp(model, cur) != 0) {
            tok_free(v);
            v = load_model(model);
            snprintf(cur, sizeof cur, "%s", model);
            snprintf(what, sizeof what, "%s: tokenizer loads", model);
            test_cond(what, v != NULL);
        }
        char *text = slurp(path, NULL);
        cJSON *j = text ? cJSON_Parse(text) : NULL;
        free(text);
        const cJSON *prompt = cJSON_GetObjectItem(j, "prompt"), *toks = cJSON_GetObjectItem(j, "tokens");
        if (!v || !cJSON_IsString(prompt) || !cJSON_IsArray(toks)) {
            snprintf(what, sizeof what, "%s: readable reference with a tokenizer", names[i]);
            test_cond(what, 0);
            cJSON_Delete(j);
            continue;
        }
        const char *pr = prompt->valuestring;
        int add_bos = cJSON_IsTrue(cJSON_GetObjectItem(j, "add_bos"));
        int32_t *ids = NULL;
        int n = 0;
        int rc = tok_encode(v, pr, strlen(pr), add_bos, 1, &ids, &n);
        if (rc) printf("  %s\n", skv_last_error());
        snprintf(what, sizeof what, "%s: %d ids equal llama.cpp's", names[i], cJSON_GetArraySize(toks));
        test_cond(what, rc == 0 && ids_equal(ids, n, toks, names[i]));
        free(ids);

        int nt = cJSON_GetArraySize(toks);
        int32_t *ref = malloc((size_t)(nt ? nt : 1) * sizeof *ref);
        int k = 0;
        const cJSON *x;
        cJSON_ArrayForEach(x, toks) ref[k++] = (int32_t)x->valuedouble;
        char *dec = tok_decode(v, ref, nt, 0);
        snprintf(what, sizeof what, "%s: decoding the reference ids gives the prompt back", names[i]);
        test_cond(what, dec && strcmp(dec, pr) == 0);
        free(dec);

        const cJSON *gt = cJSON_GetObjectItem(j, "greedy_text"), *g = cJSON_GetObjectItem(j, "greedy");
        if (cJSON_IsString(gt) && cJSON_IsArray(g)) {
            size_t cap = 4096, len = 0;
            char *out = malloc(cap);
            int prev = nt ? ref[nt - 1] : -1;
            cJSON_ArrayForEach(x, g) {
                int id = (int)x->valuedouble;
                int m = tok_piece(v, prev, id, 0, out + len, (int)(cap - len - 1));
                if (m > (int)(cap - len - 1)) m = 0;
                len += (size_t)m;
                prev = id;
            }
            out[len] = 0;
            snprintf(what, sizeof what, "%s: greedy ids decode to greedy_text", names[i]);
            test_cond(what, strcmp(out, gt->valuestring) == 0);
            if (strcmp(out, gt->valuestring) != 0) printf("  ours '%s'\n  want '%s'\n", out, gt->valuestring);
            free(out);
        }
        free(ref);
        cJSON_Delete(j);
        checked++;
    }
    tok_free(v);
    for (int i = 0; i < nn; i++) free(names[i]);
    printf("  %d reference files checked\n", checked);
}

/* ---- pre-tokenizer pieces ---- */

static const struct {
    const char *pre, *text;
    const char *want[32];
} pre_cases[] = {
    {"gpt2", "I'm can't we'LL They'RE x's",
     {"I", "'m", " can", "'t", " we", "'", "LL", " They", "'", "RE", " x", "'s", NULL}},
    {"gpt2", "1 12 123 1234 12345 a1b22",
     {"1", " 12", " 123", " 1234", " 12345", " a", "1", "b", "22", NULL}},
    {"gpt2", "hello,world!! (ok) $5+3=8 <a|b> ~^_",
     {"hello", ",", "world", "!!", " (", "ok", ")", " $", "5", "+", "3", "=", "8", " <", "a", "|", "b", ">", " ~^_", NULL}},
    {"gpt2", "one\n\ntwo  \n  three   four\t\tfive\r\nsix",
     {"one", "\n", "\n", "two", "  \n ", " three", "  ", " four", "\t", "\t", "five", "\r", "\n", "six", NULL}},
    {"gpt2", "日本語 Привет мир ١٢٣ héllo",
     {"日本語", " Привет", " мир", " ١٢٣", " héllo", NULL}},
    {"llama-bpe", "I'm can't we'LL They'RE x's",
     {"I", "'m", " can", "'t", " we", "'LL", " They", "'RE", " x", "'s", NULL}},
    {"llama-bpe", "1 12 123 1234 12345 a1b22",
     {"1", " ", "12", " ", "123", " ", "123", "4", " ", "123", "45", " a", "1", "b", "22", NULL}},
    {"llama-bpe", "hello,world!! (ok) $5+3=8 <a|b> ~^_",
     {"hello", ",world", "!!", " (", "ok", ")", " $", "5", "+", "3", "=", "8", " <", "a", "|b", ">", " ~^_", NULL}},
    {"llama-bpe", "one\n\ntwo  \n  three   four\t\tfive\r\nsix",
     {"one", "\n\n", "two", "  \n", " ", " three", "  ", " four", "\t", "\tfive", "\r\n", "six", NULL}},
    {"llama-bpe", "日本語 Привет мир ١٢٣ héllo",
     {"日本語", " Привет", " мир", " ", "١٢٣", " héllo", NULL}},
    {"qwen2", "I'm can't we'LL They'RE x's",
     {"I", "'m", " can", "'t", " we", "'LL", " They", "'RE", " x", "'s", NULL}},
    {"qwen2", "1 12 123 1234 12345 a1b22",
     {"1", " ", "1", "2", " ", "1", "2", "3", " ", "1", "2", "3", "4", " ", "1", "2", "3", "4", "5", " a", "1", "b", "2", "2", NULL}},
    {"qwen2", "hello,world!! (ok) $5+3=8 <a|b> ~^_",
     {"hello", ",world", "!!", " (", "ok", ")", " $", "5", "+", "3", "=", "8", " <", "a", "|b", ">", " ~^_", NULL}},
    {"qwen2", "one\n\ntwo  \n  three   four\t\tfive\r\nsix",
     {"one", "\n\n", "two", "  \n", " ", " three", "  ", " four", "\t", "\tfive", "\r\n", "six", NULL}},
    {"qwen2", "日本語 Привет мир ١٢٣ héllo",
     {"日本語", " Привет", " мир", " ", "١", "٢", "٣", " héllo", NULL}},
    {"default", "I'm can't we'LL They'RE x's",
     {"I", "'", "m", " can", "'", "t", " we", "'", "LL", " They", "'", "RE", " x", "'", "s", NULL}},
    {"default", "1 12 123 1234 12345 a1b22",
     {"1", " ", "12", " ", "123", " ", "1234", " ", "12345", " a", "1", "b", "22", NULL}},
    {"default", "hello,world!! (ok) $5+3=8 <a|b> ~^_",
     {"hello", ",", "world", "!!", " ", "(", "ok", ")", " ", "$", "5", "+", "3", "=", "8", " ", "<", "a", "|", "b", ">", " ", "~^_", NULL}},
    {"default", "one\n\ntwo  \n  three   four\t\tfive\r\nsix",
     {"one", "\n", "\n", "two", "  \n ", " three", "  ", " four", "\t", "\t", "five", "\r", "\n", "six", NULL}},
    {"default", "日本語 Привет мир ١٢٣ héllo",
     {"日本語", " Привет", " мир", " ", "١٢٣", " héllo", NULL}},
    {"smollm", "I'm can't we'LL They'RE x's",
     {"I", "'m", " can", "'t", " we", "'", "LL", " They", "'", "RE", " x", "'s", NULL}},
    {"smollm", "1 12 123 1234 12345 a1b22",
     {"1", " ", "1", "2", " ", "1", "2", "3", " ", "1", "2", "3", "4", " ", "1", "2", "3", "4", "5", " a", "1", "b", "2", "2", NULL}},
    {"smollm", "hello,world!! (ok) $5+3=8 <a|b> ~^_",
     {"hello", ",", "world", "!!", " (", "ok", ")", " $", "5", "+", "3", "=", "8", " <", "a", "|", "b", ">", " ~^_", NULL}},
    {"smollm", "one\n\ntwo  \n  three   four\t\tfive\r\nsix",
     {"one", "\n", "\n", "two", "  \n ", " three", "  ", " four", "\t", "\t", "five", "\r", "\n", "six", NULL}},
    {"smollm", "日本語 Привет мир ١٢٣ héllo",
     {"日本語", " Привет", " мир", " ", "١", "٢", "٣", " héllo", NULL}},
};

static void test_pre(void) {
    for (size_t c = 0; c < sizeof pre_cases / sizeof pre_cases[0]; c++) {
        tok_pre *p;
        int rc = tok_pre_from_name(pre_cases[c].pre, "test", &p);
        if (rc) { test_cond(pre_cases[c].pre, 0); continue; }
        const char *t = pre_cases[c].text;
        tok_span *sp;
        int n;
        rc = tok_pre_split(p, t, strlen(t), &sp, &n);
        int ok = rc == 0, k = 0;
        for (; ok && pre_cases[c].want[k]; k++) {
            const char *w = pre_cases[c].want[k];
            ok = k < n && sp[k].len == strlen(w) && memcmp(t + sp[k].off, w, sp[k].len) == 0;
        }
        ok = ok && k == n;
        char what[256], shown[128];
        size_t m = 0;
        for (const char *q = t; *q && m < sizeof shown - 3; q++) { /* newlines and tabs shown as \n, \t */
            const char *esc = *q == '\n' ? "\\n" : *q == '\t' ? "\\t" : *q == '\r' ? "\\r" : NULL;
            if (esc) { shown[m++] = esc[0]; shown[m++] = esc[1]; }
            else shown[m++] = *q;
        }
        shown[m] = 0;
        snprintf(what, sizeof what, "pre-tokenizer %s splits \"%s\" into %d pieces", pre_cases[c].pre, shown, k);
        test_cond(what, ok);
        if (!ok && rc == 0)
            for (int i = 0; i < n; i++) printf("  [%d] '%.*s'\n", i, (int)sp[i].len, t + sp[i].off);
        if (!rc) free(sp);
        tok_pre_free(p);
    }
    tok_pre *p;
    int rc = tok_pre_new("literal", &p);
    if (!rc) rc = tok_pre_add(p, "a.b", 1, "test");
    tok_span *ls = NULL;
    int ln = 0;
    if (!rc) rc = tok_pre_split(p, "xa.bya.b", 8, &ls, &ln);
    test_cond("a literal split (HF Split String) cuts x|a.b|y|a.b", rc == 0 && ln == 4 && ls[0].len == 1 && ls[1].len == 3 &&
              ls[2].off == 4 && ls[3].len == 3);
    free(ls);
    tok_pre_free(p);
    rc = tok_pre_from_name("no-such-pre", "x.gguf", &p);
    test_cond("an unknown pre-tokenizer name is an error naming it",
              rc == SKV_EUNSUPPORTED && strstr(skv_last_error(), "no-such-pre") && strstr(skv_last_error(), "x.gguf"));
    /* A run of 100K spaces is one piece (\s+) and must not overflow the JIT stack. */
    size_t big = 100000;
    char *sp100 = malloc(big);
    memset(sp100, ' ', big);
    tok_span *s;
    int n;
    rc = tok_pre_from_name("gpt2", "test", &p);
    rc = rc ? rc : tok_pre_split(p, sp100, big, &s, &n);
    test_cond("100K spaces pre-tokenize into one piece", rc == 0 && n == 1 && s[0].len == big);
    if (!rc) free(s);
    tok_pre_free(p);
    free(sp100);
}

/* ---- GGUF tokenizers: special tokens, byte fallback, eog ---- */

static void test_gguf_specials(void) {
    tok_vocab *sm = load_model("mini-smollm-f32"), *st = load_model("stories260k");
    if (!sm || !st) {
        test_skip("test_tok: ../shared/models missing, GGUF special-token checks skipped");
        tok_free(sm);
        tok_free(st);
        return;
    }
    test_cond("smollm: kind BPE, 49152 tokens, pre smollm, no BOS by default",
              tok_kind(sm) == TOK_BPE && tok_n_vocab(sm) == 49152 && strcmp(tok_pre_name(sm), "smollm") == 0 &&
              tok_add_bos(sm) == 0);
    test_cond("smollm: eog is <|im_end|> (eos) and <|endoftext|>, not <|im_start|>",
              tok_is_eog(sm, 2) && tok_is_eog(sm, 0) && !tok_is_eog(sm, 1) && !tok_is_eog(sm, 100) && tok_eos(sm) == 2);
    test_cond("stories260k: kind SPM, 512 tokens, BOS 1 added, EOS 2 is the only eog",
              tok_kind(st) == TOK_SPM && tok_n_vocab(st) == 512 && tok_bos(st) == 1 && tok_add_bos(st) == 1 &&
              tok_is_eog(st, 2) && !tok_is_eog(st, 1) && !tok_is_eog(st, 0));

    const char *chat = "<|im_start|>user\nHi there<|im_end|>\n";
    int32_t *ids;
    int n;
    int rc = tok_encode(sm, chat, strlen(chat), 0, 1, &ids, &n);
    int ok = rc == 0 && n > 3 && ids[0] == 1;
    int has_end = 0, low = 0;
    for (int i = 0; ok && i < n; i++) has_end += ids[i] == 2;
    test_cond("smollm: parse_special turns <|im_start|> and <|im_end|> into ids 1 and 2", ok && has_end == 1);
    char *d = rc ? NULL : tok_decode(sm, ids, n, 1);
    test_cond("smollm: decoding with show_special gives the chat text back", d && strcmp(d, chat) == 0);
    free(d);
    d = rc ? NULL : tok_decode(sm, ids, n, 0);
    test_cond("smollm: decoding without show_special drops control tokens", d && strcmp(d, "user\nHi there\n") == 0);
    free(d);
    free(ids);
    rc = tok_encode(sm, chat, strlen(chat), 0, 0, &ids, &n);
    for (int i = 0; rc == 0 && i < n; i++) low += ids[i] < 17;
    d = rc ? NULL : tok_decode(sm, ids, n, 0);
    test_cond("smollm: without parse_special the special texts stay text", rc == 0 && low == 0 && d && strcmp(d, chat) == 0);
    free(d);
    free(ids);

    /* Byte fallback: U+65E5 is not in stories260k's 512 tokens. */
    const char *ri = "\xE6\x97\xA5";
    rc = tok_encode(st, ri, 3, 1, 1, &ids, &n);
    ok = rc == 0 && n == 5 && ids[0] == 1 && ids[2] == 3 + 0xE6 && ids[3] == 3 + 0x97 && ids[4] == 3 + 0xA5 &&
         strcmp(tok_text(st, ids[2]), "<0xE6>") == 0;
    test_cond("stories260k: a character outside the vocabulary becomes <0xNN> tokens", ok);
    d = rc ? NULL : tok_decode(st, ids, n, 0);
    test_cond("stories260k: byte tokens decode back to the character", d && strcmp(d, ri) == 0);
    free(d);
    free(ids);
    rc = tok_encode(st, "a<s>b", 5, 0, 1, &ids, &n);
    int bos_in = 0;
    for (int i = 0; rc == 0 && i < n; i++) bos_in += ids[i] == 1;
    free(ids);
    test_cond("stories260k: <s> in the text is BOS with parse_special", rc == 0 && bos_in == 1);
    rc = tok_encode(st, "a<s>b", 5, 0, 0, &ids, &n);
    bos_in = 0;
    for (int i = 0; rc == 0 && i < n; i++) bos_in += ids[i] == 1;
    d = rc ? NULL : tok_decode(st, ids, n, 0);
    test_cond("stories260k: <s> stays text without parse_special", rc == 0 && bos_in == 0 && d && strcmp(d, "a<s>b") == 0);
    free(d);
    free(ids);

    /* tok_piece reports the full length when the buffer is short. */
    char buf[8];
    int len = tok_piece(sm, -1, 6403, 0, NULL, 0); /* "Once" */
    int len2 = tok_piece(sm, -1, 6403, 0, buf, 2);
    test_cond("tok_piece returns the full length past cap and writes at most cap bytes",
              len == 4 && len2 == 4 && memcmp(buf, "On", 2) == 0);
    test_cond("tok_piece of an id out of range is empty", tok_piece(sm, -1, 49152, 1, buf, 8) == 0 &&
              tok_piece(sm, -1, -5, 1, buf, 8) == 0 && tok_text(sm, 49152) == NULL);

    /* Invalid UTF-8 in BPE input: replaced by U+FFFD, as llama.cpp does. */
    rc = tok_encode(sm, "a\xFF" "b", 3, 0, 1, &ids, &n);
    d = rc ? NULL : tok_decode(sm, ids, n, 0);
    test_cond("smollm: an invalid UTF-8 byte encodes as U+FFFD", d && strcmp(d, "a\xEF\xBF\xBD" "b") == 0);
    free(d);
    free(ids);
    rc = tok_encode(st, "", 0, 1, 1, &ids, &n);
    test_cond("empty text with BOS is just BOS", rc == 0 && n == 1 && ids[0] == 1);
    free(ids);
    rc = tok_encode(sm, "x", 1, 1, 1, &ids, &n);
    test_cond("smollm: asking for BOS works (BOS id 1)", rc == 0 && n == 2 && ids[0] == 1);
    free(ids);
    tok_free(sm);
    tok_free(st);

    tok_vocab *hf = load_model("mini-smollm-hf");
    test_cond("mini-smollm-hf: BOS 1 and EOS 2 from config.json, no BOS added, pre Digits,ByteLevel",
              hf && tok_bos(hf) == 1 && tok_eos(hf) == 2 && !tok_add_bos(hf) && tok_is_eog(hf, 2) && tok_is_eog(hf, 0) &&
              strcmp(tok_pre_name(hf), "Digits,ByteLevel") == 0);
    tok_free(hf);
}

/* ---- tokenizer.json variants written here ---- */

static int put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    o[0] = (char)(0xC0 | cp >> 6);
    o[1] = (char)(0x80 | (cp & 63));
    return 2;
}

/* A tokenizer.json with the 256 byte stand-ins as ids 0..255 (in byte
 * order), four merges in both merge forms, and added tokens. pre and model
 * type can be replaced to test errors. */
static char *write_tj(const char *dir, const char *name, const char *pre_json, const char *model_type) {
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject();
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int pr = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        char u[4] = {0};
        put_utf8(u, pr ? (unsigned)b : 256u + (unsigned)k++);
        cJSON_AddNumberToObject(vocab, u, b);
    }
    cJSON_AddNumberToObject(vocab, "he", 256);
    cJSON_AddNumberToObject(vocab, "ll", 257);
    cJSON_AddNumberToObject(vocab, "hell", 258);
    cJSON_AddNumberToObject(vocab, "hello", 259);
    cJSON_AddStringToObject(model, "type", model_type);
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON *merges = cJSON_Parse("[\"h e\", [\"l\", \"l\"], \"he ll\", [\"hell\", \"o\"]]");
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "added_tokens", cJSON_Parse(
        "[{\"id\": 260, \"content\": \"<|ab|>\", \"special\": true},"
        " {\"id\": 261, \"content\": \"<|ab|><|cd|>\", \"special\": true},"
        " {\"id\": 262, \"content\": \"[X]\", \"special\": false},"
        " {\"id\": 263, \"content\": \"xab\", \"special\": true},"
        " {\"id\": 264, \"content\": \"abcd\", \"special\": true}]"));
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(pre_json));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(txt, f);
        fclose(f);
    }
    cJSON_free(txt);
    return path;
}

static int enc_is(const tok_vocab *v, const char *text, int parse_special, const int *want, int nw) {
    int32_t *ids;
    int n;
    if (tok_encode(v, text, strlen(text), 0, parse_special, &ids, &n)) return 0;
    int ok = n == nw;
    for (int i = 0; ok && i < n; i++) ok = ids[i] == want[i];
    if (!ok) {
        printf("  '%s' ->", text);
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    free(ids);
    return ok;
}

/* Writes text into dir/name; 1 on success. */
static int put_file(const char *dir, const char *name, const char *text) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    if (!f) return 0;
    int ok = fputs(text, f) >= 0;
    return fclose(f) == 0 && ok;
}

/* The files beside tokenizer.json and the added tokens' flags: BOS from
 * the post_processor's TemplateProcessing (a Sequence of processors, as
 * Llama 3's), EOS from tokenizer_config.json as a string and BOS there as
 * {"content": ...}, overriding it; an added token with lstrip and rstrip
 * takes the spaces either side of it, one without keeps them. */
static void test_hf_specials(const char *dir, const char *bl) {
    char sub[1024];
    snprintf(sub, sizeof sub, "%s/specials", dir);
    mkdir(sub, 0700);
    char *p = write_tj(sub, "tokenizer.json", bl, "BPE");
    char *text = NULL;
    size_t n = 0;
    cJSON *root = skv_read_file(p, 1 << 20, &text, &n) ? NULL : cJSON_Parse(text);
    free(text);
    cJSON *x, *added = cJSON_GetObjectItem(root, "added_tokens");
    cJSON_ArrayForEach(x, added)
        if (cJSON_GetObjectItem(x, "id")->valueint == 262) { /* [X] */
            cJSON_AddTrueToObject(x, "lstrip");
            cJSON_AddTrueToObject(x, "rstrip");
        }
    cJSON_AddItemToObject(root, "post_processor", cJSON_Parse(
        "{\"type\": \"Sequence\", \"processors\": [{\"type\": \"ByteLevel\"}, {\"type\": \"TemplateProcessing\","
        " \"single\": [{\"SpecialToken\": {\"id\": \"<|ab|>\", \"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\","
        " \"type_id\": 0}}]}]}"));
    char *out = root ? cJSON_Print(root) : NULL;
    int ok = out && put_file(sub, "tokenizer.json", out);
    cJSON_free(out);
    cJSON_Delete(root);
    tok_vocab *v = NULL;
    int rc = ok ? tok_load_hf(p, &v) : -1;
    if (rc) printf("  %s\n", rc > 0 ? "could not write the files" : skv_last_error());
    test_cond("the post_processor's TemplateProcessing (in a Sequence) sets BOS <|ab|> and adds it",
              rc == 0 && tok_bos(v) == 260 && tok_add_bos(v) == 1);
    test_cond("an added token with lstrip and rstrip takes the spaces either side of it",
              rc == 0 && enc_is(v, "he  [X]  he", 0, (int[]){256, 262, 256}, 3));
    tok_free(v);
    v = NULL;
    /* the same without the flags: the spaces stay text */
    write_tj(sub, "tokenizer.json", bl, "BPE");
    rc = tok_load_hf(p, &v);
    test_cond("without them the spaces stay text", rc == 0 && enc_is(v, "he [X] he", 0, (int[]){256, 32, 262, 32, 256}, 5));
    tok_free(v);
    v = NULL;
    ok = put_file(sub, "tokenizer_config.json",
                  "{\"bos_token\": {\"content\": \"abcd\", \"lstrip\": false}, \"eos_token\": \"<|ab|>\","
                  " \"add_bos_token\": true}");
    rc = ok ? tok_load_hf(p, &v) : -1;
    test_cond("tokenizer_config.json names BOS by {\"content\": ...} and EOS by string, and add_bos_token",
              rc == 0 && tok_bos(v) == 264 && tok_eos(v) == 260 && tok_add_bos(v) == 1);
    tok_free(v);
    v = NULL;
    ok = put_file(sub, "tokenizer_config.json", "{\"bos_token\": \"no such token\", \"eos_token\": {\"content\": 7}}");
    rc = ok ? tok_load_hf(p, &v) : -1;
    test_cond("a name no token has, or a content that is not a string, leaves BOS and EOS unset",
              rc == 0 && tok_bos(v) == -1 && tok_eos(v) == -1);
    tok_free(v);
    char path[1100];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", sub);
    remove(path);
    remove(p);
    rmdir(sub);
}

/* Merges whose results are not tokens (a trimmed vocabulary's chains: only
 * the whole word is a token) are interned as merge-only strings. 200 words
 * of 8 letters, each built by 7 merges of which 6 make a merge-only string:
 * 1,200 of them, beyond the half of the 1,024-slot string map that 456
 * tokens fill, so the map grows (rehashing every token) while the merges
 * load. Every word still encodes to its one token. */
static void test_merge_only(const char *dir, const char *bl) {
    enum { NW = 200, WL = 8 };
    cJSON *root = cJSON_CreateObject(), *model = cJSON_CreateObject(), *vocab = cJSON_CreateObject(),
          *merges = cJSON_CreateArray();
    int k = 0;
    for (int b = 0; b < 256; b++) { /* the byte stand-ins, as write_tj */
        int pr = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        char u[4] = {0};
        put_utf8(u, pr ? (unsigned)b : 256u + (unsigned)k++);
        cJSON_AddNumberToObject(vocab, u, b);
    }
    char words[NW][WL + 1];
    uint64_t seed = 0x5eed;
    for (int w = 0; w < NW; w++) {
        words[w][0] = (char)('a' + w / 26 % 26); /* distinct first two letters: no merge is made twice */
        words[w][1] = (char)('a' + w % 26);
        /* the rest upper case: a word holds no other word's first pair, so only its own chain applies */
        for (int i = 2; i < WL; i++) words[w][i] = (char)('A' + (int)((test_frand(&seed) + 1) * 13) % 26);
        words[w][WL] = 0;
        cJSON_AddNumberToObject(vocab, words[w], 256 + w);
        for (int i = 1; i < WL; i++) {
            char l[WL + 1], r[2] = {words[w][i], 0}, m[2 * WL + 4];
            memcpy(l, words[w], (size_t)i);
            l[i] = 0;
            snprintf(m, sizeof m, "%s %s", l, r);
            cJSON_AddItemToArray(merges, cJSON_CreateString(m));
        }
    }
    cJSON_AddStringToObject(model, "type", "BPE");
    cJSON_AddItemToObject(model, "vocab", vocab);
    cJSON_AddItemToObject(model, "merges", merges);
    cJSON_AddItemToObject(root, "model", model);
    cJSON_AddItemToObject(root, "pre_tokenizer", cJSON_Parse(bl));
    cJSON_AddItemToObject(root, "decoder", cJSON_Parse("{\"type\": \"ByteLevel\"}"));
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    char path[1024];
    snprintf(path, sizeof path, "%s/chains.json", dir);
    FILE *f = fopen(path, "w");
    int ok = f && txt && fputs(txt, f) >= 0;
    if (f) ok &= fclose(f) == 0;
    cJSON_free(txt);
    tok_vocab *v = NULL;
    int rc = ok ? tok_load_hf(path, &v) : -1;
    if (rc > 0 || rc < 0) printf("  %s\n", ok ? skv_last_error() : "could not write chains.json");
    test_cond("a tokenizer.json of 1,400 chained merges (1,200 results no token has) loads", rc == 0);
    int good = rc == 0;
    for (int w = 0; w < NW && good; w++) good = enc_is(v, words[w], 0, (int[]){256 + w}, 1);
    test_cond("after the string map grew, each of the 200 words encodes to its one token", good);
    test_cond("a merge-only string is no token: the vocabulary is the 456 tokens", good && tok_n_vocab(v) == 256 + NW);
    tok_free(v);
    remove(path);
}

/* model.ignore_merges (Llama 3's tokenizer.json): a piece that is a whole
 * token is taken as it is, without the merges having to build it. "lo" is
 * a token (265) no merge makes; "z" loses its byte token, so a piece with
 * no token at all for a byte drops that byte, as llama.cpp does. */
static void test_ignore_merges(const char *dir, const char *bl) {
    char *p = write_tj(dir, "im.json", bl, "BPE");
    FILE *f = fopen(p, "r");
    static char buf[1 << 16];
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f) fclose(f);
    buf[n] = 0;
    cJSON *root = cJSON_Parse(buf), *model = cJSON_GetObjectItem(root, "model");
    cJSON *vocab = cJSON_GetObjectItem(model, "vocab");
    cJSON_AddNumberToObject(vocab, "lo", 265);
    cJSON_DeleteItemFromObjectCaseSensitive(vocab, "z"); /* not "Z" */
    cJSON_AddNumberToObject(vocab, "<z>", 'z'); /* keeps the ids dense */
    int ok = 1;
    for (int im = 0; im < 2 && ok; im++) {
        cJSON_DeleteItemFromObject(model, "ignore_merges");
        cJSON_AddBoolToObject(model, "ignore_merges", im);
        char *txt = cJSON_Print(root);
        f = fopen(p, "w");
        if (!txt || !f) ok = 0;
        else fputs(txt, f);
        if (f) fclose(f);
        cJSON_free(txt);
        tok_vocab *v = NULL;
        if (ok && tok_load_hf(p, &v)) {
            printf("  %s\n", skv_last_error());
            ok = 0;
        }
        if (!ok) break;
        if (im) {
            test_cond("ignore_merges: a piece that is a whole token is taken as it is (lo -> 265)",
                      enc_is(v, "lo", 1, (int[]){265}, 1));
            test_cond("ignore_merges: a piece that is no token still goes through the merges (hellx -> hell x)",
                      enc_is(v, "hellx", 1, (int[]){258, 'x'}, 2));
        } else {
            test_cond("without ignore_merges the merges decide: lo -> l o", enc_is(v, "lo", 1, (int[]){'l', 'o'}, 2));
        }
        test_cond(im ? "ignore_merges: a byte with no token is dropped (hez -> he)"
                     : "a byte with no token is dropped, the rest kept (hez -> he)",
                  enc_is(v, "hez", 1, (int[]){256}, 1));
        tok_free(v);
    }
    test_cond("the ignore_merges tokenizer.json variants load", ok);
    cJSON_Delete(root);
    remove(p);
}

static void test_hf_synthetic(void) {
    const char *dir = test_tmpdir("tok");
    const char *bl = "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}";
    char *p = write_tj(dir, "tokenizer.json", bl, "BPE");
    tok_vocab *v;
    int rc = tok_load_hf(p, &v);
    if (rc) printf("  %s\n", skv_last_error());
    test_cond("synthetic tokenizer.json loads", rc == 0);
    if (rc) return;
    test_cond("synthetic: 265 tokens, no BOS, add_bos off", tok_n_vocab(v) == 265 && tok_bos(v) == -1 && !tok_add_bos(v));
    test_cond("merges in \"a b\" and [\"a\", \"b\"] form both apply", enc_is(v, "hello", 1, (int[]){259}, 1));
    test_cond("a space before a word is the stand-in of byte 32",
              enc_is(v, "he hello", 1, (int[]){256, ' ', 259}, 3));
    test_cond("special tokens: the longer <|ab|><|cd|> wins over <|ab|>",
              enc_is(v, "<|ab|><|cd|>", 1, (int[]){261}, 1));
    test_cond("special tokens are cut longest first, not left to right (xabcd -> x + abcd)",
              enc_is(v, "xabcd", 1, (int[]){'x', 264}, 2));
    test_cond("without parse_special control tokens stay text, user-defined ones still split",
              enc_is(v, "ab[X]", 0, (int[]){'a', 'b', 262}, 3));
    int32_t ids[] = {260, 'h', 262, 259};
    char *d = tok_decode(v, ids, 4, 0);
    test_cond("decode: control tokens hidden, user-defined shown as written", d && strcmp(d, "h[X]hello") == 0);
    free(d);
    d = tok_decode(v, ids, 4, 1);
    test_cond("decode with show_special: control tokens shown", d && strcmp(d, "<|ab|>h[X]hello") == 0);
    free(d);
    tok_free(v);

    /* Sequence[Digits, ByteLevel] and Split + ByteLevel(use_regex false). */
    p = write_tj(dir, "seq.json",
                 "{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}{1,2}\"},"
                 " \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", \"add_prefix_space\": false,"
                 " \"use_regex\": false}]}", "BPE");
    rc = tok_load_hf(p, &v);
    if (rc) printf("  %s\n", skv_last_error());
    tok_span *sp = NULL;
    int n = 0;
    if (!rc) rc = tok_pre_split(v->pre, "a12345b", 7, &sp, &n);
    test_cond("Split(Regex, Isolated) + ByteLevel(no regex): a|12|34|5|b", rc == 0 && n == 5 && sp[1].len == 2 &&
              sp[3].len == 1 && sp[4].len == 1);
    free(sp);
    if (!rc) tok_free(v);

    struct { const char *pre, *type, *field; } bad[] = {
        {"{\"type\": \"Whitespace\"}", "BPE", "pre_tokenizer.type 'Whitespace'"},
        {"{\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"String\": \" \"},"
         " \"behavior\": \"Removed\"}, {\"type\": \"ByteLevel\"}]}", "BPE", "pretokenizers[0].behavior"},
        {"{\"type\": \"Digits\", \"individual_digits\": true}", "BPE", "no ByteLevel"},
        {"{\"type\": \"ByteLevel\"}", "WordPiece", "model.type 'WordPiece'"},
        {"null", "BPE", "pre_tokenizer is null"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p = write_tj(dir, "bad.json", bad[i].pre, bad[i].type);
        v = NULL;
        rc = tok_load_hf(p, &v);
        char what[256];
        snprintf(what, sizeof what, "unsupported tokenizer.json is refused naming the file and %s", bad[i].field);
        test_cond(what, rc == SKV_EUNSUPPORTED && v == NULL && strstr(skv_last_error(), p) &&
                        strstr(skv_last_error(), bad[i].field));
        if (rc != SKV_EUNSUPPORTED || !strstr(skv_last_error(), bad[i].field)) printf("  %s\n", skv_last_error());
        tok_free(v);
        remove(p);
    }
    test_ignore_merges(dir, bl);
    test_hf_specials(dir, bl);
    test_merge_only(dir, bl);
    rc = tok_load_hf("/nonexistent/tokenizer.json", &v);
    test_cond("a missing tokenizer.json is SKV_EIO naming it", rc == SKV_EIO && strstr(skv_last_error(), "/nonexistent"));
    /* A found by fuzzing: one token with a huge id asked for gigabytes. */
    char sparse[1024];
    snprintf(sparse, sizeof sparse, "%s/sparse.json", dir);
    FILE *sf = fopen(sparse, "w");
    if (sf) {
        fputs("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 900000000}, \"merges\": []},"
              " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}", sf);
        fclose(sf);
    }
    v = NULL;
    rc = tok_load_hf(sparse, &v);
    test_cond("a token id far past the entries is refused (no huge allocation)",
              rc == SKV_EFORMAT && v == NULL && strstr(skv_last_error(), "dense"));
    tok_free(v);
    remove(sparse);
    remove(write_tj(dir, "tokenizer.json", bl, "BPE"));
    remove(write_tj(dir, "seq.json", bl, "BPE"));
    rmdir(dir);
}

/* ---- speed ---- */

static void time_encode(const char *model, const char *text, size_t len, const char *label) {
    tok_vocab *v = load_model(model);
    if (!v) return;
    int32_t *ids;
    int n;
    double t0 = skv_now();
    int rc = tok_encode(v, text, len, tok_add_bos(v), 1, &ids, &n);
    double t1 = skv_now();
    char *d = rc ? NULL : tok_decode(v, ids, n, 0);
    double t2 = skv_now();
    printf("  %s %s: %zu bytes -> %d tokens, encode %.1f ms, decode %.1f ms\n", model, label, len, n, (t1 - t0) * 1e3,
           (t2 - t1) * 1e3);
    char what[256];
    snprintf(what, sizeof what, "%s: %s round-trips through encode and decode", model, label);
    test_cond(what, rc == 0 && d && strlen(d) == len && memcmp(d, text, len) == 0);
    free(d);
    if (!rc) free(ids);
    tok_free(v);
}

static void test_speed(void) {
    const char *p = test_shared("reference/stories260k.long.json");
    if (!p) { test_skip("test_tok: ../shared/reference missing, timing skipped"); return; }
    char *txt = slurp(p, NULL);
    cJSON *j = cJSON_Parse(txt);
    free(txt);
    const char *pr = cJSON_GetObjectItem(j, "prompt")->valuestring;
    size_t pl = strlen(pr), len = 0, cap = 100000 + pl;
    char *big = malloc(cap + 1);
    while (len + pl <= 100000 + pl && len < 100000) {
        memcpy(big + len, pr, pl);
        len += pl;
    }
    big[len] = 0;
    time_encode("mini-smollm-f32", big, len, "'long' x23");
    time_encode("mini-smollm-hf", big, len, "'long' x23");
    time_encode("stories260k", big, len, "'long' x23");
    memset(big, 'a', 100000);
    time_encode("mini-smollm-f32", big, 100000, "100K x 'a' (one piece)");
    time_encode("stories260k", big, 100000, "100K x 'a'");
    free(big);
    cJSON_Delete(j);
}

int main(void) {
    test_references();
    test_pre();
    test_gguf_specials();
    test_hf_synthetic();
    test_speed();
    return test_report("test_tok");
}
