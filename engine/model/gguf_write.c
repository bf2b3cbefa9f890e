/* gguf_write.c: GGUF v3 writer (see gguf_write.h).
 *
 * The description lives in two growing arrays (metadata entries, tensor
 * infos). gguf_writer_write lays out the data section first (each tensor's
 * offset, padded to the alignment), then streams header, metadata and tensor
 * infos through a small output buffer, and tensor data slice by slice through
 * one buffer of at most the slice size, into a mkstemp file that is fsynced
 * and renamed over the destination. All integers are little-endian, as the
 * GGUF spec requires and as every machine we build for stores them. */
#include "gguf_write.h"
#include "skv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_VERSION 3
#define DEFAULT_ALIGN 32
#define DEFAULT_SLICE (64u << 20)
#define MAX_KEY 65535          /* GGUF keys are at most 65535 bytes */
#define MAX_NAME 63            /* ggml's GGML_MAX_NAME is 64 including the NUL */

typedef struct {
    char *key;
    enum gguf_vtype type;
    enum gguf_vtype arr_type;  /* element type when type == GGUF_ARRAY */
    uint8_t raw[8];            /* scalar value, native width */
    char *str;                 /* string value (owned), str_len bytes */
    uint64_t str_len;
    uint64_t n;                /* array element count */
    void *arr;                 /* numeric array (owned), n elements of native width */
    char **arr_str;            /* string array (owned), n strings */
    uint64_t *arr_len;         /* (n) their byte lengths */
} wkv;

typedef struct {
    char *name;
    enum ggml_type type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
    uint64_t offset;  /* in the data section, set by gguf_writer_write */
} wtensor;

struct gguf_writer {
    wkv *kv;          /* (n_kv) in the order first set */
    size_t n_kv, cap_kv;
    wtensor *t;       /* (n_t) in the order added */
    size_t n_t, cap_t;
    size_t slice;     /* bound on bytes per fill call */
};

static const uint8_t vwidth[GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

gguf_writer *gguf_writer_new(void) {
    gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->slice = DEFAULT_SLICE;
    return w;
}

static void kv_clear_value(wkv *e) {
    free(e->str);
    free(e->arr);
    if (e->arr_str)
        for (uint64_t i = 0; i < e->n; i++) free(e->arr_str[i]);
    free(e->arr_str);
    free(e->arr_len);
    e->str = NULL;
    e->arr = NULL;
    e->arr_str = NULL;
    e->arr_len = NULL;
    e->str_len = e->n = 0;
}

void gguf_writer_free(gguf_writer *w) {
    if (!w) return;
    for (size_t i = 0; i < w->n_kv; i++) {
        kv_clear_value(&w->kv[i]);
        free(w->kv[i].key);
    }
    free(w->kv);
    for (size_t i = 0; i < w->n_t; i++) free(w->t[i].name);
    free(w->t);
    free(w);
}

void gguf_writer_set_slice_bytes(gguf_writer *w, size_t slice_bytes) {
    w->slice = slice_bytes ? slice_bytes : DEFAULT_SLICE;
}

size_t gguf_writer_n_tensors(const gguf_writer *w) { return w->n_t; }

/* Stores the value built in *v under key, replacing an earlier value in place
 * or appending; takes ownership of v's buffers (freed on failure). */
static int kv_put(gguf_writer *w, const char *key, wkv *v) {
    if (!key || !*key || strlen(key) > MAX_KEY) {
        kv_clear_value(v);
        return skv_error(SKV_EINVAL, "gguf writer: metadata key %s%s%s is empty or longer than %d bytes",
                         key ? "'" : "", key ? key : "(null)", key ? "'" : "", MAX_KEY);
    }
    wkv *e = NULL;
    for (size_t i = 0; i < w->n_kv && !e; i++)
        if (strcmp(w->kv[i].key, key) == 0) e = &w->kv[i];
    if (e) {
        kv_clear_value(e);
    } else {
        char *k = strdup(key);
        if (k && w->n_kv == w->cap_kv) {
            size_t cap = w->cap_kv ? 2 * w->cap_kv : 16;
            wkv *grown = realloc(w->kv, cap * sizeof *grown);
            if (grown) { w->kv = grown; w->cap_kv = cap; }
        }
        if (!k || w->n_kv == w->cap_kv) {
            free(k);
            kv_clear_value(v);
            return skv_error(SKV_ENOMEM, "gguf writer: out of memory setting '%s'", key);
        }
        e = &w->kv[w->n_kv++];
        e->key = k;
    }
    char *k = e->key;
    *e = *v;
    e->key = k;
    return 0;
}

static int set_raw(gguf_writer *w, const char *key, enum gguf_vtype t, const void *p) {
    wkv v = {.type = t};
    memcpy(v.raw, p, vwidth[t]);
    return kv_put(w, key, &v);
}

int gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v) { return set_raw(w, key, GGUF_U8, &v); }
int gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v) { return set_raw(w, key, GGUF_I8, &v); }
int gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v) { return set_raw(w, key, GGUF_U16, &v); }
int gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v) { return set_raw(w, key, GGUF_I16, &v); }
int gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v) { return set_raw(w, key, GGUF_U32, &v); }
int gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v) { return set_raw(w, key, GGUF_I32, &v); }
int gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v) { return set_raw(w, key, GGUF_U64, &v); }
int gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v) { return set_raw(w, key, GGUF_I64, &v); }
int gguf_writer_set_f32(gguf_writer *w, const char *key, float v) { return set_raw(w, key, GGUF_F32, &v); }
int gguf_writer_set_f64(gguf_writer *w, const char *key, double v) { return set_raw(w, key, GGUF_F64, &v); }

