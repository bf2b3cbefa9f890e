/* test_gguf_bad: gguf_open on damaged copies of stories260k.gguf.
 *
 * The test walks the GGUF layout itself to find where each field lives,
 * writes damaged copies into a scratch folder (truncations at many points,
 * bad magic and versions, absurd counts, lengths, dims, offsets and types),
 * and expects every one to be refused with a negative code and a message
 * that names the file: never a crash, never a leak (run it under ASan). */
#include "gguf.h"
#include "model.h"
#include "skv.h"
#include "testhelp.h"

#include <stdint.h>

/* Where one metadata entry's fields start in the file. */
typedef struct {
    char key[128];
    uint64_t len_pos, key_pos, type_pos, val_pos, end;
    uint32_t type;
    uint32_t arr_type;    /* arrays: element type, at val_pos */
    uint64_t count_pos;   /* arrays: element count */
    uint64_t elems_pos;   /* arrays: first element */
} kv_at;

/* Where one tensor description's fields start in the file. */
typedef struct {
    char name[128];
    uint64_t len_pos, ndims_pos, ne_pos, type_pos, off_pos, end;
    uint32_t n_dims, type;
    uint64_t ne[4], offset;
} tensor_at;

typedef struct {
    kv_at *kv;          /* (n_kv) */
    tensor_at *t;       /* (n_t) */
    uint64_t n_kv, n_t;
    uint64_t hdr_end;   /* end of the tensor infos */
    uint64_t data_off;  /* start of the data section */
    uint64_t data_end;  /* end of the last tensor's bytes */
} layout;

static uint8_t *orig;   /* (orig_n) the pristine file */
static size_t orig_n;
static const char *dir;
static int case_no;

static uint32_t get32(const uint8_t *b, uint64_t pos) { uint32_t v; memcpy(&v, b + pos, 4); return v; }
static uint64_t get64(const uint8_t *b, uint64_t pos) { uint64_t v; memcpy(&v, b + pos, 8); return v; }
static void put32(uint8_t *b, uint64_t pos, uint32_t v) { memcpy(b + pos, &v, 4); }
static void put64(uint8_t *b, uint64_t pos, uint64_t v) { memcpy(b + pos, &v, 8); }

