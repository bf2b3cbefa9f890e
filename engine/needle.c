/* needle.c: the needle-in-a-haystack harness.
 *
 * Prompts are assembled from separately tokenized pieces (BOS, haystack
 * sentences, the needle sentence, the question block), so the needle's
 * token span is exact by construction and always starts at a sentence
 * boundary. Every case runs once per method on the same tokens: dense
 * first, then each KV policy of the list (with probes on, a sparse session
 * also runs the oracle and watches the needle's tokens). Answers are greedy.
 * A sparse miss is diagnosed by probes/needle_diag.c from the run's events. */
#include "needle.h"

#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "tok.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- option lists ------------------------------------------------------ */

int needle_parse_lengths(const char *s, int **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!s || !*s) return skv_error(SKV_EINVAL, "--lengths: empty list (expected e.g. 1k,2k,4k)");
    int cap = 8, cnt = 0;
    int *v = malloc(sizeof(int) * cap);
    if (!v) return skv_error(SKV_ENOMEM, "out of memory");
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno) goto bad;
        if (*end == 'k' || *end == 'K') { x *= 1024; end++; }
        if (*end != ',' && *end) goto bad;
        if (!(x >= 1 && x <= (1 << 24)) || x != floor(x)) goto bad;
        if (cnt == cap) {
            int *nv = realloc(v, sizeof(int) * (cap *= 2));
            if (!nv) { free(v); return skv_error(SKV_ENOMEM, "out of memory"); }
            v = nv;
        }
        for (int i = 0; i < cnt; i++)
            if (v[i] == (int)x) {
                free(v);
                return skv_error(SKV_EINVAL, "--lengths: %d is listed twice in '%s'", (int)x, s);
            }
        v[cnt++] = (int)x;
        p = *end ? end + 1 : end;
        if (*end && !*p) goto bad;
        continue;
bad:
        free(v);
        return skv_error(SKV_EINVAL, "--lengths: bad item at '%s' in '%s' (expected whole token counts such as 1k,2k,4096)", p, s);
    }
    *out = v;
    *n = cnt;
    return 0;
}

int needle_parse_depths(const char *s, float **out, int *n) {
    *out = NULL;
    *n = 0;
    if (!s || !*s) return skv_error(SKV_EINVAL, "--depths: empty list (expected e.g. 0:100:10 or 0,50,100)");
    if (strchr(s, ':')) {
        double a, b, st;
        char tail;
        if (sscanf(s, "%lf:%lf:%lf%c", &a, &b, &st, &tail) != 3 || !(st > 0) || !(a >= 0) || !(b <= 100) || b < a)
            return skv_error(SKV_EINVAL, "--depths: '%s' is not START:STOP:STEP with 0 <= START <= STOP <= 100 and STEP > 0", s);
        double span = floor((b - a) / st + 1e-6) + 1; /* counted in double: a tiny STEP overflows an int */
        if (!(span <= 1000)) return skv_error(SKV_EINVAL, "--depths: '%s' gives %.0f depths (at most 1000)", s, span);
        int cnt = (int)span;
        float *v = malloc(sizeof(float) * cnt);
        if (!v) return skv_error(SKV_ENOMEM, "out of memory");
        for (int i = 0; i < cnt; i++) v[i] = (float)fmin(100.0, a + i * st);
        *out = v;
        *n = cnt;
        return 0;
    }
    int cap = 8, cnt = 0;
    float *v = malloc(sizeof(float) * cap);
    if (!v) return skv_error(SKV_ENOMEM, "out of memory");
    for (const char *p = s; *p;) {
        char *end;
        errno = 0;
        double x = strtod(p, &end);
        if (end == p || errno || (*end != ',' && *end) || !(x >= 0 && x <= 100) || (*end && !end[1])) {
            free(v);
            return skv_error(SKV_EINVAL, "--depths: bad item at '%s' in '%s' (expected percents 0..100)", p, s);
        }
        if (cnt == cap) {
            float *nv = realloc(v, sizeof(float) * (cap *= 2));
            if (!nv) { free(v); return skv_error(SKV_ENOMEM, "out of memory"); }
            v = nv;
        }
        v[cnt++] = (float)x;
        p = *end ? end + 1 : end;
    }
    /* Depths are told apart as printed (%g: tables, case keys). */
    for (int i = 0; i < cnt; i++)
        for (int j = 0; j < i; j++) {
            char a[32], b[32];
            snprintf(a, sizeof a, "%g", v[i]);
            snprintf(b, sizeof b, "%g", v[j]);
            if (!strcmp(a, b)) {
                free(v);
                return skv_error(SKV_EINVAL, "--depths: %s is listed twice in '%s'", a, s);
            }
        }
    *out = v;
    *n = cnt;
    return 0;
}

void needle_opts_default(needle_opts *o) {
    memset(o, 0, sizeof *o);
    o->needle = NEEDLE_DEFAULT_NEEDLE;
    o->question = NEEDLE_DEFAULT_QUESTION;
    o->runs = 1;
    o->detail_case = -1;
    kv_opts_default(&o->kv);
    needle_set_methods(o, "dense,shadowkv");
}

