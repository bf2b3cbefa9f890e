/* test_gguf_write: the GGUF v3 writer, read back through gguf_open.
 *
 * Writes every metadata type (edge values, strings with NULs, arrays of each
 * kind) and tensors of several types streamed in small slices, then checks
 * every value and byte; copies a file's metadata through gguf_writer_set_kv;
 * rewrites shared models and expects llama.cpp's bytes back exactly;
 * and checks that failed writes (fill error, bad alignment, missing folder,
 * a folder in the way) leave an existing file untouched and no temporaries. */
#include "gguf.h"
#include "gguf_write.h"
#include "quant.h"
#include "skv.h"
#include "testhelp.h"

#include <dirent.h>
#include <float.h>
#include <stdint.h>

/* Deterministic byte b of tensor idx. */
static uint8_t pattern(int idx, uint64_t b) { return (uint8_t)(idx * 131 + b * 7 + (b >> 8) * 3 + 1); }

typedef struct {
    const gguf_writer *w;
    size_t row[8];        /* (n_tensors) row bytes of each tensor */
    uint64_t next[8];     /* (n_tensors) next offset expected */
    int calls, bad_slices;
    int fail_idx;         /* tensor whose fill fails, or -1 */
} fill_state;

static int fill_pattern(void *user, int idx, uint64_t offset, void *dst, size_t nbytes) {
    fill_state *s = user;
    s->calls++;
    if (idx == s->fail_idx) return skv_error(SKV_EIO, "synthetic failure in tensor %d", idx);
    if (idx < 0 || idx >= 8 || offset != s->next[idx] || offset % s->row[idx] || nbytes % s->row[idx] || !nbytes)
        s->bad_slices++;
    else s->next[idx] = offset + nbytes;
    for (size_t i = 0; i < nbytes; i++) ((uint8_t *)dst)[i] = pattern(idx, offset + i);
    return 0;
}

static long file_size(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

/* Files in dir whose name contains ".tmp-". */
static int temporaries(const char *dir) {
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) n += strstr(e->d_name, ".tmp-") != NULL;
    if (d) closedir(d);
    return n;
}

static void write_text(const char *path, const char *s) {
    FILE *f = fopen(path, "wb");
    if (f) { fputs(s, f); fclose(f); }
}

static int file_is(const char *path, const char *s) {
    char buf[256] = {0};
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    return n == strlen(s) && memcmp(buf, s, n) == 0;
}

static const char *tensor_names[] = {"a.f32", "b.f16", "c.q8_0", "d.q4_K", "e.bf16", "f.i32"};
static const enum ggml_type tensor_types[] = {GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_K, GGML_BF16, GGML_I32};
static const uint64_t tensor_ne[][4] = {{37, 3}, {64, 5}, {64, 4}, {256, 2}, {8, 3, 2}, {5}};
static const int tensor_dims[] = {2, 2, 2, 2, 3, 1};
#define N_TENSORS 6