int gguf_writer_set_bool(gguf_writer *w, const char *key, int v) {
    uint8_t b = v != 0;
    return set_raw(w, key, GGUF_BOOL, &b);
}

static const char *key_or_null(const char *key) { return key ? key : "(null)"; }

int gguf_writer_set_strn(gguf_writer *w, const char *key, const char *s, size_t len) {
    if (!s && len) return skv_error(SKV_EINVAL, "gguf writer: '%s': NULL string", key_or_null(key));
    wkv v = {.type = GGUF_STRING, .str_len = len};
    if (!(v.str = malloc(len + 1))) return skv_error(SKV_ENOMEM, "gguf writer: out of memory setting '%s'", key_or_null(key));
    if (len) memcpy(v.str, s, len);
    v.str[len] = 0;
    return kv_put(w, key, &v);
}

int gguf_writer_set_str(gguf_writer *w, const char *key, const char *s) {
    if (!s) return skv_error(SKV_EINVAL, "gguf writer: '%s': NULL string", key_or_null(key));
    return gguf_writer_set_strn(w, key, s, strlen(s));
}

int gguf_writer_set_arr(gguf_writer *w, const char *key, enum gguf_vtype elem, const void *p, size_t n) {
    if ((unsigned)elem >= GGUF_VTYPE_COUNT || elem == GGUF_STRING || elem == GGUF_ARRAY)
        return skv_error(SKV_EINVAL, "gguf writer: '%s': array element type %d is not numeric", key_or_null(key),
                         (int)elem);
    if (!p && n) return skv_error(SKV_EINVAL, "gguf writer: '%s': NULL array", key_or_null(key));
    if (n > SIZE_MAX / 8) return skv_error(SKV_EINVAL, "gguf writer: '%s': array too long", key_or_null(key));
    size_t bytes = n * vwidth[elem];
    wkv v = {.type = GGUF_ARRAY, .arr_type = elem, .n = n};
    if (!(v.arr = malloc(bytes ? bytes : 1)))
        return skv_error(SKV_ENOMEM, "gguf writer: out of memory setting '%s'", key_or_null(key));
    if (bytes) memcpy(v.arr, p, bytes);
    return kv_put(w, key, &v);
}

int gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, size_t n) {
    return gguf_writer_set_arr(w, key, GGUF_F32, v, n);
}

int gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, size_t n) {
    return gguf_writer_set_arr(w, key, GGUF_I32, v, n);
}

int gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *s, const size_t *lens, size_t n) {
    if (!s && n) return skv_error(SKV_EINVAL, "gguf writer: '%s': NULL string array", key_or_null(key));
    for (size_t i = 0; i < n; i++)
        if (!s[i] && (!lens || lens[i]))
            return skv_error(SKV_EINVAL, "gguf writer: '%s': string %zu is NULL", key_or_null(key), i);
    if (n > SIZE_MAX / sizeof(uint64_t))
        return skv_error(SKV_EINVAL, "gguf writer: '%s': array too long", key_or_null(key));
    wkv v = {.type = GGUF_ARRAY, .arr_type = GGUF_STRING, .n = n};
    v.arr_str = calloc(n ? n : 1, sizeof(char *));
    v.arr_len = calloc(n ? n : 1, sizeof(uint64_t));
    for (size_t i = 0; v.arr_str && v.arr_len && i < n; i++) {
        size_t len = lens ? lens[i] : strlen(s[i]);
        if (!(v.arr_str[i] = malloc(len + 1))) break;
        if (len) memcpy(v.arr_str[i], s[i], len);
        v.arr_str[i][len] = 0;
        v.arr_len[i] = len;
    }
    if (!v.arr_str || !v.arr_len || (n && !v.arr_str[n - 1])) {
        kv_clear_value(&v);
        return skv_error(SKV_ENOMEM, "gguf writer: out of memory setting '%s'", key_or_null(key));
    }
    return kv_put(w, key, &v);
}

