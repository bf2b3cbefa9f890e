/* test_safetensors.c: the safetensors reader on the mini HF model, on a
 * sharded copy of it written here (one shard deliberately misaligned), and
 * on damaged files that must each fail with a message naming the file. */
#include "safetensors.h"
#include "skv.h"
#include "testhelp.h"

#include <cJSON.h>
#include <ftw.h>
#include <stdint.h>

static char tmp[512];

static const char *tpath(const char *name) {
    static char buf[4][1024];
    static int slot;
    char *p = buf[slot++ & 3];
    snprintf(p, sizeof buf[0], "%s/%s", tmp, name);
    return p;
}

static int write_bytes(const char *path, const void *a, size_t na, const void *b, size_t nb) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    int ok = fwrite(a, 1, na, f) == na && (!nb || fwrite(b, 1, nb, f) == nb);
    return fclose(f) == 0 && ok ? 0 : -1;
}

/* Writes a safetensors file: header length, header text (space-padded so that
 * 8 + N is congruent to mod8 modulo 8) and data. */
static int write_st(const char *path, const char *header, int mod8, const void *data, size_t nd) {
    size_t n = strlen(header);
    while ((8 + n) % 8 != (size_t)mod8) n++;
    uint8_t *buf = calloc(1, 8 + n);
    if (!buf) return -1;
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)n >> (8 * i));
    memset(buf + 8, ' ', n);
    memcpy(buf + 8, header, strlen(header));
    int rc = write_bytes(path, buf, 8 + n, data, nd);
    free(buf);
    return rc;
}

/* Writes tensors [from, to) of s as one shard file. */
static int write_shard(const st_set *s, int from, int to, const char *path, int mod8) {
    cJSON *h = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(h, "__metadata__");
    cJSON_AddStringToObject(meta, "format", "pt");
    size_t off = 0;
    for (int i = from; i < to; i++) {
        const st_tensor *t = st_get(s, i);
        cJSON *e = cJSON_AddObjectToObject(h, t->name);
        cJSON_AddStringToObject(e, "dtype", t->type == GGML_F32 ? "F32" : t->type == GGML_F16 ? "F16" : "BF16");
        cJSON *sh = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t->n_dims; d++) cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[d]));
        cJSON *o = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(o, cJSON_CreateNumber((double)(off + t->nbytes)));
        off += t->nbytes;
    }
    char *text = cJSON_PrintUnformatted(h);
    cJSON_Delete(h);
    uint8_t *data = malloc(off ? off : 1);
    off = 0;
    for (int i = from; i < to; i++) {
        const st_tensor *t = st_get(s, i);
        memcpy(data + off, t->data, t->nbytes);
        off += t->nbytes;
    }
    int rc = write_st(path, text, mod8, data, off);
    free(data);
    free(text);
    return rc;
}

static int copy_file(const char *from, const char *to) {
    FILE *f = fopen(from, "rb");
    if (!f) return -1;
    char buf[65536];
    size_t got, total = 0;
    char *all = NULL;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0) {
        all = realloc(all, total + got);
        memcpy(all + total, buf, got);
        total += got;
    }
    fclose(f);
    int rc = write_bytes(to, all, total, NULL, 0);
    free(all);
    return rc;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

static int aligned(const st_tensor *t) {
    return (uintptr_t)t->data % (t->type == GGML_F32 ? 4 : 2) == 0;
}

/* Opens path (a file, or a directory when dir) expecting failure with code
 * want (0: any) and a message that names needle. */
static void expect_fail(const char *what, const char *path, int dir, int want, const char *needle) {
    st_set *s = NULL;
    skv_clear_error();
    int rc = dir ? st_open_dir(path, &s) : st_open_file(path, &s);
    const char *msg = skv_last_error();
    printf("  %s -> %s\n", what, msg);
    char d[256];
    snprintf(d, sizeof d, "%s fails with %s and a message naming %s", what, want ? skv_strerror(want) : "an error",
             needle);
    test_cond(d, rc < 0 && !s && (!want || rc == want) && strstr(msg, needle) && !strchr(msg, '\n'));
    st_close(s);
}

