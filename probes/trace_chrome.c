/* trace_chrome.c: a trace as Trace Event Format JSON (docs/TRACE.md,
 * "Timelines in Perfetto and chrome://tracing"), the file ui.perfetto.dev,
 * chrome://tracing and speedscope open.
 *
 * The trace is read once, record by record (as the CSV export reads it),
 * into compact tables: the spans, and per process and decode step what its
 * counters need. Then the JSON object is written by hand, every string
 * escaped and every number finite:
 *
 *   process  one per lane: the policy of a single run or of a compare lane,
 *            "seq i (policy)" for a batch's sequence (a lane that records a
 *            second run gets a process of its own, "run 2: policy");
 *   thread   one per stream, named "compute", "fetch", "rebuild" (on a CUDA
 *            trace "compute (CUDA stream 0)", "fetch (CUDA stream 1)"),
 *            sorted by stream as the Timeline view sorts its rows. Spans on
 *            one thread must nest or follow each other; a span that
 *            overlaps another on its stream without nesting in it goes on an
 *            extra track of that stream ("compute (overlap 1)");
 *   X        every span record: name = op, ts and dur in microseconds (to
 *            the nanosecond), args layer, head (-1: a span covers every KV
 *            head of its layer), step (-1: prefill) and, for a value fetch
 *            (fetch_v), the bytes its layer fetched at that step (the
 *            decode-head records' fetch_bytes, shared among the layer's
 *            fetch_v spans of the step by their time) and the GB/s achieved;
 *   i        "step N" at the start of each decode step (its first span; a
 *            step without spans starts where the one before ended and lasts
 *            its recorded wall time), args token and seconds;
 *   C        per step: "hit rate", "bytes fetched" (the step records),
 *            "mass recall" and "output error" (means of the oracle records
 *            over layers and KV heads), "needle rank" (the needle records'
 *            best landmark rank per layer and KV head, the best and the
 *            worst of those, and k; the oracle's exact rank when a needle
 *            span was watched). A value that is not finite is left out.
 *
 * The batch's shared prefill and its shared matmuls are lane 0's records
 * (the first live sequence's once sequence 0 has ended), so they are seq
 * 0's, as the Timeline view draws them. */
#include "trace_chrome.h"

#include "lanes.h"
#include "probe.h"
#include "skv.h"
#include "trace.h"

#include <cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef SKV_VERSION
#define SKV_VERSION "0.1.0-dev"
#endif

#define CH_MAX_PROCS 4096          /* lanes x runs */
#define CH_MAX_STREAM 1024         /* skv writes streams 0..2 */
#define CH_MAX_TRACKS 1024         /* tracks of one stream (overlap tracks) */
#define CH_MAX_STEP (1 << 20)      /* as the probe store */
#define CH_MAX_SECONDS 1e8         /* span times past this are not a run's */

typedef struct {
    int64_t t0, t1;                /* ns on the trace's clock */
    uint64_t rec;                  /* record number, for messages and a stable order */
    double bytes;                  /* fetch_v: its share of the layer's fetched bytes */
    int proc, stream, layer, step, op, track;
} ch_span;

typedef struct {
    int seen, has_step, has_span;
    int token;
    float hit_rate;
    double seconds;
    uint64_t fetch_bytes;
    double recall_sum, err_sum;
    int n_recall, n_err;
    int lm_best, lm_worst, lm_k;   /* -1: no needle record */
    int ex_best, ex_worst;         /* -1: no watched needle span */
    int64_t t0, t1;                /* the step's extent (ns): its spans, or the fallback */
} ch_step;

typedef struct {
    int lane, seg, has_run;
    char *policy, *opts, *backend, *model, *lane_policy;
    ch_step *steps;                /* (n_steps) indexed by decode step */
    int n_steps, cap_steps;
    int64_t pre_t0, pre_t1;        /* the prefill spans' extent */
    int has_pre;
} ch_proc;

typedef struct { int proc, step, layer; double bytes; } ch_fetch;

typedef struct { int proc, stream, track; } ch_thread;

typedef struct {
    const char *path;
    ch_proc *procs;
    int n_procs, cap_procs;
    int proc_of[PROBE_MAX_LANES];  /* the process taking lane i's records, -1 none yet */
    int seg_of[PROBE_MAX_LANES];
    int batched, n_lanes;
    ch_span *spans;
    size_t n_spans, cap_spans;
    ch_fetch *fetch;
    size_t n_fetch, cap_fetch;
    char **ops;                    /* interned op names */
    int n_ops, cap_ops;
    int *op_slot;                  /* open addressing: op index + 1, 0 empty */
    int n_slot;
    ch_thread *threads;
    int n_threads;
    cJSON *meta;
    char who[300];
    char notice[600];
    trace_chrome_stats st;
} ch_trace;

/* ---- collecting ---------------------------------------------------------- */

static int oom(void) { return skv_error(SKV_ENOMEM, "chrome export: out of memory"); }