int gguf_writer_set_kv(gguf_writer *w, const gguf_kv *kv) {
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32; uint64_t u64;
            int64_t i64; float f32; double f64; } v;
    switch (kv->type) {
    case GGUF_U8: v.u8 = (uint8_t)kv->v.u; break;
    case GGUF_I8: v.i8 = (int8_t)kv->v.i; break;
    case GGUF_U16: v.u16 = (uint16_t)kv->v.u; break;
    case GGUF_I16: v.i16 = (int16_t)kv->v.i; break;
    case GGUF_U32: v.u32 = (uint32_t)kv->v.u; break;
    case GGUF_I32: v.i32 = (int32_t)kv->v.i; break;
    case GGUF_U64: v.u64 = kv->v.u; break;
    case GGUF_I64: v.i64 = kv->v.i; break;
    case GGUF_F32: v.f32 = (float)kv->v.f; break;
    case GGUF_F64: v.f64 = kv->v.f; break;
    case GGUF_BOOL: return gguf_writer_set_bool(w, kv->key, kv->v.u != 0);
    case GGUF_STRING: return gguf_writer_set_strn(w, kv->key, kv->v.str.s, kv->v.str.len);
    case GGUF_ARRAY:
        if (kv->arr_type == GGUF_STRING) {
            size_t *lens = malloc((kv->n ? kv->n : 1) * sizeof *lens);
            if (!lens) return skv_error(SKV_ENOMEM, "gguf writer: out of memory copying '%s'", kv->key);
            for (uint64_t i = 0; i < kv->n; i++) lens[i] = kv->arr_len[i];
            int rc = gguf_writer_set_arr_str(w, kv->key, (const char *const *)kv->arr_str, lens, kv->n);
            free(lens);
            return rc;
        }
        return gguf_writer_set_arr(w, kv->key, kv->arr_type, kv->arr, kv->n);
    default:
        return skv_error(SKV_EINVAL, "gguf writer: '%s': unknown value type %d", kv->key, (int)kv->type);
    }
    return set_raw(w, kv->key, kv->type, &v);
}

int gguf_writer_remove(gguf_writer *w, const char *key) {
    for (size_t i = 0; key && i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, key) == 0) {
            kv_clear_value(&w->kv[i]);
            free(w->kv[i].key);
            memmove(&w->kv[i], &w->kv[i + 1], (w->n_kv - i - 1) * sizeof *w->kv);
            w->n_kv--;
            return 0;
        }
    return 0;
}

int gguf_writer_add_tensor(gguf_writer *w, const char *name, enum ggml_type type, int n_dims, const uint64_t *ne) {
    if (!name || !*name || strlen(name) > MAX_NAME)
        return skv_error(SKV_EINVAL, "gguf writer: tensor name '%s' is empty or longer than %d bytes",
                         name ? name : "(null)", MAX_NAME);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->t[i].name, name) == 0)
            return skv_error(SKV_EINVAL, "gguf writer: tensor '%s' added twice", name);
    if (!ggml_type_known(type))
        return skv_error(SKV_EINVAL, "gguf writer: tensor '%s': unknown type %d", name, (int)type);
    if (n_dims < 1 || n_dims > 4 || !ne)
        return skv_error(SKV_EINVAL, "gguf writer: tensor '%s': %d dimensions (expected 1-4)", name, n_dims);
    uint64_t nel = 1;
    for (int d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (1ull << 40) || nel > (1ull << 40) / ne[d])
            return skv_error(SKV_EINVAL, "gguf writer: tensor '%s': dimension %d = %llu is zero or too large", name,
                             d, (unsigned long long)ne[d]);
        nel *= ne[d];
    }
    size_t row = ggml_row_size(type, ne[0]);
    if (!row)
        return skv_error(SKV_EINVAL, "gguf writer: tensor '%s': row of %llu is not a multiple of the %s block size %u",
                         name, (unsigned long long)ne[0], ggml_type_name(type), ggml_blck_size(type));
    if (w->n_t == w->cap_t) {
        size_t cap = w->cap_t ? 2 * w->cap_t : 64;
        wtensor *t = realloc(w->t, cap * sizeof *t);
        if (!t) return skv_error(SKV_ENOMEM, "gguf writer: out of memory adding tensor '%s'", name);
        w->t = t;
        w->cap_t = cap;
    }
    wtensor *t = &w->t[w->n_t];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return skv_error(SKV_ENOMEM, "gguf writer: out of memory adding tensor '%s'", name);
    t->type = type;
    t->n_dims = (uint32_t)n_dims;
    for (int d = 0; d < 4; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    t->nbytes = (uint64_t)row * (nel / ne[0]);
    w->n_t++;
    return 0;
}

