/* session.c: ties a model, a KV policy, the forward pass and a sampler into
 * prefill-then-decode, checking the context limit and timing each phase. */
#include "session.h"
#include "probe.h"
#include "skv.h"
#include "tok.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void session_opts_default(session_opts *o) {
    memset(o, 0, sizeof *o);
    kv_opts_default(&o->kv);
    o->tap_layer = -1;
    o->sample.temp = 0;
    o->sample.top_p = 1;
}

void session_free(skv_session *s) {
    if (!s) return;
    kv_free(s->kv);
    forward_free(&s->fwd);
    kv_free(s->twin_kv);
    if (s->twin.m) forward_free(&s->twin);
    free(s->prefill_logits);
    sampler_free(&s->smp);
    free(s);
}

int session_new(skv_model *m, const session_opts *o, skv_session **out) {
    *out = NULL;
    skv_session *s = calloc(1, sizeof *s);
    if (!s) return skv_error(SKV_ENOMEM, "out of memory");
    s->m = m;
    s->o = *o;
    if (s->o.ctx <= 0) s->o.ctx = m->cfg.ctx_train;
    if (s->o.batch <= 0) s->o.batch = 512;
    skv_threads();
    char notice[256];
    notice[0] = 0;
    if (!(s->be = o->be ? o->be : skv_backend_pick(o->backend, notice, sizeof notice))) {
        free(s);
        return SKV_EINVAL;
    }
    snprintf(s->notice, sizeof s->notice, "%s", notice);
    if (s->be != &skv_backend_cpu && (o->kv.oracle || o->tap_layer >= 0 || o->kv.watch_end > o->kv.watch_begin)) {
        free(s);
        return skv_error(SKV_EUNSUPPORTED, "the oracle, the needle watch and layer taps read the KV cache in host "
                         "memory: use --backend cpu with them");
    }
    int rc = forward_init(&s->fwd, m, s->be, s->o.batch);
    if (rc) { free(s); return rc; }
    s->fwd.bus = o->bus;
    kv_shape sh = {
        .n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
        .head_dim = m->cfg.head_dim, .max_ctx = s->o.ctx, .rope = &s->fwd.rope, .be = s->be,
    };
    if ((rc = kv_new(&s->o.kv, &sh, &s->kv)) || (rc = sampler_init(&s->smp, &s->o.sample, m->cfg.vocab))) {
        session_free(s);
        return rc;
    }
    s->kv->bus = o->bus;
    if (o->kv.oracle && s->kv->policy != &kv_policy_dense) {
        kv_cache *w;
        if ((rc = kv_oracle_new(s->kv, &o->kv, &w))) { session_free(s); return rc; }
        s->kv = s->oracle = w;
    }
    if (o->tap_layer >= 0) {
        if (o->tap_layer >= m->cfg.n_layers) {
            session_free(s);
            return skv_error(SKV_ERANGE, "layer %d is out of range (the model has %d layers)", o->tap_layer,
                             m->cfg.n_layers);
        }
        kv_cache *tap;
        if ((rc = kv_tap_new(s->kv, o->tap_layer, &tap))) { session_free(s); return rc; }
        s->kv = tap;
    }
    if (o->record_prefill) {
        kv_cache *rec;
        if ((rc = kv_rec_new(s->kv, &rec))) { session_free(s); return rc; }
        s->rec = s->kv = rec;
    }
    s->top1_agree = -1;
    if (o->kv.oracle && s->kv->policy != &kv_policy_dense) {
        kv_opts d;
        kv_opts_default(&d);
        if ((rc = forward_init(&s->twin, m, s->be, s->o.batch)) || (rc = kv_new(&d, &sh, &s->twin_kv))) {
            session_free(s);
            return rc;
        }
    }
    *out = s;
    return 0;
}

/* Token events carry the token's text as it reads after the previous one. */
static void emit_token(skv_session *s, int pos, int id, int prev, int step) {
    char buf[256];
    int n = tok_piece(s->m->tok, prev, id, 1, buf, sizeof buf);
    if (n < 0) n = 0;
    if (n > (int)sizeof buf) n = sizeof buf;
    probe_event ev = {.kind = PROBE_TOKEN, .token = {.pos = pos, .id = id, .step = step, .n_text = n, .text = buf}};
    probe_emit(s->o.bus, &ev);
}