/* Grows *arr (of *cap elements of size sz) to hold need. */
static int grow(void **arr, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need) n *= 2;
    if (n > SIZE_MAX / sz) return oom();
    void *p = realloc(*arr, n * sz);
    if (!p) return oom();
    *arr = p;
    *cap = n;
    return 0;
}

static int grow_int(void **arr, int *cap, int need, size_t sz) {
    size_t c = (size_t)*cap;
    int rc = grow(arr, &c, (size_t)need, sz);
    if (!rc) *cap = c > INT32_MAX ? INT32_MAX : (int)c;
    return rc;
}

static uint32_t hash_str(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 16777619u;
    return h;
}

/* The index of op among the interned names, adding it when new. */
static int intern_op(ch_trace *t, const char *op) {
    if (!op) op = "";
    if (2 * (t->n_ops + 1) > t->n_slot) { /* rehash at half full */
        int ns = t->n_slot ? 2 * t->n_slot : 64;
        int *slot = calloc((size_t)ns, sizeof *slot);
        if (!slot) return oom();
        for (int i = 0; i < t->n_ops; i++) {
            uint32_t h = hash_str(t->ops[i]) & (uint32_t)(ns - 1);
            while (slot[h]) h = (h + 1) & (uint32_t)(ns - 1);
            slot[h] = i + 1;
        }
        free(t->op_slot);
        t->op_slot = slot;
        t->n_slot = ns;
    }
    uint32_t h = hash_str(op) & (uint32_t)(t->n_slot - 1);
    while (t->op_slot[h]) {
        if (!strcmp(t->ops[t->op_slot[h] - 1], op)) return t->op_slot[h] - 1;
        h = (h + 1) & (uint32_t)(t->n_slot - 1);
    }
    int rc = grow_int((void **)&t->ops, &t->cap_ops, t->n_ops + 1, sizeof *t->ops);
    if (rc) return rc;
    if (!(t->ops[t->n_ops] = strdup(op))) return oom();
    t->op_slot[h] = t->n_ops + 1;
    return t->n_ops++;
}

static int set_str(char **dst, const char *s) {
    free(*dst);
    *dst = strdup(s ? s : "");
    return *dst ? 0 : oom();
}

/* The process taking lane's records (made at its first record). */
static int lane_proc(ch_trace *t, int lane, ch_proc **out) {
    if (t->proc_of[lane] < 0) {
        if (t->n_procs >= CH_MAX_PROCS)
            return skv_error(SKV_EUNSUPPORTED, "%s: more than %d runs and lanes; the chrome export takes fewer", t->path,
                             CH_MAX_PROCS);
        int rc = grow_int((void **)&t->procs, &t->cap_procs, t->n_procs + 1, sizeof *t->procs);
        if (rc) return rc;
        ch_proc *p = &t->procs[t->n_procs];
        memset(p, 0, sizeof *p);
        p->lane = lane;
        p->seg = t->seg_of[lane];
        t->proc_of[lane] = t->n_procs++;
    }
    *out = &t->procs[t->proc_of[lane]];
    return 0;
}

static int bad_record(const ch_trace *t, uint64_t rec, const char *kind, const char *field, long long v, long long lo,
                      long long hi) {
    return skv_error(SKV_EFORMAT, "%s: record %" PRIu64 " (%s): %s = %lld, expected %lld..%lld", t->path, rec, kind,
                     field, v, lo, hi);
}

/* Decode step s of p, growing the table; s is in range. */
static int step_at(ch_proc *p, int s, ch_step **out) {
    if (s >= p->n_steps) {
        int rc = grow_int((void **)&p->steps, &p->cap_steps, s + 1, sizeof *p->steps);
        if (rc) return rc;
        for (int i = p->n_steps; i <= s; i++) {
            memset(&p->steps[i], 0, sizeof p->steps[i]);
            p->steps[i].lm_best = p->steps[i].lm_worst = p->steps[i].lm_k = -1;
            p->steps[i].ex_best = p->steps[i].ex_worst = -1;
        }
        p->n_steps = s + 1;
    }
    *out = &p->steps[s];
    (*out)->seen = 1;
    return 0;
}

static void rank_note(int r, int *best, int *worst) {
    if (*best < 0 || r < *best) *best = r;
    if (*worst < 0 || r > *worst) *worst = r;
}

#define CHECK(cond, kind, field, v, lo, hi) \
    do { if (!(cond)) return bad_record(t, rec, kind, field, (long long)(v), lo, hi); } while (0)