static const uint8_t scalar_size[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Reads a GGUF string at *p (bounded by n); returns 0 when it does not fit. */
static int walk_str(uint64_t *p, size_t n, char *out, size_t outn) {
    if (*p + 8 > n) return 0;
    uint64_t len = get64(orig, *p);
    if (len > n - *p - 8) return 0;
    if (out) {
        size_t k = len < outn - 1 ? (size_t)len : outn - 1;
        memcpy(out, orig + *p + 8, k);
        out[k] = 0;
    }
    *p += 8 + len;
    return 1;
}

/* Walks the pristine file into lay; 0 if it is not the GGUF we expect. */
static int walk(layout *lay) {
    size_t n = orig_n;
    if (n < 24 || memcmp(orig, "GGUF", 4)) return 0;
    lay->n_t = get64(orig, 8);
    lay->n_kv = get64(orig, 16);
    if (lay->n_t > 10000 || lay->n_kv > 10000) return 0;
    lay->kv = calloc(lay->n_kv + 1, sizeof *lay->kv);
    lay->t = calloc(lay->n_t + 1, sizeof *lay->t);
    if (!lay->kv || !lay->t) return 0;
    uint64_t p = 24;
    uint32_t align = 32;
    for (uint64_t i = 0; i < lay->n_kv; i++) {
        kv_at *k = &lay->kv[i];
        k->len_pos = p;
        k->key_pos = p + 8;
        if (!walk_str(&p, n, k->key, sizeof k->key) || p + 4 > n) return 0;
        k->type_pos = p;
        k->type = get32(orig, p);
        p += 4;
        k->val_pos = p;
        if (k->type == GGUF_STRING) {
            if (!walk_str(&p, n, NULL, 0)) return 0;
        } else if (k->type == GGUF_ARRAY) {
            if (p + 12 > n) return 0;
            k->arr_type = get32(orig, p);
            k->count_pos = p + 4;
            uint64_t cnt = get64(orig, p + 4);
            p += 12;
            k->elems_pos = p;
            if (k->arr_type == GGUF_STRING) {
                for (uint64_t j = 0; j < cnt; j++)
                    if (!walk_str(&p, n, NULL, 0)) return 0;
            } else {
                if (k->arr_type >= 13 || !scalar_size[k->arr_type]) return 0;
                p += cnt * scalar_size[k->arr_type];
            }
        } else {
            if (k->type >= 13) return 0;
            if (!strcmp(k->key, "general.alignment")) align = get32(orig, p);
            p += scalar_size[k->type];
        }
        if (p > n) return 0;
        k->end = p;
    }
    for (uint64_t i = 0; i < lay->n_t; i++) {
        tensor_at *t = &lay->t[i];
        t->len_pos = p;
        if (!walk_str(&p, n, t->name, sizeof t->name) || p + 4 > n) return 0;
        t->ndims_pos = p;
        t->n_dims = get32(orig, p);
        p += 4;
        if (t->n_dims < 1 || t->n_dims > 4 || p + 8 * t->n_dims + 12 > n) return 0;
        t->ne_pos = p;
        for (uint32_t d = 0; d < t->n_dims; d++) t->ne[d] = get64(orig, p + 8 * d);
        p += 8 * t->n_dims;
        t->type_pos = p;
        t->type = get32(orig, p);
        t->off_pos = p + 4;
        t->offset = get64(orig, p + 4);
        p += 12;
        t->end = p;
    }
    lay->hdr_end = p;
    lay->data_off = (p + align - 1) / align * align;
    for (uint64_t i = 0; i < lay->n_t; i++) {
        const tensor_at *t = &lay->t[i];
        uint64_t nel = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) nel *= t->ne[d];
        uint64_t bytes = nel / ggml_blck_size(t->type) * ggml_type_size(t->type);
        if (lay->data_off + t->offset + bytes > lay->data_end) lay->data_end = lay->data_off + t->offset + bytes;
    }
    return lay->data_end <= n;
}

/* Writes buf (n bytes) as a new case file and expects gguf_open to refuse
 * it; returns 1 when it did, cleanly and with the path in the message. */
static int refused(const uint8_t *buf, size_t n, const char *what, int quiet) {
    char path[600];
    snprintf(path, sizeof path, "%s/case-%03d.gguf", dir, case_no++);
    FILE *fp = fopen(path, "wb");
    if (!fp || (n && fwrite(buf, 1, n, fp) != n)) {
        if (fp) fclose(fp);
        printf("  cannot write %s\n", path);
        return 0;
    }
    fclose(fp);
    gguf_file *f = (gguf_file *)&f; /* must be reset to NULL */
    skv_clear_error();
    int rc = gguf_open(path, &f);
    int ok = rc < 0 && f == NULL && strstr(skv_last_error(), path) != NULL;
    if (!quiet || !ok) printf("  %s: rc %d: %s\n", what, rc, skv_last_error());
    if (rc == 0 && f) gguf_close(f);
    unlink(path);
    return ok;
}

/* A damaged copy with a 32- or 64-bit field overwritten. */
static int refused_with(uint64_t pos, int bits, uint64_t v, const char *what) {
    uint8_t *b = malloc(orig_n);
    if (!b) return 0;
    memcpy(b, orig, orig_n);
    if (bits == 32) put32(b, pos, (uint32_t)v);
    else put64(b, pos, v);
    int ok = refused(b, orig_n, what, 0);
    free(b);
    return ok;
}

static void check(const char *what, uint64_t pos, int bits, uint64_t v) {
    test_cond(what, refused_with(pos, bits, v, what));
}

