/* trace.c: the trace file writer and reader (layout in docs/TRACE.md).
 *
 * Records are encoded field by field from the event schema (probe.h), so the
 * writer and the reader share one description of every kind. The writer
 * streams records into an unlinked temporary file while the run goes on; at
 * close, when the counts are known, it writes header, metadata, the records
 * and the footer into a second temporary file next to the target and renames
 * it into place. The reader maps the file, checks header, footer, checksum,
 * metadata and the framing of every record at open, then decodes one record
 * per trace_next into a scratch buffer. */
#include "trace.h"

#include "skv.h"

#include <cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#ifndef SKV_VERSION
#define SKV_VERSION "0.1.0-dev"
#endif

static const char magic_head[8] = { 'S', 'K', 'V', 'T', 'R', 'A', 'C', 'E' };
static const char magic_end[8] = { 'S', 'K', 'V', 'T', 'E', 'N', 'D', 0 };
/* Version 2 (read only): header with the metadata first, records, footer. */
#define HEADER_BYTES 24u   /* magic, u32 version, u32 flags, u64 json length */
#define FOOTER_BYTES 20u   /* magic, u64 record count, u32 crc */
#define RECORD_HEAD 8u     /* u32 kind, u32 payload length */
/* Version 3 (written): header, records each followed by its CRC, a metadata
 * record and a footer, appended in that order as the run goes. */
#define V3_HEADER 16u      /* magic, u32 version, u32 flags */
#define V3_FOOTER 28u      /* magic, u64 record count, u64 offset of the metadata record, u32 crc */
#define RECORD_CRC 4u      /* u32 crc of the record's head and payload (version 3) */
#define META_KIND 0x7FFFFFFFu
#define SYNC_SECONDS 2.0   /* fdatasync at a step boundary at most this often */

static __thread char trace_notice_buf[640];
const char *trace_last_notice(void) { return trace_notice_buf; }

/* ---- CRC-32, slice by 8 ------------------------------------------------- */

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_tab[0][i] = c;
    }
    for (int i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++) crc_tab[t][i] = (crc_tab[t - 1][i] >> 8) ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get_u64(const unsigned char *p) { return get_u32(p) | (uint64_t)get_u32(p + 4) << 32; }

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void put_u64(unsigned char *p, uint64_t v) {
    put_u32(p, (uint32_t)v);
    put_u32(p + 4, (uint32_t)(v >> 32));
}

int trace_utf8_len(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    int len = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
    if (!len || (size_t)len > n || (len == 2 && c < 0xC2)) return 0;
    for (int i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    if (len == 3 && ((c == 0xE0 && s[1] < 0xA0) || (c == 0xED && s[1] >= 0xA0))) return 0;
    if (len == 4 && ((c == 0xF0 && s[1] < 0x90) || c > 0xF4 || (c == 0xF4 && s[1] >= 0x90))) return 0;
    return len;
}

uint32_t trace_crc32(uint32_t crc, const void *data, size_t n) {
    pthread_once(&crc_once, crc_init);
    const unsigned char *p = data;
    crc = ~crc;
    while (n >= 8) {
        uint32_t lo = get_u32(p) ^ crc, hi = get_u32(p + 4);
        crc = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff] ^ crc_tab[5][(lo >> 16) & 0xff] ^
              crc_tab[4][lo >> 24] ^ crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff] ^
              crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) crc = crc_tab[0][(crc ^ *p++) & 0xff] ^ (crc >> 8);
    return ~crc;
}

/* n 32-bit values from host order at src to little-endian bytes at dst. */
static void to_le32(unsigned char *dst, const void *src, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, src, n * 4);
#else
    const unsigned char *s = src;
    for (size_t i = 0; i < n; i++) {
        uint32_t v;
        memcpy(&v, s + 4 * i, 4);
        put_u32(dst + 4 * i, v);
    }
#endif
}