/* Metadata of every type, set into w. */
static int set_all_metadata(gguf_writer *w) {
    static const char nul_str[] = {'a', 0, 'b'};
    static const char *strs[] = {"hello", "", "\xc3\xa9t\xc3\xa9", "x"};
    static const size_t str_lens[] = {5, 0, 5, 1};
    static const float f32s[] = {1.5f, -0.0f, FLT_MAX, 1e-45f};
    static const int32_t i32s[] = {INT32_MIN, -1, 0, INT32_MAX};
    static const uint8_t u8s[] = {0, 255, 7};
    static const int64_t i64s[] = {INT64_MIN, INT64_MAX};
    static const double f64s[] = {3.141592653589793, -1e300};
    static const uint8_t bools[] = {1, 0, 1};
    static const uint16_t u16s[] = {65535, 1};
    int rc = 0;
    rc |= gguf_writer_set_str(w, "general.architecture", "llama");
    rc |= gguf_writer_set_u8(w, "t.u8", 255);
    rc |= gguf_writer_set_i8(w, "t.i8", -128);
    rc |= gguf_writer_set_u16(w, "t.u16", 65535);
    rc |= gguf_writer_set_i16(w, "t.i16", -32768);
    rc |= gguf_writer_set_u32(w, "t.u32", UINT32_MAX);
    rc |= gguf_writer_set_i32(w, "t.i32", INT32_MIN);
    rc |= gguf_writer_set_u64(w, "t.u64", UINT64_MAX);
    rc |= gguf_writer_set_i64(w, "t.i64", INT64_MIN);
    rc |= gguf_writer_set_f32(w, "t.f32", 3.25f);
    rc |= gguf_writer_set_f64(w, "t.f64", 2.718281828459045);
    rc |= gguf_writer_set_bool(w, "t.true", 7);
    rc |= gguf_writer_set_bool(w, "t.false", 0);
    rc |= gguf_writer_set_str(w, "t.empty", "");
    rc |= gguf_writer_set_strn(w, "t.nul", nul_str, 3);
    rc |= gguf_writer_set_arr_str(w, "t.strs", strs, NULL, 4);
    rc |= gguf_writer_set_arr_str(w, "t.strs_len", (const char *const[]){"ab\0cd", "", "\xc3\xa9t\xc3\xa9", "zz"}, str_lens, 4);
    rc |= gguf_writer_set_arr_f32(w, "t.f32s", f32s, 4);
    rc |= gguf_writer_set_arr_i32(w, "t.i32s", i32s, 4);
    rc |= gguf_writer_set_arr(w, "t.u8s", GGUF_U8, u8s, 3);
    rc |= gguf_writer_set_arr(w, "t.i64s", GGUF_I64, i64s, 2);
    rc |= gguf_writer_set_arr(w, "t.f64s", GGUF_F64, f64s, 2);
    rc |= gguf_writer_set_arr(w, "t.bools", GGUF_BOOL, bools, 3);
    rc |= gguf_writer_set_arr(w, "t.u16s", GGUF_U16, u16s, 2);
    rc |= gguf_writer_set_arr(w, "t.none", GGUF_I32, NULL, 0);
    rc |= gguf_writer_set_arr_str(w, "t.nostrs", NULL, NULL, 0);
    /* Replaced in place (type changes too), and one removed. */
    rc |= gguf_writer_set_u32(w, "t.replaced", 1);
    rc |= gguf_writer_set_str(w, "t.gone", "x");
    rc |= gguf_writer_set_str(w, "t.replaced", "second");
    rc |= gguf_writer_remove(w, "t.gone");
    rc |= gguf_writer_remove(w, "t.never-set");
    return rc;
}

