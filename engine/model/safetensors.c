/* safetensors.c: maps safetensors shards and validates their headers.
 *
 * Each shard is mapped read-only; its JSON header is copied out, parsed with
 * cJSON and checked entry by entry before any tensor is exposed. All tensors
 * of all shards go into one array (file order) plus a name-sorted table used
 * for look-ups and for finding duplicate names. cJSON stays inside this file:
 * the public header exposes only plain C types. */
#include "safetensors.h"
#include "skv.h"

#include <cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER (100ull << 20)  /* the reference implementation's limit */
#define ST_MAX_INDEX (64ull << 20)
#define ST_MAX_EXACT 9007199254740992.0 /* 2^53: larger JSON numbers lose precision */

typedef struct {
    char *path;
    const uint8_t *map;   /* whole file */
    size_t size;
    const uint8_t *data;  /* data buffer, after the header */
    size_t data_len;
} st_shard;

struct st_set {
    st_shard *shards;     /* (n_shards) */
    int n_shards, cap_shards;
    st_tensor *t;         /* (n) in shard order, then header order */
    void **copy;          /* (n) owned aligned copy of t[i].data, or NULL */
    int n, cap;
    const st_tensor **sorted; /* (n) by name */
    size_t data_bytes;
};

static char *st_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = skv_malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static char *join_path(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = skv_malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t o = a;
    if (a && dir[a - 1] != '/') p[o++] = '/';
    memcpy(p + o, name, b + 1);
    return p;
}

/* Maps path read-only into sh (path copied); on error nothing is left mapped. */
static int map_file(const char *path, st_shard *sh) {
    memset(sh, 0, sizeof *sh);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return skv_error(errno == ENOENT ? SKV_EMISSING : SKV_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return skv_error(SKV_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return skv_error(SKV_EFORMAT, "%s: not a regular file (expected a .safetensors file)", path);
    }
    if (st.st_size < 8) {
        close(fd);
        return skv_error(SKV_EFORMAT, "%s: file is %lld bytes, shorter than the 8-byte header length (truncated?)",
                         path, (long long)st.st_size);
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) return skv_error(SKV_EIO, "%s: cannot map: %s", path, strerror(e));
    sh->path = st_strdup(path);
    if (!sh->path) {
        munmap(m, (size_t)st.st_size);
        return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    }
    sh->map = m;
    sh->size = (size_t)st.st_size;
    return 0;
}

static void unmap_shard(st_shard *sh) {
    if (sh->map) munmap((void *)sh->map, sh->size);
    free(sh->path);
    memset(sh, 0, sizeof *sh);
}

/* Maps dtype names to ggml types; *known says whether the name is a real
 * safetensors dtype that skv does not handle (for a better message). */
static int dtype_of(const char *s, enum ggml_type *t, int *known) {
    static const char *const others[] = {
        "F64", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL",
        "F8_E4M3", "F8_E5M2", "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4", "C64",
    };
    *known = 0;
    if (!strcmp(s, "F32")) *t = GGML_F32;
    else if (!strcmp(s, "F16")) *t = GGML_F16;
    else if (!strcmp(s, "BF16")) *t = GGML_BF16;
    else {
        for (size_t i = 0; i < sizeof others / sizeof others[0]; i++)
            if (!strcmp(s, others[i])) *known = 1;
        return -1;
    }
    return 0;
}

/* Reads a JSON number that must be a non-negative integer exactly representable. */
static int json_u64(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!isfinite(v) || v < 0 || v > ST_MAX_EXACT || v != floor(v)) return -1;
    *out = (uint64_t)v;
    return 0;
}

typedef struct { uint64_t begin, end; const char *name; } st_span;

static int grow_tensors(st_set *s) {
    if (s->n < s->cap) return 0;
    int cap = s->cap ? s->cap * 2 : 64;
    st_tensor *t = realloc(s->t, (size_t)cap * sizeof *t);
    if (!t) return -1;
    s->t = t;
    void **c = realloc(s->copy, (size_t)cap * sizeof *c);
    if (!c) return -1;
    s->copy = c;
    s->cap = cap;
    return 0;
}

