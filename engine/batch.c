/* batch.c: several sequences decoded together. Each sequence is a session
 * of its own (tokens, position, KV policy instance, sampler, probe lane:
 * its bus); prefill runs per sequence, or once and forked (session_fork).
 * A step feeds every sequence one token: the weights' matmuls run once over
 * the B rows (forward_rows), RoPE and attention per sequence through its
 * policy, and each sequence's logits land in its own session, so sampling,
 * the oracle's twin and the step events are the session's as for one
 * sequence. No policy names the batch: each sees one sequence. On a bus
 * (the sequences' own, one for all), each sequence is a lane
 * (probes/lanes.h): its events follow a lane event naming it. */
#include "batch.h"

#include <math.h>
#include "probe.h"
#include "skv.h"

#include <stdlib.h>
#include <string.h>

struct skv_batch {
    int n;
    skv_session **s;       /* (n) owned */
    forward_state fwd;     /* the batched step's activations, (n) rows; the weights borrowed (forward.h) */
    kv_cache **kv;         /* (n) each session's cache */
    int *pos;              /* (n) the fed rows' positions */
    int *row_seq;          /* (n) the sequence of each fed row */
    int32_t *row_tok;      /* (n) the token of each fed row */
    float *logits;         /* (n, vocab) host */
    int steps;
    long rows_fed;         /* tokens fed over every step (a step feeds each live sequence one) */
    double t_decode;       /* seconds in batch_decode */
};

void batch_free(skv_batch *b) {
    if (!b) return;
    for (int i = 0; b->s && i < b->n; i++) session_free(b->s[i]);
    free(b->s);
    if (b->fwd.m) forward_free(&b->fwd);
    free(b->kv);
    free(b->pos);
    free(b->row_seq);
    free(b->row_tok);
    free(b->logits);
    free(b);
}

int batch_new(skv_session **seqs, int n, skv_batch **out) {
    *out = NULL;
    if (n < 1) return skv_error(SKV_EINVAL, "a batch needs at least one sequence");
    for (int i = 1; i < n; i++)
        if (seqs[i]->m != seqs[0]->m || seqs[i]->be != seqs[0]->be)
            return skv_error(SKV_EINVAL, "the sequences of a batch share one model and backend");
    skv_batch *b = calloc(1, sizeof *b);
    if (!b) return skv_error(SKV_ENOMEM, "out of memory");
    b->n = n;
    const skv_model *m = seqs[0]->m;
    b->s = calloc((size_t)n, sizeof *b->s);
    b->kv = calloc((size_t)n, sizeof *b->kv);
    b->pos = calloc((size_t)n, sizeof *b->pos);
    b->row_seq = calloc((size_t)n, sizeof *b->row_seq);
    b->row_tok = calloc((size_t)n, sizeof *b->row_tok);
    b->logits = malloc(sizeof(float) * (size_t)n * m->cfg.vocab);
    int rc = !b->s || !b->kv || !b->pos || !b->row_seq || !b->row_tok || !b->logits
                 ? skv_error(SKV_ENOMEM, "out of memory for a batch of %d", n)
                 : forward_init(&b->fwd, m, seqs[0]->be, n);
    if (rc) {
        free(b->s);
        b->s = NULL;
        batch_free(b);
        return rc;
    }
    memcpy(b->s, seqs, sizeof *b->s * (size_t)n); /* owned from here on */
    b->fwd.bus = seqs[0]->o.bus;
    *out = b;
    return 0;
}

skv_session *batch_seq(skv_batch *b, int i) { return i >= 0 && i < b->n ? b->s[i] : NULL; }

double batch_t_decode(const skv_batch *b) { return b->t_decode; }

int batch_steps(const skv_batch *b) { return b->steps; }

/* With a bus and more than one sequence, sequence i's events follow a
 * lane event for lane i (teacher "": each is fed its own tokens). */
static void lane(skv_batch *b, int i) {
    if (b->n > 1) probe_emit_lane(b->fwd.bus, i, b->n, b->s[i]->o.kv.policy, "");
}

int batch_decode(skv_batch *b, const int32_t *tokens) { return batch_decode_live(b, tokens, NULL); }

int batch_decode_live(skv_batch *b, const int32_t *tokens, const unsigned char *live) {
    int rc = 0, rows = 0;
    for (int i = 0; i < b->n; i++) {
        if (b->s[i]->n_prompt <= 0) return skv_error(SKV_EINVAL, "sequence %d of the batch has no prompt yet", i);
        if (!live || live[i]) b->row_seq[rows++] = i;
    }
    if (!rows) return 0; /* every sequence has ended: nothing to feed */
    b->fwd.lanes = b->n > 1 && probe_wants(b->fwd.bus, PROBE_LANE);
    b->fwd.lane_of = b->row_seq;
    b->fwd.n_lanes = b->n;
    for (int r = 0; r < rows && !rc; r++) {
        int i = b->row_seq[r];
        skv_session *s = b->s[i];
        lane(b, i);
        rc = session_step_begin(s, tokens[i]);
        b->kv[r] = s->kv;
        b->pos[r] = s->n_past;
        b->row_tok[r] = tokens[i];
    }
    if (rc) return rc;
    b->fwd.step = b->s[b->row_seq[0]]->step;
    double t0 = skv_now();
    if ((rc = forward_rows(&b->fwd, b->kv, b->row_tok, b->pos, rows, b->logits))) return rc;
    double dt = skv_now() - t0;
    size_t V = (size_t)b->s[0]->m->cfg.vocab;
    for (int r = 0; r < rows && !rc; r++) {
        int i = b->row_seq[r];
        skv_session *s = b->s[i];
        memcpy(s->fwd.logits, b->logits + r * V, sizeof(float) * V);
        lane(b, i);
        rc = session_step_end(s, tokens[i], dt);
    }
    b->steps++;
    b->rows_fed += rows;
    b->t_decode += dt;
    return rc;
}

long batch_rows_fed(const skv_batch *b) { return b->rows_fed; }

void batch_emit_last(skv_batch *b, int i, int32_t token) {
    if (i < 0 || i >= b->n) return;
    lane(b, i);
    session_emit_last(b->s[i], token);
}

int batch_fit(double once_a, double per_a, double avail_a, double per_b, double avail_b, int *bound) {
    double left = avail_a - once_a; /* the weights, counted once */
    double a = left < 0 ? 0 : per_a > 0 ? floor(left / per_a) : 4096, b = per_b > 0 ? floor(avail_b / per_b) : 4096;
    *bound = per_b > 0 && b < a;
    double n = b < a ? b : a;
    return n < 0 ? 0 : n > 4096 ? 4096 : (int)n;
}
