/* forward.c: embedding, RMSNorm, QKV projections, RoPE, attention through
 * the KV policy, SwiGLU and the output head, for batches of tokens. Every
 * op runs through the backend table (kernels/backend.h); this file names no
 * quant, BLAS or LAPACK function. Activations are fp32; weights are read in
 * their stored type. */
#include "forward.h"
#include "probe.h"
#include "skv.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the shared weights ------------------------------------------------
 * One copy per (model, backend) in the process (forward.h: ownership). */

static pthread_mutex_t weights_lock = PTHREAD_MUTEX_INITIALIZER;
static forward_weights *weights_list; /* under weights_lock */

/* One tensor into the backend (skipped when the model has none, as for
 * absent biases). */
static int load_one(forward_weights *w, const skv_tensor *t, skv_weight *out) {
    memset(out, 0, sizeof *out);
    if (!t->data) return 0;
    w->bytes += ggml_row_size(t->type, (uint64_t)t->cols) * (size_t)t->rows;
    return w->be->weight_load(t->type, t->data, t->rows, t->cols, out);
}

static void weights_free(forward_weights *w) {
    const skv_backend *be = w->be;
    if (w->lw) {
        for (int l = 0; l < w->m->cfg.n_layers; l++) {
            forward_layer *W = &w->lw[l];
            skv_weight *ws[] = {&W->attn_norm, &W->wq, &W->wk, &W->wv, &W->wo, &W->bq, &W->bk, &W->bv,
                                &W->ffn_norm, &W->w_gate, &W->w_up, &W->w_down};
            for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) be->weight_free(ws[i]);
        }
        free(w->lw);
    }
    be->weight_free(&w->tok_embd);
    be->weight_free(&w->out_norm);
    be->weight_free(&w->output);
    free(w);
}

/* Every weight of the model as the backend computes on it: the CPU's are
 * the model's own blocks; a device backend holds copies. */
