/* forward.c: embedding, RMSNorm, QKV projections, RoPE, attention through
 * the KV policy, SwiGLU and the output head, for batches of tokens. Every
 * op runs through the backend table (kernels/backend.h); this file names no
 * quant, BLAS or LAPACK function. Activations are fp32; weights are read in
 * their stored type. */
#include "forward.h"
#include "probe.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

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
    size_t B = max_batch;
    size_t qd = (size_t)c->n_heads * c->head_dim, kvd = (size_t)c->n_kv_heads * c->head_dim;
    f->x = skv_aligned_alloc(sizeof(float) * B * c->dim);
    f->xn = skv_aligned_alloc(sizeof(float) * B * ((size_t)c->dim > qd ? (size_t)c->dim : qd));
    f->q = skv_aligned_alloc(sizeof(float) * B * qd);
    f->att = skv_aligned_alloc(sizeof(float) * B * qd);
    f->k = skv_aligned_alloc(sizeof(float) * B * kvd);
    f->k_pre = skv_aligned_alloc(sizeof(float) * B * kvd);
    f->v = skv_aligned_alloc(sizeof(float) * B * kvd);
    f->gate = skv_aligned_alloc(sizeof(float) * B * c->ffn_dim);
    f->up = skv_aligned_alloc(sizeof(float) * B * c->ffn_dim);
    f->logits = skv_aligned_alloc(sizeof(float) * c->vocab);
    if (!f->x || !f->xn || !f->q || !f->att || !f->k || !f->k_pre || !f->v || !f->gate || !f->up || !f->logits) {
        forward_free(f);
        return skv_error(SKV_ENOMEM, "out of memory for activations (batch %d)", max_batch);
    }
    return 0;
}

void forward_free(forward_state *f) {
    free(f->x); free(f->xn); free(f->q); free(f->att); free(f->k); free(f->k_pre); free(f->v);
    free(f->gate); free(f->up); free(f->logits);
    skv_workspace_free(&f->ws);
    rope_free(&f->rope);
    memset(f, 0, sizeof *f);
}

/* y (n, W.rows) = x (n, W.cols) · Wᵀ through the backend. */
static void matmul(forward_state *f, const skv_tensor *W, const float *x, int n, float *y) {
    f->be->matmul(W->type, W->data, W->rows, W->cols, x, n, y, &f->ws);
}

static void add_bias(forward_state *f, float *y, const skv_tensor *b, int n, int width) {
    if (b->data) f->be->add_bias(y, b->data, n, width);
}

/* Records a compute-stream span when someone listens. */
static void span(forward_state *f, const char *op, int layer, double t0) {
    if (!probe_wants(f->bus, PROBE_SPAN)) return;
    probe_emit_span(f->bus, PROBE_STREAM_COMPUTE, op, layer, f->step, t0, probe_time(f->bus));
}

int forward_batch(forward_state *f, kv_cache *kv, const int32_t *tokens, int n, int pos) {
    const skv_model *m = f->m;
    const model_config *c = &m->cfg;
    SKV_ASSERT(n >= 1 && n <= f->max_batch);
    int dim = c->dim, hd = c->head_dim;
    int qd = c->n_heads * hd, kvd = c->n_kv_heads * hd, ffn = c->ffn_dim;
    const skv_backend *be = f->be;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return skv_error(SKV_EINVAL, "token id %d is outside the vocabulary of %d", tokens[i], c->vocab);
    be->embed(m->tok_embd.type, m->tok_embd.data, dim, tokens, n, f->x);
    int rc;
    for (int l = 0; l < c->n_layers; l++) {
        const model_layer *L = &m->layers[l];
        double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
        be->rmsnorm(f->xn, f->x, L->attn_norm.data, n, dim, c->norm_eps);
        matmul(f, &L->wq, f->xn, n, f->q);
        matmul(f, &L->wk, f->xn, n, f->k);
        matmul(f, &L->wv, f->xn, n, f->v);
        add_bias(f, f->q, &L->bq, n, qd);
        add_bias(f, f->k, &L->bk, n, kvd);
        add_bias(f, f->v, &L->bv, n, kvd);
        memcpy(f->k_pre, f->k, sizeof(float) * n * kvd);
        be->rope(&f->rope, f->q, n, c->n_heads, pos);
        be->rope(&f->rope, f->k, n, c->n_kv_heads, pos);
        span(f, "qkv", l, t0);
        if ((rc = kv->cls->append(kv, l, pos, n, f->k_pre, f->k, f->v))) return rc;
        if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
        if ((rc = kv->cls->attend(kv, l, pos, n, f->q, f->att))) return rc;
        span(f, "attention", l, t0);
        if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
        matmul(f, &L->wo, f->att, n, f->xn);
        be->add(f->x, f->xn, (size_t)n * dim);
        be->rmsnorm(f->xn, f->x, L->ffn_norm.data, n, dim, c->norm_eps);
        matmul(f, &L->w_gate, f->xn, n, f->gate);
        matmul(f, &L->w_up, f->xn, n, f->up);
        be->swiglu(f->gate, f->up, (size_t)n * ffn);
        matmul(f, &L->w_down, f->gate, n, f->xn);
        be->add(f->x, f->xn, (size_t)n * dim);
        span(f, "mlp", l, t0);
    }
    double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
    be->rmsnorm(f->xn, f->x + (size_t)(n - 1) * dim, m->out_norm.data, 1, dim, c->norm_eps);
    matmul(f, &m->output, f->xn, 1, f->logits);
    span(f, "logits", -1, t0);
    return 0;
}