int needle_set_methods(needle_opts *o, const char *list) {
    char names[NEEDLE_MAX_METHODS][32];
    int n = 1, has_dense = 0;
    snprintf(names[0], sizeof names[0], "dense");
    for (const char *p = list; *p;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[32];
        if (!len || len >= sizeof name)
            return skv_error(SKV_EINVAL, "--kv: '%s' is not a comma-separated list of policies", list);
        memcpy(name, p, len);
        name[len] = 0;
        if (!kv_policy_find(name)) return SKV_EINVAL;
        if (!strcmp(name, "dense")) {
            if (has_dense++) return skv_error(SKV_EINVAL, "--kv: dense is listed twice");
        } else {
            for (int i = 1; i < n; i++)
                if (!strcmp(names[i], name)) return skv_error(SKV_EINVAL, "--kv: %s is listed twice", name);
            if (n == NEEDLE_MAX_METHODS)
                return skv_error(SKV_EINVAL, "--kv: at most %d policies besides dense", NEEDLE_MAX_METHODS - 1);
            snprintf(names[n++], sizeof names[0], "%s", name);
        }
        p = e ? e + 1 : p + len;
    }
    memcpy(o->methods, names, sizeof names[0] * n);
    o->n_methods = n;
    return 0;
}

/* ---- small buffers -------------------------------------------------------- */

typedef struct { int32_t *v; int n, cap; } ids_buf;

static int ids_push(ids_buf *b, const int32_t *x, int n) {
    if (b->n + n > b->cap) {
        int cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        int32_t *p = realloc(b->v, sizeof(int32_t) * cap);
        if (!p) return skv_error(SKV_ENOMEM, "out of memory");
        b->v = p;
        b->cap = cap;
    }
    if (n) memcpy(b->v + b->n, x, sizeof(int32_t) * n);
    b->n += n;
    return 0;
}

typedef struct { char *s; size_t n, cap; } str_buf;

static int str_add(str_buf *b, const char *x, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->s, cap);
        if (!p) return skv_error(SKV_ENOMEM, "out of memory");
        b->s = p;
        b->cap = cap;
    }
    memcpy(b->s + b->n, x, n);
    b->n += n;
    b->s[b->n] = 0;
    return 0;
}

/* ---- prompt pieces ----------------------------------------------------------- */

/* A piece of text as tokens. Byte-level BPE pieces get a leading space so
 * that they join like words; SentencePiece adds its own. */
static int encode_piece(const tok_vocab *v, const char *text, ids_buf *out) {
    out->n = 0;
    char *tmp = NULL;
    if (tok_kind(v) != TOK_SPM) {
        size_t n = strlen(text);
        if (!(tmp = malloc(n + 2))) return skv_error(SKV_ENOMEM, "out of memory");
        tmp[0] = ' ';
        memcpy(tmp + 1, text, n + 1);
        text = tmp;
    }
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode(v, text, strlen(text), 0, 0, &ids, &n);
    free(tmp);
    if (rc) return rc;
    rc = ids_push(out, ids, n);
    free(ids);
    return rc;
}

typedef struct {
    ids_buf hay;       /* every sentence's tokens back to back */
    int *sent_end;     /* (n_sent) end offset of each sentence in hay */
    int n_sent;
} haystack;

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* Splits text into sentences (ending in . ! or ?, closing quotes kept) with
 * whitespace collapsed, and tokenizes each. */
static int haystack_build(const tok_vocab *v, const char *text, haystack *h) {
    memset(h, 0, sizeof *h);
    str_buf cur = {0};
    ids_buf piece = {0};
    int cap = 0, rc = 0;
    for (const char *p = text;; p++) {
        int end = !*p;
        if (!end) {
            char ch = is_space(*p) ? ' ' : *p;
            if (!(ch == ' ' && (cur.n == 0 || cur.s[cur.n - 1] == ' ')) && (rc = str_add(&cur, &ch, 1))) break;
        }
        int stop = end;
        if (!end && (*p == '.' || *p == '!' || *p == '?')) {
            const char *q = p + 1;
            while (*q == '"' || *q == '\'' || *q == ')') q++;
            if (!*q || is_space(*q)) {
                if (q > p + 1 && (rc = str_add(&cur, p + 1, (size_t)(q - p - 1)))) break;
                p = q - 1;
                stop = 1;
            }
        }
        if (stop) {
            while (cur.n && cur.s[cur.n - 1] == ' ') cur.s[--cur.n] = 0;
            if (cur.n) {
                if ((rc = encode_piece(v, cur.s, &piece))) break;
                if (piece.n) {
                    if (h->n_sent == cap) {
                        int *ne = realloc(h->sent_end, sizeof(int) * (cap = cap ? cap * 2 : 64));
                        if (!ne) { rc = skv_error(SKV_ENOMEM, "out of memory"); break; }
                        h->sent_end = ne;
                    }
                    if ((rc = ids_push(&h->hay, piece.v, piece.n))) break;
                    h->sent_end[h->n_sent++] = h->hay.n;
                }
            }
            cur.n = 0;
            if (cur.s) cur.s[0] = 0;
        }
        if (end) break;
    }
    free(cur.s);
    free(piece.v);
    if (!rc && h->n_sent == 0) rc = skv_error(SKV_EINVAL, "the haystack has no text");
    return rc;
}

static void haystack_free(haystack *h) {
    free(h->hay.v);
    free(h->sent_end);
    memset(h, 0, sizeof *h);
}

/* The first n haystack tokens (sentences repeated as needed; the last one
 * cut) into out, and the sentence boundaries 0..n into *bounds. */