static int weights_load(const skv_model *m, const skv_backend *be, forward_weights **out) {
    *out = NULL;
    forward_weights *w = calloc(1, sizeof *w);
    if (!w || !(w->lw = calloc((size_t)m->cfg.n_layers, sizeof *w->lw))) {
        free(w);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    w->m = m;
    w->be = be;
    int rc = 0;
    for (int l = 0; l < m->cfg.n_layers && !rc; l++) {
        const model_layer *L = &m->layers[l];
        forward_layer *W = &w->lw[l];
        if ((rc = load_one(w, &L->attn_norm, &W->attn_norm)) || (rc = load_one(w, &L->wq, &W->wq)) ||
            (rc = load_one(w, &L->wk, &W->wk)) || (rc = load_one(w, &L->wv, &W->wv)) ||
            (rc = load_one(w, &L->wo, &W->wo)) || (rc = load_one(w, &L->bq, &W->bq)) ||
            (rc = load_one(w, &L->bk, &W->bk)) || (rc = load_one(w, &L->bv, &W->bv)) ||
            (rc = load_one(w, &L->ffn_norm, &W->ffn_norm)) || (rc = load_one(w, &L->w_gate, &W->w_gate)) ||
            (rc = load_one(w, &L->w_up, &W->w_up)) || (rc = load_one(w, &L->w_down, &W->w_down)))
            break;
    }
    if (!rc) rc = load_one(w, &m->tok_embd, &w->tok_embd);
    if (!rc) rc = load_one(w, &m->out_norm, &w->out_norm);
    if (!rc && m->output.data == m->tok_embd.data) { /* tied: share the embedding's copy */
        w->output = w->tok_embd;
        w->output.owned = NULL;
    } else if (!rc) {
        rc = load_one(w, &m->output, &w->output);
    }
    if (rc) {
        weights_free(w);
        return rc;
    }
    *out = w;
    return 0;
}

int forward_weights_get(const skv_model *m, const skv_backend *be, forward_weights **out) {
    if (!be) be = &skv_backend_cpu;
    *out = NULL;
    pthread_mutex_lock(&weights_lock);
    forward_weights *w = weights_list;
    while (w && (w->m != m || w->be != be)) w = w->next;
    int rc = 0;
    if (w) w->refs++;
    else if (!(rc = weights_load(m, be, &w))) { /* the first user loads them, under the lock */
        w->refs = 1;
        w->next = weights_list;
        weights_list = w;
    }
    pthread_mutex_unlock(&weights_lock);
    *out = w;
    return rc;
}

void forward_weights_put(forward_weights *w) {
    if (!w) return;
    pthread_mutex_lock(&weights_lock);
    int last = --w->refs == 0;
    if (last) { /* out of the registry, then freed by this last owner */
        forward_weights **p = &weights_list;
        while (*p != w) p = &(*p)->next;
        *p = w->next;
    }
    pthread_mutex_unlock(&weights_lock);
    if (last) weights_free(w);
}

size_t forward_act_bytes(const model_config *c, int rows) {
    size_t B = (size_t)rows, qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    size_t dim = (size_t)c->dim, xn = dim > qd ? dim : qd;
    return sizeof(float) * (B * (dim + xn + 2 * qd + 3 * kvd + 2 * (size_t)c->ffn_dim) + (size_t)c->vocab);
}

int forward_init(forward_state *f, const skv_model *m, const skv_backend *be, int max_batch) {
    memset(f, 0, sizeof *f);
    const model_config *c = &m->cfg;
    f->m = m;
    f->be = be ? be : &skv_backend_cpu;
    f->max_batch = max_batch;
    f->step = -1;
    const float *factors = NULL;
    float *tmp = NULL;
    if (m->gguf) {
        const gguf_tensor *rf = gguf_find_tensor(m->gguf, "rope_freqs.weight");
        if (rf && rf->type == GGML_F32 && rf->ne[0] == (uint64_t)c->rope_dim / 2) {
            tmp = malloc(sizeof(float) * rf->ne[0]);
            if (!tmp) return skv_error(SKV_ENOMEM, "out of memory");
            memcpy(tmp, rf->data, sizeof(float) * rf->ne[0]);
            factors = tmp;
        }
    }
    rope_params rp = model_rope_params(c);
    int rc = rope_init(&f->rope, &rp, factors);
    free(tmp);
    if (rc) return rc;
    if ((rc = forward_weights_get(m, f->be, &f->w))) {
        forward_free(f);
        return rc;
    }
    size_t B = max_batch;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    be = f->be;
    f->x = be->alloc(sizeof(float) * B * c->dim);
    f->xn = be->alloc(sizeof(float) * B * ((size_t)c->dim > qd ? (size_t)c->dim : qd));
    f->q = be->alloc(sizeof(float) * B * qd);
    f->att = be->alloc(sizeof(float) * B * qd);
    f->k = be->alloc(sizeof(float) * B * kvd);
    f->k_pre = be->alloc(sizeof(float) * B * kvd);
    f->v = be->alloc(sizeof(float) * B * kvd);
    f->gate = be->alloc(sizeof(float) * B * c->ffn_dim);
    f->up = be->alloc(sizeof(float) * B * c->ffn_dim);
    f->logits_be = be->alloc(sizeof(float) * c->vocab);
    /* a device's logits come back into host_alloc's (pinned) memory: a
     * queued copy the step's one sync waits for */
    f->logits = be == &skv_backend_cpu ? f->logits_be : be->host_alloc(sizeof(float) * c->vocab);
    if (!f->x || !f->xn || !f->q || !f->att || !f->k || !f->k_pre || !f->v || !f->gate || !f->up || !f->logits_be ||
        !f->logits) {
        forward_free(f);
        return skv_error(SKV_ENOMEM, "out of memory for activations (batch %d)", max_batch);
    }
    return 0;
}

void forward_free(forward_state *f) {
    const skv_backend *be = f->be;
    if (!be) return;
    if (f->logits && f->logits != f->logits_be) be->host_free(f->logits);
    if (f->logits_host) be->host_free(f->logits_host);
    float *bufs[] = {f->x, f->xn, f->q, f->att, f->k, f->k_pre, f->v, f->gate, f->up, f->logits_be, f->logits_rows};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(bufs[i]);
    forward_weights_put(f->w);
    skv_workspace_free(&f->ws);
    rope_free(&f->rope);
    memset(f, 0, sizeof *f);
}

/* y (n, T.rows) = x (n, T.cols) · Wᵀ through the backend, W being the
 * backend's copy of the model tensor T. */
static void matmul(forward_state *f, const skv_tensor *T, const skv_weight *W, const float *x, int n, float *y) {
    f->be->matmul(W->type, W->data, T->rows, T->cols, x, n, y, &f->ws);
}

static void add_bias(forward_state *f, float *y, const skv_weight *b, int n, int width) {
    if (b->data) f->be->add_bias(y, b->data, n, width);
}

/* Records a compute-stream span when someone listens (host-clock spans:
 * the CPU's ops run on the calling thread; a device backend's own spans
 * come from span_drain instead). */
static void span(forward_state *f, const char *op, int layer, double t0) {
    if (f->be->span_drain || !probe_wants(f->bus, PROBE_SPAN)) return;
    probe_emit_span(f->bus, PROBE_STREAM_COMPUTE, op, layer, f->step, t0, probe_time(f->bus));
}

/* A device backend's spans of this batch, timed by the device, onto the
 * probe clock. */
static void device_spans(forward_state *f) {
    skv_span sp[256];
    double off = skv_now() - probe_time(f->bus);
    int n;
    while ((n = f->be->span_drain(sp, 256)) > 0)
        for (int i = 0; i < n; i++)
            probe_emit_span(f->bus, sp[i].stream ? PROBE_STREAM_FETCH : PROBE_STREAM_COMPUTE, sp[i].op, sp[i].layer,
                            sp[i].step, sp[i].t0 - off, sp[i].t1 - off);
}

/* In a traced batch, the lane event before the shared ops' spans (the
 * matmuls of every row at once): the first row's lane, sequence 0 unless it
 * has ended (batch_decode_live). */
static void shared_lane(forward_state *f, kv_cache *const *kv, int n) {
    probe_emit_lane(f->bus, f->lane_of ? f->lane_of[0] : 0, f->lane_of ? f->n_lanes : n, kv[0]->policy->name, "");
}

/* The layers over n rows already embedded in f->x. One sequence (kv[0], rows
 * at positions pos[0]..pos[0]+n-1, its prefill or one decode token), or,
 * with rows_apart, n sequences in one decode step: row i is sequence i's
 * token at position pos[i] in its own cache kv[i]. The matmuls, norms and
 * RoPE run over all n rows either way; attention per sequence unless the
 * policy takes the batch (step_batch), and RoPE in it too when the policy
 * says so (step_ropes).
 *
 * Each residual add goes with the norm after it (add_rmsnorm): the
 * attention's with the MLP's norm, the MLP's with the next layer's
 * attention norm. The last layer's MLP output is left in f->xn, not yet
 * added to f->x: forward_batch and forward_rows add it with the output norm
 * (the rows whose logits they want). */
static int run_layers(forward_state *f, kv_cache *const *kv, const int *pos, int n, int rows_apart) {
    const skv_model *m = f->m;
    const model_config *c = &m->cfg;
    int dim = c->dim, hd = c->head_dim;
    int qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, ffn = c->ffn_dim;
    const skv_backend *be = f->be;
    int rc;
    for (int l = 0; l < c->n_layers; l++) {
        const model_layer *L = &m->layers[l];
        const forward_layer *W = &f->w->lw[l];
        if (be->span_tag) be->span_tag(l, f->step);
        double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
        if (l == 0) be->rmsnorm(f->xn, f->x, W->attn_norm.data, n, dim, c->norm_eps);
        else be->add_rmsnorm(f->x, f->xn, f->xn, W->attn_norm.data, n, dim, c->norm_eps); /* the MLP's residual */
        {
            enum ggml_type t[3] = {W->wq.type, W->wk.type, W->wv.type};
            const void *w[3] = {W->wq.data, W->wk.data, W->wv.data};
            int rows[3] = {L->wq.rows, L->wk.rows, L->wv.rows};
            float *y[3] = {f->q, f->k, f->v};
            be->matmul_k(3, t, w, rows, L->wq.cols, f->xn, n, y, &f->ws);
        }
        add_bias(f, f->q, &W->bq, n, qd);
        add_bias(f, f->k, &W->bk, n, kvd);
        add_bias(f, f->v, &W->bv, n, kvd);
        int lanes = rows_apart && f->lanes;
        /* one token a sequence (a decode step, or a one-token chunk): the
         * whole batch's append and attention in one call where the policy
         * has it and every sequence runs it */
        int seqs = rows_apart ? n : 1, batched = (rows_apart || n == 1) && !lanes && kv[0]->cls->step_batch;
        for (int i = 1; i < seqs && batched; i++)
            if (kv[i]->cls != kv[0]->cls) batched = 0;
        /* k_pre: the keys before RoPE (ShadowKV's SVD takes them); a step
         * that applies RoPE itself (step_ropes) gets them un-rotated */
        if (!(batched && kv[0]->cls->step_ropes))
            be->rope_qk(&f->rope, f->q, c->n_heads, f->k, c->n_kv_heads, f->k_pre, n, pos[0], rows_apart ? pos : NULL);
        span(f, "qkv", l, t0);
        if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
        if (batched && (rc = kv[0]->cls->step_batch(kv, seqs, l, pos, f->k_pre, f->k, f->v, f->q, f->att)))
            return rc;
        for (int i = 0; i < seqs && !batched; i++) {
            int r = rows_apart ? 1 : n;
            size_t ok = (size_t)i * kvd, oq = (size_t)i * qd;
            if (lanes) { /* sequence i's attention, in its lane */
                probe_emit_lane(f->bus, f->lane_of ? f->lane_of[i] : i, f->lane_of ? f->n_lanes : n,
                                kv[i]->policy->name, "");
                if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
            }
            if ((rc = kv[i]->cls->append(kv[i], l, pos[i], r, f->k_pre + ok, f->k + ok, f->v + ok))) return rc;
            if ((rc = kv[i]->cls->attend(kv[i], l, pos[i], r, f->q + oq, f->att + oq))) return rc;
            if (lanes) span(f, "attention", l, t0);
        }
        if (lanes) shared_lane(f, kv, n);
        else span(f, "attention", l, t0);
        if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
        matmul(f, &L->wo, &W->wo, f->att, n, f->xn);
        be->add_rmsnorm(f->x, f->xn, f->xn, W->ffn_norm.data, n, dim, c->norm_eps);
        SKV_ASSERT(L->w_up.rows == ffn && L->w_gate.rows == ffn);
        be->matmul_swiglu(W->w_gate.type, W->w_gate.data, W->w_up.type, W->w_up.data, ffn, L->w_gate.cols, f->xn, n,
                          f->gate, f->up, &f->ws);
        matmul(f, &L->w_down, &W->w_down, f->gate, n, f->xn); /* added by the next norm */
        span(f, "mlp", l, t0);
    }
    return 0;
}

static int check_tokens(const model_config *c, const int32_t *tokens, int n) {
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return skv_error(SKV_EINVAL, "token id %d is outside the vocabulary of %d", tokens[i], c->vocab);
    return 0;
}

int forward_batch(forward_state *f, kv_cache *kv, const int32_t *tokens, int n, int pos) {
    const skv_model *m = f->m;
    const model_config *c = &m->cfg;
    SKV_ASSERT(n >= 1 && n <= f->max_batch);
    int dim = c->dim;
    const skv_backend *be = f->be;
    int rc = check_tokens(c, tokens, n);
    if (rc) return rc;
    int dspans = be->span_drain && probe_wants(f->bus, PROBE_SPAN);
    if (be->span_enable) be->span_enable(dspans);
    if (be->span_tag) be->span_tag(-1, f->step);
    /* a decode step (not a prefill chunk): one unit on a device (backend.h) */
    int unit = f->step >= 0 && be->step_begin;
    if (unit) be->step_begin();
    be->embed(f->w->tok_embd.type, f->w->tok_embd.data, dim, tokens, n, f->x);
    if ((rc = run_layers(f, &kv, &pos, n, 0))) {
        if (unit) be->step_end();
        return rc;
    }
    if (be->span_tag) be->span_tag(-1, f->step);
    double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
    /* the last row alone: its last residual, the output norm, the head */
    size_t last = (size_t)(n - 1) * dim;
    be->add_rmsnorm(f->x + last, f->xn + last, f->xn + last, f->w->out_norm.data, 1, dim, c->norm_eps);
    matmul(f, &m->output, &f->w->output, f->xn + last, 1, f->logits_be);
    /* a device's: queued into host_alloc's memory, then the step's one wait */
    size_t lb = sizeof(float) * (size_t)c->vocab;
    if (f->logits != f->logits_be) be->copy2d(f->logits, lb, f->logits_be, lb, lb, 1);
    if (unit) be->step_end();
    if (be->sync) be->sync();
    span(f, "logits", -1, t0);
    if (dspans) device_spans(f);
    return 0;
}

int forward_rows(forward_state *f, kv_cache *const *kv, const int32_t *tokens, const int *pos, int n, float *logits) {
    const skv_model *m = f->m;
    const model_config *c = &m->cfg;
    if (n < 1 || n > f->max_batch)
        return skv_error(SKV_EINVAL, "forward_rows: %d sequences, the state holds 1..%d", n, f->max_batch);
    const skv_backend *be = f->be;
    int rc = check_tokens(c, tokens, n);
    if (rc) return rc;
    int dev = be != &skv_backend_cpu;
    if (n > f->rows_cap) { /* every row's logits, in the backend's memory (and a device's host_alloc staging) */
        if (f->logits_rows) be->free(f->logits_rows);
        if (f->logits_host) be->host_free(f->logits_host);
        f->logits_host = NULL;
        f->rows_cap = 0;
        if (!(f->logits_rows = be->alloc(sizeof(float) * (size_t)n * c->vocab)) ||
            (dev && !(f->logits_host = be->host_alloc(sizeof(float) * (size_t)n * c->vocab))))
            return skv_error(SKV_ENOMEM, "out of memory for the logits of %d sequences", n);
        f->rows_cap = n;
    }
    int dspans = be->span_drain && probe_wants(f->bus, PROBE_SPAN);
    if (be->span_enable) be->span_enable(dspans);
    if (be->span_tag) be->span_tag(-1, f->step);
    if (f->lanes) shared_lane(f, kv, n);
    if (be->step_begin) be->step_begin(); /* the batch's decode step: one unit on a device (backend.h) */
    be->embed(f->w->tok_embd.type, f->w->tok_embd.data, c->dim, tokens, n, f->x);
    if ((rc = run_layers(f, kv, pos, n, 1))) {
        if (be->step_end) be->step_end();
        return rc;
    }
    if (be->span_tag) be->span_tag(-1, f->step);
    double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
    be->add_rmsnorm(f->x, f->xn, f->xn, f->w->out_norm.data, n, c->dim, c->norm_eps);
    matmul(f, &m->output, &f->w->output, f->xn, n, f->logits_rows);
    size_t lb = sizeof(float) * (size_t)n * c->vocab;
    if (dev) { /* queued into the staging, the step's one wait, then the caller's array */
        be->copy2d(f->logits_host, lb, f->logits_rows, lb, lb, 1);
        if (be->step_end) be->step_end();
        if (be->sync) be->sync();
        memcpy(logits, f->logits_host, lb);
    } else {
        if (be->step_end) be->step_end();
        be->download(logits, f->logits_rows, lb);
        if (be->sync) be->sync();
    }
    span(f, "logits", -1, t0);
    if (dspans) device_spans(f);
    return 0;
}