static void test_mini(const char *dir, st_set **keep) {
    st_set *s = NULL;
    int rc = st_open_dir(dir, &s);
    if (rc) printf("  %s\n", skv_last_error());
    test_cond("mini-smollm-hf opens", rc == 0 && s);
    if (!s) return;
    test_cond("38 tensors in one file", st_count(s) == 38 && st_n_files(s) == 1);
    const int D = 192, F = 512, KV = 64, V = 49152;
    char name[128];
    int ok = 1, al = 1;
    const st_tensor *t = st_find(s, "model.embed_tokens.weight");
    ok &= t && t->type == GGML_BF16 && t->n_dims == 2 && t->shape[0] == V && t->shape[1] == D &&
          t->nbytes == (size_t)V * D * 2;
    t = st_find(s, "model.norm.weight");
    ok &= t && t->type == GGML_F32 && t->n_dims == 1 && t->shape[0] == D && t->nbytes == (size_t)D * 4;
    struct { const char *suffix; int rows, cols; enum ggml_type type; } per[] = {
        {"self_attn.q_proj.weight", D, D, GGML_BF16},  {"self_attn.k_proj.weight", KV, D, GGML_BF16},
        {"self_attn.v_proj.weight", KV, D, GGML_BF16}, {"self_attn.o_proj.weight", D, D, GGML_BF16},
        {"mlp.gate_proj.weight", F, D, GGML_BF16},     {"mlp.up_proj.weight", F, D, GGML_BF16},
        {"mlp.down_proj.weight", D, F, GGML_BF16},     {"input_layernorm.weight", D, 0, GGML_F32},
        {"post_attention_layernorm.weight", D, 0, GGML_F32},
    };
    for (int l = 0; l < 4; l++) {
        for (size_t k = 0; k < sizeof per / sizeof per[0]; k++) {
            snprintf(name, sizeof name, "model.layers.%d.%s", l, per[k].suffix);
            t = st_find(s, name);
            int nd = per[k].cols ? 2 : 1;
            size_t n = (size_t)per[k].rows * (per[k].cols ? per[k].cols : 1);
            int good = t && t->type == per[k].type && t->n_dims == nd && t->shape[0] == per[k].rows &&
                       (nd == 1 || t->shape[1] == per[k].cols) && t->nbytes == n * (nd == 1 ? 4 : 2) &&
                       t->file && strstr(t->file, "model.safetensors");
            if (!good) printf("  wrong: %s\n", name);
            ok &= good;
        }
    }
    test_cond("every llama tensor has the right dtype and shape", ok);
    for (int i = 0; i < st_count(s); i++) al &= aligned(st_get(s, i)) && st_find(s, st_get(s, i)->name) == st_get(s, i);
    test_cond("every data pointer is aligned and st_find agrees with st_get", al);
    t = st_find(s, "model.norm.weight");
    int finite = t != NULL;
    for (int i = 0; t && i < D; i++) finite &= isfinite(((const float *)t->data)[i]) != 0;
    test_cond("final norm weights read as finite floats", finite);
    test_cond("st_find of an absent name is NULL", st_find(s, "lm_head.weight") == NULL && st_get(s, 38) == NULL);
    test_cond("data bytes add up", st_data_bytes(s) == 22027008);
    *keep = s;
}

