/* probe.c: the event schema, event copies, and the probe bus with its ring
 * and callback subscribers.
 *
 * Emission takes the bus lock twice (to pin the interested subscribers, then
 * to unpin them) and never holds it while delivering, so a producer blocked
 * on a full ring stalls nobody else: subscribe, unsubscribe and the other
 * subscribers keep working. Each subscriber has its own lock; a ring's slots
 * keep their array buffers between events, so a steady stream allocates
 * nothing once every slot has seen its largest event. */
#include "probe.h"

#include "skv.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(int) == 4 && sizeof(float) == 4 && sizeof(double) == 8, "probe fields assume 32-bit int and float");
_Static_assert(sizeof(const float *) == sizeof(const void *) && sizeof(const int *) == sizeof(const void *),
               "array fields are read and written as void pointers");

/* ---- key=value lists ------------------------------------------------------ */

double probe_pairs_get(const char *pairs, const char *key, double def) {
    size_t kl = strlen(key);
    for (const char *p = pairs ? pairs : ""; *p;) {
        while (*p == ' ') p++;
        const char *end = p;
        while (*end && *end != ' ') end++;
        if ((size_t)(end - p) > kl && !strncmp(p, key, kl) && p[kl] == '=') {
            char *num_end;
            double v = strtod(p + kl + 1, &num_end);
            return num_end == end && num_end != p + kl + 1 ? v : def;
        }
        p = end;
    }
    return def;
}

int probe_pairs_int(const char *pairs, const char *key, int def, int lo, int hi) {
    double v = probe_pairs_get(pairs, key, NAN);
    return v >= lo && v <= hi ? (int)v : def;
}

int probe_pairs_in_force(const char *opts, const char *stats, char *buf, size_t n) {
    int diff = 0;
    size_t len = 0;
    if (n) buf[0] = 0;
    for (const char *p = opts ? opts : ""; *p;) {
        while (*p == ' ') p++;
        const char *eq = p, *end = p;
        while (*end && *end != ' ') end++;
        while (eq < end && *eq != '=') eq++;
        char key[64];
        if (eq < end && eq > p && (size_t)(eq - p) < sizeof key) {
            memcpy(key, p, (size_t)(eq - p));
            key[eq - p] = 0;
            double asked = probe_pairs_get(opts, key, NAN), used = probe_pairs_get(stats, key, NAN);
            if (!isnan(asked) && !isnan(used) && used != asked) {
                char a[40], b[40];
                diff++;
                if (len < n)
                    len += (size_t)snprintf(buf + len, n - len, "%s%s=%s (asked %s)", len ? " " : "", key,
                                            skv_num(a, sizeof a, used, 6), skv_num(b, sizeof b, asked, 6));
            }
        }
        p = end;
    }
    return diff;
}

/* ---- schema ------------------------------------------------------------ */

#define SC(m, f) { #f, PROBE_F_I32, offsetof(probe_event, m.f), -1 }
#define SF(m, f) { #f, PROBE_F_F32, offsetof(probe_event, m.f), -1 }
#define SD(m, f) { #f, PROBE_F_F64, offsetof(probe_event, m.f), -1 }
#define SU(m, f) { #f, PROBE_F_U64, offsetof(probe_event, m.f), -1 }
#define SS(m, f) { #f, PROBE_F_STR, offsetof(probe_event, m.f), -1 }
#define SA(m, f, t, c) { #f, t, offsetof(probe_event, m.f), c }

static const probe_field schema_run[] = {
    SC(run, random_weights), SC(run, n_layers), SC(run, n_heads), SC(run, n_kv_heads), SC(run, head_dim),
    SC(run, max_ctx), SC(run, prompt_len), SC(run, budget), SC(run, oracle),
    SS(run, model), SS(run, arch), SS(run, format), SS(run, kv_policy), SS(run, backend), SS(run, kv_opts),
};

static const probe_field schema_token[] = {
    SC(token, pos), SC(token, id), SC(token, step), SC(token, n_text),
    SA(token, text, PROBE_F_BYTES, 3),
};