/* n little-endian 32-bit values at src to host order at dst. */
static void from_le32(void *dst, const unsigned char *src, size_t n) {
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    memcpy(dst, src, n * 4);
#else
    unsigned char *d = dst;
    for (size_t i = 0; i < n; i++) {
        uint32_t v = get_u32(src + 4 * i);
        memcpy(d + 4 * i, &v, 4);
    }
#endif
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

static const void *field_ptr(const probe_event *e, const probe_field *f) {
    const void *p;
    memcpy(&p, (const char *)e + f->off, sizeof p);
    return p;
}

static int field_int(const probe_event *e, const probe_field *f) {
    int v;
    memcpy(&v, (const char *)e + f->off, sizeof v);
    return v;
}

/* ---- encoding ------------------------------------------------------------ */

#define TRACE_MAX_POLICIES 16 /* distinct "policy: options" kept for the metadata */

typedef struct {
    unsigned char *p;   /* (cap) */
    size_t n, cap;
} wbuf;

static int wb_reserve(wbuf *b, size_t extra) {
    if (b->n + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->n + extra) cap *= 2;
    unsigned char *p = realloc(b->p, cap);
    if (!p) return SKV_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

/* The whole record (header and payload) for ev into b. */
static int encode_event(wbuf *b, const probe_event *ev) {
    int nf;
    const probe_field *fs = probe_schema(ev->kind, &nf);
    b->n = 0;
    if (wb_reserve(b, RECORD_HEAD)) return SKV_ENOMEM;
    put_u32(b->p, (uint32_t)ev->kind);
    b->n = RECORD_HEAD;
    for (int i = 0; i < nf; i++) {
        const probe_field *f = &fs[i];
        switch (f->type) {
        case PROBE_F_I32:
        case PROBE_F_F32:
            if (wb_reserve(b, 4)) return SKV_ENOMEM;
            to_le32(b->p + b->n, (const char *)ev + f->off, 1);
            b->n += 4;
            break;
        case PROBE_F_F64:
        case PROBE_F_U64: {
            uint64_t v;
            memcpy(&v, (const char *)ev + f->off, 8);
            if (wb_reserve(b, 8)) return SKV_ENOMEM;
            put_u64(b->p + b->n, v);
            b->n += 8;
            break;
        }
        case PROBE_F_STR: {
            const char *s = field_ptr(ev, f);
            size_t len = s ? strlen(s) : 0;
            if (len > UINT32_MAX - 8 || wb_reserve(b, 4 + len)) return SKV_ENOMEM;
            put_u32(b->p + b->n, (uint32_t)len);
            if (len) memcpy(b->p + b->n + 4, s, len);
            b->n += 4 + len;
            break;
        }
        case PROBE_F_BYTES:
        case PROBE_F_I32S:
        case PROBE_F_F32S: {
            size_t cnt = (size_t)field_int(ev, &fs[f->count]);
            size_t bytes = f->type == PROBE_F_BYTES ? cnt : cnt * 4;
            if (wb_reserve(b, bytes)) return SKV_ENOMEM;
            if (f->type == PROBE_F_BYTES) {
                if (cnt) memcpy(b->p + b->n, field_ptr(ev, f), cnt);
            } else if (cnt) {
                to_le32(b->p + b->n, field_ptr(ev, f), cnt);
            }
            b->n += bytes;
            break;
        }
        }
    }
    if (b->n - RECORD_HEAD > UINT32_MAX) return SKV_ERANGE;
    put_u32(b->p + 4, (uint32_t)(b->n - RECORD_HEAD));
    return 0;
}

/* ---- writer -------------------------------------------------------------- */

struct trace_writer {
    char *path;                 /* the target */
    char *tmp;                  /* the file written when the target existed (renamed at close), or NULL */
    FILE *f;                    /* the file the records go to: path itself, or tmp */
    char *fbuf;                 /* its stdio buffer */
    probe_sub *sub;
    wbuf enc;
    uint64_t n_records, count[PROBE_KIND_COUNT], offset;
    uint32_t crc;               /* of every byte written so far */
    double last_sync;
    probe_event *run;           /* the first PROBE_RUN, for the metadata */
    char policies[TRACE_MAX_POLICIES][160]; /* every run event's "policy: options" (compare mode: one a lane) */
    int n_policies;
    int n_lanes, batched;       /* lane events: the most lanes named; teacher "" (a batch's sequences) */
    cJSON *notes;               /* trace_writer_note's strings, or NULL */
    int n_steps, n_layers, n_heads;
    int err;                    /* first error met while recording */
    char msg[512];
};

#define BODY_BUF (1u << 20)

/* Remembers the first error (message from skv_last_error) for close. */
static int writer_fail(trace_writer *w, int rc) {
    if (!w->err) {
        w->err = rc;
        snprintf(w->msg, sizeof w->msg, "%s", skv_last_error());
    }
    return rc;
}

static void writer_callback(const probe_event *ev, void *user) { trace_writer_write(user, ev); }

/* Writes n bytes and folds them into the running CRC. */
static int writer_put(trace_writer *w, const void *p, size_t n) {
    if (fwrite(p, 1, n, w->f) != n)
        return writer_fail(w, skv_error(SKV_EIO, "%s: cannot write the trace: %s", w->path, strerror(errno)));
    w->crc = trace_crc32(w->crc, p, n);
    w->offset += n;
    return 0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void writer_free(trace_writer *w) {
    if (w->sub) probe_unsubscribe(w->sub);
    if (w->f) fclose(w->f);
    free(w->fbuf);
    free(w->enc.p);
    free(w->run);
    cJSON_Delete(w->notes);
    free(w->tmp);
    free(w->path);
    free(w);
}

int trace_writer_open(const char *path, probe_bus *bus, trace_writer **out) {
    *out = NULL;
    trace_writer *w = skv_calloc(1, sizeof *w);
    if (!w) return skv_error(SKV_ENOMEM, "%s: out of memory for the trace writer", path);
    w->path = strdup(path);
    w->fbuf = malloc(BODY_BUF);
    if (!w->path || !w->fbuf) {
        writer_free(w);
        return skv_error(SKV_ENOMEM, "%s: out of memory for the trace writer", path);
    }
    /* A new file is written in place, so a run that dies leaves a trace
     * readable up to its last complete step; an existing one is replaced
     * only at close, from a file beside it. */
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0 && errno == EEXIST) {
        fd = skv_temp_beside(path, ".rec.", &w->tmp);
        if (fd < 0) {
            writer_free(w);
            return fd;
        }
    } else if (fd < 0) {
        int e = errno;
        writer_free(w);
        return skv_error(SKV_EIO, "%s: cannot create the trace: %s", path, strerror(e));
    }
    w->f = fdopen(fd, "wb");
    if (!w->f) {
        int e = errno;
        close(fd);
        if (!w->tmp) unlink(path);
        else unlink(w->tmp);
        writer_free(w);
        return skv_error(SKV_EIO, "%s: cannot open the trace: %s", path, strerror(e));
    }
    setvbuf(w->f, w->fbuf, _IOFBF, BODY_BUF);
    unsigned char head[V3_HEADER];
    memcpy(head, magic_head, 8);
    put_u32(head + 8, TRACE_VERSION);
    put_u32(head + 12, 0);
    w->last_sync = now_s();
    if (writer_put(w, head, sizeof head) || fflush(w->f)) {
        int rc = skv_error(SKV_EIO, "%s: cannot write the trace: %s", path, strerror(errno));
        trace_writer_abort(w);
        return rc;
    }
    if (bus) {
        int rc = probe_subscribe_callback(bus, ~0u, writer_callback, w, &w->sub);
        if (rc) {
            trace_writer_abort(w);
            return rc;
        }
    }
    *out = w;
    return 0;
}

int trace_writer_note(trace_writer *w, const char *key, const char *value) {
    if (!w->notes && !(w->notes = cJSON_CreateObject())) return skv_error(SKV_ENOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(w->notes, key);
    return cJSON_AddStringToObject(w->notes, key, value) ? 0 : skv_error(SKV_ENOMEM, "out of memory");
}

/* A lane event into the lanes seen: the most named, and whether they are a
 * batch's sequences (teacher ""). */
static void lane_note(const probe_ev_lane *e, int *n_lanes, int *batched) {
    if (e->n_lanes > *n_lanes) *n_lanes = e->n_lanes;
    *batched = !e->teacher || !e->teacher[0];
}

/* Adds run's "policy: options" to the list (n) unless it is there; its
 * index in the list, -1 when the list is full. */
static int policy_note(char (*list)[160], int *n, const probe_ev_run *run) {
    char one[160];
    snprintf(one, sizeof one, "%s%s%s", run->kv_policy ? run->kv_policy : "?",
             run->kv_opts && *run->kv_opts ? ": " : "", run->kv_opts ? run->kv_opts : "");
    for (int i = 0; i < *n; i++)
        if (!strcmp(list[i], one)) return i;
    if (*n == TRACE_MAX_POLICIES) return -1;
    snprintf(list[*n], sizeof list[0], "%s", one);
    return (*n)++;
}

/* Keeps the largest step, layer and head seen, for the metadata counts. */
static void writer_see(trace_writer *w, const probe_event *ev) {
    int nf;
    const probe_field *fs = probe_schema(ev->kind, &nf);
    for (int i = 0; i < nf; i++) {
        if (fs[i].type != PROBE_F_I32) continue;
        int v = field_int(ev, &fs[i]);
        /* a token counts no step: the run's last is fed by none (the store's rule) */
        if (!strcmp(fs[i].name, "step") && ev->kind != PROBE_TOKEN && v + 1 > w->n_steps) w->n_steps = v + 1;
        if (!strcmp(fs[i].name, "layer") && v + 1 > w->n_layers) w->n_layers = v + 1;
        if (!strcmp(fs[i].name, "head") && v + 1 > w->n_heads) w->n_heads = v + 1;
    }
}

int trace_writer_write(trace_writer *w, const probe_event *ev) {
    if (w->err) return w->err;
    int rc = probe_event_check(ev);
    if (rc) return writer_fail(w, skv_error(rc, "%s: %s", w->path, skv_last_error()));
    rc = encode_event(&w->enc, ev);
    if (rc || wb_reserve(&w->enc, RECORD_CRC))
        return writer_fail(w, skv_error(rc ? rc : SKV_ENOMEM, "%s: cannot encode a %s event (out of memory or over 4 GiB)",
                                        w->path, probe_kind_name(ev->kind)));
    put_u32(w->enc.p + w->enc.n, trace_crc32(0, w->enc.p, w->enc.n));
    if ((rc = writer_put(w, w->enc.p, w->enc.n + RECORD_CRC))) return rc;
    if (ev->kind == PROBE_RUN && !w->run && !(w->run = probe_event_dup(ev)))
        return writer_fail(w, skv_error(SKV_ENOMEM, "%s: out of memory", w->path));
    if (ev->kind == PROBE_RUN) policy_note(w->policies, &w->n_policies, &ev->run);
    if (ev->kind == PROBE_LANE) lane_note(&ev->lane, &w->n_lanes, &w->batched);
    w->n_records++;
    w->count[ev->kind]++;
    writer_see(w, ev);
    /* A finished step reaches the file (a kill loses nothing before it) and,
     * every few seconds, the disk (a power loss loses at most those). */
    if (ev->kind == PROBE_STEP) {
        if (fflush(w->f))
            return writer_fail(w, skv_error(SKV_EIO, "%s: cannot write the trace: %s", w->path, strerror(errno)));
        double t = now_s();
        if (t - w->last_sync >= SYNC_SECONDS) {
            w->last_sync = t;
            fdatasync(fileno(w->f));
        }
    }
    return 0;
}

void trace_writer_abort(trace_writer *w) {
    if (!w) return;
    if (w->sub) {
        probe_unsubscribe(w->sub);
        w->sub = NULL;
    }
    if (w->f) fclose(w->f);
    w->f = NULL;
    unlink(w->tmp ? w->tmp : w->path);
    writer_free(w);
}

/* The metadata block as a cJSON object (caller deletes), or NULL. */
static cJSON *writer_meta(const trace_writer *w) {
    cJSON *m = cJSON_CreateObject();
    if (!m) return NULL;
    cJSON_AddStringToObject(m, "format", "skv-trace");
    cJSON_AddNumberToObject(m, "format_version", TRACE_VERSION);
    cJSON_AddStringToObject(m, "skv_version", SKV_VERSION);
    cJSON *c = cJSON_AddObjectToObject(m, "created");
    if (c) {
        time_t now = time(NULL);
        struct tm tm;
        char buf[64] = "";
        if (gmtime_r(&now, &tm)) strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
        cJSON_AddStringToObject(c, "utc", buf);
        cJSON_AddNumberToObject(c, "unix_time", (double)now);
        char host[256] = "";
        gethostname(host, sizeof host - 1);
        cJSON_AddStringToObject(c, "host", host);
        cJSON_AddNumberToObject(c, "pid", (double)getpid());
    }
    if (w->run) {
        cJSON *r = cJSON_AddObjectToObject(m, "run");
        int nf;
        const probe_field *fs = probe_schema(PROBE_RUN, &nf);
        for (int i = 0; r && i < nf; i++) {
            if (fs[i].type == PROBE_F_I32) {
                cJSON_AddNumberToObject(r, fs[i].name, field_int(w->run, &fs[i]));
            } else if (fs[i].type == PROBE_F_STR) {
                const char *s = field_ptr(w->run, &fs[i]);
                cJSON_AddStringToObject(r, fs[i].name, s ? s : "");
            }
        }
    } else {
        cJSON_AddNullToObject(m, "run");
    }
    /* Every policy of the run: compare mode writes a run event per lane. */
    cJSON *pl = cJSON_AddArrayToObject(m, "policies");
    for (int i = 0; pl && i < w->n_policies; i++) cJSON_AddItemToArray(pl, cJSON_CreateString(w->policies[i]));
    /* Lanes: one a policy in compare mode, one a sequence in a batch. */
    cJSON_AddNumberToObject(m, "lanes", w->n_lanes > 1 ? w->n_lanes : 1);
    cJSON_AddBoolToObject(m, "batch", w->n_lanes > 1 && w->batched);
    cJSON *k = cJSON_AddObjectToObject(m, "kinds");
    for (int i = 1; k && i < PROBE_KIND_COUNT; i++)
        if (w->count[i]) cJSON_AddNumberToObject(k, probe_kind_name((probe_kind)i), (double)w->count[i]);
    cJSON_AddNumberToObject(m, "records", (double)w->n_records);
    int layers = w->run && w->run->run.n_layers > 0 ? w->run->run.n_layers : w->n_layers;
    int heads = w->run && w->run->run.n_kv_heads > 0 ? w->run->run.n_kv_heads : w->n_heads;
    cJSON_AddNumberToObject(m, "steps", w->n_steps);
    cJSON_AddNumberToObject(m, "layers", layers);
    cJSON_AddNumberToObject(m, "kv_heads", heads);
    const cJSON *it;
    cJSON_ArrayForEach(it, w->notes)
        if (!cJSON_GetObjectItemCaseSensitive(m, it->string)) cJSON_AddStringToObject(m, it->string, it->valuestring);
    return m;
}

int trace_writer_close(trace_writer *w) {
    if (!w) return 0;
    if (w->sub) {
        probe_unsubscribe(w->sub);
        w->sub = NULL;
    }
    int rc = w->err ? skv_error(w->err, "%s", w->msg) : 0;
    if (!rc) {
        /* the metadata record, then the footer */
        cJSON *m = writer_meta(w);
        char *json = m ? cJSON_PrintUnformatted(m) : NULL;
        cJSON_Delete(m);
        size_t jn = json ? strlen(json) : 0;
        if (!json || jn > UINT32_MAX - 16) rc = skv_error(SKV_ENOMEM, "%s: out of memory for the metadata", w->path);
        uint64_t meta_off = w->offset;
        if (!rc) {
            unsigned char head[RECORD_HEAD], tail[RECORD_CRC];
            put_u32(head, META_KIND);
            put_u32(head + 4, (uint32_t)jn);
            uint32_t c = trace_crc32(trace_crc32(0, head, sizeof head), json, jn);
            put_u32(tail, c);
            rc = writer_put(w, head, sizeof head) || writer_put(w, json, jn) || writer_put(w, tail, sizeof tail);
        }
        free(json);
        if (!rc) {
            unsigned char foot[V3_FOOTER];
            memcpy(foot, magic_end, 8);
            put_u64(foot + 8, w->n_records);
            put_u64(foot + 16, meta_off);
            put_u32(foot + 24, trace_crc32(w->crc, foot, 24));
            if (fwrite(foot, 1, sizeof foot, w->f) != sizeof foot || fflush(w->f) || fsync(fileno(w->f)))
                rc = skv_error(SKV_EIO, "%s: cannot write the trace: %s", w->path, strerror(errno));
        }
        if (rc) rc = w->err ? skv_error(w->err, "%s", w->msg) : rc;
    }
    if (fclose(w->f) && !rc) rc = skv_error(SKV_EIO, "%s: cannot write the trace: %s", w->path, strerror(errno));
    w->f = NULL;
    if (!rc && w->tmp) {
        rc = skv_place(w->tmp, w->path, 1);
        if (!rc) {
            free(w->tmp);
            w->tmp = NULL;
        }
    }
    if (rc && w->err == SKV_EIO && !w->tmp) {
        /* recording failed (a full disk): what was written stays, a trace cut
         * short that loads up to its last complete step */
        rc = skv_error(w->err, "%s; the trace is kept, cut short at its last complete step", w->msg);
    } else if (rc) {
        unlink(w->tmp ? w->tmp : w->path);
    }
    writer_free(w);
    return rc;
}

/* ---- reader ----------------------------------------------------------------- */

struct trace_reader {
    char *path;
    const unsigned char *map;   /* (size) the whole file */
    size_t size;
    size_t rec_begin, rec_end;  /* the records lie in [rec_begin, rec_end) */
    size_t pos;                 /* next record */
    int version;
    size_t rec_tail;            /* bytes after each payload: its CRC in version 3, none in 2 */
    uint64_t n_records, index;  /* records in the file, next record's index */
    uint64_t count[PROBE_KIND_COUNT], n_unknown;
    char *json;                 /* metadata text, NUL-terminated */
    cJSON *meta;
    probe_event ev;
    char *scratch;              /* (scratch_cap) arrays of ev */
    size_t scratch_cap;
};

static void reader_free(trace_reader *r) {
    if (!r) return;
    if (r->map) munmap((void *)r->map, r->size);
    cJSON_Delete(r->meta);
    free(r->json);
    free(r->scratch);
    free(r->path);
    free(r);
}

void trace_close(trace_reader *r) { reader_free(r); }

/* A one-line SKV_EFORMAT error about a file. */
static int file_error(int code, const char *path, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int file_error(int code, const char *path, const char *fmt, ...) {
    char msg[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return skv_error(code, "%s: %s", path, msg);
}

static const char *kind_label(uint32_t kind) {
    return kind > 0 && kind < PROBE_KIND_COUNT ? probe_kind_name((probe_kind)kind) : "unknown kind";
}

/* The step of a PROBE_STEP payload (its first field), or -1. */
static int payload_step(const unsigned char *p, uint32_t len) { return len >= 4 ? (int)get_u32(p) : -1; }

/* Version 3: the records are walked and each one's CRC checked. A file whose
 * footer and metadata record are intact holds a complete run. Otherwise the
 * recording was interrupted (or its end is damaged): the reader keeps the
 * records up to the last complete step (everything before the last intact
 * step record), or, when no step was recorded, every intact record, and
 * says so in trace_last_notice(). A record damaged in the middle ends the
 * intact part the same way. */
static int reader_check_v3(trace_reader *r) {
    const char *path = r->path;
    const unsigned char *m = r->map;
    size_t size = r->size, pos = V3_HEADER, end_ok = V3_HEADER, step_end = 0;
    uint64_t n = 0, n_at_step = 0, n_ok = 0;
    uint64_t cnt[PROBE_KIND_COUNT] = {0}, cnt_step[PROBE_KIND_COUNT] = {0}, unk = 0, unk_step = 0;
    int last_step = -1, complete = 0;
    const char *why = "the recording was interrupted before it closed";
    char whybuf[200];
    size_t meta_off = 0;
    uint32_t meta_len = 0;
    /* the footer, when there is one */
    if (size >= V3_HEADER + V3_FOOTER && !memcmp(m + size - V3_FOOTER, magic_end, 8) &&
        get_u32(m + size - 4) == trace_crc32(0, m, size - 4)) {
        uint64_t mo = get_u64(m + size - V3_FOOTER + 16);
        if (mo >= V3_HEADER && mo <= size - V3_FOOTER - RECORD_HEAD - RECORD_CRC &&
            get_u32(m + mo) == META_KIND && get_u32(m + mo + 4) == size - V3_FOOTER - mo - RECORD_HEAD - RECORD_CRC) {
            complete = 1;
            meta_off = (size_t)mo;
            meta_len = get_u32(m + mo + 4);
        } else {
            why = "its footer points at no metadata record";
        }
    } else if (size >= V3_HEADER + V3_FOOTER && !memcmp(m + size - V3_FOOTER, magic_end, 8)) {
        why = "its checksum does not match (the file is damaged)";
    }
    size_t stop = complete ? meta_off : size;
    while (pos < stop) {
        if (stop - pos < RECORD_HEAD + RECORD_CRC) {
            snprintf(whybuf, sizeof whybuf, "record %" PRIu64 " at byte %zu is cut off", n, pos);
            why = whybuf;
            complete = 0; /* stray bytes before the metadata record: the records do not end where it begins */
            break;
        }
        uint32_t kind = get_u32(m + pos), len = get_u32(m + pos + 4);
        if (kind == META_KIND && !complete) {
            if (!strcmp(why, "the recording was interrupted before it closed")) why = "its footer is missing or damaged";
            break;
        }
        if (len > stop - pos - RECORD_HEAD - RECORD_CRC) {
            snprintf(whybuf, sizeof whybuf, "record %" PRIu64 " at byte %zu runs past the %s", n, pos,
                     complete ? "records" : "end of the file");
            why = whybuf;
            complete = 0;
            break;
        }
        if (get_u32(m + pos + RECORD_HEAD + len) != trace_crc32(0, m + pos, RECORD_HEAD + (size_t)len)) {
            snprintf(whybuf, sizeof whybuf, "record %" PRIu64 " (%s) at byte %zu is damaged (checksum mismatch)", n,
                     kind_label(kind), pos);
            why = whybuf;
            complete = 0;
            break;
        }
        pos += RECORD_HEAD + (size_t)len + RECORD_CRC;
        n++;
        if (kind > 0 && kind < PROBE_KIND_COUNT) cnt[kind]++;
        else unk++;
        if (kind == PROBE_STEP) {
            step_end = pos;
            n_at_step = n;
            memcpy(cnt_step, cnt, sizeof cnt);
            unk_step = unk;
            last_step = payload_step(m + pos - RECORD_CRC - len, len);
        }
        end_ok = pos;
        n_ok = n;
    }
    r->rec_begin = V3_HEADER;
    r->rec_tail = RECORD_CRC;
    if (complete) {
        if (n != get_u64(m + size - V3_FOOTER + 8))
            return file_error(SKV_EFORMAT, path, "footer says %" PRIu64 " records, the file holds %" PRIu64,
                              get_u64(m + size - V3_FOOTER + 8), n);
        if (get_u32(m + meta_off + RECORD_HEAD + meta_len) != trace_crc32(0, m + meta_off, RECORD_HEAD + (size_t)meta_len))
            return file_error(SKV_EFORMAT, path, "the metadata record is damaged (checksum mismatch)");
        r->rec_end = meta_off;
        r->n_records = n;
        memcpy(r->count, cnt, sizeof cnt);
        r->n_unknown = unk;
        r->json = malloc((size_t)meta_len + 1);
        if (!r->json) return file_error(SKV_ENOMEM, path, "out of memory for the metadata");
        memcpy(r->json, m + meta_off + RECORD_HEAD, meta_len);
        r->json[meta_len] = 0;
        r->meta = cJSON_ParseWithLength(r->json, meta_len);
        if (!r->meta || !cJSON_IsObject(r->meta))
            return file_error(SKV_EFORMAT, path, "metadata is not a valid JSON object");
        return 0;
    }
    /* cut short: keep what is intact, up to the last complete step */
    if (step_end) {
        r->rec_end = step_end;
        r->n_records = n_at_step;
        memcpy(r->count, cnt_step, sizeof cnt_step);
        r->n_unknown = unk_step;
    } else {
        r->rec_end = end_ok;
        r->n_records = n_ok;
        memcpy(r->count, cnt, sizeof cnt);
        r->n_unknown = unk;
    }
    if (last_step >= 0)
        snprintf(trace_notice_buf, sizeof trace_notice_buf,
                 "%s: cut short: %s; loaded what is intact up to the end of decode step %d (%" PRIu64 " records)", path,
                 why, last_step, r->n_records);
    else
        snprintf(trace_notice_buf, sizeof trace_notice_buf,
                 "%s: cut short: %s before any decode step finished; loaded the %" PRIu64 " intact records", path, why,
                 r->n_records);
    r->json = strdup("{\"format\": \"skv-trace\", \"format_version\": 3, \"cut_short\": true}");
    r->meta = r->json ? cJSON_Parse(r->json) : NULL;
    if (!r->meta) return file_error(SKV_ENOMEM, path, "out of memory");
    return 0;
}

/* Checks header, footer, checksum and metadata of r's mapped file. */
static int reader_check_file(trace_reader *r) {
    const char *path = r->path;
    const unsigned char *m = r->map;
    size_t size = r->size;
    size_t lead = size < 8 ? size : 8;
    if (memcmp(m, magic_head, lead))
        return file_error(SKV_EFORMAT, path, "not an skv trace (the file does not start with \"SKVTRACE\")");
    if (size < V3_HEADER)
        return file_error(SKV_EFORMAT, path, "truncated: %zu bytes, a trace has at least %u", size, V3_HEADER);
    uint32_t version = get_u32(m + 8);
    if (version == 1)
        return file_error(SKV_EUNSUPPORTED, path, "trace format version 1 was written before the KV policy registry "
                          "(run and selection records changed); this skv reads versions 2 and %d: record the run again",
                          TRACE_VERSION);
    if (version != 2 && version != TRACE_VERSION)
        return file_error(SKV_EUNSUPPORTED, path, "trace format version %u is not supported (this skv reads versions 2 "
                          "and %d)", version, TRACE_VERSION);
    r->version = (int)version;
    if (version == TRACE_VERSION) return reader_check_v3(r);
    if (size < HEADER_BYTES + FOOTER_BYTES)
        return file_error(SKV_EFORMAT, path, "truncated: %zu bytes, a version 2 trace has at least %u", size,
                          HEADER_BYTES + FOOTER_BYTES);
    if (memcmp(m + size - FOOTER_BYTES, magic_end, 8))
        return file_error(SKV_EFORMAT, path, "truncated or unfinished: no end marker in the last %u bytes",
                          FOOTER_BYTES);
    uint64_t jn = get_u64(m + 16);
    if (jn > size - HEADER_BYTES - FOOTER_BYTES)
        return file_error(SKV_EFORMAT, path, "metadata length %" PRIu64 " runs past the end of the file (%zu bytes)",
                          jn, size);
    uint32_t want = get_u32(m + size - 4), got = trace_crc32(0, m, size - 4);
    if (want != got)
        return file_error(SKV_EFORMAT, path, "checksum mismatch (footer says %08x, contents give %08x): the file is corrupt",
                          want, got);
    r->json = malloc((size_t)jn + 1);
    if (!r->json) return file_error(SKV_ENOMEM, path, "out of memory for the metadata");
    memcpy(r->json, m + HEADER_BYTES, (size_t)jn);
    r->json[jn] = 0;
    const char *end = NULL;
    r->meta = cJSON_ParseWithLengthOpts(r->json, (size_t)jn, &end, 0);
    if (!r->meta || !cJSON_IsObject(r->meta))
        return file_error(SKV_EFORMAT, path, "metadata is not a valid JSON object (error near byte %zu of the block)",
                          end && end >= r->json ? (size_t)(end - r->json) : (size_t)0);
    const cJSON *fv = cJSON_GetObjectItemCaseSensitive(r->meta, "format_version");
    if (!cJSON_IsNumber(fv) || fv->valuedouble != (double)version)
        return file_error(SKV_EFORMAT, path, "metadata field format_version is %s, expected %u",
                          cJSON_IsNumber(fv) ? "different" : "missing", version);
    r->rec_begin = HEADER_BYTES + (size_t)jn;
    r->rec_end = size - FOOTER_BYTES;
    r->n_records = get_u64(m + size - FOOTER_BYTES + 8);
    return 0;
}

/* Version 2: walks every record header: each must fit before the footer. */
static int reader_scan(trace_reader *r) {
    size_t pos = r->rec_begin;
    uint64_t n = 0;
    while (pos < r->rec_end) {
        if (r->rec_end - pos < RECORD_HEAD)
            return file_error(SKV_EFORMAT, r->path, "record %" PRIu64 " at byte %zu: header cut off (%zu bytes before the footer)",
                              n, pos, r->rec_end - pos);
        uint32_t kind = get_u32(r->map + pos), len = get_u32(r->map + pos + 4);
        if (len > r->rec_end - pos - RECORD_HEAD)
            return file_error(SKV_EFORMAT, r->path,
                              "record %" PRIu64 " (%s) at byte %zu: length %u runs past the end of the records (%zu bytes left)",
                              n, kind_label(kind), pos, len, r->rec_end - pos - RECORD_HEAD);
        if (kind > 0 && kind < PROBE_KIND_COUNT) r->count[kind]++;
        else r->n_unknown++;
        pos += RECORD_HEAD + len;
        n++;
    }
    if (n != r->n_records)
        return file_error(SKV_EFORMAT, r->path, "footer says %" PRIu64 " records, the file holds %" PRIu64, r->n_records, n);
    return 0;
}

int trace_open(const char *path, trace_reader **out) {
    *out = NULL;
    trace_notice_buf[0] = 0;
    trace_reader *r = skv_calloc(1, sizeof *r);
    if (!r || !(r->path = strdup(path))) {
        free(r);
        return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    }
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st)) {
        int e = errno;
        if (fd >= 0) close(fd);
        reader_free(r);
        return skv_error(SKV_EIO, "%s: cannot open: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        reader_free(r);
        return skv_error(SKV_EIO, "%s: not a regular file", path);
    }
    r->size = (size_t)st.st_size;
    if (r->size == 0) {
        close(fd);
        reader_free(r);
        return skv_error(SKV_EFORMAT, "%s: empty file, not an skv trace", path);
    }
    void *m = mmap(NULL, r->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (m == MAP_FAILED) {
        reader_free(r);
        return skv_error(SKV_EIO, "%s: cannot map: %s", path, strerror(e));
    }
    r->map = m;
    int rc = reader_check_file(r);
    if (!rc && r->version == 2) rc = reader_scan(r); /* version 3 records were walked, CRC by CRC, at check */
    if (rc) {
        reader_free(r);
        return rc;
    }
    r->pos = r->rec_begin;
    *out = r;
    return 0;
}

/* A one-line error about record idx of kind at byte off. */
static int record_error(const trace_reader *r, uint64_t idx, uint32_t kind, size_t off, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int record_error(const trace_reader *r, uint64_t idx, uint32_t kind, size_t off, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return skv_error(SKV_EFORMAT, "%s: record %" PRIu64 " (%s at byte %zu): %s", r->path, idx, kind_label(kind), off, msg);
}

/* Decodes payload p (len bytes) of a known kind into r->ev. */
static int decode_event(trace_reader *r, uint32_t kind, const unsigned char *p, size_t len, size_t off) {
    int nf;
    const probe_field *fs = probe_schema((probe_kind)kind, &nf);
    size_t need = len + (size_t)nf * 16;
    if (need > r->scratch_cap) {
        char *s = realloc(r->scratch, need);
        if (!s) return skv_error(SKV_ENOMEM, "%s: out of memory", r->path);
        r->scratch = s;
        r->scratch_cap = need;
    }
    probe_event *ev = &r->ev;
    memset(ev, 0, sizeof *ev);
    ev->kind = (probe_kind)kind;
    char *sc = r->scratch;
    size_t at = 0;
    uint64_t idx = r->index;
    for (int i = 0; i < nf; i++) {
        const probe_field *f = &fs[i];
        char *dst = (char *)ev + f->off;
        size_t left = len - at;
        if (f->type == PROBE_F_I32 || f->type == PROBE_F_F32) {
            if (left < 4) return record_error(r, idx, kind, off, "field %s runs past the record (%zu bytes left)", f->name, left);
            from_le32(dst, p + at, 1);
            at += 4;
        } else if (f->type == PROBE_F_F64 || f->type == PROBE_F_U64) {
            if (left < 8) return record_error(r, idx, kind, off, "field %s runs past the record (%zu bytes left)", f->name, left);
            uint64_t v = get_u64(p + at);
            memcpy(dst, &v, 8);
            at += 8;
        } else if (f->type == PROBE_F_STR) {
            if (left < 4) return record_error(r, idx, kind, off, "string %s runs past the record (%zu bytes left)", f->name, left);
            uint32_t sl = get_u32(p + at);
            if (sl > left - 4)
                return record_error(r, idx, kind, off, "string %s of %u bytes overruns the record (%zu bytes left)",
                                    f->name, sl, left - 4);
            memcpy(sc, p + at + 4, sl);
            sc[sl] = 0;
            memcpy(dst, &sc, sizeof sc);
            sc += align8((size_t)sl + 1);
            at += 4 + (size_t)sl;
        } else {
            int cnt = field_int(ev, &fs[f->count]);
            if (cnt < 0)
                return record_error(r, idx, kind, off, "%s = %d, expected >= 0", fs[f->count].name, cnt);
            size_t bytes = f->type == PROBE_F_BYTES ? (size_t)cnt : (size_t)cnt * 4;
            if (bytes > left)
                return record_error(r, idx, kind, off,
                                    "array %s of %d elements (%zu bytes) overruns the record (%zu bytes left)", f->name,
                                    cnt, bytes, left);
            if (f->type == PROBE_F_BYTES) {
                memcpy(sc, p + at, bytes);
                sc[bytes] = 0;
            } else {
                from_le32(sc, p + at, (size_t)cnt);
            }
            char *arr = sc;
            memcpy(dst, &arr, sizeof arr);
            sc += align8(bytes + 1);
            at += bytes;
        }
    }
    if (at != len)
        return record_error(r, idx, kind, off, "%zu bytes left after the last field (array sizes do not match the record length)",
                            len - at);
    return 0;
}

int trace_next(trace_reader *r, const probe_event **ev) {
    *ev = NULL;
    while (r->pos < r->rec_end) {
        size_t off = r->pos;
        uint32_t kind = get_u32(r->map + off), len = get_u32(r->map + off + 4);
        r->pos += RECORD_HEAD + (size_t)len + r->rec_tail;   /* framing was checked at open */
        if (kind == 0 || kind >= PROBE_KIND_COUNT) {
            r->index++;
            continue;
        }
        int rc = decode_event(r, kind, r->map + off + RECORD_HEAD, len, off);
        r->index++;
        if (rc) return rc;
        *ev = &r->ev;
        return 1;
    }
    return 0;
}

const char *trace_meta_json(const trace_reader *r) { return r->json; }
uint64_t trace_n_records(const trace_reader *r) { return r->n_records; }

/* Replays into lanes when L is set, else into st (lane 0 of a compare trace). */
static int load(const char *path, probe_store *st, probe_lanes *L, char *who, size_t who_n, int *foreign) {
    trace_reader *r;
    int rc = trace_open(path, &r);
    if (rc) return rc;
    if (who) *foreign = trace_writer_label(r, who, who_n);
    const probe_event *ev;
    int lane = 0;
    while ((rc = trace_next(r, &ev)) > 0) {
        if (L) rc = probe_lanes_add(L, ev);
        else if (ev->kind == PROBE_LANE) {
            lane = ev->lane.lane;
            continue;
        } else if (lane != 0) {
            continue;
        } else {
            rc = probe_store_add(st, ev);
        }
        if (rc) {
            char msg[512];
            snprintf(msg, sizeof msg, "%s", skv_last_error());
            rc = skv_error(rc, "%s: record %" PRIu64 ": %s", path, r->index - 1, msg);
            break;
        }
    }
    trace_close(r);
    return rc < 0 ? rc : 0;
}

int trace_load_store(const char *path, probe_store *st) { return load(path, st, NULL, NULL, 0, NULL); }

int trace_load_lanes(const char *path, probe_lanes *L) { return load(path, NULL, L, NULL, 0, NULL); }

int trace_load_lanes_writer(const char *path, probe_lanes *L, char *who, size_t n, int *foreign) {
    return load(path, NULL, L, who, n, foreign);
}

/* ---- info ------------------------------------------------------------------- */

static const char *meta_str(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) && v->valuestring ? v->valuestring : "?";
}

static double meta_num(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* What a trace's records say when its metadata record is missing (a run
 * cut short): every policy, the steps finished and the layers. */
typedef struct {
    char policies[TRACE_MAX_POLICIES][160];
    int n_policies, steps, layers;
    int n_lanes, batched;
    probe_event *run;   /* the first run event (owned) */
    /* per policy: its options put in force at other values ("rank=7 (asked
     * 160)"), from its first step's statistics; checked once */
    char in_force[TRACE_MAX_POLICIES][300];
    int checked[TRACE_MAX_POLICIES];
} trace_scan;

static void scan_records(trace_reader *r, trace_scan *sc) {
    memset(sc, 0, sizeof *sc);
    const probe_event *ev = NULL;
    int lane = 0, of_lane[PROBE_MAX_LANES]; /* each lane's policy (a batch's lanes share lane 0's) */
    for (int i = 0; i < PROBE_MAX_LANES; i++) of_lane[i] = -1;
    while (trace_next(r, &ev) > 0) {
        if (ev->kind == PROBE_RUN) {
            of_lane[lane] = policy_note(sc->policies, &sc->n_policies, &ev->run);
            if (!sc->run) sc->run = probe_event_dup(ev);
            if (ev->run.n_layers > sc->layers) sc->layers = ev->run.n_layers;
        } else if (ev->kind == PROBE_STEP) {
            if (ev->step.step + 1 > sc->steps) sc->steps = ev->step.step + 1;
            int p = of_lane[lane] >= 0 ? of_lane[lane] : of_lane[0];
            if (p >= 0 && !sc->checked[p]) {
                const char *opts = strstr(sc->policies[p], ": ");
                sc->checked[p] = 1;
                probe_pairs_in_force(opts ? opts + 2 : "", ev->step.kv_stats, sc->in_force[p], sizeof sc->in_force[p]);
            }
        } else if (ev->kind == PROBE_PREFILL_LAYER && ev->prefill_layer.layer + 1 > sc->layers) {
            sc->layers = ev->prefill_layer.layer + 1;
        } else if (ev->kind == PROBE_LANE) {
            lane_note(&ev->lane, &sc->n_lanes, &sc->batched);
            if (ev->lane.lane >= 0 && ev->lane.lane < PROBE_MAX_LANES) lane = ev->lane.lane;
        }
    }
}

/* The options each policy put in force at other values than asked (a line
 * each; the policy named when the trace holds several). */
static void print_in_force(FILE *out, const trace_scan *sc) {
    for (int i = 0; i < sc->n_policies; i++) {
        if (!sc->in_force[i][0]) continue;
        int name = (int)strcspn(sc->policies[i], ":");
        if (sc->n_policies > 1) fprintf(out, "  in force   %.*s: %s\n", name, sc->policies[i], sc->in_force[i]);
        else fprintf(out, "  in force   %s\n", sc->in_force[i]);
    }
}

int trace_writer_label(const trace_reader *r, char *buf, size_t n) {
    const cJSON *m = r->meta;
    const char *w = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "writer"));
    if (!w) {
        const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "skv_version"));
        snprintf(buf, n, "skv%s%s", v ? " " : "", v ? v : "");
        return 0;
    }
    const char *v = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "writer_version"));
    const char *p = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "producer"));
    snprintf(buf, n, "%.100s%s%.20s%s%.120s", w, v ? " " : "", v ? v : "", p ? ", producer " : "", p ? p : "");
    return 1;
}