static int add_span(ch_trace *t, ch_proc *p, const probe_ev_span *e, uint64_t rec) {
    CHECK(e->step >= -1 && e->step < CH_MAX_STEP, "span", "step", e->step, -1, CH_MAX_STEP - 1);
    CHECK(e->layer >= -1, "span", "layer", e->layer, -1, INT32_MAX);
    CHECK(e->stream >= 0 && e->stream < CH_MAX_STREAM, "span", "stream", e->stream, 0, CH_MAX_STREAM - 1);
    if (!isfinite(e->t0) || !isfinite(e->t1) || fabs(e->t0) > CH_MAX_SECONDS || fabs(e->t1) > CH_MAX_SECONDS)
        return skv_error(SKV_EFORMAT, "%s: record %" PRIu64 " (span '%s'): times %g..%g s are not a run's", t->path, rec,
                         e->op ? e->op : "", e->t0, e->t1);
    int64_t a = llround(e->t0 * 1e9), b = llround(e->t1 * 1e9);
    if (b < a)
        return skv_error(SKV_EFORMAT, "%s: record %" PRIu64 " (span '%s', step %d, layer %d): it ends before it starts "
                         "(t0 %.9g s, t1 %.9g s)", t->path, rec, e->op ? e->op : "", e->step, e->layer, e->t0, e->t1);
    int op = intern_op(t, e->op);
    if (op < 0) return op;
    int rc = grow((void **)&t->spans, &t->cap_spans, t->n_spans + 1, sizeof *t->spans);
    if (rc) return rc;
    t->spans[t->n_spans++] = (ch_span){ a, b, rec, 0, (int)(p - t->procs), e->stream, e->layer, e->step, op, 0 };
    if (e->step >= 0) {
        ch_step *s;
        if ((rc = step_at(p, e->step, &s))) return rc;
    }
    return 0;
}

static int add_event(ch_trace *t, const probe_event *ev, uint64_t rec, int *lane) {
    ch_proc *p;
    ch_step *s;
    int rc;
    switch (ev->kind) {
    case PROBE_LANE:
        CHECK(ev->lane.lane >= 0 && ev->lane.lane < PROBE_MAX_LANES, "lane", "lane", ev->lane.lane, 0,
              PROBE_MAX_LANES - 1);
        *lane = ev->lane.lane;
        if (ev->lane.lane + 1 > t->n_lanes) t->n_lanes = ev->lane.lane + 1;
        if (!ev->lane.teacher || !*ev->lane.teacher) t->batched = 1;
        if ((rc = lane_proc(t, *lane, &p))) return rc;
        return p->lane_policy ? 0 : set_str(&p->lane_policy, ev->lane.policy);
    case PROBE_RUN:
        if ((rc = lane_proc(t, *lane, &p))) return rc;
        if (p->has_run) { /* a second run in this lane: a process of its own */
            t->seg_of[*lane]++;
            t->proc_of[*lane] = -1;
            if ((rc = lane_proc(t, *lane, &p))) return rc;
        }
        p->has_run = 1;
        if ((rc = set_str(&p->policy, ev->run.kv_policy)) || (rc = set_str(&p->opts, ev->run.kv_opts)) ||
            (rc = set_str(&p->backend, ev->run.backend)) || (rc = set_str(&p->model, ev->run.model)))
            return rc;
        return 0;
    case PROBE_SPAN:
        if ((rc = lane_proc(t, *lane, &p))) return rc;
        return add_span(t, p, &ev->span, rec);
    case PROBE_STEP:
        CHECK(ev->step.step >= 0 && ev->step.step < CH_MAX_STEP, "step", "step", ev->step.step, 0, CH_MAX_STEP - 1);
        if ((rc = lane_proc(t, *lane, &p)) || (rc = step_at(p, ev->step.step, &s))) return rc;
        s->has_step = 1;
        s->token = ev->step.token;
        s->hit_rate = ev->step.hit_rate;
        s->seconds = ev->step.seconds;
        s->fetch_bytes = ev->step.fetch_bytes;
        return 0;
    case PROBE_DECODE_HEAD: {
        const probe_ev_decode_head *d = &ev->decode_head;
        CHECK(d->step >= 0 && d->step < CH_MAX_STEP, "decode_head", "step", d->step, 0, CH_MAX_STEP - 1);
        CHECK(d->layer >= 0, "decode_head", "layer", d->layer, 0, INT32_MAX);
        if ((rc = lane_proc(t, *lane, &p)) || (rc = step_at(p, d->step, &s))) return rc;
        if (!d->fetch_bytes) return 0;
        if ((rc = grow((void **)&t->fetch, &t->cap_fetch, t->n_fetch + 1, sizeof *t->fetch))) return rc;
        t->fetch[t->n_fetch++] = (ch_fetch){ (int)(p - t->procs), d->step, d->layer, (double)d->fetch_bytes };
        return 0;
    }
    case PROBE_ORACLE: {
        const probe_ev_oracle *o = &ev->oracle;
        CHECK(o->step >= 0 && o->step < CH_MAX_STEP, "oracle", "step", o->step, 0, CH_MAX_STEP - 1);
        if ((rc = lane_proc(t, *lane, &p)) || (rc = step_at(p, o->step, &s))) return rc;
        if (isfinite(o->recall)) { s->recall_sum += o->recall; s->n_recall++; }
        if (isfinite(o->out_err)) { s->err_sum += o->out_err; s->n_err++; }
        if (o->needle_len > 0 && o->needle_rank >= 0) rank_note(o->needle_rank, &s->ex_best, &s->ex_worst);
        return 0;
    }
    case PROBE_NEEDLE: {
        const probe_ev_needle *n = &ev->needle;
        if (n->step < 0) return 0; /* prefill: no step to count it in */
        CHECK(n->step < CH_MAX_STEP, "needle", "step", n->step, -1, CH_MAX_STEP - 1);
        if ((rc = lane_proc(t, *lane, &p)) || (rc = step_at(p, n->step, &s))) return rc;
        int best = -1;
        for (int i = 0; i < n->n_chunks; i++) /* chunks the policy ranks (not kept dense) */
            if (n->rank[i] >= 0 && !(n->n_info && n->part[i] != 0) && (best < 0 || n->rank[i] < best)) best = n->rank[i];
        if (best >= 0) rank_note(best, &s->lm_best, &s->lm_worst);
        if (n->k > 0) s->lm_k = n->k;
        return 0;
    }
    default:
        return 0;
    }
}

