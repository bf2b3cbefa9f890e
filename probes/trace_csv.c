/* trace_csv.c: a trace as tidy CSV tables (docs/TRACE.md, "CSV export").
 *
 * One table per record kind, KIND.csv: a row per record with its scalar
 * fields, after two key columns, `record` (the record's number in the trace,
 * from 0, over the kinds this build knows) and `lane` (compare mode: the
 * lane the record belongs to; 0 for a single run; the lane kind has its own
 * field of that name instead). One long table per array
 * field, KIND__FIELD.csv: a row per element, keyed by record, the record's
 * step / layer / head (those of its scalars it has), and the element's
 * index i, then its value. Both are written from the schema tables, so a
 * kind added there is exported without a change here. Floats keep every
 * bit that matters: f32 with 9 significant digits, f64 with 17; NaN is
 * "nan". Strings and token bytes are quoted as RFC 4180 says; a byte that
 * is not part of valid UTF-8 is written \xNN and a backslash \\. */
#include "trace.h"

#include "probe.h"
#include "skv.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_TABLES 64

typedef struct {
    char path[4096];
    char *tmp;
    FILE *f;
} csv_table;

typedef struct {
    const char *dir;
    int force;
    csv_table t[PROBE_KIND_COUNT][1 + 8]; /* [kind][0]: the kind's table; [kind][1 + a]: its a-th array field */
    int n_open;
} csv_out;

/* A quoted CSV field of n bytes: valid UTF-8 as is, other bytes \xNN, \ as \\, " doubled. */
static void put_bytes(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        if (*u == '"') { fputs("\"\"", f); i++; continue; }
        if (*u == '\\') { fputs("\\\\", f); i++; continue; }
        if (*u == 0) { fputs("\\x00", f); i++; continue; }
        int len = trace_utf8_len(u, n - i);
        if (!len) { fprintf(f, "\\x%02X", *u); i++; continue; }
        fwrite(u, 1, (size_t)len, f);
        i += (size_t)len;
    }
    fputc('"', f);
}

static void put_f32(FILE *f, float v) {
    if (isnan(v)) fputs("nan", f);
    else if (isinf(v)) fputs(v > 0 ? "inf" : "-inf", f);
    else fprintf(f, "%.9g", v);
}

static void put_f64(FILE *f, double v) {
    if (isnan(v)) fputs("nan", f);
    else if (isinf(v)) fputs(v > 0 ? "inf" : "-inf", f);
    else fprintf(f, "%.17g", v);
}

static int is_array(probe_ftype t) { return t == PROBE_F_BYTES || t == PROBE_F_I32S || t == PROBE_F_F32S; }

/* The key scalars a long table carries: step, layer, head, when the kind has them. */
static const char *const long_keys[] = { "step", "layer", "head" };

static int key_field(const probe_field *fs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (!is_array(fs[i].type) && !strcmp(fs[i].name, name)) return i;
    return -1;
}

static int open_table(csv_out *o, csv_table *t, const char *name, const char *header) {
    snprintf(t->path, sizeof t->path, "%s/%s.csv", o->dir, name);
    struct stat sb;
    if (!o->force && stat(t->path, &sb) == 0)
        return skv_error(SKV_EIO, "%s exists; use --force to replace it", t->path);
    int fd = skv_temp_beside(t->path, ".tmp", &t->tmp);
    if (fd < 0) return fd;
    if (!(t->f = fdopen(fd, "w"))) {
        remove(t->tmp);
        return skv_error(SKV_EIO, "%s: cannot write it: %s", t->tmp, strerror(errno));
    }
    fputs(header, t->f);
    fputc('\n', t->f);
    o->n_open++;
    return 0;
}

/* Opens the kind's tables at its first record. */
static int open_kind(csv_out *o, probe_kind k) {
    int n;
    const probe_field *fs = probe_schema(k, &n);
    char h[2048];
    /* the lane kind's own field is its lane: no second column of that name */
    int len = snprintf(h, sizeof h, key_field(fs, n, "lane") >= 0 ? "record" : "record,lane");
    for (int i = 0; i < n; i++)
        if (!is_array(fs[i].type)) len += snprintf(h + len, sizeof h - (size_t)len, ",%s", fs[i].name);
    /* token bytes are a text column of the kind's table */
    for (int i = 0; i < n; i++)
        if (fs[i].type == PROBE_F_BYTES) len += snprintf(h + len, sizeof h - (size_t)len, ",%s", fs[i].name);
    int rc = open_table(o, &o->t[k][0], probe_kind_name(k), h);
    for (int i = 0, a = 0; !rc && i < n; i++) {
        if (fs[i].type != PROBE_F_I32S && fs[i].type != PROBE_F_F32S) continue;
        char name[128];
        snprintf(name, sizeof name, "%s__%s", probe_kind_name(k), fs[i].name);
        len = snprintf(h, sizeof h, "record,lane");
        for (int j = 0; j < 3; j++)
            if (key_field(fs, n, long_keys[j]) >= 0) len += snprintf(h + len, sizeof h - (size_t)len, ",%s", long_keys[j]);
        snprintf(h + len, sizeof h - (size_t)len, ",i,%s", fs[i].name);
        if (a >= 8) return skv_error(SKV_EUNSUPPORTED, "csv: kind %s has more than 8 arrays", probe_kind_name(k));
        rc = open_table(o, &o->t[k][1 + a], name, h);
        a++;
    }
    return rc;
}