static const probe_field schema_prefill_layer[] = {
    SC(prefill_layer, layer), SC(prefill_layer, seq_len), SC(prefill_layer, rank), SC(prefill_layer, n_sv),
    SF(prefill_layer, rel_err), SD(prefill_layer, t_svd), SD(prefill_layer, t_landmarks),
    SD(prefill_layer, t_cosmin), SD(prefill_layer, t_outliers), SD(prefill_layer, t_offload),
    SA(prefill_layer, sv, PROBE_F_F32S, 3),
};

static const probe_field schema_prefill_head[] = {
    SC(prefill_head, layer), SC(prefill_head, head), SC(prefill_head, chunk), SC(prefill_head, n_chunks),
    SC(prefill_head, n_outliers), SC(prefill_head, n_landmarks), SC(prefill_head, local_start),
    SA(prefill_head, cos_min, PROBE_F_F32S, 3), SA(prefill_head, outliers, PROBE_F_I32S, 4),
};

static const probe_field schema_decode_head[] = {
    SC(decode_head, step), SC(decode_head, layer), SC(decode_head, head), SC(decode_head, block),
    SU(decode_head, fetch_bytes), SC(decode_head, n_sel),
    SC(decode_head, hits), SC(decode_head, misses), SC(decode_head, has_oracle), SF(decode_head, recall),
    SC(decode_head, n_chunks),
    SA(decode_head, sel, PROBE_F_I32S, 5), SA(decode_head, score, PROBE_F_F32S, 5),
    SA(decode_head, rank_exact, PROBE_F_I32S, 10), SA(decode_head, rank_landmark, PROBE_F_I32S, 10),
};

static const probe_field schema_step[] = {
    SC(step, step), SC(step, token), SD(step, seconds), SU(step, kv_resident), SU(step, kv_offloaded),
    SF(step, hit_rate), SC(step, has_oracle), SC(step, top1_agree), SC(step, n_fetch), SU(step, fetch_bytes),
    SS(step, kv_stats),
};

static const probe_field schema_span[] = {
    SC(span, stream), SC(span, layer), SC(span, step), SD(span, t0), SD(span, t1), SS(span, op),
};

static const probe_field schema_needle[] = {
    SC(needle, id), SC(needle, tok_begin), SC(needle, tok_end), SC(needle, n_chunks),
    SC(needle, step), SC(needle, layer), SC(needle, head), SF(needle, mass_exact), SF(needle, mass_sparse),
    SA(needle, chunks, PROBE_F_I32S, 3), SA(needle, rank, PROBE_F_I32S, 3), SA(needle, selected, PROBE_F_I32S, 3),
    /* appended (fields 12..): scalars, then arrays counted by n_info (field 16) */
    SC(needle, k), SF(needle, key_err), SF(needle, mass_ideal), SF(needle, out_err), SC(needle, n_info),
    SA(needle, part, PROBE_F_I32S, 16), SA(needle, rank_exact, PROBE_F_I32S, 16),
    SA(needle, cos_min, PROBE_F_F32S, 16), SA(needle, mass_chunk, PROBE_F_F32S, 16),
};

static const probe_field schema_niah[] = {
    SC(niah, index), SC(niah, length), SF(niah, depth), SC(niah, run), SC(niah, method), SC(niah, hit),
    SC(niah, prompt_len), SC(niah, tok_begin), SC(niah, tok_end), SC(niah, detail), SC(niah, n_steps),
    SS(niah, policy), SS(niah, value), SS(niah, answer),
    SA(niah, top1_agree, PROBE_F_I32S, 10), SA(niah, logit_dist, PROBE_F_F32S, 10),
};