static int haystack_take(const haystack *h, int n, ids_buf *out, int **bounds, int *n_bounds) {
    out->n = 0;
    int cap = 64, nb = 0;
    int *b = malloc(sizeof(int) * cap);
    if (!b) return skv_error(SKV_ENOMEM, "out of memory");
    b[nb++] = 0;
    int s = 0, rc = 0;
    while (out->n < n) {
        int from = s ? h->sent_end[s - 1] : 0, len = h->sent_end[s] - from;
        int take = len < n - out->n ? len : n - out->n;
        if ((rc = ids_push(out, h->hay.v + from, take))) break;
        if (nb == cap) {
            int *nbp = realloc(b, sizeof(int) * (cap *= 2));
            if (!nbp) { rc = skv_error(SKV_ENOMEM, "out of memory"); break; }
            b = nbp;
        }
        if (take == len || out->n == n) b[nb++] = out->n;
        s = (s + 1) % h->n_sent;
    }
    if (rc) { free(b); return rc; }
    if (b[nb - 1] != n) b[nb++] = n; /* n == 0 */
    *bounds = b;
    *n_bounds = nb;
    return 0;
}

/* ---- values and scoring ------------------------------------------------------- */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int needle_contains_value(const char *text, const char *value) {
    size_t n = strlen(value);
    if (!text || !n) return 0;
    for (const char *p = strstr(text, value); p; p = strstr(p + 1, value)) {
        int before = p > text && p[-1] >= '0' && p[-1] <= '9';
        int after = p[n] >= '0' && p[n] <= '9';
        if (!before && !after) return 1;
    }
    return 0;
}

/* ---- generation ----------------------------------------------------------------- */

/* Greedy answer of up to n tokens after the prompt; with the oracle, the
 * top-1 agreement and logit distance against the dense twin per step. */
static int generate(skv_session *s, int prev, int n, char **text, needle_case *c, int m) {
    const tok_vocab *tok = s->m->tok;
    int V = s->m->cfg.vocab, rc = 0;
    str_buf out = {0};
    char buf[256];
    if ((rc = str_add(&out, "", 0))) return rc;
    for (int i = 0; i < n; i++) {
        int id = sampler_argmax(session_logits(s), V);
        if (tok_is_eog(tok, id)) break;
        int len = tok_piece(tok, prev, id, 0, buf, sizeof buf);
        if (len > (int)sizeof buf) len = sizeof buf;
        if (len > 0 && (rc = str_add(&out, buf, (size_t)len))) break;
        prev = id;
        if (i + 1 == n) { session_emit_last(s, id); break; } /* no step feeds it: a trace has it all the same */
        if ((rc = session_decode(s, id))) break;
        if (c && s->twin_kv) {
            double num = 0, den = 0;
            const float *a = s->fwd.logits, *b = s->twin.logits;
            for (int j = 0; j < V; j++) {
                num += ((double)a[j] - b[j]) * ((double)a[j] - b[j]);
                den += (double)b[j] * b[j];
            }
            c->top1_agree[m][c->n_steps[m]] = s->top1_agree > 0;
            c->logit_dist[m][c->n_steps[m]] = (float)(den > 0 ? sqrt(num / den) : sqrt(num));
            c->n_steps[m]++;
        }
    }
    if (rc) { free(out.s); return rc; }
    *text = out.s;
    return 0;
}

/* ---- event collection -------------------------------------------------------- */

typedef struct {
    probe_event **ev;
    int n, cap;
    int oom;
} collector;

static void collect(const probe_event *ev, void *user) {
    collector *c = user;
    if (c->oom) return;
    if (c->n == c->cap) {
        int cap = c->cap ? c->cap * 2 : 1024;
        probe_event **p = realloc(c->ev, sizeof *p * cap);
        if (!p) { c->oom = 1; return; }
        c->ev = p;
        c->cap = cap;
    }
    probe_event *d = probe_event_dup(ev);
    if (!d) { c->oom = 1; return; }
    c->ev[c->n++] = d;
}

static void events_free(probe_event **ev, int n) {
    for (int i = 0; i < n; i++) free(ev[i]);
    free(ev);
}

probe_event needle_niah_event(const needle_opts *o, const needle_case *c, int m, int detail) {
    probe_event ev = {
        .kind = PROBE_NIAH,
        .niah = {
            .index = c->index, .length = c->length, .depth = c->depth, .run = c->run, .method = m,
            .hit = c->hit[m], .prompt_len = c->prompt_len, .tok_begin = c->tok_begin, .tok_end = c->tok_end,
            .detail = detail, .n_steps = c->n_steps[m], .policy = o->methods[m], .value = c->value,
            .answer = c->answer[m], .top1_agree = c->top1_agree[m], .logit_dist = c->logit_dist[m],
        },
    };
    return ev;
}

/* ---- the sweep ------------------------------------------------------------------- */

typedef struct {
    skv_model *m;
    const needle_opts *o;
    const needle_task *task;
    needle_task own;      /* the task made from needle_opts' needle and question (task NULL) */
    haystack hay;
    ids_buf facts[NEEDLE_MAX_FACTS], question, tmp;
    int bos;
    probe_bus *bus;
    probe_sub *sub;
    collector col;
} sweep;

/* The case's facts: how many, their keys (drawn without replacement from
 * the task's) and values (seven digits; the asked fact's from (seed, case)
 * as ever); the expected answer. */