/* ---- arranging ------------------------------------------------------------ */

static int fetch_cmp(const void *a, const void *b) {
    const ch_fetch *x = a, *y = b;
    if (x->proc != y->proc) return x->proc < y->proc ? -1 : 1;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return (x->layer > y->layer) - (x->layer < y->layer);
}

/* Spans by process, stream, start, longest first: the order tracks are laid in. */
static int span_cmp(const void *a, const void *b) {
    const ch_span *x = a, *y = b;
    if (x->proc != y->proc) return x->proc < y->proc ? -1 : 1;
    if (x->stream != y->stream) return x->stream < y->stream ? -1 : 1;
    if (x->t0 != y->t0) return x->t0 < y->t0 ? -1 : 1;
    if (x->t1 != y->t1) return x->t1 > y->t1 ? -1 : 1;
    return (x->rec > y->rec) - (x->rec < y->rec);
}

static const ch_fetch *find_fetch(const ch_trace *t, int proc, int step, int layer) {
    ch_fetch key = { proc, step, layer, 0 };
    return bsearch(&key, t->fetch, t->n_fetch, sizeof *t->fetch, fetch_cmp);
}

/* Sums the decode-head bytes per (process, step, layer) and shares each
 * among that layer's fetch_v spans of the step, by their time. */
static int place_fetch_bytes(ch_trace *t) {
    if (t->n_fetch) qsort(t->fetch, t->n_fetch, sizeof *t->fetch, fetch_cmp);
    size_t m = 0;
    for (size_t i = 0; i < t->n_fetch; i++) {
        if (m && !fetch_cmp(&t->fetch[m - 1], &t->fetch[i])) t->fetch[m - 1].bytes += t->fetch[i].bytes;
        else t->fetch[m++] = t->fetch[i];
    }
    t->n_fetch = m;
    int fv = -1;
    for (int i = 0; i < t->n_ops; i++)
        if (!strcmp(t->ops[i], "fetch_v")) fv = i;
    if (fv < 0 || !m) return 0;
    /* the fetch_v spans' total time per key, summed in the fetch table's order */
    double *total = calloc(m, sizeof *total);
    int *count = calloc(m, sizeof *count);
    if (!total || !count) { free(total); free(count); return oom(); }
    for (size_t i = 0; i < t->n_spans; i++) {
        const ch_span *s = &t->spans[i];
        const ch_fetch *f = s->op == fv && s->step >= 0 ? find_fetch(t, s->proc, s->step, s->layer) : NULL;
        if (f) { total[f - t->fetch] += (double)(s->t1 - s->t0); count[f - t->fetch]++; }
    }
    for (size_t i = 0; i < t->n_spans; i++) {
        ch_span *s = &t->spans[i];
        const ch_fetch *f = s->op == fv && s->step >= 0 ? find_fetch(t, s->proc, s->step, s->layer) : NULL;
        if (!f) continue;
        size_t k = (size_t)(f - t->fetch);
        s->bytes = total[k] > 0 ? f->bytes * (double)(s->t1 - s->t0) / total[k] : f->bytes / count[k];
    }
    free(total);
    free(count);
    return 0;
}

/* Lays each (process, stream)'s spans on tracks: a span goes on the first
 * track where it nests in the innermost open span or follows it. */