/* Validates one header entry and appends it to the set. */
static int add_entry(st_set *s, const st_shard *sh, const cJSON *e, st_span *sp) {
    const char *path = sh->path, *name = e->string;
    if (!name[0]) return skv_error(SKV_EFORMAT, "%s: header has a tensor with an empty name", path);
    if (!cJSON_IsObject(e))
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': expected an object {dtype, shape, data_offsets}", path, name);

    const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(jd))
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'dtype' missing or not a string", path, name);
    enum ggml_type type = GGML_F32;
    int known;
    if (dtype_of(jd->valuestring, &type, &known))
        return skv_error(SKV_EUNSUPPORTED, "%s: tensor '%s': dtype '%s' is %s (expected F32, F16 or BF16)", path,
                         name, jd->valuestring, known ? "not supported" : "unknown");

    if (!cJSON_IsArray(js))
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'shape' missing or not an array", path, name);
    int nd = cJSON_GetArraySize(js);
    if (nd > ST_MAX_DIMS)
        return skv_error(SKV_EUNSUPPORTED, "%s: tensor '%s': field 'shape' has %d dims (at most %d supported)", path,
                         name, nd, ST_MAX_DIMS);
    int64_t shape[ST_MAX_DIMS] = {1, 1, 1, 1};
    uint64_t nelem = 1;
    int d = 0, overflow = 0;
    for (const cJSON *x = js->child; x; x = x->next, d++) {
        uint64_t v;
        if (json_u64(x, &v))
            return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'shape' dim %d is not a non-negative integer", path,
                             name, d);
        shape[d] = (int64_t)v;
        overflow |= __builtin_mul_overflow(nelem, v, &nelem);
    }
    size_t esize = ggml_type_size(type);
    uint64_t want;
    overflow |= __builtin_mul_overflow(nelem, (uint64_t)esize, &want);
    if (overflow)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'shape' gives a size that overflows", path, name);

    if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'data_offsets' missing or not an array [begin, end]",
                         path, name);
    uint64_t begin, end;
    if (json_u64(jo->child, &begin) || json_u64(jo->child->next, &end))
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'data_offsets' holds a value that is not a "
                         "non-negative integer", path, name);
    if (begin > end)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'data_offsets' [%llu, %llu] has begin > end", path,
                         name, (unsigned long long)begin, (unsigned long long)end);
    if (end > sh->data_len)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': field 'data_offsets' end %llu is past the data buffer "
                         "(%zu bytes; truncated?)", path, name, (unsigned long long)end, sh->data_len);
    if (end - begin != want)
        return skv_error(SKV_EFORMAT, "%s: tensor '%s': data_offsets span %llu bytes but shape x %s needs %llu",
                         path, name, (unsigned long long)(end - begin), jd->valuestring,
                         (unsigned long long)want);

    if (grow_tensors(s)) return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    st_tensor *t = &s->t[s->n];
    memset(t, 0, sizeof *t);
    s->copy[s->n] = NULL;
    t->name = st_strdup(name);
    if (!t->name) return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    s->n++; /* counted now so that st_close frees the name on a later error */
    t->type = type;
    t->n_dims = nd;
    memcpy(t->shape, shape, sizeof shape);
    t->nbytes = (size_t)want;
    t->file = sh->path;
    const uint8_t *p = sh->data + begin;
    if ((uintptr_t)p % esize) {
        /* safetensors does not align offsets; give the reader an aligned copy */
        void *c = skv_aligned_alloc(t->nbytes);
        if (!c) return skv_error(SKV_ENOMEM, "%s: tensor '%s': out of memory copying %zu bytes", path, name, t->nbytes);
        memcpy(c, p, t->nbytes);
        s->copy[s->n - 1] = c;
        p = c;
    }
    t->data = p;
    s->data_bytes += t->nbytes;
    *sp = (st_span){begin, end, t->name};
    return 0;
}