static void check_metadata(const gguf_file *f) {
    const gguf_kv *kv;
    test_cond("version 3", f->version == 3);
    test_cond("kv count", f->n_kv == 27);
    test_cond("first key is general.architecture", f->n_kv && strcmp(f->kv[0].key, "general.architecture") == 0);
    test_cond("replaced key keeps its place", f->n_kv == 27 && strcmp(f->kv[26].key, "t.replaced") == 0);
    test_cond("str", gguf_get_str(f, "general.architecture") && !strcmp(gguf_get_str(f, "general.architecture"), "llama"));
    kv = gguf_find(f, "t.u8");    test_cond("u8 255", kv && kv->type == GGUF_U8 && kv->v.u == 255);
    kv = gguf_find(f, "t.i8");    test_cond("i8 -128", kv && kv->type == GGUF_I8 && kv->v.i == -128);
    kv = gguf_find(f, "t.u16");   test_cond("u16 65535", kv && kv->type == GGUF_U16 && kv->v.u == 65535);
    kv = gguf_find(f, "t.i16");   test_cond("i16 -32768", kv && kv->type == GGUF_I16 && kv->v.i == -32768);
    kv = gguf_find(f, "t.u32");   test_cond("u32 max", kv && kv->type == GGUF_U32 && kv->v.u == UINT32_MAX);
    kv = gguf_find(f, "t.i32");   test_cond("i32 min", kv && kv->type == GGUF_I32 && kv->v.i == INT32_MIN);
    kv = gguf_find(f, "t.u64");   test_cond("u64 max", kv && kv->type == GGUF_U64 && kv->v.u == UINT64_MAX);
    kv = gguf_find(f, "t.i64");   test_cond("i64 min", kv && kv->type == GGUF_I64 && kv->v.i == INT64_MIN);
    kv = gguf_find(f, "t.f32");   test_cond("f32 3.25", kv && kv->type == GGUF_F32 && kv->v.f == 3.25);
    kv = gguf_find(f, "t.f64");   test_cond("f64 e", kv && kv->type == GGUF_F64 && kv->v.f == 2.718281828459045);
    kv = gguf_find(f, "t.true");  test_cond("bool true", kv && kv->type == GGUF_BOOL && kv->v.u == 1);
    kv = gguf_find(f, "t.false"); test_cond("bool false", kv && kv->type == GGUF_BOOL && kv->v.u == 0);
    kv = gguf_find(f, "t.empty"); test_cond("empty string", kv && kv->type == GGUF_STRING && kv->v.str.len == 0);
    kv = gguf_find(f, "t.nul");
    test_cond("string with a NUL", kv && kv->type == GGUF_STRING && kv->v.str.len == 3 && !memcmp(kv->v.str.s, "a\0b", 3));
    kv = gguf_find(f, "t.strs");
    test_cond("string array", kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING && kv->n == 4 &&
                                  !strcmp(kv->arr_str[0], "hello") && kv->arr_len[1] == 0 &&
                                  !strcmp(kv->arr_str[2], "\xc3\xa9t\xc3\xa9") && !strcmp(kv->arr_str[3], "x"));
    kv = gguf_find(f, "t.strs_len");
    test_cond("string array with lengths", kv && kv->n == 4 && kv->arr_len[0] == 5 && !memcmp(kv->arr_str[0], "ab\0cd", 6) &&
                                               kv->arr_len[1] == 0 && kv->arr_len[2] == 5 && kv->arr_len[3] == 1 &&
                                               !strcmp(kv->arr_str[3], "z"));
    kv = gguf_find(f, "t.f32s");
    test_cond("f32 array", kv && kv->arr_type == GGUF_F32 && kv->n == 4 && gguf_arr_num(kv, 0) == 1.5 &&
                               signbit(gguf_arr_num(kv, 1)) && gguf_arr_num(kv, 2) == FLT_MAX &&
                               gguf_arr_num(kv, 3) == (double)1e-45f);
    kv = gguf_find(f, "t.i32s");
    test_cond("i32 array", kv && kv->arr_type == GGUF_I32 && kv->n == 4 && gguf_arr_num(kv, 0) == INT32_MIN &&
                               gguf_arr_num(kv, 1) == -1 && gguf_arr_num(kv, 3) == INT32_MAX);
    kv = gguf_find(f, "t.u8s");
    test_cond("u8 array", kv && kv->arr_type == GGUF_U8 && kv->n == 3 && gguf_arr_num(kv, 1) == 255);
    kv = gguf_find(f, "t.i64s");
    test_cond("i64 array", kv && kv->arr_type == GGUF_I64 && kv->n == 2 && ((const int64_t *)kv->arr)[0] == INT64_MIN &&
                               ((const int64_t *)kv->arr)[1] == INT64_MAX);
    kv = gguf_find(f, "t.f64s");
    test_cond("f64 array", kv && kv->arr_type == GGUF_F64 && kv->n == 2 && gguf_arr_num(kv, 0) == 3.141592653589793 &&
                               gguf_arr_num(kv, 1) == -1e300);
    kv = gguf_find(f, "t.bools");
    test_cond("bool array", kv && kv->arr_type == GGUF_BOOL && kv->n == 3 && gguf_arr_num(kv, 0) == 1 &&
                                gguf_arr_num(kv, 1) == 0);
    kv = gguf_find(f, "t.u16s");
    test_cond("u16 array", kv && kv->arr_type == GGUF_U16 && kv->n == 2 && gguf_arr_num(kv, 0) == 65535);
    kv = gguf_find(f, "t.none");
    test_cond("empty i32 array", kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_I32 && kv->n == 0);
    kv = gguf_find(f, "t.nostrs");
    test_cond("empty string array", kv && kv->type == GGUF_ARRAY && kv->arr_type == GGUF_STRING && kv->n == 0);
    kv = gguf_find(f, "t.replaced");
    test_cond("replaced value", kv && kv->type == GGUF_STRING && !strcmp(kv->v.str.s, "second"));
    test_cond("removed key is gone", gguf_find(f, "t.gone") == NULL);
}