static int place_tracks(ch_trace *t) {
    if (t->n_spans) qsort(t->spans, t->n_spans, sizeof *t->spans, span_cmp);
    typedef struct { int64_t *end; int n, cap; } stack;
    stack *tr = NULL;
    int n_tr = 0, made = 0, cap_tr = 0, rc = 0;
    size_t cap_th = 0;
    for (size_t i = 0; i < t->n_spans && !rc; i++) {
        ch_span *s = &t->spans[i];
        if (i == 0 || s->proc != s[-1].proc || s->stream != s[-1].stream) { /* a new stream */
            for (int k = 0; k < n_tr; k++) tr[k].n = 0;
            n_tr = 0;
        }
        int k = 0;
        for (;; k++) {
            if (k == n_tr) {
                if (n_tr == CH_MAX_TRACKS) {
                    rc = skv_error(SKV_EUNSUPPORTED, "%s: record %" PRIu64 " (span '%s'): more than %d spans of one "
                                   "stream overlap without nesting", t->path, s->rec, t->ops[s->op], CH_MAX_TRACKS);
                    break;
                }
                if (n_tr == made) { /* stacks are kept from stream to stream */
                    if ((rc = grow_int((void **)&tr, &cap_tr, n_tr + 1, sizeof *tr))) break;
                    memset(&tr[made++], 0, sizeof *tr);
                }
                n_tr++;
                /* a new thread: (proc, stream, track) */
                if ((rc = grow((void **)&t->threads, &cap_th, (size_t)t->n_threads + 1, sizeof *t->threads))) break;
                t->threads[t->n_threads++] = (ch_thread){ s->proc, s->stream, k };
            }
            stack *st = &tr[k];
            while (st->n && st->end[st->n - 1] <= s->t0) st->n--; /* spans that ended: this one follows them */
            if (!st->n || st->end[st->n - 1] >= s->t1) break;     /* nests in the innermost open one */
        }
        if (rc) break;
        stack *st = &tr[k];
        if ((rc = grow_int((void **)&st->end, &st->cap, st->n + 1, sizeof *st->end))) break;
        st->end[st->n++] = s->t1;
        s->track = k;
        if (k) t->st.overflow++;
    }
    for (int k = 0; k < made; k++) free(tr[k].end);
    free(tr);
    return rc;
}

/* Each step's extent: its spans' first start and last end; a step without
 * spans starts where the one before ended and lasts its recorded time. */
static void place_steps(ch_trace *t) {
    for (size_t i = 0; i < t->n_spans; i++) {
        const ch_span *s = &t->spans[i];
        ch_proc *p = &t->procs[s->proc];
        if (s->step < 0) {
            if (!p->has_pre || s->t0 < p->pre_t0) p->pre_t0 = s->t0;
            if (!p->has_pre || s->t1 > p->pre_t1) p->pre_t1 = s->t1;
            p->has_pre = 1;
            continue;
        }
        ch_step *st = &p->steps[s->step];
        if (!st->has_span || s->t0 < st->t0) st->t0 = s->t0;
        if (!st->has_span || s->t1 > st->t1) st->t1 = s->t1;
        st->has_span = 1;
    }
    for (int i = 0; i < t->n_procs; i++) {
        ch_proc *p = &t->procs[i];
        int64_t at = p->has_pre ? p->pre_t1 : 0;
        for (int k = 0; k < p->n_steps; k++) {
            ch_step *st = &p->steps[k];
            if (!st->seen) continue;
            if (!st->has_span) {
                double d = st->has_step && isfinite(st->seconds) && st->seconds > 0 && st->seconds < CH_MAX_SECONDS
                               ? st->seconds : 0;
                st->t0 = at;
                st->t1 = at + llround(d * 1e9);
            }
            at = st->t1;
            t->st.steps++;
        }
    }
}

/* ---- writing ------------------------------------------------------------- */

/* A JSON string: valid UTF-8 as is, control characters escaped, any byte
 * that is not part of valid UTF-8 as U+FFFD. */
static void put_str(FILE *f, const char *s) {
    fputc('"', f);
    size_t n = s ? strlen(s) : 0;
    for (size_t i = 0; i < n;) {
        const unsigned char *u = (const unsigned char *)s + i;
        if (*u == '"' || *u == '\\') { fputc('\\', f); fputc(*u, f); i++; continue; }
        if (*u < 0x20) {
            if (*u == '\n') fputs("\\n", f);
            else if (*u == '\t') fputs("\\t", f);
            else if (*u == '\r') fputs("\\r", f);
            else fprintf(f, "\\u%04x", *u);
            i++;
            continue;
        }
        int len = trace_utf8_len(u, n - i);
        if (!len) { fputs("\\ufffd", f); i++; continue; }
        fwrite(u, 1, (size_t)len, f);
        i += (size_t)len;
    }
    fputc('"', f);
}

/* A finite number with digits significant digits (integers whole); the
 * callers never pass NaN or an infinity, and this writes 0 if one came. */
static void put_num(FILE *f, double v, int digits) {
    char b[40];
    fputs(isfinite(v) ? skv_num(b, sizeof b, v, digits) : "0", f);
}

/* Nanoseconds as microseconds, exact: "12.345". */
static void put_us(FILE *f, int64_t ns) {
    uint64_t a = ns < 0 ? (uint64_t)0 - (uint64_t)ns : (uint64_t)ns;
    fprintf(f, "%s%" PRIu64 ".%03u", ns < 0 ? "-" : "", a / 1000, (unsigned)(a % 1000));
}