static int span_cmp(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end > y->end) - (x->end < y->end);
}

/* Rejects a shard whose tensors' byte ranges overlap (spans sorted in place). */
static int check_overlap(const st_shard *sh, st_span *v, int m) {
    qsort(v, (size_t)m, sizeof *v, span_cmp);
    uint64_t reach = 0;       /* furthest end so far, and whose */
    const char *who = NULL;
    for (int i = 0; i < m; i++) {
        if (v[i].begin == v[i].end) continue; /* empty tensors occupy nothing */
        if (who && v[i].begin < reach)
            return skv_error(SKV_EFORMAT, "%s: tensors '%s' and '%s': data_offsets overlap", sh->path, who,
                             v[i].name);
        if (v[i].end > reach) { reach = v[i].end; who = v[i].name; }
    }
    return 0;
}

/* Parses the header of a mapped shard and appends its tensors. */
static int parse_shard(st_set *s, st_shard *sh) {
    const char *path = sh->path;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | sh->map[i];
    if (n > ST_MAX_HEADER)
        return skv_error(SKV_EFORMAT, "%s: header length %llu is absurd (limit %llu bytes; not a safetensors file?)",
                         path, (unsigned long long)n, ST_MAX_HEADER);
    if (n > sh->size - 8)
        return skv_error(SKV_EFORMAT, "%s: header length %llu runs past the end of the file (%zu bytes; truncated?)",
                         path, (unsigned long long)n, sh->size);
    if (n < 2 || sh->map[8] != '{')
        return skv_error(SKV_EFORMAT, "%s: header does not start with '{' (expected a JSON object)", path);
    sh->data = sh->map + 8 + n;
    sh->data_len = sh->size - 8 - (size_t)n;

    /* cJSON wants a terminated string; the mapping has none after the header */
    char *text = skv_malloc((size_t)n + 1);
    if (!text) return skv_error(SKV_ENOMEM, "%s: out of memory for a %llu-byte header", path, (unsigned long long)n);
    memcpy(text, sh->map + 8, (size_t)n);
    text[n] = 0;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, (size_t)n, &end, 0);
    if (!root) {
        long at = end ? (long)(end - text) : -1;
        free(text);
        return skv_error(SKV_EFORMAT, "%s: header is not valid JSON (error near byte %ld of %llu)", path, at,
                         (unsigned long long)n);
    }
    for (const char *q = end; q < text + n; q++) {
        if (*q != ' ' && *q != '\t' && *q != '\n' && *q != '\r') {
            long at = (long)(q - text);
            cJSON_Delete(root);
            free(text);
            return skv_error(SKV_EFORMAT, "%s: header has bytes after its JSON object (at byte %ld)", path, at);
        }
    }
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return skv_error(SKV_EFORMAT, "%s: header is not a JSON object", path);
    }

    int rc = 0, m = 0;
    st_span *spans = skv_calloc((size_t)cJSON_GetArraySize(root), sizeof *spans);
    if (!spans) {
        cJSON_Delete(root);
        return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    }
    for (const cJSON *e = root->child; e && !rc; e = e->next) {
        if (!strcmp(e->string, "__metadata__")) {
            if (!cJSON_IsObject(e)) rc = skv_error(SKV_EFORMAT, "%s: field '__metadata__' is not an object", path);
            for (const cJSON *m = e->child; m && !rc; m = m->next)
                if (!cJSON_IsString(m))
                    rc = skv_error(SKV_EFORMAT, "%s: field '__metadata__.%s' is not a string", path, m->string);
            continue;
        }
        rc = add_entry(s, sh, e, &spans[m]);
        if (!rc) m++;
    }
    if (!rc) rc = check_overlap(sh, spans, m);
    free(spans);
    cJSON_Delete(root);
    return rc;
}