/* Writes s as two shards plus an index (shard 2 misaligned) and compares. */
static void test_sharded(const st_set *s, const char *config) {
    int n = st_count(s), cut = n / 2;
    int w = write_shard(s, 0, cut, tpath("model-00001-of-00002.safetensors"), 0) |
            write_shard(s, cut, n, tpath("model-00002-of-00002.safetensors"), 1) |
            copy_file(config, tpath("config.json"));
    cJSON *idx = cJSON_CreateObject();
    cJSON *meta = cJSON_AddObjectToObject(idx, "metadata");
    cJSON_AddNumberToObject(meta, "total_size", (double)st_data_bytes(s));
    cJSON *wm = cJSON_AddObjectToObject(idx, "weight_map");
    for (int i = n - 1; i >= 0; i--)
        cJSON_AddStringToObject(wm, st_get(s, i)->name,
                                i < cut ? "model-00001-of-00002.safetensors" : "model-00002-of-00002.safetensors");
    char *text = cJSON_Print(idx);
    cJSON_Delete(idx);
    w |= write_bytes(tpath("model.safetensors.index.json"), text, strlen(text), NULL, 0);
    free(text);
    test_cond("sharded copy written", w == 0);

    st_set *sh = NULL;
    int rc = st_open_dir(tmp, &sh);
    if (rc) printf("  %s\n", skv_last_error());
    test_cond("sharded copy opens through its index", rc == 0 && sh && st_n_files(sh) == 2 && st_count(sh) == n);
    if (!sh) return;
    int same = 1, al = 1, files = 1;
    for (int i = 0; i < n; i++) {
        const st_tensor *a = st_get(s, i), *b = st_find(sh, a->name);
        if (!b) { same = 0; continue; }
        same &= a->type == b->type && a->n_dims == b->n_dims && !memcmp(a->shape, b->shape, sizeof a->shape) &&
                a->nbytes == b->nbytes && !memcmp(a->data, b->data, a->nbytes);
        al &= aligned(b);
        files &= strstr(b->file, i < cut ? "00001-of" : "00002-of") != NULL;
    }
    test_cond("every tensor's bytes equal the single-file version", same);
    test_cond("misaligned shard's tensors come back aligned", al);
    test_cond("each tensor names its shard", files);
    st_close(sh);

    sh = NULL;
    rc = st_open_file(tpath("model-00002-of-00002.safetensors"), &sh);
    test_cond("one shard opens on its own", rc == 0 && sh && st_count(sh) == n - cut);
    st_close(sh);

    /* a directory holding a single, oddly named *.safetensors */
    char one[600];
    snprintf(one, sizeof one, "%s/one", tmp);
    mkdir(one, 0700);
    snprintf(one, sizeof one, "%s/one/weights.safetensors", tmp);
    rename(tpath("model-00001-of-00002.safetensors"), one);
    snprintf(one, sizeof one, "%s/one", tmp);
    sh = NULL;
    rc = st_open_dir(one, &sh);
    test_cond("a directory with exactly one *.safetensors opens it", rc == 0 && sh && st_count(sh) == cut);
    st_close(sh);
    rename(tpath("one/weights.safetensors"), tpath("model-00001-of-00002.safetensors"));
}

/* A small valid file: a = F32 (2,3), b = BF16 (4). */
static const char *good_header =
    "{\"__metadata__\":{\"format\":\"pt\"},"
    "\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";

static void bad_header(const char *file, const char *what, const char *header, int want) {
    uint8_t data[32] = {0};
    write_st(tpath(file), header, 0, data, sizeof data);
    expect_fail(what, tpath(file), 0, want, file);
}