/* A cJSON value re-written through put_str and put_num (the trace's
 * metadata: cJSON keeps any bytes a writer put in its strings). */
static void put_json(FILE *f, const cJSON *j, int depth) {
    if (depth > 64 || !j) { fputs("null", f); return; }
    if (cJSON_IsObject(j) || cJSON_IsArray(j)) {
        int obj = cJSON_IsObject(j);
        fputc(obj ? '{' : '[', f);
        for (const cJSON *c = j->child; c; c = c->next) {
            if (c != j->child) fputc(',', f);
            if (obj) { put_str(f, c->string); fputc(':', f); }
            put_json(f, c, depth + 1);
        }
        fputc(obj ? '}' : ']', f);
    } else if (cJSON_IsString(j)) {
        put_str(f, j->valuestring);
    } else if (cJSON_IsNumber(j)) {
        if (isfinite(j->valuedouble)) put_num(f, j->valuedouble, 17);
        else fputs("null", f);
    } else if (cJSON_IsTrue(j)) {
        fputs("true", f);
    } else if (cJSON_IsFalse(j)) {
        fputs("false", f);
    } else {
        fputs("null", f);
    }
}

static int tid_of(int stream, int track) { return 1 + stream + CH_MAX_STREAM * track; }

/* The process's name as the views label its lane. */
static void proc_name(const ch_trace *t, const ch_proc *p, char *buf, size_t n) {
    const char *pol = p->policy && *p->policy ? p->policy : p->lane_policy && *p->lane_policy ? p->lane_policy : "";
    char run[32] = "";
    if (p->seg) snprintf(run, sizeof run, "run %d: ", p->seg + 1);
    if (t->batched) snprintf(buf, n, "%sseq %d%s%s%s", run, p->lane, *pol ? " (" : "", pol, *pol ? ")" : "");
    else snprintf(buf, n, "%s%s", run, *pol ? pol : "run");
}

/* The run's options of p, or of the lane-0 run of the same policy (a
 * batch's later sequences have no run record of their own). */
static const char *proc_opts(const ch_trace *t, const ch_proc *p, const char **backend) {
    const ch_proc *src = p;
    if (!p->has_run)
        for (int i = 0; i < t->n_procs; i++)
            if (t->procs[i].has_run && t->procs[i].seg == p->seg) { src = &t->procs[i]; break; }
    *backend = src->backend ? src->backend : "";
    return src->opts ? src->opts : "";
}

static void thread_name(const ch_trace *t, const ch_thread *th, char *buf, size_t n) {
    const char *backend;
    proc_opts(t, &t->procs[th->proc], &backend);
    int cuda = !strcmp(backend, "cuda");
    char base[64];
    if (th->stream < PROBE_STREAM_COUNT) snprintf(base, sizeof base, "%s", probe_stream_name(th->stream));
    else snprintf(base, sizeof base, "stream %d", th->stream);
    if (cuda && th->stream < 2) /* the device's spans: its compute stream and its copy stream */
        snprintf(base + strlen(base), sizeof base - strlen(base), " (CUDA stream %d)", th->stream);
    if (th->track) snprintf(buf, n, "%s (overlap %d)", base, th->track);
    else snprintf(buf, n, "%s", base);
}

typedef struct { ch_trace *t; FILE *f; int first; } ch_out;

/* Starts the next event of traceEvents. */
static FILE *ev_begin(ch_out *o) {
    fputs(o->first ? "\n" : ",\n", o->f);
    o->first = 0;
    o->t->st.events++;
    return o->f;
}

static void put_meta_ev(ch_out *o, const char *name, int pid, int tid, const char *key, const char *sval, double nval) {
    FILE *f = ev_begin(o);
    fprintf(f, "{\"ph\":\"M\",\"name\":\"%s\",\"pid\":%d,\"tid\":%d,\"args\":{\"%s\":", name, pid, tid, key);
    if (sval) put_str(f, sval);
    else put_num(f, nval, 17);
    fputs("}}", f);
}

/* One counter track value at ts, when finite. */
static void put_counter(ch_out *o, int pid, int64_t ts, const char *name, const char *const *keys, const double *vals,
                        int n) {
    int any = 0;
    for (int i = 0; i < n; i++) any |= isfinite(vals[i]);
    if (!any) return;
    FILE *f = ev_begin(o);
    fprintf(f, "{\"ph\":\"C\",\"name\":\"%s\",\"cat\":\"step\",\"pid\":%d,\"tid\":%d,\"ts\":", name, pid, tid_of(0, 0));
    put_us(f, ts);
    fputs(",\"args\":{", f);
    for (int i = 0, w = 0; i < n; i++) {
        if (!isfinite(vals[i])) continue;
        fprintf(f, "%s\"%s\":", w++ ? "," : "", keys[i]);
        put_num(f, vals[i], 9);
    }
    fputs("}}", f);
}