/* ---- output ---- */

typedef struct {
    int fd;
    const char *path;  /* the destination, for messages */
    uint8_t buf[1 << 16]; /* (len) bytes not yet written */
    size_t len;
    uint64_t pos;      /* bytes handed to out_bytes so far */
} out_file;

static int write_all(out_file *o, const void *p, size_t n) {
    const uint8_t *b = p;
    while (n) {
        ssize_t k = write(o->fd, b, n > (1u << 30) ? (1u << 30) : n);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            return skv_error(SKV_EIO, "%s: cannot write: %s", o->path, k < 0 ? strerror(errno) : "no progress");
        b += k;
        n -= (size_t)k;
    }
    return 0;
}

static int out_flush(out_file *o) {
    int rc = write_all(o, o->buf, o->len);
    o->len = 0;
    return rc;
}

static int out_bytes(out_file *o, const void *p, size_t n) {
    o->pos += n;
    if (o->len + n > sizeof o->buf) {
        int rc = out_flush(o);
        if (rc) return rc;
        if (n > sizeof o->buf) return write_all(o, p, n);
    }
    memcpy(o->buf + o->len, p, n);
    o->len += n;
    return 0;
}

static int out_u32(out_file *o, uint32_t v) { return out_bytes(o, &v, 4); }
static int out_u64(out_file *o, uint64_t v) { return out_bytes(o, &v, 8); }

static int out_str(out_file *o, const char *s, uint64_t len) {
    int rc = out_u64(o, len);
    return rc ? rc : out_bytes(o, s, len);
}

static int out_pad(out_file *o, uint32_t align) {
    static const uint8_t zeros[256];
    while (o->pos % align) {
        uint64_t k = align - o->pos % align;
        int rc = out_bytes(o, zeros, k > sizeof zeros ? sizeof zeros : (size_t)k);
        if (rc) return rc;
    }
    return 0;
}

static int out_kv(out_file *o, const wkv *e) {
    int rc;
    if ((rc = out_str(o, e->key, strlen(e->key))) || (rc = out_u32(o, (uint32_t)e->type))) return rc;
    if (e->type == GGUF_STRING) return out_str(o, e->str, e->str_len);
    if (e->type != GGUF_ARRAY) return out_bytes(o, e->raw, vwidth[e->type]);
    if ((rc = out_u32(o, (uint32_t)e->arr_type)) || (rc = out_u64(o, e->n))) return rc;
    if (e->arr_type != GGUF_STRING) return out_bytes(o, e->arr, (size_t)e->n * vwidth[e->arr_type]);
    for (uint64_t i = 0; i < e->n; i++)
        if ((rc = out_str(o, e->arr_str[i], e->arr_len[i]))) return rc;
    return 0;
}

/* The alignment from general.alignment (a power-of-two u32), or 32. */
static int layout_alignment(const gguf_writer *w, const char *path, uint32_t *align) {
    *align = DEFAULT_ALIGN;
    for (size_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->kv[i].key, "general.alignment") == 0) {
            uint32_t a = 0;
            if (w->kv[i].type == GGUF_U32) memcpy(&a, w->kv[i].raw, 4);
            if (w->kv[i].type != GGUF_U32 || a == 0 || (a & (a - 1)))
                return skv_error(SKV_EINVAL, "%s: general.alignment must be a power-of-two u32", path);
            *align = a;
        }
    return 0;
}

/* Bytes per fill call for tensor t: whole rows, at most slice bytes unless
 * one row is bigger. */
static uint64_t slice_of(const wtensor *t, size_t slice) {
    size_t row = ggml_row_size(t->type, t->ne[0]);
    uint64_t rows = slice / row ? slice / row : 1;
    return t->nbytes < rows * row ? t->nbytes : rows * row;
}