static int case_facts(const sweep *w, needle_case *c) {
    const needle_task *t = w->task;
    uint64_t r = splitmix64(w->o->seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)c->index << 20) ^ 0x5eedull);
    snprintf(c->task, sizeof c->task, "%s", t->name);
    c->n_facts = t->facts_min + (t->facts_max > t->facts_min ? (int)(r % (uint64_t)(t->facts_max - t->facts_min + 1)) : 0);
    int pick[NEEDLE_MAX_FACTS];
    for (int i = 0; i < c->n_facts; i++) {
        c->keys[i][0] = 0;
        if (needle_task_keyed(t) && t->n_keys) {
            int k;
            for (int again = 1; again;) {
                r = splitmix64(r);
                k = (int)(r % (uint64_t)t->n_keys);
                again = 0;
                for (int j = 0; j < i; j++) again |= pick[j] == k;
            }
            pick[i] = k;
            snprintf(c->keys[i], sizeof c->keys[i], "%s", t->keys[k]);
        }
        uint64_t x = i == 0 ? splitmix64(w->o->seed * 0x100000001b3ull + (uint64_t)c->index) : (r = splitmix64(r));
        for (int again = 1; again;) {
            snprintf(c->values[i], sizeof c->values[i], "%07llu", (unsigned long long)(1000000 + x % 9000000));
            again = 0;
            for (int j = 0; j < i; j++) again |= !strcmp(c->values[j], c->values[i]);
            if (again) x = splitmix64(x);
        }
    }
    char *ans = needle_fill(t->answer, c->keys[0], c->values[0]);
    if (!ans) return skv_error(SKV_ENOMEM, "out of memory");
    snprintf(c->value, sizeof c->value, "%s", ans);
    free(ans);
    return 0;
}

/* Builds case c's prompt into out (exactly c->length tokens): BOS, the
 * haystack with the asked fact at the sentence boundary nearest the depth
 * and each distractor at a boundary drawn from the case's seed, the
 * question. Every piece is tokenized apart with a leading space. */