static void put_step(ch_out *o, int pid, int k, const ch_step *s) {
    FILE *f = ev_begin(o);
    fprintf(f, "{\"ph\":\"i\",\"s\":\"p\",\"name\":\"step %d\",\"cat\":\"step\",\"pid\":%d,\"tid\":%d,\"ts\":", k, pid,
            tid_of(0, 0));
    put_us(f, s->t0);
    fprintf(f, ",\"args\":{\"step\":%d", k);
    if (s->has_step) {
        fprintf(f, ",\"token\":%d", s->token);
        if (isfinite(s->seconds)) { fputs(",\"seconds\":", f); put_num(f, s->seconds, 9); }
    }
    fputs("}}", f);
    if (s->has_step) {
        put_counter(o, pid, s->t0, "hit rate", (const char *const[]){ "hit_rate" }, (double[]){ s->hit_rate }, 1);
        put_counter(o, pid, s->t0, "bytes fetched", (const char *const[]){ "bytes" }, (double[]){ (double)s->fetch_bytes },
                    1);
    }
    if (s->n_recall)
        put_counter(o, pid, s->t0, "mass recall", (const char *const[]){ "recall" },
                    (double[]){ s->recall_sum / s->n_recall }, 1);
    if (s->n_err)
        put_counter(o, pid, s->t0, "output error", (const char *const[]){ "out_err" },
                    (double[]){ s->err_sum / s->n_err }, 1);
    if (s->lm_best >= 0 || s->ex_best >= 0) {
        const char *keys[5];
        double vals[5];
        int n = 0;
        if (s->lm_best >= 0) {
            keys[n] = "landmark_best", vals[n++] = s->lm_best;
            keys[n] = "landmark_worst", vals[n++] = s->lm_worst;
            if (s->lm_k > 0) keys[n] = "k", vals[n++] = s->lm_k;
        }
        if (s->ex_best >= 0) {
            keys[n] = "exact_best", vals[n++] = s->ex_best;
            keys[n] = "exact_worst", vals[n++] = s->ex_worst;
        }
        put_counter(o, pid, s->t0, "needle rank", keys, vals, n);
    }
}

static void put_span(ch_out *o, const ch_span *s) {
    FILE *f = ev_begin(o);
    fputs("{\"ph\":\"X\",\"name\":", f);
    put_str(f, o->t->ops[s->op]);
    fprintf(f, ",\"cat\":\"%s\",\"pid\":%d,\"tid\":%d,\"ts\":", s->step < 0 ? "prefill" : "decode", s->proc + 1,
            tid_of(s->stream, s->track));
    put_us(f, s->t0);
    fputs(",\"dur\":", f);
    put_us(f, s->t1 - s->t0);
    fprintf(f, ",\"args\":{\"layer\":%d,\"head\":-1,\"step\":%d", s->layer, s->step);
    if (s->bytes > 0) {
        fputs(",\"bytes\":", f);
        put_num(f, round(s->bytes), 17);
        if (s->t1 > s->t0) {
            fputs(",\"GB/s\":", f);
            put_num(f, s->bytes / (double)(s->t1 - s->t0), 4); /* bytes per ns = GB/s */
        }
    }
    fputs("}}", f);
}

static const char *meta_str(const cJSON *o, const char *key) {
    const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, key));
    return s ? s : "";
}