static const probe_field schema_oracle[] = {
    SC(oracle, step), SC(oracle, layer), SC(oracle, head), SC(oracle, n_q), SC(oracle, unit), SC(oracle, ctx),
    SC(oracle, n_kept), SC(oracle, n_gen), SF(oracle, recall), SF(oracle, overlap), SF(oracle, out_err),
    SF(oracle, mass_kept), SC(oracle, needle_len), SC(oracle, needle_kept), SC(oracle, needle_rank),
    SF(oracle, needle_mass),
    SA(oracle, q_kept, PROBE_F_I32S, 3), SA(oracle, q_recall, PROBE_F_F32S, 3),
    SA(oracle, q_overlap, PROBE_F_F32S, 3), SA(oracle, q_out_err, PROBE_F_F32S, 3),
};

static const probe_field schema_lane[] = {
    SC(lane, lane), SC(lane, n_lanes), SS(lane, policy), SS(lane, teacher),
};

static const probe_field schema_metric[] = {
    SC(metric, step), SC(metric, layer), SC(metric, head), SF(metric, value), SC(metric, n),
    SS(metric, name), SA(metric, vals, PROBE_F_F32S, 4),
};

#define NF(a) ((int)(sizeof a / sizeof a[0]))
static const struct { const char *name; const probe_field *f; int n; } schemas[PROBE_KIND_COUNT] = {
    [PROBE_NONE] = { "none", NULL, 0 },
    [PROBE_RUN] = { "run", schema_run, NF(schema_run) },
    [PROBE_TOKEN] = { "token", schema_token, NF(schema_token) },
    [PROBE_PREFILL_LAYER] = { "prefill_layer", schema_prefill_layer, NF(schema_prefill_layer) },
    [PROBE_PREFILL_HEAD] = { "prefill_head", schema_prefill_head, NF(schema_prefill_head) },
    [PROBE_DECODE_HEAD] = { "decode_head", schema_decode_head, NF(schema_decode_head) },
    [PROBE_STEP] = { "step", schema_step, NF(schema_step) },
    [PROBE_SPAN] = { "span", schema_span, NF(schema_span) },
    [PROBE_NEEDLE] = { "needle", schema_needle, NF(schema_needle) },
    [PROBE_NIAH] = { "niah", schema_niah, NF(schema_niah) },
    [PROBE_ORACLE] = { "oracle", schema_oracle, NF(schema_oracle) },
    [PROBE_LANE] = { "lane", schema_lane, NF(schema_lane) },
    [PROBE_METRIC] = { "metric", schema_metric, NF(schema_metric) },
};

const probe_field *probe_schema(probe_kind k, int *n_fields) {
    if ((int)k <= PROBE_NONE || (int)k >= PROBE_KIND_COUNT) {
        if (n_fields) *n_fields = 0;
        return NULL;
    }
    if (n_fields) *n_fields = schemas[k].n;
    return schemas[k].f;
}

const char *probe_kind_name(probe_kind k) {
    return (int)k > PROBE_NONE && (int)k < PROBE_KIND_COUNT ? schemas[k].name : "unknown";
}

const char *probe_stream_name(int stream) {
    switch (stream) {
    case PROBE_STREAM_COMPUTE: return "compute";
    case PROBE_STREAM_FETCH: return "fetch";
    case PROBE_STREAM_REBUILD: return "rebuild";
    default: return "other";
    }
}

/* ---- field access ------------------------------------------------------ */

static const void *field_ptr(const probe_event *e, const probe_field *f) {
    const void *p;
    memcpy(&p, (const char *)e + f->off, sizeof p);
    return p;
}

static void field_set_ptr(probe_event *e, const probe_field *f, const void *p) {
    memcpy((char *)e + f->off, &p, sizeof p);
}

static size_t scalar_size(probe_ftype t) {
    return t == PROBE_F_I32 || t == PROBE_F_F32 ? 4 : t == PROBE_F_F64 || t == PROBE_F_U64 ? 8 : 0;
}

static size_t elem_size(probe_ftype t) {
    return t == PROBE_F_BYTES ? 1 : t == PROBE_F_I32S || t == PROBE_F_F32S ? 4 : 0;
}