static void test_damaged(void) {
    uint8_t data[32];
    for (int i = 0; i < 32; i++) data[i] = (uint8_t)i;
    write_st(tpath("good.safetensors"), good_header, 0, data, sizeof data);
    st_set *s = NULL;
    int rc = st_open_file(tpath("good.safetensors"), &s);
    test_cond("small hand-written file opens", rc == 0 && s && st_count(s) == 2 && st_find(s, "b") &&
              st_find(s, "b")->nbytes == 8 && ((const uint8_t *)st_find(s, "b")->data)[0] == 24);
    st_close(s);

    /* truncations at several points */
    FILE *f = fopen(tpath("good.safetensors"), "rb");
    uint8_t whole[1024];
    size_t len = f ? fread(whole, 1, sizeof whole, f) : 0;
    if (f) fclose(f);
    size_t n = 0;
    for (int i = 0; i < 8; i++) n |= (size_t)whole[i] << (8 * i);
    size_t cuts[] = {0, 4, 7, 8, 8 + n / 2, 8 + n - 1, 8 + n, 8 + n + 10, len - 1};
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        char file[64], what[64];
        snprintf(file, sizeof file, "cut%zu.safetensors", cuts[i]);
        snprintf(what, sizeof what, "truncated at %zu of %zu", cuts[i], len);
        write_bytes(tpath(file), whole, cuts[i], NULL, 0);
        expect_fail(what, tpath(file), 0, SKV_EFORMAT, file);
    }

    /* header length absurd, and merely past the end */
    uint8_t absurd[64];
    memcpy(absurd, whole, sizeof absurd);
    memset(absurd, 0, 8);
    absurd[7] = 0x40;
    write_bytes(tpath("absurd.safetensors"), absurd, sizeof absurd, NULL, 0);
    expect_fail("header length 2^62", tpath("absurd.safetensors"), 0, SKV_EFORMAT, "absurd.safetensors");
    absurd[7] = 0;
    absurd[1] = 0x10;
    write_bytes(tpath("pastend.safetensors"), absurd, sizeof absurd, NULL, 0);
    expect_fail("header length past the end", tpath("pastend.safetensors"), 0, SKV_EFORMAT, "pastend.safetensors");

    bad_header("notjson.safetensors", "header not JSON", "{\"a\": {\"dtype\": F32,", SKV_EFORMAT);
    bad_header("array.safetensors", "header a JSON array", "[1, 2, 3]", SKV_EFORMAT);
    bad_header("trail.safetensors", "bytes after the header object", "{} x", SKV_EFORMAT);
    bad_header("pastbuf.safetensors", "data_offsets past end",
               "{\"a\":{\"dtype\":\"BF16\",\"shape\":[20],\"data_offsets\":[0,40]}}", SKV_EFORMAT);
    bad_header("backward.safetensors", "begin > end",
               "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,16]}}", SKV_EFORMAT);
    bad_header("strofs.safetensors", "data_offsets strings",
               "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[\"0\",\"8\"]}}", SKV_EFORMAT);
    bad_header("oneofs.safetensors", "data_offsets with one number",
               "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[8]}}", SKV_EFORMAT);
    bad_header("fracofs.safetensors", "data_offsets fractional",
               "{\"a\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0.5,8.5]}}", SKV_EFORMAT);
    bad_header("mismatch.safetensors", "size/shape mismatch",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,24]}}", SKV_EFORMAT);
    bad_header("i8.safetensors", "dtype I8",
               "{\"a\":{\"dtype\":\"I8\",\"shape\":[4],\"data_offsets\":[0,4]}}", SKV_EUNSUPPORTED);
    bad_header("fp8.safetensors", "dtype F8_E4M3",
               "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", SKV_EUNSUPPORTED);
    bad_header("nodtype.safetensors", "dtype missing",
               "{\"a\":{\"shape\":[4],\"data_offsets\":[0,4]}}", SKV_EFORMAT);
    bad_header("dim5.safetensors", "5-dim shape",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,2,3],\"data_offsets\":[0,24]}}", SKV_EUNSUPPORTED);
    bad_header("negdim.safetensors", "negative dim",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[-2,3],\"data_offsets\":[0,24]}}", SKV_EFORMAT);
    bad_header("hugedim.safetensors", "shape overflowing 64 bits",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,24]}}", SKV_EFORMAT);
    bad_header("overlap.safetensors", "overlapping tensors",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", SKV_EFORMAT);
    bad_header("dupname.safetensors", "a name twice in one header",
               "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
               "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", SKV_EFORMAT);
    bad_header("meta.safetensors", "__metadata__ with a number",
               "{\"__metadata__\":{\"n\":3},\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}",
               SKV_EFORMAT);
    bad_header("empty.safetensors", "no tensors", "{}", SKV_EFORMAT);

    /* index cases: two shards holding the same names; a missing shard; a misplaced name */
    write_st(tpath("dup1.safetensors"), good_header, 0, data, sizeof data);
    write_st(tpath("dup2.safetensors"), good_header, 0, data, sizeof data);
    const char *idx = "{\"weight_map\":{\"a\":\"dup1.safetensors\",\"b\":\"dup2.safetensors\"}}";
    write_bytes(tpath("dup.index.json"), idx, strlen(idx), NULL, 0);
    expect_fail("a name in two shards", tpath("dup.index.json"), 0, SKV_EFORMAT, "dup2.safetensors");
    idx = "{\"weight_map\":{\"a\":\"dup1.safetensors\",\"b\":\"gone-00002.safetensors\"}}";
    write_bytes(tpath("gone.index.json"), idx, strlen(idx), NULL, 0);
    expect_fail("index naming a missing shard", tpath("gone.index.json"), 0, SKV_EMISSING, "gone-00002.safetensors");
    idx = "{\"weight_map\":{\"a\":\"dup1.safetensors\",\"zz\":\"dup1.safetensors\"}}";
    write_bytes(tpath("where.index.json"), idx, strlen(idx), NULL, 0);
    expect_fail("index naming a tensor its shard lacks", tpath("where.index.json"), 0, SKV_EFORMAT, "where.index.json");
    idx = "{\"weight_map\":{\"a\":\"../dup1.safetensors\"}}";
    write_bytes(tpath("escape.index.json"), idx, strlen(idx), NULL, 0);
    expect_fail("index leaving its directory", tpath("escape.index.json"), 0, SKV_EFORMAT, "escape.index.json");
    idx = "{\"weight_map\": 3";
    write_bytes(tpath("broken.index.json"), idx, strlen(idx), NULL, 0);
    expect_fail("index not JSON", tpath("broken.index.json"), 0, SKV_EFORMAT, "broken.index.json");

    /* directories */
    char d[600];
    snprintf(d, sizeof d, "%s/emptydir", tmp);
    mkdir(d, 0700);
    expect_fail("empty directory", d, 1, SKV_EMISSING, "emptydir");
    snprintf(d, sizeof d, "%s/twodir", tmp);
    mkdir(d, 0700);
    write_st(tpath("twodir/x.safetensors"), good_header, 0, data, sizeof data);
    write_st(tpath("twodir/y.safetensors"), good_header, 0, data, sizeof data);
    expect_fail("two shards and no index", d, 1, SKV_EMISSING, "twodir");
    snprintf(d, sizeof d, "%s/missingdir", tmp);
    expect_fail("missing directory", d, 1, SKV_EMISSING, "missingdir");
}

