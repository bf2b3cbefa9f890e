/* gguf.c: GGUF v2/v3 parsing and validation over an mmap of the file.
 *
 * A cursor walks the header, metadata and tensor table. Every read checks the
 * bytes left, so a truncated or corrupt file ends in a one-line SKV_EFORMAT
 * message instead of an out-of-bounds read. */
#include "gguf.h"
#include "skv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAGIC 0x46554747u /* "GGUF" little-endian */
#define GGUF_MAX_DIM (1ull << 40)
#define GGUF_MAX_COUNT (1ull << 32)

static const char *vtype_names[GGUF_VTYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t vtype_size[GGUF_VTYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_vtype_name(enum gguf_vtype t) {
    return (unsigned)t < GGUF_VTYPE_COUNT ? vtype_names[t] : "unknown";
}

typedef struct {
    const uint8_t *p, *end, *base;
    const char *path;
    const char *what; /* what is being read, for messages */
} cursor;

static int need(cursor *c, uint64_t n) {
    if ((uint64_t)(c->end - c->p) < n)
        return skv_error(SKV_EFORMAT, "%s: truncated GGUF file: %s needs %llu bytes at offset %lld, file has %lld",
                         c->path, c->what, (unsigned long long)n, (long long)(c->p - c->base),
                         (long long)(c->end - c->base));
    return 0;
}

#define READ_FN(name, type) \
    static int name(cursor *c, type *out) { \
        int rc = need(c, sizeof(type)); \
        if (rc) return rc; \
        memcpy(out, c->p, sizeof(type)); \
        c->p += sizeof(type); \
        return 0; \
    }
READ_FN(rd_u32, uint32_t)
READ_FN(rd_u64, uint64_t)

static int rd_str(cursor *c, char **out, uint64_t *len_out) {
    uint64_t len;
    int rc = rd_u64(c, &len);
    if (rc) return rc;
    if (len > (1ull << 30))
        return skv_error(SKV_EFORMAT, "%s: %s: string length %llu is absurd", c->path, c->what,
                         (unsigned long long)len);
    if ((rc = need(c, len))) return rc;
    char *s = malloc(len + 1);
    if (!s) return skv_error(SKV_ENOMEM, "%s: out of memory reading %s", c->path, c->what);
    memcpy(s, c->p, len);
    s[len] = 0;
    c->p += len;
    *out = s;
    if (len_out) *len_out = len;
    return 0;
}

static int rd_scalar(cursor *c, gguf_kv *kv, enum gguf_vtype t) {
    int rc = need(c, vtype_size[t]);
    if (rc) return rc;
    const uint8_t *p = c->p;
    switch (t) {
    case GGUF_U8: kv->v.u = p[0]; break;
    case GGUF_I8: kv->v.i = (int8_t)p[0]; break;
    case GGUF_BOOL: kv->v.u = p[0] != 0; break;
    case GGUF_U16: { uint16_t x; memcpy(&x, p, 2); kv->v.u = x; break; }
    case GGUF_I16: { int16_t x; memcpy(&x, p, 2); kv->v.i = x; break; }
    case GGUF_U32: { uint32_t x; memcpy(&x, p, 4); kv->v.u = x; break; }
    case GGUF_I32: { int32_t x; memcpy(&x, p, 4); kv->v.i = x; break; }
    case GGUF_F32: { float x; memcpy(&x, p, 4); kv->v.f = x; break; }
    case GGUF_U64: { uint64_t x; memcpy(&x, p, 8); kv->v.u = x; break; }
    case GGUF_I64: { int64_t x; memcpy(&x, p, 8); kv->v.i = x; break; }
    case GGUF_F64: { double x; memcpy(&x, p, 8); kv->v.f = x; break; }
    default: return skv_error(SKV_EFORMAT, "%s: %s: bad scalar type %d", c->path, c->what, (int)t);
    }
    c->p += vtype_size[t];
    return 0;
}

static int rd_value(cursor *c, gguf_kv *kv) {
    uint32_t t;
    int rc = rd_u32(c, &t);
    if (rc) return rc;
    if (t >= GGUF_VTYPE_COUNT)
        return skv_error(SKV_EFORMAT, "%s: metadata key '%s': unknown value type %u (expected 0-12)",
                         c->path, kv->key, t);
    kv->type = t;
    kv->n = 1;
    if (t == GGUF_STRING) return rd_str(c, &kv->v.str.s, &kv->v.str.len);
    if (t != GGUF_ARRAY) return rd_scalar(c, kv, t);

    uint32_t at;
    uint64_t n;
    if ((rc = rd_u32(c, &at)) || (rc = rd_u64(c, &n))) return rc;
    if (at >= GGUF_VTYPE_COUNT || at == GGUF_ARRAY)
        return skv_error(SKV_EFORMAT, "%s: metadata key '%s': unsupported array element type %u",
                         c->path, kv->key, at);
    if (n > GGUF_MAX_COUNT || (at != GGUF_STRING && n * vtype_size[at] > (uint64_t)(c->end - c->p)))
        return skv_error(SKV_EFORMAT, "%s: metadata key '%s': array of %llu elements runs past the end of the file",
                         c->path, kv->key, (unsigned long long)n);
    kv->arr_type = at;
    kv->n = n;
    if (at == GGUF_STRING) {
        /* Each element needs at least its 8-byte length. */
        if (n * 8 > (uint64_t)(c->end - c->p))
            return skv_error(SKV_EFORMAT, "%s: metadata key '%s': string array of %llu elements runs past the end of the file",
                             c->path, kv->key, (unsigned long long)n);
        kv->arr_str = calloc(n ? n : 1, sizeof(char *));
        kv->arr_len = calloc(n ? n : 1, sizeof(uint32_t));
        if (!kv->arr_str || !kv->arr_len) return skv_error(SKV_ENOMEM, "%s: out of memory", c->path);
        for (uint64_t i = 0; i < n; i++) {
            uint64_t len;
            if ((rc = rd_str(c, &kv->arr_str[i], &len))) return rc;
            kv->arr_len[i] = (uint32_t)len;
        }
        return 0;
    }
    size_t bytes = (size_t)n * vtype_size[at];
    kv->arr = skv_aligned_alloc(bytes ? bytes : 1);
    if (!kv->arr) return skv_error(SKV_ENOMEM, "%s: out of memory", c->path);
    memcpy(kv->arr, c->p, bytes);
    c->p += bytes;
    return 0;
}

void gguf_close(gguf_file *f) {
    if (!f) return;
    for (uint64_t i = 0; f->kv && i < f->n_kv; i++) {
        gguf_kv *kv = &f->kv[i];
        free(kv->key);
        if (kv->type == GGUF_STRING) free(kv->v.str.s);
        free(kv->arr);
        if (kv->arr_str)
            for (uint64_t j = 0; j < kv->n; j++) free(kv->arr_str[j]);
        free(kv->arr_str);
        free(kv->arr_len);
    }
    free(f->kv);
    for (uint64_t i = 0; f->tensors && i < f->n_tensors; i++) free(f->tensors[i].name);
    free(f->tensors);
    if (f->map) munmap((void *)f->map, f->map_size);
    free(f->path);
    free(f);
}

static int parse(gguf_file *f) {
    cursor c = {f->map, f->map + f->map_size, f->map, f->path, "header"};
    uint32_t magic;
    int rc;
    if (f->map_size < 4 || (memcpy(&magic, f->map, 4), magic != GGUF_MAGIC))
        return skv_error(SKV_EFORMAT, "%s: not a GGUF file (bad magic, expected \"GGUF\")", f->path);
    c.p += 4;
    if ((rc = rd_u32(&c, &f->version))) return rc;
    if (f->version != 2 && f->version != 3)
        return skv_error(SKV_EUNSUPPORTED, "%s: GGUF version %u is not supported (expected 2 or 3)",
                         f->path, f->version);
    if ((rc = rd_u64(&c, &f->n_tensors)) || (rc = rd_u64(&c, &f->n_kv))) return rc;
    if (f->n_tensors > 1000000 || f->n_kv > 1000000)
        return skv_error(SKV_EFORMAT, "%s: absurd counts in header: %llu tensors, %llu metadata keys",
                         f->path, (unsigned long long)f->n_tensors, (unsigned long long)f->n_kv);
    /* The smallest metadata entry is 13 bytes and the smallest tensor info 32:
     * refuse counts that cannot fit before allocating for them. */
    uint64_t left = f->map_size - 24;
    if (f->n_kv > left / 13 || f->n_tensors > left / 32)
        return skv_error(SKV_EFORMAT, "%s: %llu metadata keys and %llu tensors cannot fit in %zu bytes", f->path,
                         (unsigned long long)f->n_kv, (unsigned long long)f->n_tensors, f->map_size);
    f->kv = calloc(f->n_kv ? f->n_kv : 1, sizeof *f->kv);
    f->tensors = calloc(f->n_tensors ? f->n_tensors : 1, sizeof *f->tensors);
    if (!f->kv || !f->tensors) return skv_error(SKV_ENOMEM, "%s: out of memory", f->path);

    char what[320];
    for (uint64_t i = 0; i < f->n_kv; i++) {
        snprintf(what, sizeof what, "metadata key %llu", (unsigned long long)i);
        c.what = what;
        if ((rc = rd_str(&c, &f->kv[i].key, NULL))) { f->n_kv = i + 1; return rc; }
        snprintf(what, sizeof what, "metadata value of '%.200s'", f->kv[i].key);
        if ((rc = rd_value(&c, &f->kv[i]))) { f->n_kv = i + 1; return rc; }
    }

    f->alignment = 32;
    const gguf_kv *al = gguf_find(f, "general.alignment");
    if (al) {
        if (al->type != GGUF_U32 || al->v.u == 0 || (al->v.u & (al->v.u - 1)))
            return skv_error(SKV_EFORMAT, "%s: general.alignment must be a power-of-two u32", f->path);
        f->alignment = (uint32_t)al->v.u;
    }

    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        snprintf(what, sizeof what, "tensor info %llu", (unsigned long long)i);
        c.what = what;
        if ((rc = rd_str(&c, &t->name, NULL))) { f->n_tensors = i + 1; return rc; }
        snprintf(what, sizeof what, "tensor info of '%.200s'", t->name);
        if ((rc = rd_u32(&c, &t->n_dims))) return rc;
        if (t->n_dims < 1 || t->n_dims > 4)
            return skv_error(SKV_EFORMAT, "%s: tensor '%s': %u dimensions (expected 1-4)", f->path, t->name, t->n_dims);
        uint64_t nel = 1;
        for (int d = 0; d < 4; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            if ((rc = rd_u64(&c, &t->ne[d]))) return rc;
            if (t->ne[d] == 0 || t->ne[d] > GGUF_MAX_DIM || nel > GGUF_MAX_DIM / t->ne[d])
                return skv_error(SKV_EFORMAT, "%s: tensor '%s': absurd dimension %llu", f->path, t->name,
                                 (unsigned long long)t->ne[d]);
            nel *= t->ne[d];
        }
        uint32_t ty;
        if ((rc = rd_u32(&c, &ty)) || (rc = rd_u64(&c, &t->offset))) return rc;
        t->type = ty;
        if (!ggml_type_known(t->type))
            return skv_error(SKV_EUNSUPPORTED, "%s: tensor '%s': unknown tensor type %u", f->path, t->name, ty);
        size_t row = ggml_row_size(t->type, t->ne[0]);
        if (!row)
            return skv_error(SKV_EFORMAT, "%s: tensor '%s': row of %llu is not a multiple of the %s block size %u",
                             f->path, t->name, (unsigned long long)t->ne[0], ggml_type_name(t->type),
                             ggml_blck_size(t->type));
        t->nbytes = (uint64_t)row * (nel / t->ne[0]);
    }

    uint64_t hdr = (uint64_t)(c.p - c.base);
    f->data_offset = (hdr + f->alignment - 1) / f->alignment * f->alignment;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (t->offset % f->alignment)
            return skv_error(SKV_EFORMAT, "%s: tensor '%s': offset %llu is not aligned to %u", f->path, t->name,
                             (unsigned long long)t->offset, f->alignment);
        if (f->data_offset > f->map_size || t->offset > f->map_size - f->data_offset ||
            t->nbytes > f->map_size - f->data_offset - t->offset)
            return skv_error(SKV_EFORMAT, "%s: tensor '%s': data (%llu bytes at data offset %llu) runs past the end of the file (%zu bytes)",
                             f->path, t->name, (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                             f->map_size);
        t->data = f->map + f->data_offset + t->offset;
    }
    return 0;
}

int gguf_open(const char *path, gguf_file **out) {
    *out = NULL;
    gguf_file *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) { free(f); return skv_error(SKV_ENOMEM, "%s: out of memory", path); }
    int fd = open(path, O_RDONLY);
    if (fd < 0) {
        int e = errno;
        gguf_close(f);
        return skv_error(SKV_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        gguf_close(f);
        return skv_error(SKV_EIO, "%s: not a regular file", path);
    }
    if (st.st_size < 24) {
        close(fd);
        gguf_close(f);
        return skv_error(SKV_EFORMAT, "%s: truncated GGUF file: %lld bytes is shorter than the 24-byte header",
                         path, (long long)st.st_size);
    }
    void *m = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED) {
        int e = errno;
        gguf_close(f);
        return skv_error(SKV_EIO, "%s: cannot map: %s", path, strerror(e));
    }
    f->map = m;
    f->map_size = st.st_size;
    int rc = parse(f);
    if (rc) { gguf_close(f); return rc; }
    *out = f;
    return 0;
}