static void put_scalar(FILE *f, const probe_event *ev, const probe_field *fd) {
    const char *base = (const char *)ev + fd->off;
    switch (fd->type) {
    case PROBE_F_I32: fprintf(f, "%d", *(const int *)base); break;
    case PROBE_F_F32: put_f32(f, *(const float *)base); break;
    case PROBE_F_F64: put_f64(f, *(const double *)base); break;
    case PROBE_F_U64: fprintf(f, "%" PRIu64, *(const uint64_t *)base); break;
    case PROBE_F_STR: {
        const char *s = *(const char *const *)base;
        put_bytes(f, s ? s : "", s ? strlen(s) : 0);
        break;
    }
    default: break;
    }
}

static int write_record(csv_out *o, const probe_event *ev, uint64_t rec, int lane) {
    probe_kind k = ev->kind;
    int n;
    const probe_field *fs = probe_schema(k, &n);
    if (!fs) return 0;
    int rc = 0;
    if (!o->t[k][0].f && (rc = open_kind(o, k))) return rc;
    FILE *f = o->t[k][0].f;
    if (key_field(fs, n, "lane") >= 0) fprintf(f, "%" PRIu64, rec);
    else fprintf(f, "%" PRIu64 ",%d", rec, lane);
    for (int i = 0; i < n; i++) {
        if (is_array(fs[i].type)) continue;
        fputc(',', f);
        put_scalar(f, ev, &fs[i]);
    }
    for (int i = 0; i < n; i++) {
        if (fs[i].type != PROBE_F_BYTES) continue;
        int cnt = *(const int *)((const char *)ev + fs[fs[i].count].off);
        const char *p = *(const char *const *)((const char *)ev + fs[i].off);
        fputc(',', f);
        put_bytes(f, p ? p : "", p && cnt > 0 ? (size_t)cnt : 0);
    }
    fputc('\n', f);
    int keys[3];
    for (int j = 0; j < 3; j++) keys[j] = key_field(fs, n, long_keys[j]);
    for (int i = 0, a = 0; i < n; i++) {
        if (fs[i].type != PROBE_F_I32S && fs[i].type != PROBE_F_F32S) continue;
        FILE *g = o->t[k][1 + a++].f;
        int cnt = *(const int *)((const char *)ev + fs[fs[i].count].off);
        const void *arr = *(const void *const *)((const char *)ev + fs[i].off);
        for (int e = 0; e < cnt; e++) {
            fprintf(g, "%" PRIu64 ",%d", rec, lane);
            for (int j = 0; j < 3; j++)
                if (keys[j] >= 0) fprintf(g, ",%d", *(const int *)((const char *)ev + fs[keys[j]].off));
            fprintf(g, ",%d,", e);
            if (fs[i].type == PROBE_F_I32S) fprintf(g, "%d", ((const int *)arr)[e]);
            else put_f32(g, ((const float *)arr)[e]);
            fputc('\n', g);
        }
    }
    return ferror(f) ? skv_error(SKV_EIO, "%s: cannot write it", o->t[k][0].tmp) : 0;
}

static void close_all(csv_out *o, int keep, int *rc) {
    for (int k = 0; k < PROBE_KIND_COUNT; k++)
        for (int a = 0; a < 9; a++) {
            csv_table *t = &o->t[k][a];
            if (!t->f) continue;
            int bad = fflush(t->f) || ferror(t->f);
            bad |= fclose(t->f) != 0;
            t->f = NULL;
            if (keep && !*rc && bad) *rc = skv_error(SKV_EIO, "%s: cannot write it", t->tmp);
            if (keep && !*rc) *rc = skv_place(t->tmp, t->path, o->force);
            else remove(t->tmp);
            free(t->tmp);
            t->tmp = NULL;
        }
}

int trace_export_csv(const char *path, const char *dir, int force, int partial, int *n_tables) {
    if (n_tables) *n_tables = 0;
    trace_reader *r = NULL;
    int rc = trace_open(path, &r);
    if (rc) return rc;
    if (*trace_last_notice() && !partial) {
        char note[600];
        snprintf(note, sizeof note, "%s", trace_last_notice());
        trace_close(r);
        return skv_error(SKV_EFORMAT, "%s; add --partial to export what is intact", note);
    }
    if ((rc = skv_make_dir(dir))) {
        trace_close(r);
        return rc;
    }
    char mp[4096];
    snprintf(mp, sizeof mp, "%s/meta.json", dir);
    struct stat sb;
    if (!force && lstat(mp, &sb) == 0) { /* before any table is written */
        trace_close(r);
        return skv_error(SKV_EIO, "%s exists; use --force to replace it", mp);
    }
    csv_out o;
    memset(&o, 0, sizeof o);
    o.dir = dir;
    o.force = force;
    const probe_event *ev;
    uint64_t rec = 0;
    int lane = 0;
    for (;;) {
        int k = trace_next(r, &ev);
        if (k < 0) { rc = k; break; }
        if (k == 0) break;
        if (ev->kind == PROBE_LANE) lane = ev->lane.lane;
        if ((rc = write_record(&o, ev, rec++, lane))) break;
    }
    int tables = o.n_open;
    close_all(&o, 1, &rc);
    if (!rc) {
        rc = skv_save_atomic(mp, force, skv_put_text, (void *)trace_meta_json(r));
    }
    trace_close(r);
    if (!rc && n_tables) *n_tables = tables;
    return rc;
}