int trace_info(const char *path, FILE *out) {
    trace_reader *r;
    int rc = trace_open(path, &r);
    if (rc) return rc;
    const cJSON *m = r->meta, *created = cJSON_GetObjectItemCaseSensitive(m, "created");
    char who[300];
    int foreign = trace_writer_label(r, who, sizeof who);
    if (cJSON_GetObjectItemCaseSensitive(m, "skv_version") || foreign) {
        fprintf(out, "%s: skv trace format %d, written by %s", path, r->version, who);
        if (cJSON_IsObject(created)) fprintf(out, " on %s (%s)", meta_str(created, "utc"), meta_str(created, "host"));
    } else {
        fprintf(out, "%s: skv trace format %d, no metadata record (the run was cut short; read from its records)", path,
                r->version);
    }
    fprintf(out, "\n");
    const cJSON *pl = cJSON_GetObjectItemCaseSensitive(m, "policies");
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(m, "run");
    trace_scan sc;
    scan_records(r, &sc);
    if (cJSON_IsObject(run)) {
        fprintf(out, "  model      %s (%s, %s%s), backend %s\n", meta_str(run, "model"), meta_str(run, "arch"),
                meta_str(run, "format"), meta_num(run, "random_weights") > 0 ? ", random weights" : "",
                meta_str(run, "backend"));
        fprintf(out, "  shape      %.0f layers, %.0f heads, %.0f KV heads, head dim %.0f, max context %.0f, prompt %.0f\n",
                meta_num(run, "n_layers"), meta_num(run, "n_heads"), meta_num(run, "n_kv_heads"),
                meta_num(run, "head_dim"), meta_num(run, "max_ctx"), meta_num(run, "prompt_len"));
        const char *opts = meta_str(run, "kv_opts");
        if (cJSON_GetArraySize(pl) > 1) /* compare mode: every lane's policy */
            for (int i = 0; i < cJSON_GetArraySize(pl); i++)
                fprintf(out, "  %-10s %s%s\n", i ? "" : "policies", cJSON_GetStringValue(cJSON_GetArrayItem(pl, i)) ?
                        cJSON_GetStringValue(cJSON_GetArrayItem(pl, i)) : "?", !i && meta_num(run, "oracle") > 0 ?
                        ", oracle" : "");
        else
            fprintf(out, "  kv policy  %s%s%s%s\n", meta_str(run, "kv_policy"), *opts && strcmp(opts, "?") ? ": " : "",
                    strcmp(opts, "?") ? opts : "", meta_num(run, "oracle") > 0 ? ", oracle" : "");
        print_in_force(out, &sc);
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "batch")))
            fprintf(out, "  batch      %.0f sequences decoded together, one lane each\n", meta_num(m, "lanes"));
        fprintf(out, "  steps      %.0f\n  layers     %.0f\n", meta_num(m, "steps"), meta_num(m, "layers"));
    } else {
        /* a trace cut short has no metadata: its records say what they can */
        if (sc.run) {
            const probe_ev_run *e = &sc.run->run;
            fprintf(out, "  model      %s (%s, %s), backend %s\n", e->model ? e->model : "?", e->arch ? e->arch : "?",
                    e->format ? e->format : "?", e->backend ? e->backend : "?");
            for (int i = 0; i < sc.n_policies; i++)
                fprintf(out, "  %-10s %s\n", i ? "" : sc.n_policies > 1 ? "policies" : "kv policy", sc.policies[i]);
            print_in_force(out, &sc);
        } else {
            fprintf(out, "  model      (no run event recorded)\n");
        }
        if (sc.n_lanes > 1 && sc.batched)
            fprintf(out, "  batch      %d sequences decoded together, one lane each\n", sc.n_lanes);
        fprintf(out, "  steps      %d finished\n  layers     %d\n", sc.steps, sc.layers);
    }
    free(sc.run);
    if (trace_notice_buf[0]) fprintf(out, "  %s\n", trace_notice_buf);
    /* a run stopped by Ctrl-C closes whole, and its metadata says where it stopped */
    const char *intr = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "interrupted"));
    if (intr) fprintf(out, "  interrupted %s: the run was stopped (Ctrl-C); the trace holds what finished before\n", intr);
    fprintf(out, "  records    %" PRIu64 "\n", r->n_records);
    for (int k = 1; k < PROBE_KIND_COUNT; k++)
        if (r->count[k]) fprintf(out, "    %-14s %" PRIu64 "\n", probe_kind_name((probe_kind)k), r->count[k]);
    if (r->n_unknown) fprintf(out, "    %-14s %" PRIu64 " (from a newer skv, skipped)\n", "unknown kinds", r->n_unknown);
    const char *ck = trace_notice_buf[0] ? "cut short" : "checksum ok";
    if (r->size >= 1u << 20) fprintf(out, "  file size  %zu bytes (%.1f MiB), %s\n", r->size, r->size / 1048576.0, ck);
    else fprintf(out, "  file size  %zu bytes (%.1f KiB), %s\n", r->size, r->size / 1024.0, ck);
    trace_close(r);
    return 0;
}