static int write_json(FILE *f, void *ctx, const char *path) {
    (void)path;
    ch_trace *t = ctx;
    ch_out o = { t, f, 1 };
    fputs("{\"traceEvents\":[", f);
    char name[256];
    for (int i = 0; i < t->n_procs; i++) {
        const ch_proc *p = &t->procs[i];
        int pid = i + 1;
        const char *backend, *opts = proc_opts(t, p, &backend);
        proc_name(t, p, name, sizeof name);
        put_meta_ev(&o, "process_name", pid, 0, "name", name, 0);
        put_meta_ev(&o, "process_sort_index", pid, 0, "sort_index", NULL, i);
        if (*opts) put_meta_ev(&o, "process_labels", pid, 0, "labels", opts, 0);
        int named_compute = 0;
        for (int k = 0; k < t->n_threads; k++) {
            const ch_thread *th = &t->threads[k];
            if (th->proc != i) continue;
            thread_name(t, th, name, sizeof name);
            int tid = tid_of(th->stream, th->track);
            named_compute |= tid == tid_of(0, 0);
            put_meta_ev(&o, "thread_name", pid, tid, "name", name, 0);
            put_meta_ev(&o, "thread_sort_index", pid, tid, "sort_index", NULL, th->stream * CH_MAX_TRACKS + th->track);
        }
        if (!named_compute) { /* the steps' and counters' thread, when the lane has no compute spans */
            ch_thread th = { i, 0, 0 };
            thread_name(t, &th, name, sizeof name);
            put_meta_ev(&o, "thread_name", pid, tid_of(0, 0), "name", name, 0);
            put_meta_ev(&o, "thread_sort_index", pid, tid_of(0, 0), "sort_index", NULL, 0);
        }
        for (int k = 0; k < p->n_steps; k++)
            if (p->steps[k].seen) put_step(&o, pid, k, &p->steps[k]);
    }
    for (size_t i = 0; i < t->n_spans; i++) put_span(&o, &t->spans[i]);
    t->st.spans = t->n_spans;
    fputs("\n],\n\"displayTimeUnit\":\"ms\",\n", f);

    /* otherData: flat strings (chrome://tracing lists them); metadata: the same and the trace's own */
    const cJSON *run = cJSON_GetObjectItemCaseSensitive(t->meta, "run");
    char pols[2048] = "";
    size_t len = 0;
    for (int i = 0; i < t->n_procs && len < sizeof pols; i++) {
        const ch_proc *p = &t->procs[i];
        const char *backend, *opts = proc_opts(t, p, &backend);
        proc_name(t, p, name, sizeof name);
        len += (size_t)snprintf(pols + len, sizeof pols - len, "%s%s%s%s", i ? "; " : "", name, *opts ? ": " : "", opts);
    }
    const char *model = meta_str(run, "model"), *backend = meta_str(run, "backend");
    for (int i = 0; i < t->n_procs && !*model; i++) /* no metadata (a trace cut short): its first run record */
        if (t->procs[i].has_run) model = t->procs[i].model, backend = t->procs[i].backend;
    char exporter[96];
    snprintf(exporter, sizeof exporter, "skv %s (skv export --format chrome)", SKV_VERSION);
    const char *keys[] = { "model", "backend", "policies", "trace", "trace_writer", "exported_by", "cut_short" };
    const char *vals[] = { model, backend, pols, t->path, t->who, exporter, t->notice };
    for (int pass = 0; pass < 2; pass++) {
        fputs(pass ? "\"metadata\":{" : "\"otherData\":{", f);
        for (int i = 0, w = 0; i < (int)(sizeof keys / sizeof keys[0]); i++) {
            if (!*vals[i]) continue;
            fprintf(f, "%s\"%s\":", w++ ? "," : "", keys[i]);
            put_str(f, vals[i]);
        }
        if (pass) {
            fprintf(f, ",\"skv_version\":\"%s\",\"processes\":%d,\"steps\":%d,\"spans\":%" PRIu64 ",\"skv_trace\":",
                    SKV_VERSION, t->n_procs, t->st.steps, (uint64_t)t->n_spans);
            put_json(f, t->meta, 0);
        }
        fputs(pass ? "}\n" : "},\n", f);
    }
    fputs("}\n", f);
    return ferror(f) ? skv_error(SKV_EIO, "%s: cannot write it", path) : 0;
}

static void ch_free(ch_trace *t) {
    for (int i = 0; i < t->n_procs; i++) {
        ch_proc *p = &t->procs[i];
        free(p->policy);
        free(p->opts);
        free(p->backend);
        free(p->model);
        free(p->lane_policy);
        free(p->steps);
    }
    free(t->procs);
    for (int i = 0; i < t->n_ops; i++) free(t->ops[i]);
    free(t->ops);
    free(t->op_slot);
    free(t->spans);
    free(t->fetch);
    free(t->threads);
    cJSON_Delete(t->meta);
}

int trace_export_chrome(const char *path, const char *out, int force, int partial, trace_chrome_stats *stats) {
    if (stats) memset(stats, 0, sizeof *stats);
    trace_reader *r = NULL;
    int rc = trace_open(path, &r);
    if (rc) return rc;
    ch_trace t;
    memset(&t, 0, sizeof t);
    t.path = path;
    for (int i = 0; i < PROBE_MAX_LANES; i++) t.proc_of[i] = -1;
    snprintf(t.notice, sizeof t.notice, "%s", trace_last_notice());
    if (*t.notice && !partial) {
        trace_close(r);
        return skv_error(SKV_EFORMAT, "%s; add --partial to export what is intact", t.notice);
    }
    trace_writer_label(r, t.who, sizeof t.who);
    t.meta = cJSON_Parse(trace_meta_json(r));
    if (!t.meta) rc = oom();
    const probe_event *ev;
    uint64_t rec = 0;
    int lane = 0;
    while (!rc) {
        int k = trace_next(r, &ev);
        if (k < 0) { rc = k; break; }
        if (k == 0) break;
        rc = add_event(&t, ev, rec++, &lane);
    }
    trace_close(r);
    if (!rc && !t.n_procs) rc = skv_error(SKV_EMISSING, "%s: no records to export", path);
    if (!rc) rc = place_fetch_bytes(&t);
    if (!rc) rc = place_tracks(&t);
    if (!rc) {
        place_steps(&t);
        rc = skv_save_atomic(out, force, write_json, &t);
    }
    if (!rc) {
        t.st.processes = t.n_procs;
        t.st.threads = t.n_threads;
        if (stats) *stats = t.st;
    }
    ch_free(&t);
    return rc;
}