/* Element count of array field f (its count field's value). */
static int field_count(const probe_event *e, const probe_field *fs, const probe_field *f) {
    int n;
    memcpy(&n, (const char *)e + fs[f->count].off, sizeof n);
    return n;
}

/* Bytes the copy of field f needs: the array or string plus a NUL for text. */
static size_t field_bytes(const probe_event *e, const probe_field *fs, const probe_field *f) {
    if (f->type == PROBE_F_STR) {
        const char *s = field_ptr(e, f);
        return (s ? strlen(s) : 0) + 1;
    }
    size_t n = (size_t)field_count(e, fs, f) * elem_size(f->type);
    return f->type == PROBE_F_BYTES ? n + 1 : n;
}

static size_t align8(size_t n) { return (n + 7) & ~(size_t)7; }

int probe_event_check(const probe_event *ev) {
    if (!ev) return skv_error(SKV_EINVAL, "probe: NULL event");
    int nf;
    const probe_field *fs = probe_schema(ev->kind, &nf);
    if (!fs) return skv_error(SKV_EINVAL, "probe: event kind %d is not known", (int)ev->kind);
    for (int i = 0; i < nf; i++) {
        const probe_field *f = &fs[i];
        if (!elem_size(f->type)) continue;
        int n = field_count(ev, fs, f);
        if (n < 0)
            return skv_error(SKV_EINVAL, "probe: %s event: %s = %d, expected >= 0", schemas[ev->kind].name,
                             fs[f->count].name, n);
        if (n > 0 && !field_ptr(ev, f))
            return skv_error(SKV_EINVAL, "probe: %s event: %s is NULL but %s = %d", schemas[ev->kind].name,
                             f->name, fs[f->count].name, n);
    }
    return 0;
}

/* Bytes beyond the probe_event itself that a copy of ev needs. */
static size_t event_extra(const probe_event *ev) {
    int nf;
    const probe_field *fs = probe_schema(ev->kind, &nf);
    size_t total = 0;
    for (int i = 0; i < nf; i++)
        if (fs[i].type == PROBE_F_STR || elem_size(fs[i].type)) total += align8(field_bytes(ev, fs, &fs[i]));
    return total;
}

/* Copies src into dst, its arrays and strings into buf (event_extra bytes). */
static void event_copy_into(probe_event *dst, char *buf, const probe_event *src) {
    int nf;
    const probe_field *fs = probe_schema(src->kind, &nf);
    *dst = *src;
    for (int i = 0; i < nf; i++) {
        const probe_field *f = &fs[i];
        if (f->type != PROBE_F_STR && !elem_size(f->type)) continue;
        const char *from = field_ptr(src, f);
        size_t n = field_bytes(src, fs, f);
        if (f->type == PROBE_F_STR) {
            if (n > 1) memcpy(buf, from, n);
            else buf[0] = 0;
        } else if (f->type == PROBE_F_BYTES) {
            if (n > 1) memcpy(buf, from, n - 1);
            buf[n - 1] = 0;
        } else if (n) {
            memcpy(buf, from, n);
        }
        field_set_ptr(dst, f, n ? buf : NULL);
        buf += align8(n);
    }
}

probe_event *probe_event_dup(const probe_event *ev) {
    size_t head = align8(sizeof(probe_event));
    char *p = skv_malloc(head + event_extra(ev));
    if (!p) return NULL;
    event_copy_into((probe_event *)p, p + head, ev);
    return (probe_event *)p;
}

int probe_event_equal(const probe_event *a, const probe_event *b) {
    if (a->kind != b->kind) return 0;
    int nf;
    const probe_field *fs = probe_schema(a->kind, &nf);
    if (!fs) return 0;
    for (int i = 0; i < nf; i++) {
        const probe_field *f = &fs[i];
        size_t sz = scalar_size(f->type);
        if (sz) {
            if (memcmp((const char *)a + f->off, (const char *)b + f->off, sz)) return 0;
        } else if (f->type == PROBE_F_STR) {
            const char *x = field_ptr(a, f), *y = field_ptr(b, f);
            if (strcmp(x ? x : "", y ? y : "")) return 0;
        } else {
            size_t n = (size_t)field_count(a, fs, f) * elem_size(f->type);
            if (n && memcmp(field_ptr(a, f), field_ptr(b, f), n)) return 0;
        }
    }
    return 1;
}