void session_run_event(const skv_model *m, const session_opts *o, const char *backend, int prompt_len,
                       char *opts_buf, size_t n, probe_event *ev) {
    const model_config *c = &m->cfg;
    const kv_class *p = kv_policy_find(o->kv.policy);
    if (p) kv_opts_describe(&o->kv, p, prompt_len, opts_buf, n);
    else if (n) opts_buf[0] = 0, skv_clear_error();
    *ev = (probe_event){.kind = PROBE_RUN, .run = {
        .model = c->name[0] ? c->name : m->path, .arch = c->arch, .format = m->format,
        .random_weights = m->random_weights, .n_layers = c->n_layers, .n_heads = c->n_heads,
        .n_kv_heads = c->n_kv_heads, .head_dim = c->head_dim, .max_ctx = o->ctx > 0 ? o->ctx : c->ctx_train,
        .prompt_len = prompt_len, .kv_policy = o->kv.policy,
        .budget = p && p->budgeted ? kv_budget_tokens(&o->kv, prompt_len) : 0, .oracle = o->kv.oracle,
        .backend = backend, .kv_opts = opts_buf}};
}

static void emit_run(skv_session *s, int prompt_len) {
    char opts[512];
    probe_event ev;
    session_run_event(s->m, &s->o, s->be->name, prompt_len, opts, sizeof opts, &ev);
    probe_emit(s->o.bus, &ev);
}

int session_prefill(skv_session *s, const int32_t *tokens, int n, int (*progress)(void *, int, int), void *user) {
    if (n <= 0) return skv_error(SKV_EINVAL, "the prompt is empty");
    if (s->n_past + n > s->o.ctx)
        return skv_error(SKV_ERANGE, "the prompt has %d tokens, more than the context of %d (raise it with -c)",
                         s->n_past + n, s->o.ctx);
    double t0 = skv_now(), rec0 = kv_rec_seconds(s->rec);
    s->kv->step = -1;
    s->fwd.step = -1;
    if (s->n_past == 0 && probe_wants(s->o.bus, PROBE_RUN)) emit_run(s, n);
    if (s->n_past == 0) { /* the whole prompt in this call, most likely */
        kv_begin_prefill(s->kv, n);
        if (s->twin_kv) kv_begin_prefill(s->twin_kv, n);
    }
    if (probe_wants(s->o.bus, PROBE_TOKEN))
        for (int i = 0; i < n; i++) emit_token(s, s->n_past + i, tokens[i], i ? tokens[i - 1] : -1, -1);
    for (int i = 0; i < n; i += s->o.batch) {
        int b = n - i < s->o.batch ? n - i : s->o.batch;
        int rc = forward_batch(&s->fwd, s->kv, tokens + i, b, s->n_past);
        if (!rc && s->twin_kv) rc = forward_batch(&s->twin, s->twin_kv, tokens + i, b, s->n_past);
        if (rc) return rc;
        s->n_past += b;
        if (progress && progress(user, i + b, n)) return skv_error(SKV_EINVAL, "prefill cancelled");
    }
    double te = skv_now();
    int rc = s->kv->cls->end_prefill(s->kv);
    if (rc) return rc;
    s->t_end_prefill += skv_now() - te;
    s->n_prompt = s->n_past;
    s->last_token = tokens[n - 1];
    if (s->rec) { /* what a fork starts from */
        size_t V = (size_t)s->m->cfg.vocab;
        free(s->prefill_logits);
        if (!(s->prefill_logits = malloc(sizeof(float) * V))) return skv_error(SKV_ENOMEM, "out of memory");
        memcpy(s->prefill_logits, s->fwd.logits, sizeof(float) * V);
    }
    /* the recorder's copies for the forks (kv_rec_seconds) are not the prefill's */
    s->t_prefill += skv_now() - t0 - (kv_rec_seconds(s->rec) - rec0);
    return 0;
}