/* Maps path as a new shard of s and parses it. */
static int add_shard(st_set *s, const char *path) {
    if (s->n_shards == s->cap_shards) {
        int cap = s->cap_shards ? s->cap_shards * 2 : 4;
        st_shard *v = realloc(s->shards, (size_t)cap * sizeof *v);
        if (!v) return skv_error(SKV_ENOMEM, "%s: out of memory", path);
        s->shards = v;
        s->cap_shards = cap;
    }
    st_shard *sh = &s->shards[s->n_shards];
    int rc = map_file(path, sh);
    if (rc) return rc;
    s->n_shards++;
    return parse_shard(s, sh);
}

static int name_cmp(const void *a, const void *b) {
    return strcmp((*(const st_tensor *const *)a)->name, (*(const st_tensor *const *)b)->name);
}

/* Builds the sorted name table and rejects duplicate names. */
static int finish(st_set *s, const char *src) {
    if (s->n == 0) return skv_error(SKV_EFORMAT, "%s: holds no tensors", src);
    s->sorted = skv_calloc((size_t)s->n, sizeof *s->sorted);
    if (!s->sorted) return skv_error(SKV_ENOMEM, "%s: out of memory", src);
    for (int i = 0; i < s->n; i++) s->sorted[i] = &s->t[i];
    qsort(s->sorted, (size_t)s->n, sizeof *s->sorted, name_cmp);
    for (int i = 1; i < s->n; i++)
        if (!strcmp(s->sorted[i - 1]->name, s->sorted[i]->name)) {
            const char *f1 = s->sorted[i - 1]->file, *f2 = s->sorted[i]->file;
            if (f1 == f2) return skv_error(SKV_EFORMAT, "%s: tensor '%s' appears twice in its header", f1,
                                           s->sorted[i]->name);
            return skv_error(SKV_EFORMAT, "%s: tensor '%s' appears twice (in %s and %s)", src, s->sorted[i]->name,
                             f1, f2);
        }
    return 0;
}

/* Shard names in an index are relative file names; refuse ones that leave the directory. */
static int bad_shard_name(const char *f) {
    if (!f[0] || f[0] == '/') return 1;
    for (const char *p = f; (p = strstr(p, "..")); p += 2)
        if ((p == f || p[-1] == '/') && (p[2] == 0 || p[2] == '/')) return 1;
    return 0;
}

/* Opens the index at path: maps each shard once, then checks that every
 * weight_map entry is in the shard it names. */
static int open_index(st_set *s, const char *path) {
    char *text;
    size_t len;
    int rc = skv_read_file(path, ST_MAX_INDEX, &text, &len);
    if (rc) return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return skv_error(SKV_EFORMAT, "%s: not valid JSON", path);
    const cJSON *wm = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    if (!cJSON_IsObject(wm) || !wm->child) {
        cJSON_Delete(root);
        return skv_error(SKV_EFORMAT, "%s: field 'weight_map' missing, empty or not an object", path);
    }

    char *dir = st_strdup(path);
    if (!dir) { cJSON_Delete(root); return skv_error(SKV_ENOMEM, "%s: out of memory", path); }
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else strcpy(dir, ".");

    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        if (!cJSON_IsString(e) || bad_shard_name(e->valuestring)) {
            rc = skv_error(SKV_EFORMAT, "%s: field 'weight_map.%s' is not a shard file name in this directory",
                           path, e->string);
            break;
        }
        int seen = 0;
        for (const cJSON *p = wm->child; p != e && !seen; p = p->next)
            seen = !strcmp(p->valuestring, e->valuestring);
        if (seen) continue;
        char *sp = join_path(dir, e->valuestring);
        if (!sp) { rc = skv_error(SKV_ENOMEM, "%s: out of memory", path); break; }
        rc = add_shard(s, sp);
        if (rc == SKV_EMISSING)
            rc = skv_error(SKV_EMISSING, "%s: weight_map names shard '%s', which is missing (%s)", path,
                           e->valuestring, sp);
        free(sp);
    }
    if (!rc) rc = finish(s, path);
    for (const cJSON *e = wm->child; e && !rc; e = e->next) {
        const st_tensor *t = st_find(s, e->string);
        const char *f = t ? strrchr(t->file, '/') : NULL;
        f = f ? f + 1 : t ? t->file : NULL;
        if (!t || strcmp(f, e->valuestring))
            rc = skv_error(SKV_EFORMAT, "%s: weight_map puts tensor '%s' in '%s', but %s", path, e->string,
                           e->valuestring, t ? "it is in another shard" : "that shard does not hold it");
    }
    free(dir);
    cJSON_Delete(root);
    return rc;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