/* ---- bus --------------------------------------------------------------- */

#define PROBE_MAX_SUBS 16

typedef struct {
    probe_event ev;
    char *buf;          /* (buf_cap) bytes the event's arrays point into */
    size_t buf_cap;
} ring_slot;

struct probe_sub {
    probe_bus *bus;
    unsigned mask;
    int refs, dead;                 /* under the bus lock */
    pthread_mutex_t mu;
    int closed;                     /* under mu: unsubscribing */
    probe_callback fn;              /* callback subscriber, or NULL for a ring */
    void *user;
    pthread_cond_t not_full, not_empty;
    ring_slot *slots;               /* (cap) */
    int cap, head, tail, count;     /* under mu */
    int waiting;                    /* producers blocked on a full ring */
    uint64_t stalls;
};

struct probe_bus_priv {
    pthread_mutex_t mu;
    pthread_cond_t idle;            /* a dead subscriber's last delivery ended */
    probe_sub *subs[PROBE_MAX_SUBS];
    int n_subs;
    double t0;
};

int probe_bus_new(probe_bus **out) {
    *out = NULL;
    probe_bus *b = skv_calloc(1, sizeof *b);
    struct probe_bus_priv *p = skv_calloc(1, sizeof *p);
    if (!b || !p) {
        free(b);
        free(p);
        return skv_error(SKV_ENOMEM, "probe: out of memory for the bus");
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->idle, NULL);
    p->t0 = skv_now();
    b->priv = p;
    *out = b;
    return 0;
}

static void sub_free(probe_sub *s) {
    if (s->slots)
        for (int i = 0; i < s->cap; i++) free(s->slots[i].buf);
    free(s->slots);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->not_full);
    pthread_cond_destroy(&s->not_empty);
    free(s);
}

void probe_bus_free(probe_bus *b) {
    if (!b) return;
    for (int i = 0; i < b->priv->n_subs; i++) sub_free(b->priv->subs[i]);
    pthread_mutex_destroy(&b->priv->mu);
    pthread_cond_destroy(&b->priv->idle);
    free(b->priv);
    free(b);
}

double probe_time(const probe_bus *b) { return b ? skv_now() - b->priv->t0 : 0.0; }

/* Recomputes the bus mask from its subscribers; caller holds the bus lock. */
static void bus_update_mask(probe_bus *b) {
    unsigned m = 0;
    for (int i = 0; i < b->priv->n_subs; i++) m |= b->priv->subs[i]->mask;
    __atomic_store_n(&b->mask, m & PROBE_ALL, __ATOMIC_RELAXED);
}

static int bus_attach(probe_bus *b, probe_sub *s) {
    struct probe_bus_priv *p = b->priv;
    pthread_mutex_lock(&p->mu);
    if (p->n_subs == PROBE_MAX_SUBS) {
        pthread_mutex_unlock(&p->mu);
        return skv_error(SKV_ERANGE, "probe: more than %d subscribers on one bus", PROBE_MAX_SUBS);
    }
    p->subs[p->n_subs++] = s;
    bus_update_mask(b);
    pthread_mutex_unlock(&p->mu);
    return 0;
}

static probe_sub *sub_new(probe_bus *b, unsigned mask) {
    probe_sub *s = skv_calloc(1, sizeof *s);
    if (!s) return NULL;
    s->bus = b;
    s->mask = mask & PROBE_ALL;
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->not_full, &ca);
    pthread_cond_init(&s->not_empty, &ca);
    pthread_condattr_destroy(&ca);
    return s;
}