int session_fork(const skv_session *src, const kv_opts *kv, skv_session **out) {
    *out = NULL;
    if (!src->rec || !src->prefill_logits || src->n_prompt <= 0)
        return skv_error(SKV_EINVAL, "session_fork: the source did not record its prefill");
    session_opts o = src->o;
    o.kv = *kv;
    o.kv.oracle = 0;
    o.kv.watch_begin = o.kv.watch_end = 0;
    o.kv.n_watch_more = 0;
    o.bus = NULL;
    o.tap_layer = -1;
    o.record_prefill = 0;
    o.batch = 1; /* a fork only decodes: activations for one token, not a prefill batch */
    skv_session *s = NULL;
    int rc = session_new(src->m, &o, &s);
    if (rc) return rc;
    double t0 = skv_now();
    if ((rc = kv_rec_replay(src->rec, s->kv))) { session_free(s); return rc; }
    s->t_prefill = skv_now() - t0;
    memcpy(s->fwd.logits, src->prefill_logits, sizeof(float) * (size_t)src->m->cfg.vocab);
    if (s->fwd.logits_be != s->fwd.logits) /* a device backend reads them from its own memory */
        s->be->upload(s->fwd.logits_be, s->fwd.logits, sizeof(float) * (size_t)src->m->cfg.vocab);
    s->n_past = s->n_prompt = src->n_prompt;
    s->last_token = src->last_token;
    s->kv->step = -1;
    *out = s;
    return 0;
}

void session_set_bus(skv_session *s, probe_bus *bus) {
    s->o.bus = bus;
    s->fwd.bus = bus;
    s->kv->bus = bus;
}

int session_step_begin(skv_session *s, int32_t token) {
    if (s->n_past + 1 > s->o.ctx)
        return skv_error(SKV_ERANGE, "the context of %d positions is full", s->o.ctx);
    s->kv->step = s->step;
    s->fwd.step = s->step;
    if (probe_wants(s->o.bus, PROBE_TOKEN)) emit_token(s, s->n_past, token, s->last_token, s->step);
    return 0;
}

void session_emit_last(skv_session *s, int32_t token) {
    if (probe_wants(s->o.bus, PROBE_TOKEN)) emit_token(s, s->n_past, token, s->last_token, s->step);
}

int session_decode(skv_session *s, int32_t token) {
    int rc = session_step_begin(s, token);
    if (rc) return rc;
    double t0 = skv_now();
    if ((rc = forward_batch(&s->fwd, s->kv, &token, 1, s->n_past))) return rc;
    return session_step_end(s, token, skv_now() - t0);
}

int session_step_end(skv_session *s, int32_t token, double dt) {
    int rc;
    if ((rc = kv_end_step(s->kv))) return rc;
    if (s->twin_kv) {
        if ((rc = forward_batch(&s->twin, s->twin_kv, &token, 1, s->n_past))) return rc;
        int V = s->m->cfg.vocab;
        s->top1_agree = sampler_argmax(s->fwd.logits, V) == sampler_argmax(s->twin.logits, V);
        s->n_agree += s->top1_agree;
        s->n_compared++;
    }
    if (probe_wants(s->o.bus, PROBE_STEP)) {
        size_t res, off;
        s->kv->cls->bytes(s->kv, &res, &off);
        /* Generic stats by name; a policy without a cache has none (NaN). */
        double hits = kv_stat(s->kv, "step_hits"), misses = kv_stat(s->kv, "step_misses");
        double fetches = kv_stat(s->kv, "step_fetches"), fbytes = kv_stat(s->kv, "step_fetch_bytes");
        double k = isnan(hits) || isnan(misses) ? 0 : hits + misses;
        char stats[1024];
        kv_stats_describe(s->kv, stats, sizeof stats);
        probe_event ev = {.kind = PROBE_STEP, .step = {
            .step = s->step, .token = token, .seconds = dt, .kv_resident = res, .kv_offloaded = off,
            .hit_rate = k > 0 ? (float)(hits / k) : NAN, .has_oracle = s->twin_kv != NULL,
            .top1_agree = s->top1_agree > 0, .n_fetch = isnan(fetches) ? 0 : (int)fetches,
            .fetch_bytes = isnan(fbytes) ? 0 : (uint64_t)fbytes, .kv_stats = stats}};
        probe_emit(s->o.bus, &ev);
    }
    skv_clear_error();
    s->last_token = token;
    s->n_past++;
    s->step++;
    s->t_decode += dt;
    return 0;
}