/* Truncations at each point of cuts[] (n of them): one check for the group. */
static void truncations(const char *group, const uint64_t *cuts, int n) {
    int ok = 1, tried = 0;
    for (int i = 0; i < n; i++) {
        if (cuts[i] >= orig_n) continue;
        char what[128];
        snprintf(what, sizeof what, "truncated at %llu (%s)", (unsigned long long)cuts[i], group);
        ok &= refused(orig, (size_t)cuts[i], what, 1);
        tried++;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "truncated inside the %s at %d points: all refused", group, tried);
    test_cond(msg, ok && tried > 0);
}

/* A copy with a general.alignment entry of type vtype and value v inserted
 * first in the metadata, the data section moved to the new aligned start. */
static int with_alignment(const layout *lay, uint32_t vtype, uint32_t v, uint32_t data_align, uint8_t **out,
                          size_t *out_n) {
    static const char key[] = "general.alignment";
    uint64_t klen = sizeof key - 1;
    size_t entry = 8 + klen + 4 + (vtype == GGUF_U8 ? 1 : 4);
    uint64_t hdr = lay->hdr_end + entry;
    uint64_t data = (hdr + data_align - 1) / data_align * data_align;
    size_t n = (size_t)(data + (orig_n - lay->data_off));
    uint8_t *b = calloc(1, n);
    if (!b) return 0;
    memcpy(b, orig, 24);
    put64(b, 16, lay->n_kv + 1);
    uint8_t *p = b + 24;
    memcpy(p, &klen, 8);
    memcpy(p + 8, key, klen);
    memcpy(p + 8 + klen, &vtype, 4);
    if (vtype == GGUF_U8) p[12 + klen] = (uint8_t)v;
    else memcpy(p + 12 + klen, &v, 4);
    memcpy(b + 24 + entry, orig + 24, (size_t)(lay->hdr_end - 24));
    memcpy(b + data, orig + lay->data_off, orig_n - (size_t)lay->data_off);
    *out = b;
    *out_n = n;
    return 1;
}

static const kv_at *kv_named(const layout *lay, const char *key) {
    for (uint64_t i = 0; i < lay->n_kv; i++)
        if (!strcmp(lay->kv[i].key, key)) return &lay->kv[i];
    return NULL;
}