static void check_tensors(const gguf_file *f, uint32_t align) {
    test_cond("tensor count", f->n_tensors == N_TENSORS);
    int ok_info = 1, ok_data = 1, ok_align = 1;
    for (int i = 0; i < N_TENSORS && (uint64_t)i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        ok_info &= !strcmp(t->name, tensor_names[i]) && t->type == tensor_types[i] &&
                   t->n_dims == (uint32_t)tensor_dims[i];
        uint64_t nel = 1;
        for (int d = 0; d < tensor_dims[i]; d++) {
            ok_info &= t->ne[d] == tensor_ne[i][d];
            nel *= tensor_ne[i][d];
        }
        ok_info &= t->nbytes == nel / ggml_blck_size(t->type) * ggml_type_size(t->type);
        ok_align &= ((uintptr_t)t->data - (uintptr_t)f->map) % align == 0;
        for (uint64_t b = 0; b < t->nbytes; b++) ok_data &= ((const uint8_t *)t->data)[b] == pattern(i, b);
    }
    test_cond("tensor names, types and shapes", ok_info);
    test_cond("tensor data aligned in the file", ok_align && f->alignment == align);
    test_cond("tensor bytes are what fill produced", ok_data);
}

static gguf_writer *make_writer(void) {
    gguf_writer *w = gguf_writer_new();
    if (!w) return NULL;
    int rc = set_all_metadata(w);
    for (int i = 0; i < N_TENSORS; i++)
        rc |= gguf_writer_add_tensor(w, tensor_names[i], tensor_types[i], tensor_dims[i], tensor_ne[i]);
    if (rc) { gguf_writer_free(w); return NULL; }
    return w;
}

static void init_state(fill_state *s, int fail_idx) {
    memset(s, 0, sizeof *s);
    for (int i = 0; i < N_TENSORS; i++) s->row[i] = ggml_row_size(tensor_types[i], tensor_ne[i][0]);
    s->fail_idx = fail_idx;
}

/* Fill for a q8_0 tensor quantized from a known fp32 matrix, (rows, n). */
typedef struct { const float *x; size_t n; } quant_src;
static int fill_quant(void *user, int idx, uint64_t offset, void *dst, size_t nbytes) {
    (void)idx;
    const quant_src *q = user;
    size_t rs = ggml_row_size(GGML_Q8_0, q->n);
    for (size_t r = 0; r < nbytes / rs; r++) {
        int rc = quant_quantize_row(GGML_Q8_0, q->x + (offset / rs + r) * q->n, (uint8_t *)dst + r * rs, q->n);
        if (rc) return rc;
    }
    return 0;
}

static int fill_copy(void *user, int idx, uint64_t offset, void *dst, size_t nbytes) {
    const gguf_file *f = user;
    memcpy(dst, (const uint8_t *)f->tensors[idx].data + offset, nbytes);
    return 0;
}