const gguf_kv *gguf_find(const gguf_file *f, const char *key) {
    for (uint64_t i = 0; i < f->n_kv; i++)
        if (f->kv[i].key && strcmp(f->kv[i].key, key) == 0) return &f->kv[i];
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *f, const char *name) {
    for (uint64_t i = 0; i < f->n_tensors; i++)
        if (strcmp(f->tensors[i].name, name) == 0) return &f->tensors[i];
    return NULL;
}

static int is_int(enum gguf_vtype t) {
    return t == GGUF_U8 || t == GGUF_I8 || t == GGUF_U16 || t == GGUF_I16 || t == GGUF_U32 ||
           t == GGUF_I32 || t == GGUF_U64 || t == GGUF_I64 || t == GGUF_BOOL;
}
static int is_signed(enum gguf_vtype t) {
    return t == GGUF_I8 || t == GGUF_I16 || t == GGUF_I32 || t == GGUF_I64;
}

int gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return SKV_EMISSING;
    if (!is_int(kv->type) || (is_signed(kv->type) && kv->v.i < 0))
        return skv_error(SKV_EFORMAT, "%s: metadata '%s' is %s, expected a non-negative integer", f->path, key,
                         gguf_vtype_name(kv->type));
    *out = kv->v.u;
    return 0;
}

int gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out) {
    uint64_t v;
    int rc = gguf_get_u64(f, key, &v);
    if (rc) return rc;
    if (v > UINT32_MAX) return skv_error(SKV_EFORMAT, "%s: metadata '%s' = %llu is out of range", f->path, key,
                                         (unsigned long long)v);
    *out = (uint32_t)v;
    return 0;
}

int gguf_get_f32(const gguf_file *f, const char *key, float *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return SKV_EMISSING;
    if (kv->type == GGUF_F32 || kv->type == GGUF_F64) *out = (float)kv->v.f;
    else if (is_int(kv->type)) *out = is_signed(kv->type) ? (float)kv->v.i : (float)kv->v.u;
    else return skv_error(SKV_EFORMAT, "%s: metadata '%s' is %s, expected a number", f->path, key,
                          gguf_vtype_name(kv->type));
    return 0;
}

int gguf_get_bool(const gguf_file *f, const char *key, int *out) {
    const gguf_kv *kv = gguf_find(f, key);
    if (!kv) return SKV_EMISSING;
    if (!is_int(kv->type)) return skv_error(SKV_EFORMAT, "%s: metadata '%s' is %s, expected a bool", f->path, key,
                                            gguf_vtype_name(kv->type));
    *out = kv->v.u != 0;
    return 0;
}

const char *gguf_get_str(const gguf_file *f, const char *key) {
    const gguf_kv *kv = gguf_find(f, key);
    return kv && kv->type == GGUF_STRING ? kv->v.str.s : NULL;
}

double gguf_arr_num(const gguf_kv *kv, uint64_t i) {
    const uint8_t *p = (const uint8_t *)kv->arr + i * vtype_size[kv->arr_type];
    switch (kv->arr_type) {
    case GGUF_U8: case GGUF_BOOL: return *p;
    case GGUF_I8: return (int8_t)*p;
    case GGUF_U16: { uint16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_I16: { int16_t x; memcpy(&x, p, 2); return x; }
    case GGUF_U32: { uint32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_I32: { int32_t x; memcpy(&x, p, 4); return x; }
    case GGUF_F32: { float x; memcpy(&x, p, 4); return x; }
    case GGUF_U64: { uint64_t x; memcpy(&x, p, 8); return (double)x; }
    case GGUF_I64: { int64_t x; memcpy(&x, p, 8); return (double)x; }
    case GGUF_F64: { double x; memcpy(&x, p, 8); return x; }
    default: return 0;
    }
}