int st_open_file(const char *path, st_set **out) {
    *out = NULL;
    st_set *s = skv_calloc(1, sizeof *s);
    if (!s) return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    int rc;
    if (ends_with(path, ".json")) {
        rc = open_index(s, path);
    } else {
        rc = add_shard(s, path);
        if (!rc) rc = finish(s, path);
    }
    if (rc) {
        st_close(s);
        return rc;
    }
    *out = s;
    return 0;
}

/* Picks the weights file of a directory (see st_open_dir) into *picked. */
static int pick_in_dir(const char *dir, char **picked) {
    static const char *const names[] = {"model.safetensors", "model.safetensors.index.json"};
    struct stat st;
    for (int i = 0; i < 2; i++) {
        char *p = join_path(dir, names[i]);
        if (!p) return skv_error(SKV_ENOMEM, "%s: out of memory", dir);
        if (stat(p, &st) == 0) { *picked = p; return 0; }
        free(p);
    }
    DIR *d = opendir(dir);
    if (!d) return skv_error(errno == ENOENT ? SKV_EMISSING : SKV_EIO, "%s: cannot open directory: %s", dir,
                             strerror(errno));
    char *found = NULL;
    int count = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!ends_with(e->d_name, ".safetensors") || e->d_name[0] == '.') continue;
        if (++count == 1) found = join_path(dir, e->d_name);
    }
    closedir(d);
    if (count == 1 && !found) return skv_error(SKV_ENOMEM, "%s: out of memory", dir);
    if (count == 1) { *picked = found; return 0; }
    free(found);
    if (count == 0)
        return skv_error(SKV_EMISSING, "%s: no model.safetensors, model.safetensors.index.json or *.safetensors", dir);
    return skv_error(SKV_EMISSING, "%s: %d .safetensors files but no model.safetensors.index.json to order them",
                     dir, count);
}

int st_open_dir(const char *dir, st_set **out) {
    *out = NULL;
    struct stat st;
    if (stat(dir, &st) != 0)
        return skv_error(errno == ENOENT ? SKV_EMISSING : SKV_EIO, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode)) return skv_error(SKV_EINVAL, "%s: not a directory", dir);
    char *path = NULL;
    int rc = pick_in_dir(dir, &path);
    if (rc) return rc;
    rc = st_open_file(path, out);
    free(path);
    return rc;
}

void st_close(st_set *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        free(s->t[i].name);
        free(s->copy[i]);
    }
    for (int i = 0; i < s->n_shards; i++) unmap_shard(&s->shards[i]);
    free(s->t);
    free(s->copy);
    free(s->sorted);
    free(s->shards);
    free(s);
}

static int find_cmp(const void *key, const void *elem) {
    return strcmp(key, (*(const st_tensor *const *)elem)->name);
}

const st_tensor *st_find(const st_set *s, const char *name) {
    if (!s->sorted) return NULL;
    const st_tensor *const *p = bsearch(name, s->sorted, (size_t)s->n, sizeof *s->sorted, find_cmp);
    return p ? *p : NULL;
}

int st_count(const st_set *s) { return s->n; }

const st_tensor *st_get(const st_set *s, int i) { return i >= 0 && i < s->n ? &s->t[i] : NULL; }

int st_n_files(const st_set *s) { return s->n_shards; }

size_t st_data_bytes(const st_set *s) { return s->data_bytes; }