/* Streams tensor idx through buf (room for slice_of(t) bytes). */
static int out_tensor(out_file *o, const wtensor *t, int idx, gguf_fill_fn fill, void *user, uint8_t *buf,
                      size_t slice) {
    uint64_t step = slice_of(t, slice);
    for (uint64_t off = 0; off < t->nbytes; off += step) {
        size_t n = (size_t)(t->nbytes - off < step ? t->nbytes - off : step);
        skv_clear_error();
        int rc = fill(user, idx, off, buf, n);
        if (rc) {
            char why[768];
            snprintf(why, sizeof why, "%s", skv_last_error());
            return skv_error(rc < 0 ? rc : SKV_EIO, "%s: producing tensor '%s' (bytes %llu..%llu) failed: %s",
                             o->path, t->name, (unsigned long long)off, (unsigned long long)(off + n), why);
        }
        o->pos += n;
        if ((rc = write_all(o, buf, n))) return rc;
    }
    return 0;
}

/* fsync of the directory holding path, so that the rename is durable; a
 * directory that cannot be opened or synced is not an error. */
static void sync_dir(const char *path) {
    char *dir = strdup(path);
    if (!dir) return;
    char *slash = strrchr(dir, '/');
    const char *d = ".";
    if (slash == dir) d = "/";
    else if (slash) { *slash = 0; d = dir; }
    int fd = open(d, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(dir);
}

int gguf_writer_write(gguf_writer *w, const char *path, gguf_fill_fn fill, void *user) {
    if (!path || !*path) return skv_error(SKV_EINVAL, "gguf writer: empty output path");
    if (w->n_t && !fill) return skv_error(SKV_EINVAL, "%s: gguf writer: tensors declared but no fill callback", path);
    uint32_t align;
    int rc = layout_alignment(w, path, &align);
    if (rc) return rc;

    /* Data layout, and the one slice buffer. */
    uint64_t off = 0, cap = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        wtensor *t = &w->t[i];
        t->offset = off;
        off = (off + t->nbytes + align - 1) / align * align;
        if (slice_of(t, w->slice) > cap) cap = slice_of(t, w->slice);
    }
    if (cap > SIZE_MAX / 2) return skv_error(SKV_ENOMEM, "%s: a row of %llu bytes is too big to buffer", path,
                                             (unsigned long long)cap);

    char *tmp = NULL;
    out_file *o = malloc(sizeof *o);
    uint8_t *buf = cap ? malloc((size_t)cap) : NULL;
    if (!o || (cap && !buf)) {
        free(o); free(buf);
        return skv_error(SKV_ENOMEM, "%s: out of memory preparing to write", path);
    }
    int fd = skv_temp_beside(path, ".tmp-", &tmp);
    if (fd < 0) {
        free(o); free(buf);
        return fd;
    }
    o->fd = fd;
    o->path = path;
    o->len = 0;
    o->pos = 0;

    if ((rc = out_u32(o, GGUF_MAGIC)) || (rc = out_u32(o, GGUF_VERSION)) || (rc = out_u64(o, w->n_t)) ||
        (rc = out_u64(o, w->n_kv)))
        goto fail;
    for (size_t i = 0; i < w->n_kv; i++)
        if ((rc = out_kv(o, &w->kv[i]))) goto fail;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        if ((rc = out_str(o, t->name, strlen(t->name))) || (rc = out_u32(o, t->n_dims))) goto fail;
        for (uint32_t d = 0; d < t->n_dims; d++)
            if ((rc = out_u64(o, t->ne[d]))) goto fail;
        if ((rc = out_u32(o, (uint32_t)t->type)) || (rc = out_u64(o, t->offset))) goto fail;
    }
    if ((rc = out_pad(o, align)) || (rc = out_flush(o))) goto fail;
    uint64_t data_start = o->pos;
    for (size_t i = 0; i < w->n_t; i++) {
        const wtensor *t = &w->t[i];
        SKV_ASSERT(o->pos == data_start + t->offset);
        if ((rc = out_tensor(o, t, (int)i, fill, user, buf, w->slice)) || (rc = out_pad(o, align)) ||
            (rc = out_flush(o)))
            goto fail;
    }
    if (fchmod(fd, 0644) != 0 || fsync(fd) != 0) {
        rc = skv_error(SKV_EIO, "%s: cannot sync the temporary file: %s", path, strerror(errno));
        goto fail;
    }
    fd = -1;
    if (close(o->fd) != 0) {
        rc = skv_error(SKV_EIO, "%s: cannot close the temporary file: %s", path, strerror(errno));
        goto fail;
    }
    if (rename(tmp, path) != 0) {
        rc = skv_error(SKV_EIO, "%s: cannot rename the temporary file over it: %s", path, strerror(errno));
        goto fail;
    }
    sync_dir(path);
    free(tmp); free(o); free(buf);
    return 0;

fail:
    if (fd >= 0) close(fd);
    unlink(tmp);
    free(tmp); free(o); free(buf);
    return rc;
}