static int build_prompt(sweep *w, needle_case *c, ids_buf *out) {
    const tok_vocab *tok = w->m->tok;
    int rc = 0, fixed = w->bos;
    for (int i = 0; i < c->n_facts && !rc; i++) {
        char *text = needle_fill(w->task->fact, c->keys[i], c->values[i]);
        if (!text) return skv_error(SKV_ENOMEM, "out of memory");
        rc = encode_piece(tok, text, &w->facts[i]);
        free(text);
        fixed += w->facts[i].n;
    }
    char *q = rc ? NULL : needle_fill(w->task->question, c->keys[0], c->values[0]);
    if (!rc && !q) return skv_error(SKV_ENOMEM, "out of memory");
    if (!rc) rc = encode_piece(tok, q, &w->question);
    free(q);
    if (rc) return rc;
    fixed += w->question.n;
    int n = c->length - fixed;
    if (n < 1)
        return skv_error(SKV_EINVAL, "length %d is too short: the facts and question alone take %d tokens", c->length,
                         fixed);
    int *b = NULL, nb = 0;
    if ((rc = haystack_take(&w->hay, n, &w->tmp, &b, &nb))) return rc;
    double target = c->depth / 100.0 * n;
    int spot[NEEDLE_MAX_FACTS], order[NEEDLE_MAX_FACTS];
    spot[0] = b[0];
    for (int i = 1; i < nb; i++)
        if (fabs(b[i] - target) < fabs(spot[0] - target)) spot[0] = b[i];
    uint64_t r = splitmix64(w->o->seed ^ ((uint64_t)c->index * 0xd1b54a32d192ed03ull) ^ 0xfac7ull);
    for (int i = 1; i < c->n_facts; i++) {
        r = splitmix64(r);
        spot[i] = b[r % (uint64_t)nb];
    }
    free(b);
    for (int i = 0; i < c->n_facts; i++) order[i] = i;
    for (int i = 1; i < c->n_facts; i++) /* by spot; at a shared spot, in the order drawn */
        for (int j = i; j > 0 && spot[order[j - 1]] > spot[order[j]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    out->n = 0;
    int32_t bos = tok_bos(tok);
    if (w->bos && (rc = ids_push(out, &bos, 1))) return rc;
    int prev = 0;
    for (int k = 0; k < c->n_facts; k++) {
        int f = order[k];
        if ((rc = ids_push(out, w->tmp.v + prev, spot[f] - prev))) return rc;
        prev = spot[f];
        c->fact_begin[f] = out->n;
        if ((rc = ids_push(out, w->facts[f].v, w->facts[f].n))) return rc;
        c->fact_end[f] = out->n;
    }
    if ((rc = ids_push(out, w->tmp.v + prev, n - prev)) || (rc = ids_push(out, w->question.v, w->question.n)))
        return rc;
    c->prompt_len = out->n;
    c->tok_begin = c->fact_begin[0];
    c->tok_end = c->fact_end[0];
    c->insert_depth = (int)lround(100.0 * spot[0] / n);
    return 0;
}

/* One session over prompt p under method m; the answer into c->answer[m]. */
static int run_method(sweep *w, needle_case *c, const ids_buf *p, int m, int n_answer, skv_session **keep) {
    session_opts so;
    session_opts_default(&so);
    so.ctx = w->o->ctx > 0 ? w->o->ctx : p->n + n_answer;
    so.batch = w->o->batch;
    so.sample.temp = 0;
    snprintf(so.backend, sizeof so.backend, "%s", w->o->backend);
    int probes = w->o->probes && m != NEEDLE_DENSE;
    so.kv = w->o->kv;
    snprintf(so.kv.policy, sizeof so.kv.policy, "%s", w->o->methods[m]);
    /* a --kv-opt was checked against the sweep's methods (needle_run);
     * each method takes the options it has */
    for (int i = 0; i < so.kv.n_set; i++) so.kv.set[i].strict = 0;
    so.kv.oracle = probes || (w->o->oracle && m != NEEDLE_DENSE);
    so.kv.watch_begin = probes ? c->tok_begin : 0;
    so.kv.watch_end = probes ? c->tok_end : 0;
    so.kv.n_watch_more = 0;
    for (int i = 1; probes && i < c->n_facts && i <= KV_WATCH_MORE; i++) {
        so.kv.watch_more[i - 1][0] = c->fact_begin[i];
        so.kv.watch_more[i - 1][1] = c->fact_end[i];
        so.kv.n_watch_more = i;
    }
    so.bus = probes ? w->bus : NULL;
    so.record_prefill = keep != NULL; /* its fixes are checked from this prefill (session_fork) */
    if (probes && (!(c->top1_agree[m] = calloc((size_t)n_answer, sizeof(int))) ||
                   !(c->logit_dist[m] = calloc((size_t)n_answer, sizeof(float)))))
        return skv_error(SKV_ENOMEM, "out of memory");
    if (p->n + n_answer > so.ctx)
        return skv_error(SKV_ERANGE, "a %d-token prompt and a %d-token answer do not fit the context of %d (raise -c)",
                         p->n, n_answer, so.ctx);
    skv_session *s = NULL;
    int rc = session_new(w->m, &so, &s);
    if (!rc) rc = session_prefill(s, p->v, p->n, NULL, NULL);
    if (!rc) rc = generate(s, p->v[p->n - 1], n_answer, &c->answer[m], probes ? c : NULL, m);
    if (!rc) {
        c->t_prefill[m] = s->t_prefill;
        c->t_decode[m] = s->t_decode;
        c->decode_steps[m] = s->step;
        kv_oracle_summary sum;
        int has = s->oracle && kv_oracle_get(s->oracle, -1, &sum) && sum.n;
        if (has) c->t_decode[m] = s->t_decode > sum.seconds ? s->t_decode - sum.seconds : 0; /* the policy's time alone */
        c->recall[m] = m == NEEDLE_DENSE ? 1.0 : has ? sum.recall : NAN;
        c->out_err[m] = m == NEEDLE_DENSE ? 0.0 : has ? sum.out_err : NAN;
        c->fetch_bytes[m] = kv_stat(s->kv, "fetch_bytes");
        size_t res = 0, off = 0;
        kv_cache *inner = kv_unwrap(s->kv);
        inner->cls->bytes(inner, &res, &off);
        c->resident_bytes[m] = (double)res;
    }
    if (!rc && keep) *keep = s;
    else session_free(s);
    if (!rc) {
        c->hit[m] = needle_contains_value(c->answer[m], c->value);
        c->distractor[m] = -1;
        for (int i = 1; i < c->n_facts && !c->hit[m] && c->distractor[m] < 0; i++)
            if (needle_contains_value(c->answer[m], c->values[i])) c->distractor[m] = i;
    }
    return rc;
}

static void case_free(needle_case *c) {
    for (int m = 0; m < NEEDLE_MAX_METHODS; m++) {
        free(c->answer[m]);
        free(c->top1_agree[m]);
        free(c->logit_dist[m]);
    }
    memset(c, 0, sizeof *c);
}

void needle_result_free(needle_result *r) {
    if (!r) return;
    for (int i = 0; i < r->n_cases; i++) case_free(&r->cases[i]);
    free(r->cases);
    events_free(r->ev, r->n_ev);
    memset(r, 0, sizeof *r);
    r->detail = -1;
}

static void sweep_free(sweep *w) {
    if (w->sub) probe_unsubscribe(w->sub);
    probe_bus_free(w->bus);
    events_free(w->col.ev, w->col.n);
    haystack_free(&w->hay);
    for (int i = 0; i < NEEDLE_MAX_FACTS; i++) free(w->facts[i].v);
    free(w->question.v);
    free(w->tmp.v);
    needle_task_free(&w->own);
}

/* One rerun of case c from src's recorded prefill with opt = value: 1 and
 * the answer in ans when it retrieved the value, 0 when not, -1 when it
 * cannot be checked (opt is not an option of the policy, or the prefill was
 * too big to record), < -1 on an error. */
static int rerun(needle_case *c, const ids_buf *p, int n_answer, const skv_session *src, const char *opt, double value,
                 char *ans, size_t an) {
    kv_opts kv = src->o.kv;
    if (!strcmp(opt, "budget")) {
        kv.budget = (int)value;
        kv.budget_pct = 0;
    } else if (kv_opts_set_num(&kv, opt, value)) {
        skv_clear_error();
        return -1;
    }
    skv_session *f = NULL;
    char *text = NULL;
    int rc = session_fork(src, &kv, &f);
    if (rc) { /* the prefill was not recorded whole (too big): the fix stays unchecked */
        skv_clear_error();
        return -1;
    }
    rc = generate(f, p->v[p->n - 1], n_answer, &text, NULL, 0);
    session_free(f);
    if (rc) return rc;
    snprintf(ans, an, "%s", text);
    for (char *q = ans; *q; q++)
        if (*q == '\n' || *q == '\r') *q = ' ';
    int hit = needle_contains_value(text, c->value);
    free(text);
    return hit;
}

/* Reruns case c from src's recorded prefill with cause's change
 * (session_fork: no second prefill through the model): the smaller value
 * first when there is one, then the value the fix names (unless it leaves no
 * sparsity), then, while they miss, twice the last value up to the cause's
 * limit. The first that retrieves ends it and becomes the cause's value;
 * every rerun is kept in cause->tries, so the verdict says what each gave. */
static int check_fix(needle_case *c, const ids_buf *p, int n_answer, const skv_session *src, needle_cause *cause) {
    double next = cause->smaller > 0 ? cause->smaller : cause->dense_needed ? 0 : cause->value;
    while (next > 0 && cause->n_tries < NEEDLE_MAX_TRIES) {
        needle_try *t = &cause->tries[cause->n_tries];
        int k = rerun(c, p, n_answer, src, cause->opt, next, t->answer, sizeof t->answer);
        if (k < -1) return k;
        if (k < 0) break; /* not an option of this policy, or no recorded prefill: left unchecked */
        t->value = next;
        t->hit = k;
        cause->n_tries++;
        cause->check = k ? NEEDLE_CHECK_RETRIEVED : NEEDLE_CHECK_MISSED;
        size_t alen = strnlen(t->answer, sizeof cause->check_answer - 1);
        memmove(cause->check_answer, t->answer, alen);
        cause->check_answer[alen] = 0;
        if (k) {
            cause->value = next;
            cause->dense_needed = 0;
            break;
        }
        double prev = next;
        if (prev < cause->proposed && !cause->dense_needed) next = cause->proposed; /* the smaller missed: the value */
        else next = 2 * prev <= cause->limit ? 2 * prev : 0;                      /* the ladder */
        if (next > 0 && next <= prev) next = 0;
    }
    return 0;
}

/* Method m of case c has run with probes: its collected events go into a
 * store with the NIAH events of dense and m, a miss is diagnosed, and the
 * events are kept in res (the first sparse miss, else case 0's first sparse
 * method) or freed. The store and report stay in c for the callback. */
static int method_probes(sweep *w, needle_case *c, int m, needle_result *res, int *chose_miss, const ids_buf *p,
                         int n_answer, const skv_session *src) {
    probe_store *st = NULL;
    needle_report *rep = NULL;
    int rc = probe_store_new(&st);
    for (int i = 0; !rc && i < w->col.n; i++) rc = probe_store_add(st, w->col.ev[i]);
    int ms[2] = {NEEDLE_DENSE, m};
    for (int i = 0; !rc && i < 2; i++) {
        probe_event ev = needle_niah_event(w->o, c, ms[i], 1);
        rc = probe_store_add(st, &ev);
    }
    if (!rc && !c->hit[m]) {
        if (!(rep = malloc(sizeof *rep))) rc = skv_error(SKV_ENOMEM, "out of memory");
        else if ((rc = needle_diagnose(st, 0, rep)) == SKV_EMISSING) {
            free(rep);
            rep = NULL;
            rc = 0;
        }
        if (!rc && rep) {
            needle_fit_options(rep); /* (the floor came with the diagnosis: needle_trace_floor) */
            /* each fix rerun from the recorded prefill; not when dense misses too (the model's cause) */
            rep->checks = src != NULL && rep->dense_hit != 0;
            for (int i = 0; rep->checks && !rc && i < rep->n_causes; i++)
                if (rep->causes[i].opt[0])
                    rc = check_fix(c, p, n_answer, src, &rep->causes[i]);
            needle_causes_sort(rep);
        }
    }
    c->store[m] = st;
    c->report[m] = rep;
    int miss = !c->hit[m];
    int want = w->o->detail_case, take;
    if (want >= 0) /* the asked case: its first method, replaced by its first miss */
        take = c->index == want && (res->detail != want || (miss && !*chose_miss));
    else
        take = res->detail < 0 || (miss && !*chose_miss);
    if (take) {
        events_free(res->ev, res->n_ev);
        res->ev = w->col.ev;
        res->n_ev = w->col.n;
        res->detail = c->index;
        res->detail_method = m;
        *chose_miss = miss;
    } else {
        events_free(w->col.ev, w->col.n);
    }
    memset(&w->col, 0, sizeof w->col);
    return rc;
}

/* Frees what method_probes left in c. */
static void case_probes_free(needle_case *c) {
    for (int m = 0; m < NEEDLE_MAX_METHODS; m++) {
        free((needle_report *)c->report[m]);
        probe_store_free((probe_store *)c->store[m]);
        c->report[m] = NULL;
        c->store[m] = NULL;
    }
}

void needle_fit_options(needle_report *rep) {
    const kv_class *p = kv_policy_find(rep->policy);
    for (int i = 0; p && i < rep->n_causes; i++) {
        needle_cause *c = &rep->causes[i];
        if (!c->opt[0] || !strcmp(c->opt, "budget")) continue;
        int has = 0;
        for (int j = 0; j < p->n_opts && !has; j++) has = !strcmp(p->opts[j].key, c->opt);
        if (has) continue;
        char opt[sizeof c->opt];
        memcpy(opt, c->opt, sizeof opt);
        snprintf(c->fix, sizeof c->fix, "no change is proposed: the trace recorded a %s option, which skv's %s does not "
                 "have", opt, p->name);
        c->opt[0] = 0;
        c->smaller = c->limit = 0;
    }
}

int needle_context_notice(const skv_model *m, const needle_opts *o, char *buf, size_t n) {
    int max_len = 0;
    for (int i = 0; i < o->n_lengths; i++) max_len = o->lengths[i] > max_len ? o->lengths[i] : max_len;
    if (n) buf[0] = 0;
    if (max_len <= m->cfg.ctx_train) return 0;
    snprintf(buf, n, "lengths up to %d tokens run past the model's trained context of %d; retrieval there is not "
             "expected", max_len, m->cfg.ctx_train);
    return 1;
}

/* The policy's floor as a cause, when the run's budget was under it: it
 * selects nothing, whatever else is wrong (said first). What the probes
 * blamed on the selection goes: a "never selected" (no score chose what was
 * kept: it was only what the policy always keeps) and a "budget" whose raise
 * stays at or under the floor (the floor's own fix goes further). */
void needle_trace_floor(const probe_store *st, needle_report *rep) {
    const probe_ev_run *run = probe_store_run(st);
    const kv_class *p = kv_policy_find(rep->policy);
    if (!run || !p || rep->dense_hit == 0 || run->budget <= 0) return;
    kv_opts o;
    kv_opts_default(&o);
    snprintf(o.policy, sizeof o.policy, "%s", p->name);
    o.budget = run->budget; /* in tokens at the run's prompt */
    o.budget_pct = 0;
    for (int i = 0; i < p->n_opts; i++) { /* the options it recorded; the others at their defaults */
        double v = run->kv_opts ? probe_pairs_get(run->kv_opts, p->opts[i].key, NAN) : NAN;
        if (isfinite(v) && kv_opts_set_num(&o, p->opts[i].key, v)) skv_clear_error();
    }
    char why[200];
    int floor = kv_under_floor(&o, p, run->prompt_len, why, sizeof why), n = 0;
    if (!floor) return;
    for (int i = 0; i < rep->n_causes; i++) {
        const needle_cause *x = &rep->causes[i];
        if (x->kind == NEEDLE_CAUSE_OUTLIER || (x->kind == NEEDLE_CAUSE_BUDGET && x->proposed <= floor)) continue;
        rep->causes[n++] = *x;
    }
    rep->n_causes = n;
    if (n < NEEDLE_N_CAUSES) {
        needle_cause *c = &rep->causes[rep->n_causes++];
        memset(c, 0, sizeof *c);
        c->kind = NEEDLE_CAUSE_FLOOR;
        c->score = 1;
        c->step = c->layer = c->head = c->chunk = -1;
        snprintf(c->evidence, sizeof c->evidence, "at --budget %d %s selects nothing: it needs at least %s",
                 run->budget, rep->policy, why);
        snprintf(c->fix, sizeof c->fix, "raise --budget to %d tokens (its floor)", floor);
        snprintf(c->opt, sizeof c->opt, "budget");
        c->value = c->proposed = floor;
    }
    needle_causes_sort(rep);
}

int needle_floor_notice(const needle_opts *o, char *buf, size_t n) {
    size_t len = 0;
    int any = 0;
    if (n) buf[0] = 0;
    for (int m = 1; m < o->n_methods; m++) {
        const kv_class *p = kv_policy_find(o->methods[m]);
        char why[200], lens[200] = "";
        size_t ll = 0;
        int under = 0, lo = 0, hi = 0;
        for (int i = 0; i < o->n_lengths; i++) {
            if (!kv_under_floor(&o->kv, p, o->lengths[i], why, sizeof why)) continue;
            int b = kv_budget_tokens(&o->kv, o->lengths[i]);
            lo = under && lo < b ? lo : b;
            hi = under && hi > b ? hi : b;
            if (ll < sizeof lens) ll += snprintf(lens + ll, sizeof lens - ll, "%s%d", under ? ", " : "", o->lengths[i]);
            under++;
        }
        if (!under || len >= n) continue;
        char budget[64];
        if (lo == hi) snprintf(budget, sizeof budget, "%d tokens", lo);
        else snprintf(budget, sizeof budget, "%d to %d tokens", lo, hi);
        len += snprintf(buf + len, n - len, "%s%s: the budget (%s%s%s) is under its floor of %s", any++ ? "\n" : "",
                        o->methods[m], budget, under == o->n_lengths ? "" : under > 1 ? " at lengths " : " at length ",
                        under < o->n_lengths ? lens : "", why);
    }
    return any;
}

int needle_floor_metric(const needle_opts *o, float *vals, probe_event *ev) {
    int n = 0;
    for (int m = 1; m < o->n_methods; m++) {
        const kv_class *p = kv_policy_find(o->methods[m]);
        for (int i = 0; p && i < o->n_lengths; i++)
            if (kv_under_floor(&o->kv, p, o->lengths[i], NULL, 0)) {
                vals[2 * n] = (float)m;
                vals[2 * n + 1] = (float)o->lengths[i];
                n++;
            }
    }
    *ev = (probe_event){.kind = PROBE_METRIC};
    ev->metric = (probe_ev_metric){.step = -1, .layer = 0, .head = -1, .name = "under_floor", .value = (float)n,
                                   .n = 2 * n, .vals = vals};
    return n;
}

int needle_check_kv_opts(const needle_opts *o) {
    for (int i = 0; i < o->kv.n_set; i++) {
        if (!o->kv.set[i].strict) continue;
        int has = 0;
        for (int mi = 0; mi < o->n_methods && !has; mi++) {
            const kv_class *p = kv_policy_find(o->methods[mi]);
            has = p && kv_policy_opt(p, o->kv.set[i].key);
        }
        if (!has)
            return skv_error(SKV_EINVAL, "KV option '%s' is not an option of any method of the sweep (skv run --kv help)",
                             o->kv.set[i].key);
    }
    return 0;
}

int needle_run(skv_model *m, const needle_opts *o, needle_case_fn fn, void *user, needle_result *res) {
    return needle_run_skip(m, o, NULL, fn, user, res);
}

int needle_run_skip(skv_model *m, const needle_opts *o, needle_skip_fn skip, needle_case_fn fn, void *user,
                    needle_result *res) {
    memset(res, 0, sizeof *res);
    res->detail = -1;
    if (!o->haystack || o->n_lengths < 1 || o->n_depths < 1 || o->runs < 1)
        return skv_error(SKV_EINVAL, "needle: a haystack, lengths, depths and runs >= 1 are required");
    if (o->n_methods < 1 || o->n_methods > NEEDLE_MAX_METHODS || strcmp(o->methods[0], "dense"))
        return skv_error(SKV_EINVAL, "needle: the methods must start with dense (needle_set_methods)");
    int rc_opts = needle_check_kv_opts(o);
    if (rc_opts) return rc_opts;
    needle_diag_set_amend(needle_trace_floor); /* a miss's diagnosis names the policy's floor */
    sweep w = { .m = m, .o = o, .task = o->task };
    int rc = 0;
    if (!w.task) {
        if (!o->needle || !o->question) return skv_error(SKV_EINVAL, "needle: a task, or a needle and a question, is required");
        if ((rc = needle_task_custom(o->needle, o->question, o->answer_prefix, &w.own))) return rc;
        w.task = &w.own;
    }
    w.bos = !o->no_bos && tok_add_bos(m->tok) && tok_bos(m->tok) >= 0;
    if ((rc = haystack_build(m->tok, w.task->haystack ? w.task->haystack : o->haystack, &w.hay))) goto done;
    if (o->probes && ((rc = probe_bus_new(&w.bus)) ||
                      (rc = probe_subscribe_callback(w.bus, PROBE_ALL & ~PROBE_MASK(PROBE_SPAN) & ~PROBE_MASK(PROBE_NIAH),
                                                     collect, &w.col, &w.sub))))
        goto done;
    /* Answer length: the expected answer's tokens (seven digits for a value) plus a few. */
    int n_answer = o->answer_tokens;
    if (n_answer <= 0) {
        char *a = needle_fill(w.task->answer, "key", "4821735");
        if (!a) { rc = skv_error(SKV_ENOMEM, "out of memory"); goto done; }
        rc = encode_piece(m->tok, a, &w.tmp);
        free(a);
        if (rc) goto done;
        n_answer = w.tmp.n + 4;
    }
    res->answer_tokens = n_answer;
    int n = o->n_lengths * o->n_depths * o->runs;
    if (!(res->cases = calloc((size_t)n, sizeof *res->cases))) { rc = skv_error(SKV_ENOMEM, "out of memory"); goto done; }
    needle_context_notice(m, o, res->notice, sizeof res->notice);
    ids_buf prompt = {0};
    int chose_miss = 0, index = 0;
    for (int li = 0; li < o->n_lengths && !rc; li++)
        for (int di = 0; di < o->n_depths && !rc; di++)
            for (int r = 0; r < o->runs && !rc; r++, index++) {
                needle_case *c = &res->cases[res->n_cases];
                memset(c, 0, sizeof *c);
                c->index = index;
                c->length = o->lengths[li];
                c->depth = o->depths[di];
                c->run = r;
                for (int mi = 0; mi < NEEDLE_MAX_METHODS; mi++) c->distractor[mi] = -1;
                if ((rc = case_facts(&w, c))) break;
                if (skip && skip(c, user)) continue;
                res->n_cases++;
                if ((rc = build_prompt(&w, c, &prompt))) break;
                for (int mi = 0; !rc && mi < o->n_methods; mi++) {
                    skv_session *keep = NULL; /* --explain's checks fork from this run's prefill */
                    int checks = o->probes && o->check && mi != NEEDLE_DENSE;
                    if (!(rc = run_method(&w, c, &prompt, mi, n_answer, checks ? &keep : NULL)) && w.col.oom)
                        rc = skv_error(SKV_ENOMEM, "needle: out of memory recording probe events");
                    if (!rc && o->probes && mi != NEEDLE_DENSE)
                        rc = method_probes(&w, c, mi, res, &chose_miss, &prompt, n_answer, keep);
                    session_free(keep);
                }
                if (!rc && fn) rc = fn(c, user);
                case_probes_free(c);
            }
    free(prompt.v);
done:
    sweep_free(&w);
    return rc;
}