/* 1 if files a and b hold the same bytes. */
static int same_bytes(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    char ba[1 << 14], bb[1 << 14];
    while (same) {
        size_t na = fread(ba, 1, sizeof ba, fa), nb = fread(bb, 1, sizeof bb, fb);
        same = na == nb && memcmp(ba, bb, na) == 0;
        if (na == 0) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

/* Re-writes a shared model (metadata through set_kv, tensors through fill)
 * and expects llama.cpp's bytes back exactly. */
static void check_rewrite(const char *rel, const char *dir) {
    const char *src = test_shared(rel);
    char msg[300], out[600];
    if (!src) {
        snprintf(msg, sizeof msg, "test_gguf_write: ../shared/%s missing, rewrite check skipped", rel);
        test_skip(msg);
        return;
    }
    gguf_file *f;
    int rc = gguf_open(src, &f);
    if (rc) { test_cond(rel, 0); printf("  %s\n", skv_last_error()); return; }
    gguf_writer *w = gguf_writer_new();
    rc = w ? 0 : SKV_ENOMEM;
    for (uint64_t i = 0; !rc && i < f->n_kv; i++) rc = gguf_writer_set_kv(w, &f->kv[i]);
    for (uint64_t i = 0; !rc && i < f->n_tensors; i++) {
        const gguf_tensor *t = &f->tensors[i];
        rc = gguf_writer_add_tensor(w, t->name, t->type, (int)t->n_dims, t->ne);
    }
    snprintf(out, sizeof out, "%s/rewrite.gguf", dir);
    if (!rc) rc = gguf_writer_write(w, out, fill_copy, f);
    snprintf(msg, sizeof msg, "rewriting %s gives the same bytes", rel);
    test_cond(msg, rc == 0 && same_bytes(src, out));
    if (rc) printf("  %s\n", skv_last_error());
    unlink(out);
    gguf_writer_free(w);
    gguf_close(f);
}

int main(void) {
    const char *dir = test_tmpdir("gguf_write");
    char path[600], other[600], sub[600];
    snprintf(path, sizeof path, "%s/model.gguf", dir);

    /* Full round trip, slices of at most 100 bytes (but at least a row). */
    gguf_writer *w = make_writer();
    test_cond("writer built with every metadata type", w != NULL);
    if (!w) return test_report("test_gguf_write");
    test_cond("six tensors declared", gguf_writer_n_tensors(w) == N_TENSORS);
    gguf_writer_set_slice_bytes(w, 100);
    fill_state st;
    init_state(&st, -1);
    int rc = gguf_writer_write(w, path, fill_pattern, &st);
    test_cond("write succeeds", rc == 0);
    if (rc) printf("  %s\n", skv_last_error());
    test_cond("fill slices are whole rows, in order", st.bad_slices == 0 && st.calls > N_TENSORS);
    gguf_file *f = NULL;
    rc = gguf_open(path, &f);
    test_cond("written file opens", rc == 0);
    if (rc) printf("  %s\n", skv_last_error());
    if (f) {
        check_metadata(f);
        check_tensors(f, 32);
        int full = 1;
        for (int i = 0; i < N_TENSORS && (uint64_t)i < f->n_tensors; i++) full &= st.next[i] == f->tensors[i].nbytes;
        test_cond("fill covered every tensor exactly", full);
        test_cond("file ends at the last tensor's padded end",
                  (uint64_t)file_size(path) ==
                      f->data_offset + (f->tensors[N_TENSORS - 1].offset + f->tensors[N_TENSORS - 1].nbytes + 31) / 32 * 32);
    }
    test_cond("no temporary file left", temporaries(dir) == 0);

    /* Copy the metadata through gguf_writer_set_kv, with a 64-byte alignment. */
    if (f) {
        gguf_writer *c = gguf_writer_new();
        int crc = c ? 0 : -1;
        for (uint64_t i = 0; c && i < f->n_kv; i++) crc |= gguf_writer_set_kv(c, &f->kv[i]);
        crc |= c ? gguf_writer_set_u32(c, "general.alignment", 64) : -1;
        for (int i = 0; c && i < N_TENSORS; i++)
            crc |= gguf_writer_add_tensor(c, tensor_names[i], tensor_types[i], tensor_dims[i], tensor_ne[i]);
        snprintf(other, sizeof other, "%s/copy.gguf", dir);
        init_state(&st, -1);
        crc |= c ? gguf_writer_write(c, other, fill_pattern, &st) : -1;
        test_cond("copy written through set_kv", crc == 0);
        gguf_file *g = NULL;
        if (crc == 0 && gguf_open(other, &g) == 0) {
            test_cond("copy has the same keys plus alignment", g->n_kv == f->n_kv + 1);
            int same = 1;
            for (uint64_t i = 0; i < f->n_kv && i < g->n_kv; i++) {
                const gguf_kv *a = &f->kv[i], *b = &g->kv[i];
                same &= !strcmp(a->key, b->key) && a->type == b->type && a->n == b->n;
                if (a->type == GGUF_STRING) same &= a->v.str.len == b->v.str.len && !memcmp(a->v.str.s, b->v.str.s, a->v.str.len);
                else if (a->type == GGUF_ARRAY && a->arr_type == GGUF_STRING)
                    for (uint64_t j = 0; j < a->n; j++)
                        same &= a->arr_len[j] == b->arr_len[j] && !memcmp(a->arr_str[j], b->arr_str[j], a->arr_len[j]);
                else if (a->type == GGUF_ARRAY)
                    for (uint64_t j = 0; j < a->n; j++) same &= gguf_arr_num(a, j) == gguf_arr_num(b, j);
                else same &= a->v.u == b->v.u;
            }
            test_cond("copied metadata identical", same);
            check_tensors(g, 64);
            gguf_close(g);
        } else {
            test_cond("copy opens", 0);
            printf("  %s\n", skv_last_error());
        }
        unlink(other);
        gguf_writer_free(c);
    }
    if (f) gguf_close(f);

    /* Quantized data streamed row by row and read back. */
    {
        enum { ROWS = 50, N = 96 };
        float *x = malloc(ROWS * N * sizeof(float)), *y = malloc(N * sizeof(float));
        for (int i = 0; x && i < ROWS * N; i++) x[i] = sinf((float)i * 0.37f) * (1 + i % 7);
        gguf_writer *q = gguf_writer_new();
        quant_src src = {x, N};
        int qrc = q && x && y ? 0 : -1;
        if (!qrc) {
            gguf_writer_set_slice_bytes(q, 3 * ggml_row_size(GGML_Q8_0, N) + 5);
            qrc |= gguf_writer_add_tensor(q, "w", GGML_Q8_0, 2, (const uint64_t[]){N, ROWS});
            snprintf(other, sizeof other, "%s/q.gguf", dir);
            qrc |= gguf_writer_write(q, other, fill_quant, &src);
        }
        gguf_file *g = NULL;
        double err = 1;
        if (!qrc && gguf_open(other, &g) == 0) {
            const gguf_tensor *t = gguf_find_tensor(g, "w");
            double num = 0, den = 0;
            for (int r = 0; t && r < ROWS; r++) {
                quant_dequant_row(GGML_Q8_0, (const uint8_t *)t->data + r * ggml_row_size(GGML_Q8_0, N), y, N);
                for (int j = 0; j < N; j++) {
                    num += (y[j] - x[r * N + j]) * (double)(y[j] - x[r * N + j]);
                    den += (double)x[r * N + j] * x[r * N + j];
                }
            }
            err = sqrt(num / den);
            gguf_close(g);
        }
        test_cond("q8_0 tensor quantized in fill reads back (rel L2 < 1e-2)", qrc == 0 && err < 1e-2);
        unlink(other);
        gguf_writer_free(q);
        free(x);
        free(y);
    }

    /* A failing fill leaves the existing file as it was. */
    write_text(path, "precious");
    init_state(&st, 3);
    gguf_writer_set_slice_bytes(w, 0);
    rc = gguf_writer_write(w, path, fill_pattern, &st);
    test_cond("fill failure is reported", rc == SKV_EIO);
    test_cond("fill failure message names the file, tensor and cause",
              strstr(skv_last_error(), path) && strstr(skv_last_error(), "d.q4_K") &&
                  strstr(skv_last_error(), "synthetic failure"));
    test_cond("existing file untouched after a failed fill", file_is(path, "precious"));
    test_cond("no temporary file left after a failed fill", temporaries(dir) == 0);

    /* A bad alignment is refused before anything is written. */
    gguf_writer_set_u32(w, "general.alignment", 48);
    init_state(&st, -1);
    rc = gguf_writer_write(w, path, fill_pattern, &st);
    test_cond("alignment 48 is refused", rc == SKV_EINVAL && strstr(skv_last_error(), path) && st.calls == 0);
    test_cond("existing file untouched after a refused write", file_is(path, "precious"));
    gguf_writer_set_u16(w, "general.alignment", 64);
    test_cond("a u16 alignment is refused", gguf_writer_write(w, path, fill_pattern, &st) == SKV_EINVAL);
    gguf_writer_remove(w, "general.alignment");

    /* A missing folder, and a folder where the file should go. */
    snprintf(other, sizeof other, "%s/no/such/dir/x.gguf", dir);
    rc = gguf_writer_write(w, other, fill_pattern, &st);
    test_cond("missing folder: EIO naming the path", rc == SKV_EIO && strstr(skv_last_error(), other));
    snprintf(sub, sizeof sub, "%s/adir", dir);
    mkdir(sub, 0700);
    init_state(&st, -1);
    rc = gguf_writer_write(w, sub, fill_pattern, &st);
    struct stat sst;
    test_cond("folder in the way: EIO, folder still there", rc == SKV_EIO && stat(sub, &sst) == 0 && S_ISDIR(sst.st_mode));
    test_cond("no temporary file left after a failed rename", temporaries(dir) == 0);
    rmdir(sub);

    /* The same writer writes again, over the old file, now successfully. */
    init_state(&st, -1);
    rc = gguf_writer_write(w, path, fill_pattern, &st);
    f = NULL;
    test_cond("rewrite over an existing file succeeds", rc == 0 && gguf_open(path, &f) == 0);
    if (f) { check_tensors(f, 32); gguf_close(f); }

    /* Bad descriptions. */
    const uint64_t ne33[] = {33, 2}, ne0[] = {0, 2}, ne_ok[] = {32, 2};
    test_cond("duplicate tensor refused", gguf_writer_add_tensor(w, "a.f32", GGML_F32, 1, ne_ok) == SKV_EINVAL);
    test_cond("q8_0 row of 33 refused", gguf_writer_add_tensor(w, "x", GGML_Q8_0, 2, ne33) == SKV_EINVAL &&
                                            strstr(skv_last_error(), "block size"));
    test_cond("zero dimension refused", gguf_writer_add_tensor(w, "x", GGML_F32, 2, ne0) == SKV_EINVAL);
    test_cond("0 and 5 dims refused", gguf_writer_add_tensor(w, "x", GGML_F32, 0, ne_ok) == SKV_EINVAL &&
                                          gguf_writer_add_tensor(w, "x", GGML_F32, 5, ne_ok) == SKV_EINVAL);
    test_cond("unknown type refused", gguf_writer_add_tensor(w, "x", (enum ggml_type)4, 2, ne_ok) == SKV_EINVAL &&
                                          gguf_writer_add_tensor(w, "x", (enum ggml_type)99, 2, ne_ok) == SKV_EINVAL);
    test_cond("64-byte tensor name refused",
              gguf_writer_add_tensor(w, "0123456789012345678901234567890123456789012345678901234567890123",
                                     GGML_F32, 2, ne_ok) == SKV_EINVAL);
    test_cond("empty and NULL keys refused", gguf_writer_set_u32(w, "", 1) == SKV_EINVAL &&
                                                 gguf_writer_set_str(w, NULL, "x") == SKV_EINVAL);
    test_cond("NULL string refused", gguf_writer_set_str(w, "k", NULL) == SKV_EINVAL);
    test_cond("array of strings via set_arr refused", gguf_writer_set_arr(w, "k", GGUF_STRING, "x", 1) == SKV_EINVAL);
    test_cond("array of arrays refused", gguf_writer_set_arr(w, "k", GGUF_ARRAY, "x", 1) == SKV_EINVAL);
    test_cond("tensors without fill refused", gguf_writer_write(w, path, NULL, NULL) == SKV_EINVAL);
    test_cond("descriptions unchanged by refusals", gguf_writer_n_tensors(w) == N_TENSORS);
    gguf_writer_free(w);

    /* An empty file: header only. */
    gguf_writer *e = gguf_writer_new();
    snprintf(other, sizeof other, "%s/empty.gguf", dir);
    f = NULL;
    test_cond("empty writer writes a valid file", e && gguf_writer_write(e, other, NULL, NULL) == 0 &&
                                                      gguf_open(other, &f) == 0 && f->n_kv == 0 && f->n_tensors == 0);
    if (f) gguf_close(f);
    gguf_writer_free(e);
    unlink(other);

    check_rewrite("models/stories260k.gguf", dir);
    check_rewrite("models/mini-smollm-q4_k_m.gguf", dir);

    unlink(path);
    test_cond("scratch folder removed", rmdir(dir) == 0);
    return test_report("test_gguf_write");
}