int main(void) {
    const char *src = test_shared("models/stories260k.gguf");
    if (!src) {
        test_skip("test_gguf_bad: ../shared/models/stories260k.gguf missing");
        return test_report("test_gguf_bad");
    }
    FILE *fp = fopen(src, "rb");
    struct stat st;
    if (!fp || stat(src, &st) != 0 || !(orig = malloc((size_t)st.st_size)) ||
        fread(orig, 1, (size_t)st.st_size, fp) != (size_t)st.st_size) {
        test_cond("read stories260k.gguf", 0);
        if (fp) fclose(fp);
        free(orig);
        return test_report("test_gguf_bad");
    }
    fclose(fp);
    orig_n = (size_t)st.st_size;
    dir = test_tmpdir("gguf_bad");

    layout lay = {0};
    int walked = walk(&lay);
    test_cond("the test's own walk of the GGUF layout", walked && lay.n_kv > 4 && lay.n_t > 4);
    if (!walked) {
        free(lay.kv); free(lay.t); free(orig);
        rmdir(dir);
        return test_report("test_gguf_bad");
    }
    printf("  %llu kv, %llu tensors, infos end at %llu, data %llu..%llu of %zu bytes\n",
           (unsigned long long)lay.n_kv, (unsigned long long)lay.n_t, (unsigned long long)lay.hdr_end,
           (unsigned long long)lay.data_off, (unsigned long long)lay.data_end, orig_n);

    /* Control: an undamaged copy opens, so the refusals below mean something. */
    {
        char path[600];
        snprintf(path, sizeof path, "%s/pristine.gguf", dir);
        FILE *o = fopen(path, "wb");
        if (o) { fwrite(orig, 1, orig_n, o); fclose(o); }
        gguf_file *f = NULL;
        test_cond("control: an undamaged copy opens", gguf_open(path, &f) == 0);
        if (f) gguf_close(f);
        unlink(path);
    }

    /* A metadata value of the wrong type (llama.block_count, a u32, retyped
     * f32 in place: the file stays well formed): the model is refused in
     * one line naming the file, the key, the type found and the one wanted. */
    {
        const kv_at *bc = kv_named(&lay, "llama.block_count");
        char path[600];
        snprintf(path, sizeof path, "%s/retyped.gguf", dir);
        uint8_t *b = bc && bc->type == GGUF_U32 ? malloc(orig_n) : NULL;
        FILE *o = b ? fopen(path, "wb") : NULL;
        if (o) {
            memcpy(b, orig, orig_n);
            put32(b, bc->type_pos, GGUF_F32);
            fwrite(b, 1, orig_n, o);
            fclose(o);
        }
        skv_model *m = NULL;
        int rc = o ? model_load(path, &m) : 0;
        const char *e = skv_last_error();
        printf("  retyped: rc %d: %s\n", rc, e);
        test_cond("llama.block_count retyped f32: the model is refused, naming the file, the key and both types",
                  rc < 0 && !m && strstr(e, path) && strstr(e, "'llama.block_count' is f32") &&
                  strstr(e, "non-negative integer") && !strchr(e, '\n'));
        model_free(m);
        free(b);
        unlink(path);
    }

    /* Truncations. */
    uint64_t cuts[1024];
    int nc = 0;
    static const uint64_t head[] = {1, 3, 4, 7, 8, 12, 16, 20, 23, 24};
    for (size_t i = 0; i < sizeof head / sizeof head[0]; i++) cuts[nc++] = head[i];
    truncations("header", cuts, nc);
    nc = 0;
    for (uint64_t i = 0; i < lay.n_kv && nc < 1000; i++) {
        const kv_at *k = &lay.kv[i];
        uint64_t pts[] = {k->len_pos + 1, k->len_pos + 7, k->key_pos, k->key_pos + 1, k->type_pos - 1,
                          k->type_pos, k->type_pos + 3, k->val_pos, k->val_pos + 1, (k->val_pos + k->end) / 2,
                          k->end - 1, k->end};
        for (size_t j = 0; j < sizeof pts / sizeof pts[0]; j++) cuts[nc++] = pts[j];
        if (k->type == GGUF_ARRAY) {
            cuts[nc++] = k->count_pos + 4;
            cuts[nc++] = k->elems_pos;
            cuts[nc++] = k->elems_pos + 3;
        }
    }
    truncations("metadata", cuts, nc);
    nc = 0;
    for (uint64_t i = 0; i < lay.n_t && nc < 1000; i++) {
        if (i > 3 && i + 2 < lay.n_t) continue; /* the first few and the last two */
        const tensor_at *t = &lay.t[i];
        uint64_t pts[] = {t->len_pos, t->len_pos + 4, t->len_pos + 9, t->ndims_pos, t->ndims_pos + 2,
                          t->ne_pos + 5, t->ne_pos + 8, t->type_pos, t->type_pos + 1, t->off_pos,
                          t->off_pos + 7, t->end - 1};
        for (size_t j = 0; j < sizeof pts / sizeof pts[0]; j++) cuts[nc++] = pts[j];
    }
    cuts[nc++] = lay.hdr_end;
    truncations("tensor infos", cuts, nc);
    nc = 0;
    uint64_t data_pts[] = {lay.hdr_end + 1, lay.data_off - 1, lay.data_off, lay.data_off + 1,
                           lay.data_off + 1000, (lay.data_off + lay.data_end) / 2, lay.data_end - 256,
                           lay.data_end - 4, lay.data_end - 1};
    for (size_t j = 0; j < sizeof data_pts / sizeof data_pts[0]; j++) cuts[nc++] = data_pts[j];
    truncations("tensor data", cuts, nc);

    /* Empty file, folder, missing file. */
    test_cond("zero-byte file refused", refused(orig, 0, "zero-byte file", 0));
    {
        char path[600];
        gguf_file *f = (gguf_file *)&f;
        snprintf(path, sizeof path, "%s/a-folder.gguf", dir);
        mkdir(path, 0700);
        int rc = gguf_open(path, &f);
        printf("  folder: rc %d: %s\n", rc, skv_last_error());
        test_cond("folder refused", rc < 0 && f == NULL && strstr(skv_last_error(), path));
        rmdir(path);
        snprintf(path, sizeof path, "%s/no-such-file.gguf", dir);
        f = (gguf_file *)&f;
        rc = gguf_open(path, &f);
        printf("  missing: rc %d: %s\n", rc, skv_last_error());
        test_cond("missing file refused", rc == SKV_EIO && f == NULL && strstr(skv_last_error(), path));
    }

    /* Header fields. */
    check("wrong magic GGUG", 0, 32, 0x47554747u);
    check("wrong magic (ggml's old GGJT)", 0, 32, 0x67676a74u);
    check("version 1", 4, 32, 1);
    check("version 99", 4, 32, 99);
    check("version 0", 4, 32, 0);
    check("absurd tensor count 2^40", 8, 64, 1ull << 40);
    check("tensor count 2^64-1", 8, 64, UINT64_MAX);
    check("tensor count 999999 (under the cap, past the end)", 8, 64, 999999);
    check("absurd kv count 2^40", 16, 64, 1ull << 40);
    check("kv count 2^64-1", 16, 64, UINT64_MAX);
    check("kv count 999999 (under the cap, past the end)", 16, 64, 999999);

    /* Metadata. */
    const kv_at *k0 = &lay.kv[0];
    check("absurd key length 2^62", k0->len_pos, 64, 1ull << 62);
    check("key length 2^31", k0->len_pos, 64, 1ull << 31);
    check("key length just past the end of the file", k0->len_pos, 64, orig_n - k0->key_pos + 1);
    check("bad value type 13", k0->type_pos, 32, 13);
    check("bad value type 99", k0->type_pos, 32, 99);
    check("bad value type 2^32-1", k0->type_pos, 32, UINT32_MAX);
    const kv_at *arch = kv_named(&lay, "general.architecture");
    if (arch && arch->type == GGUF_STRING) {
        check("absurd string value length", arch->val_pos, 64, UINT64_MAX);
        check("string value length past the end", arch->val_pos, 64, orig_n);
    }
    const kv_at *toks = kv_named(&lay, "tokenizer.ggml.tokens");
    if (toks && toks->type == GGUF_ARRAY && toks->arr_type == GGUF_STRING) {
        check("string array: absurd element length", toks->elems_pos, 64, 1ull << 40);
        check("string array: absurd count", toks->count_pos, 64, 1ull << 40);
        check("string array: count past the end", toks->count_pos, 64, orig_n / 8);
        check("array element type 99", toks->val_pos, 32, 99);
        check("array of arrays", toks->val_pos, 32, GGUF_ARRAY);
    } else {
        test_cond("stories260k has tokenizer.ggml.tokens", 0);
    }
    const kv_at *scores = kv_named(&lay, "tokenizer.ggml.scores");
    if (scores && scores->type == GGUF_ARRAY && scores->arr_type == GGUF_F32) {
        check("f32 array: absurd count", scores->count_pos, 64, UINT64_MAX);
        check("f32 array: count past the end", scores->count_pos, 64, orig_n / 4);
    } else {
        test_cond("stories260k has tokenizer.ggml.scores", 0);
    }

    /* Tensor infos: the first 2-D tensor, and the one whose data ends last. */
    const tensor_at *t2 = NULL, *tl = &lay.t[0];
    for (uint64_t i = 0; i < lay.n_t; i++) {
        if (!t2 && lay.t[i].n_dims == 2) t2 = &lay.t[i];
        if (lay.t[i].offset > tl->offset) tl = &lay.t[i];
    }
    if (t2) {
        check("absurd tensor name length", t2->len_pos, 64, UINT64_MAX / 2);
        check("0 dimensions", t2->ndims_pos, 32, 0);
        check("5 dimensions", t2->ndims_pos, 32, 5);
        check("2^32-1 dimensions", t2->ndims_pos, 32, UINT32_MAX);
        check("dimension 0", t2->ne_pos + 8, 64, 0);
        check("dimension 2^64-1", t2->ne_pos + 8, 64, UINT64_MAX);
        check("dimension 2^40 (absurd product)", t2->ne_pos + 8, 64, 1ull << 40);
        check("dimension 2^20: data runs past the end", t2->ne_pos + 8, 64, 1ull << 20);
        check("f32 -> q4_K: a row of 64 is not a multiple of the block", t2->type_pos, 32, GGML_Q4_K);
        check("unknown tensor type 4 (a retired slot)", t2->type_pos, 32, 4);
        check("unknown tensor type 40", t2->type_pos, 32, 40);
        check("unknown tensor type 99", t2->type_pos, 32, 99);
        check("unknown tensor type 2^32-1", t2->type_pos, 32, UINT32_MAX);
        check("unaligned tensor offset (+1)", t2->off_pos, 64, t2->offset + 1);
        check("unaligned tensor offset (+16)", t2->off_pos, 64, t2->offset + 16);
        check("tensor offset past the end", t2->off_pos, 64, (orig_n + 31) / 32 * 32);
        check("tensor offset 2^64-32", t2->off_pos, 64, UINT64_MAX - 31);
    } else {
        test_cond("stories260k has a 2-D tensor", 0);
    }
    check("last tensor f32 -> f64: data runs past the end", tl->type_pos, 32, GGML_F64);
    uint64_t tl_bytes = ggml_row_size((enum ggml_type)tl->type, tl->ne[0]) * (tl->n_dims > 1 ? tl->ne[1] : 1);
    check("last tensor at the first aligned offset past the end", tl->off_pos, 64,
          ((orig_n - lay.data_off - tl_bytes) / 32 + 1) * 32);

    /* general.alignment inserted by hand: valid 32 opens, bad ones do not. */
    {
        uint8_t *b = NULL;
        size_t n = 0;
        char path[600];
        snprintf(path, sizeof path, "%s/aligned.gguf", dir);
        int ok = with_alignment(&lay, GGUF_U32, 32, 32, &b, &n);
        FILE *o = ok ? fopen(path, "wb") : NULL;
        if (o) { fwrite(b, 1, n, o); fclose(o); }
        gguf_file *f = NULL;
        test_cond("control: an inserted general.alignment = 32 opens", o && gguf_open(path, &f) == 0 &&
                                                                       f->alignment == 32);
        if (f) gguf_close(f);
        unlink(path);
        free(b);
        static const struct { uint32_t vtype, v; const char *what; } bad[] = {
            {GGUF_U32, 0, "general.alignment = 0"},
            {GGUF_U32, 48, "general.alignment = 48"},
            {GGUF_U8, 32, "general.alignment of type u8"},
            {GGUF_U32, 1u << 31, "general.alignment = 2^31 (data offset past the end)"},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            b = NULL;
            ok = with_alignment(&lay, bad[i].vtype, bad[i].v, 32, &b, &n);
            test_cond(bad[i].what, ok && refused(b, n, bad[i].what, 0));
            free(b);
        }
    }

    free(lay.kv);
    free(lay.t);
    free(orig);
    test_cond("scratch folder removed", rmdir(dir) == 0);
    return test_report("test_gguf_bad");
}
