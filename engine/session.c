/* session.c: ties a model, a KV policy, the forward pass and a sampler into
 * prefill-then-decode, checking the context limit and timing each phase. */
#include "session.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

void session_opts_default(session_opts *o) {
    memset(o, 0, sizeof *o);
    kv_opts_default(&o->kv);
    o->sample.temp = 0;
    o->sample.top_p = 1;
}

void session_free(skv_session *s) {
    if (!s) return;
    kv_free(s->kv);
    forward_free(&s->fwd);
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
    int rc = forward_init(&s->fwd, m, s->o.batch);
    if (rc) { free(s); return rc; }
    s->fwd.bus = o->bus;
    kv_shape sh = {
        .n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
        .head_dim = m->cfg.head_dim, .max_ctx = s->o.ctx, .rope = &s->fwd.rope,
    };
    if ((rc = kv_new(&s->o.kv, &sh, &s->kv)) || (rc = sampler_init(&s->smp, &s->o.sample, m->cfg.vocab))) {
        session_free(s);
        return rc;
    }
    s->kv->bus = o->bus;
    *out = s;
    return 0;
}

int session_prefill(skv_session *s, const int32_t *tokens, int n, void (*progress)(void *, int, int), void *user) {
    if (n <= 0) return skv_error(SKV_EINVAL, "the prompt is empty");
    if (s->n_past + n > s->o.ctx)
        return skv_error(SKV_ERANGE, "the prompt has %d tokens, more than the context of %d (raise it with -c)",
                         s->n_past + n, s->o.ctx);
    double t0 = skv_now();
    s->kv->step = -1;
    s->fwd.step = -1;
    for (int i = 0; i < n; i += s->o.batch) {
        int b = n - i < s->o.batch ? n - i : s->o.batch;
        int rc = forward_batch(&s->fwd, s->kv, tokens + i, b, s->n_past);
        if (rc) return rc;
        s->n_past += b;
        if (progress) progress(user, i + b, n);
    }
    int rc = s->kv->cls->end_prefill(s->kv);
    if (rc) return rc;
    s->n_prompt = s->n_past;
    s->t_prefill += skv_now() - t0;
    return 0;
}

int session_decode(skv_session *s, int32_t token) {
    if (s->n_past + 1 > s->o.ctx)
        return skv_error(SKV_ERANGE, "the context of %d positions is full", s->o.ctx);
    double t0 = skv_now();
    s->kv->step = s->step;
    s->fwd.step = s->step;
    int rc = forward_batch(&s->fwd, s->kv, &token, 1, s->n_past);
    if (rc) return rc;
    s->n_past++;
    s->step++;
    s->t_decode += skv_now() - t0;
    return 0;
}