int probe_subscribe_ring(probe_bus *b, unsigned mask, int capacity, probe_sub **out) {
    *out = NULL;
    if (!b || capacity < 1) return skv_error(SKV_EINVAL, "probe: ring capacity %d, expected >= 1", capacity);
    probe_sub *s = sub_new(b, mask);
    if (s) s->slots = skv_calloc((size_t)capacity, sizeof *s->slots);
    if (!s || !s->slots) {
        if (s) sub_free(s);
        return skv_error(SKV_ENOMEM, "probe: out of memory for a ring of %d events", capacity);
    }
    s->cap = capacity;
    int rc = bus_attach(b, s);
    if (rc) {
        sub_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int probe_subscribe_callback(probe_bus *b, unsigned mask, probe_callback fn, void *user, probe_sub **out) {
    *out = NULL;
    if (!b || !fn) return skv_error(SKV_EINVAL, "probe: callback subscriber needs a bus and a function");
    probe_sub *s = sub_new(b, mask);
    if (!s) return skv_error(SKV_ENOMEM, "probe: out of memory for a subscriber");
    s->fn = fn;
    s->user = user;
    int rc = bus_attach(b, s);
    if (rc) {
        sub_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

void probe_unsubscribe(probe_sub *s) {
    if (!s) return;
    struct probe_bus_priv *p = s->bus->priv;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_subs; i++)
        if (p->subs[i] == s) {
            p->subs[i] = p->subs[--p->n_subs];
            break;
        }
    s->dead = 1;
    bus_update_mask(s->bus);
    pthread_mutex_unlock(&p->mu);

    /* Wake a producer blocked on the full ring; a running callback finishes first. */
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    pthread_cond_broadcast(&s->not_full);
    pthread_cond_broadcast(&s->not_empty);
    pthread_mutex_unlock(&s->mu);

    pthread_mutex_lock(&p->mu);
    while (s->refs > 0) pthread_cond_wait(&p->idle, &p->mu);
    pthread_mutex_unlock(&p->mu);
    sub_free(s);
}

/* Copies ev into a ring slot, growing the slot's buffer when needed. */
static int slot_fill(ring_slot *slot, const probe_event *ev) {
    size_t need = event_extra(ev);
    if (need > slot->buf_cap) {
        size_t cap = need < 256 ? 256 : need + need / 2;
        char *nb = realloc(slot->buf, cap);
        if (!nb) return SKV_ENOMEM;
        slot->buf = nb;
        slot->buf_cap = cap;
    }
    event_copy_into(&slot->ev, slot->buf, ev);
    return 0;
}

static int deliver(probe_sub *s, const probe_event *ev) {
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    if (s->fn) {
        if (!s->closed) s->fn(ev, s->user);
    } else {
        if (s->count == s->cap && !s->closed) {
            s->stalls++;
            s->waiting++;
            while (s->count == s->cap && !s->closed) pthread_cond_wait(&s->not_full, &s->mu);
            s->waiting--;
        }
        if (!s->closed) {
            rc = slot_fill(&s->slots[s->head], ev);
            if (rc == 0) {
                s->head = (s->head + 1) % s->cap;
                s->count++;
                pthread_cond_signal(&s->not_empty);
            }
        }
    }
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int probe_emit(probe_bus *b, const probe_event *ev) {
    if (!b || !ev || (int)ev->kind <= PROBE_NONE || (int)ev->kind >= PROBE_KIND_COUNT) return 0;
    unsigned bit = PROBE_MASK(ev->kind);
    if (!(__atomic_load_n(&b->mask, __ATOMIC_RELAXED) & bit)) return 0;
    if (probe_event_check(ev)) {
        fprintf(stderr, "skv: %s\n", skv_last_error());
        SKV_ASSERT(!"probe_emit: malformed event");
    }
    struct probe_bus_priv *p = b->priv;
    probe_sub *to[PROBE_MAX_SUBS];
    int n = 0;
    pthread_mutex_lock(&p->mu);
    for (int i = 0; i < p->n_subs; i++)
        if (p->subs[i]->mask & bit) {
            p->subs[i]->refs++;
            to[n++] = p->subs[i];
        }
    pthread_mutex_unlock(&p->mu);

    int rc = 0;
    for (int i = 0; i < n; i++) {
        int r = deliver(to[i], ev);
        if (r && !rc) rc = skv_error(r, "probe: out of memory copying a %s event (dropped)", schemas[ev->kind].name);
    }

    pthread_mutex_lock(&p->mu);
    int wake = 0;
    for (int i = 0; i < n; i++)
        if (--to[i]->refs == 0 && to[i]->dead) wake = 1;
    if (wake) pthread_cond_broadcast(&p->idle);
    pthread_mutex_unlock(&p->mu);
    return rc;
}

int probe_emit_span(probe_bus *b, int stream, const char *op, int layer, int step, double t0, double t1) {
    if (!probe_wants(b, PROBE_SPAN)) return 0;
    probe_event ev = { .kind = PROBE_SPAN,
                       .span = { .stream = stream, .layer = layer, .step = step, .t0 = t0, .t1 = t1, .op = op } };
    return probe_emit(b, &ev);
}

int probe_emit_lane(probe_bus *b, int lane, int n_lanes, const char *policy, const char *teacher) {
    if (!probe_wants(b, PROBE_LANE)) return 0;
    probe_event ev = { .kind = PROBE_LANE,
                       .lane = { .lane = lane, .n_lanes = n_lanes, .policy = policy, .teacher = teacher } };
    return probe_emit(b, &ev);
}

int probe_emit_metric(probe_bus *b, const char *name, int step, int layer, int head, float value, int n,
                      const float *vals) {
    if (!probe_wants(b, PROBE_METRIC)) return 0;
    probe_event ev = { .kind = PROBE_METRIC, .metric = { .step = step, .layer = layer, .head = head, .name = name,
                                                        .value = value, .n = n, .vals = vals } };
    return probe_emit(b, &ev);
}

/* ---- ring consumer ----------------------------------------------------- */

const probe_event *probe_ring_peek(probe_sub *s) {
    const probe_event *ev = NULL;
    pthread_mutex_lock(&s->mu);
    if (s->count > 0) ev = &s->slots[s->tail].ev;
    pthread_mutex_unlock(&s->mu);
    return ev;
}

const probe_event *probe_ring_wait(probe_sub *s, double timeout_s) {
    struct timespec until;
    if (timeout_s >= 0) {
        clock_gettime(CLOCK_MONOTONIC, &until);
        double t = until.tv_sec + until.tv_nsec * 1e-9 + timeout_s;
        until.tv_sec = (time_t)t;
        until.tv_nsec = (long)((t - (double)until.tv_sec) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_nsec = 999999999L;
    }
    const probe_event *ev = NULL;
    pthread_mutex_lock(&s->mu);
    while (s->count == 0 && !s->closed) {
        if (timeout_s < 0) {
            pthread_cond_wait(&s->not_empty, &s->mu);
        } else if (pthread_cond_timedwait(&s->not_empty, &s->mu, &until) == ETIMEDOUT) {
            break;
        }
    }
    if (s->count > 0) ev = &s->slots[s->tail].ev;
    pthread_mutex_unlock(&s->mu);
    return ev;
}

void probe_ring_pop(probe_sub *s) {
    pthread_mutex_lock(&s->mu);
    if (s->count > 0) {
        s->tail = (s->tail + 1) % s->cap;
        s->count--;
        /* Wake blocked producers at half capacity, not per slot: fewer switches. */
        if (s->waiting && s->count <= s->cap / 2) pthread_cond_broadcast(&s->not_full);
    }
    pthread_mutex_unlock(&s->mu);
}

int probe_ring_pending(probe_sub *s) {
    pthread_mutex_lock(&s->mu);
    int n = s->count;
    pthread_mutex_unlock(&s->mu);
    return n;
}

uint64_t probe_ring_stalls(probe_sub *s) {
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->stalls;
    pthread_mutex_unlock(&s->mu);
    return n;
}