/* Every byte of a small header replaced by a few values: no crash, and any
 * failure names the file. */
static void test_mutations(void) {
    uint8_t data[32] = {0};
    write_st(tpath("m.safetensors"), good_header, 0, data, sizeof data);
    FILE *f = fopen(tpath("m.safetensors"), "rb");
    uint8_t whole[1024];
    size_t len = f ? fread(whole, 1, sizeof whole, f) : 0;
    if (f) fclose(f);
    static const uint8_t vals[] = {0, '"', '9', '-', 0xff, '}', ' '};
    int opened = 0, failed = 0, named = 1;
    for (size_t i = 0; i < len - 32; i++) {
        for (size_t k = 0; k < sizeof vals; k++) {
            uint8_t save = whole[i];
            whole[i] = vals[k];
            write_bytes(tpath("m.safetensors"), whole, len, NULL, 0);
            whole[i] = save;
            st_set *s = NULL;
            if (st_open_file(tpath("m.safetensors"), &s) == 0) {
                opened++;
                for (int j = 0; j < st_count(s); j++) named &= aligned(st_get(s, j));
                st_close(s);
            } else {
                failed++;
                named &= strstr(skv_last_error(), "m.safetensors") != NULL;
            }
        }
    }
    printf("  %d mutations opened, %d refused\n", opened, failed);
    test_cond("header mutations never crash; each refusal names the file", named && failed > 0);
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("safetensors"));
    const char *dir = test_shared("models/mini-smollm-hf");
    if (!dir) {
        test_skip("../shared/models/mini-smollm-hf not found: mini model and sharded-copy checks skipped");
    } else {
        st_set *s = NULL;
        test_mini(dir, &s);
        if (s) {
            char config[1100];
            snprintf(config, sizeof config, "%s/config.json", dir);
            test_sharded(s, config);
        }
        st_close(s);
    }
    test_damaged();
    test_mutations();
    nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_report("test_safetensors");
}
