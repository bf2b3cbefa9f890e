/* session.h: a generation session: a model, its KV policy, the forward
 * state and a sampler, fed a prompt and then one token at a time. This is the
 * unit the CLI, the inspector's worker thread and the needle harness drive. */
#ifndef SKV_SESSION_H
#define SKV_SESSION_H

#include "forward.h"
#include "kv.h"
#include "model.h"
#include "probe.h"
#include "sampler.h"

typedef struct {
    char backend[16];        /* where the math runs ("cpu"); "" = the default */
    const skv_backend *be;   /* non-NULL: this backend table itself, not backend's by name (tests: a
                                stand-in device, tests/test_devpath.c); forks take it over */
    int ctx;                 /* positions; 0 = the model's trained context */
    int batch;               /* prefill batch; 0 = 512 */
    kv_opts kv;
    sampler_opts sample;
    probe_bus *bus;          /* may be NULL */
    int tap_layer;           /* >= 0: record that layer's K, V and last query (kv_tap_get) */
    int record_prefill;      /* 1: keep the prefill's keys, values and queries for session_fork */
} session_opts;

void session_opts_default(session_opts *o);

typedef struct skv_session skv_session;
struct skv_session {
    skv_model *m;            /* borrowed */
    session_opts o;
    const skv_backend *be;   /* the backend in use (after any fallback) */
    char notice[256];        /* a message for the user (backend fallback), or "" */
    forward_state fwd;       /* its activations own; the weights borrowed from the process's one copy
                                (forward_weights), shared with forks, batches and the twin */
    kv_cache *kv;
    kv_cache *oracle;        /* --oracle with a sparse policy: the oracle wrapper (inside kv, owned by it) */
    kv_cache *rec;           /* record_prefill: the prefill recorder (kv itself, outermost) */
    float *prefill_logits;   /* record_prefill: (vocab) the logits at the end of the prefill (owned) */
    sampler smp;
    int n_past;              /* positions filled */
    int n_prompt;
    int step;                /* decode steps done */
    double t_prefill;        /* seconds (the policy's end_prefill included; record_prefill's copies not) */
    double t_end_prefill;    /* seconds of the policy's end_prefill (ShadowKV's SVD, landmarks, offload) */
    double t_decode;         /* seconds, summed over steps */
    int last_token;          /* last token fed (for token text) */
    /* Oracle mode: a dense twin of the forward pass fed the same tokens, so
     * that the sparse and dense argmax can be compared at every step. */
    forward_state twin;
    kv_cache *twin_kv;
    int top1_agree;          /* last step: 1 if both argmax agree, -1 without oracle */
    int n_agree, n_compared; /* over the run */
};

int session_new(skv_model *m, const session_opts *o, skv_session **out);
void session_free(skv_session *s);

/* The run event of a session with options o on backend, for a prompt of
 * prompt_len tokens: built here alone, so every producer (the session, the
 * needle harness) records the same fields. The policy's options are written
 * into opts_buf (n bytes), which the event points at. */
void session_run_event(const skv_model *m, const session_opts *o, const char *backend, int prompt_len,
                       char *opts_buf, size_t n, probe_event *ev);

/* Runs the prompt (n tokens). progress, when set, is called after each batch;
 * a non-zero return cancels the prefill (SKV_EINVAL, "prefill cancelled"). */
int session_prefill(skv_session *s, const int32_t *tokens, int n, int (*progress)(void *user, int done, int total),
                    void *user);

/* A new session at the end of src's prefill with other KV options (the same
 * policy: a budget, rank, window...): src must have been made with
 * record_prefill. Its policy is fed src's recorded prefill (kv_rec_replay),
 * not the model, and it takes src's last logits, so its decode is the one a
 * prefill of the same prompt under kv would give. On a device backend the
 * replay moves the recorded rows through the backend's upload (kv_rec.c);
 * the fork borrows src's weights (one copy in the process, forward.h) and
 * adds only its own KV cache and one row of activations. No oracle, probes
 * or tap; the caller frees it. */
int session_fork(const skv_session *src, const kv_opts *kv, skv_session **out);

/* Sets the bus s and its KV policy emit on (NULL: none). A fork starts
 * with none: a batch that is traced gives its sequences the source's. */
void session_set_bus(skv_session *s, probe_bus *bus);

/* Feeds one token at the next position. */
int session_decode(skv_session *s, int32_t token);

/* A generated token that no step feeds (the run's last, or one a full
 * context stopped at): its token event, at the step that would have fed it,
 * so that a trace holds the whole text. No step is run or counted. */
void session_emit_last(skv_session *s, int32_t token);

/* session_decode in two halves around the forward pass, for a step that
 * runs several sessions' rows at once (batch.c): the context check, the
 * step numbers and the token event; then, with s->fwd.logits holding the
 * row's logits and dt the seconds the step took, the oracle's dense twin,
 * the step event and the counters. */
int session_step_begin(skv_session *s, int32_t token);
int session_step_end(skv_session *s, int32_t token, double dt);

/* Logits of the last token fed, (vocab). */
static inline const float *session_logits(const skv_session *s) { return s->fwd.logits; }

/* Samples from the current logits. */
static inline int session_sample(skv_session *s) { return sampler_sample(&s->smp, s->fwd.logits); }

#endif
