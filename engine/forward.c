/* forward.c: embedding, RMSNorm, QKV projections, RoPE, attention through
 * the KV policy, SwiGLU and the output head, for batches of tokens on the
 * CPU. Activations are fp32; weights are read in their stored type. */
#include "forward.h"
#include "probe.h"
#include "quant.h"
#include "skv.h"
#include "vec.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

int forward_init(forward_state *f, const skv_model *m, int max_batch) {
    memset(f, 0, sizeof *f);
    const model_config *c = &m->cfg;
    f->m = m;
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
    free(f->gate); free(f->up); free(f->logits); free(f->wbuf);
    rope_free(&f->rope);
    memset(f, 0, sizeof *f);
}

void rmsnorm(float *out, const float *x, const skv_tensor *w, int n, float eps) {
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float s = (float)(1.0 / sqrt(ss / n + eps));
    const float *wf = w->data; /* norms are f32 (the loader converts) */
    for (int i = 0; i < n; i++) out[i] = x[i] * s * wf[i];
}

/* Rows of W per GEMM task: each thread dequantizes a block into its own
 * scratch and multiplies it with single-threaded OpenBLAS. */
#define WBLOCK_ROWS 256

void forward_matmul(forward_state *f, const skv_tensor *W, const float *x, int n, float *y) {
    int rows = W->rows, cols = W->cols;
    if (n == 1) {
        quant_matvec(W->type, W->data, rows, cols, x, y);
        return;
    }
    int nt = skv_threads();
    size_t need = (size_t)nt * WBLOCK_ROWS * cols;
    if (W->type != GGML_F32 && f->wbuf_len < need) {
        free(f->wbuf);
        f->wbuf = skv_aligned_alloc(sizeof(float) * need);
        SKV_ASSERT(f->wbuf);
        f->wbuf_len = need;
    }
    int nblk = (rows + WBLOCK_ROWS - 1) / WBLOCK_ROWS;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int b = 0; b < nblk; b++) {
        int r0 = b * WBLOCK_ROWS, r1 = r0 + WBLOCK_ROWS < rows ? r0 + WBLOCK_ROWS : rows;
        const float *w;
        if (W->type == GGML_F32) {
            w = (const float *)W->data + (size_t)r0 * cols;
        } else {
            float *buf = f->wbuf + (size_t)omp_get_thread_num() * WBLOCK_ROWS * cols;
            quant_dequant_row(W->type, (const uint8_t *)W->data + ggml_row_size(W->type, cols) * r0, buf,
                              (size_t)(r1 - r0) * cols);
            w = buf;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r1 - r0, cols, 1.0f, x, cols, w, cols, 0.0f,
                    y + r0, rows);
    }
}

static void add_bias(float *y, const skv_tensor *b, int n, int width) {
    if (!b->data) return;
    const float *bf = b->data;
    for (int i = 0; i < n; i++) vec_axpy(y + (size_t)i * width, 1.0f, bf, width);
}

static inline float silu(float x) { return x / (1.0f + expf(-x)); }

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
    size_t erow = ggml_row_size(m->tok_embd.type, dim);
    for (int i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= c->vocab)
            return skv_error(SKV_EINVAL, "token id %d is outside the vocabulary of %d", tokens[i], c->vocab);
        quant_dequant_row(m->tok_embd.type, (const uint8_t *)m->tok_embd.data + erow * tokens[i],
                          f->x + (size_t)i * dim, dim);
    }
    int rc;
    for (int l = 0; l < c->n_layers; l++) {
        const model_layer *L = &m->layers[l];
        double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
        for (int i = 0; i < n; i++) rmsnorm(f->xn + (size_t)i * dim, f->x + (size_t)i * dim, &L->attn_norm, dim, c->norm_eps);
        forward_matmul(f, &L->wq, f->xn, n, f->q);
        forward_matmul(f, &L->wk, f->xn, n, f->k);
        forward_matmul(f, &L->wv, f->xn, n, f->v);
        add_bias(f->q, &L->bq, n, qd);
        add_bias(f->k, &L->bk, n, kvd);
        add_bias(f->v, &L->bv, n, kvd);
        memcpy(f->k_pre, f->k, sizeof(float) * n * kvd);
        for (int i = 0; i < n; i++) {
            rope_apply(&f->rope, f->q + (size_t)i * qd, c->n_heads, pos + i);
            rope_apply(&f->rope, f->k + (size_t)i * kvd, c->n_kv_heads, pos + i);
        }
        span(f, "qkv", l, t0);
        if ((rc = kv->cls->append(kv, l, pos, n, f->k_pre, f->k, f->v))) return rc;
        if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
        if ((rc = kv->cls->attend(kv, l, pos, n, f->q, f->att))) return rc;
        span(f, "attention", l, t0);
        if (probe_wants(f->bus, PROBE_SPAN)) t0 = probe_time(f->bus);
        forward_matmul(f, &L->wo, f->att, n, f->xn);
        for (int i = 0; i < n * dim; i++) f->x[i] += f->xn[i];
        for (int i = 0; i < n; i++) rmsnorm(f->xn + (size_t)i * dim, f->x + (size_t)i * dim, &L->ffn_norm, dim, c->norm_eps);
        forward_matmul(f, &L->w_gate, f->xn, n, f->gate);
        forward_matmul(f, &L->w_up, f->xn, n, f->up);
        for (size_t i = 0; i < (size_t)n * ffn; i++) f->gate[i] = silu(f->gate[i]) * f->up[i];
        forward_matmul(f, &L->w_down, f->gate, n, f->xn);
        for (int i = 0; i < n * dim; i++) f->x[i] += f->xn[i];
        span(f, "mlp", l, t0);
    }
    double t0 = probe_wants(f->bus, PROBE_SPAN) ? probe_time(f->bus) : 0;
    rmsnorm(f->xn, f->x + (size_t)(n - 1) * dim, &m->out_norm, dim, c->norm_eps);
    forward_matmul(f, &m->output, f->xn, 1, f->logits);
    span(f, "logits", -1, t0);
    return 0;
}
