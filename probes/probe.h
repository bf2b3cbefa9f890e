/* probe.h: the probe event model and the probe bus.
 *
 * The engine calls probe points; each point first asks whether anyone wants
 * its kind of event, so a probe nobody listens to costs one branch:
 *
 *     if (probe_wants(bus, PROBE_SPAN)) {
 *         probe_event ev = { .kind = PROBE_SPAN, .span = { ... } };
 *         probe_emit(bus, &ev);
 *     }
 *
 * Producers fill plain fields and point at their own arrays; the bus copies
 * everything an event points at, so subscribers never see engine memory.
 * Two kinds of subscriber:
 *  - a ring (fixed number of slots, chosen at subscribe time) drained by
 *    another thread; when it is full the producer blocks until the consumer
 *    pops (lossless, ordered);
 *  - a callback, run on the emitting thread with a pointer that is valid
 *    only during the call (the trace writer, tests). Calls to one callback
 *    are serialized even when several threads emit.
 *
 * Every event kind also has a schema (probe_schema): the list of its fields
 * with types and offsets. Copying, comparing and the trace format are all
 * driven by it, so adding a field means adding one table row. */
#ifndef SKV_PROBE_H
#define SKV_PROBE_H

#include <stddef.h>
#include <stdint.h>

/* Kind numbers are stored in trace files: never renumber, only append. */
typedef enum {
    PROBE_NONE = 0,
    PROBE_RUN = 1,           /* once, at the start of a run */
    PROBE_TOKEN = 2,         /* every prompt and generated token */
    PROBE_PREFILL_LAYER = 3, /* low-rank key policies' prefill, per layer (spectrum) */
    PROBE_PREFILL_HEAD = 4,  /* block policies' prefill, per layer and KV head (cos-min, outliers) */
    PROBE_DECODE_HEAD = 5,   /* the generic selection event: per decode step, layer and KV head */
    PROBE_STEP = 6,          /* per decode step */
    PROBE_SPAN = 7,          /* a timed operation on a stream */
    PROBE_NEEDLE = 8,        /* needle tracking, per step, layer and KV head */
    PROBE_NIAH = 9,          /* needle harness: one case's result under one method */
    PROBE_ORACLE = 10,       /* the shared measures against exact attention: per step, layer and KV head */
    PROBE_LANE = 11,         /* compare mode: the events that follow belong to lane `lane` (one policy) */
    PROBE_METRIC = 12,       /* a policy's own named measure, per step, layer and KV head (peer views) */
    PROBE_KIND_COUNT         /* one past the last kind this build knows */
} probe_kind;

#define PROBE_MASK(k) (1u << (unsigned)(k))
#define PROBE_ALL (((1u << PROBE_KIND_COUNT) - 1u) & ~1u)

/* Streams of PROBE_SPAN (the two CUDA streams of ShadowKV plus compute). */
enum { PROBE_STREAM_COMPUTE = 0, PROBE_STREAM_FETCH = 1, PROBE_STREAM_REBUILD = 2, PROBE_STREAM_COUNT };

/* Strings are NUL-terminated (NULL reads as ""). Arrays are counted by the
 * int field named in their comment. In a delivered copy every string and the
 * token text are followed by a NUL. */
typedef struct {
    const char *model, *arch, *format; /* "stories260k", "llama", "gguf" */
    int random_weights;                /* 1: weights were randomly initialized */
    int n_layers, n_heads, n_kv_heads, head_dim;
    int max_ctx, prompt_len;
    const char *kv_policy;             /* the registered policy's name */
    int budget;                        /* tokens attended per KV head; 0 for a policy without a budget */
    int oracle;                        /* 1: exact attention ran beside the policy */
    const char *backend;               /* "cpu", "cuda" */
    const char *kv_opts;               /* the policy's options in force, "key=value key=value"
                                          (probe_pairs_get reads one) */
} probe_ev_run;

typedef struct {
    int pos, id;
    int step;                          /* -1 for prompt tokens, 0.. for generated ones */
    int n_text;
    const char *text;                  /* (n_text) bytes, any values */
} probe_ev_token;

typedef struct {
    int layer, seq_len, rank;          /* rank r chosen for this layer */
    int n_sv;                          /* min(seq_len, n_kv_heads*head_dim) */
    float rel_err;                     /* ||K - U·ΣVᵀ||_F / ||K||_F */
    double t_svd, t_landmarks, t_cosmin, t_outliers, t_offload; /* seconds */
    const float *sv;                   /* (n_sv) singular values of pre-RoPE K, descending */
} probe_ev_prefill_layer;

typedef struct {
    int layer, head;                   /* head: KV head */
    int chunk, n_chunks;               /* tokens per chunk, chunks in the prompt */
    int n_outliers, n_landmarks;
    int local_start;                   /* first chunk of the dense local window */
    const float *cos_min;              /* (n_chunks) min cosine(landmark, key) per chunk */
    const int *outliers;               /* (n_outliers) chunk ids kept dense */
} probe_ev_prefill_head;

/* What a policy kept for one (step, layer, KV head): the blocks it attended
 * in full precision besides its always-kept rows, and what that cost. Every
 * view and the diagnosis read this event, whatever the policy. */
typedef struct {
    int step, layer, head;
    int block;                         /* tokens per block (chunk, page); block ids * block = positions */
    uint64_t fetch_bytes;              /* bytes fetched from slow memory for this head at this step */
    int n_sel;                         /* blocks selected (k) */
    int hits, misses;                  /* against last step's cached selection */
    int has_oracle;                    /* 1: recall and the rank arrays are filled */
    float recall;                      /* exact attention mass captured by the selection */
    int n_chunks;                      /* oracle arrays' length (0 without oracle) */
    const int *sel;                    /* (n_sel) selected chunk ids */
    const float *score;                /* (n_sel) their landmark scores */
    const int *rank_exact;             /* (n_chunks) rank of each chunk under exact attention */
    const int *rank_landmark;          /* (n_chunks) rank of each chunk under landmark scores */
} probe_ev_decode_head;

typedef struct {
    int step, token;                   /* the sampled token id */
    double seconds;                    /* wall time of the step */
    uint64_t kv_resident, kv_offloaded; /* bytes */
    float hit_rate;                    /* mean hits/k over layers and heads; NaN: no cache (Quest) or nothing selected */
    int has_oracle, top1_agree;        /* 1: dense and sparse argmax agree */
    int n_fetch;                       /* chunks fetched (misses) this step */
    uint64_t fetch_bytes;
    const char *kv_stats;              /* the policy's stats after the step, "key=value ..." */
} probe_ev_step;

typedef struct {
    int stream;                        /* PROBE_STREAM_* */
    int layer;                         /* -1: not tied to a layer */
    int step;                          /* -1: prefill */
    double t0, t1;                     /* seconds since the bus was created */
    const char *op;                    /* short name: "svd", "fetch_v", "rebuild_k" */
} probe_ev_span;

/* Needle tracking: every event repeats the needle's token span and chunks
 * (a few ints) so that any one of them describes the needle. */
typedef struct {
    int id;                            /* needle index, 0.. */
    int tok_begin, tok_end;            /* token positions [begin, end) */
    int n_chunks;
    int step, layer, head;             /* step -1: prefill */
    float mass_exact, mass_sparse;     /* attention mass on the needle, exact / sparse */
    const int *chunks;                 /* (n_chunks) chunk ids the needle covers */
    const int *rank;                   /* (n_chunks) landmark-score rank, -1: not scored (dense) */
    const int *selected;               /* (n_chunks) 1: chunk in the selection */
    /* Appended for the needle report (engine/needle.h); zero in events that
     * do not fill them. Masses are means over the KV head's query heads. */
    int k;                             /* chunks selected per KV head (the budget in chunks) */
    float key_err;                     /* step -1: rank-r relative error of the needle's pre-RoPE keys
                                          in this KV head, ||K - U·ΣVᵀ||_F / ||K||_F; -1 unknown */
    float mass_ideal;                  /* needle mass the sparse attention would give if the kept
                                          chunks had exact keys (exact mass renormalized over the
                                          kept tokens); -1 without oracle */
    float out_err;                     /* ||sparse - exact attention output|| / ||exact|| over the
                                          KV head's query heads; -1 without oracle */
    int n_info;                        /* 0, or n_chunks when the arrays below are filled */
    const int *part;                   /* (n_info) 0: candidate (offloaded, selectable),
                                          1: outlier (dense), 2: local window (dense) */
    const int *rank_exact;             /* (n_info) rank among candidates by exact attention mass, -1 */
    const float *cos_min;              /* (n_info) the chunk's cos-min; NaN for a partial tail chunk */
    const float *mass_chunk;           /* (n_info) exact attention mass on the needle tokens of the
                                          chunk; -1 without oracle */
} probe_ev_needle;

/* One needle-in-a-haystack case (engine/needle.h) under one method; the
 * NIAH heatmap is drawn from these alone. */
typedef struct {
    int index;                         /* case number in the sweep, 0.. */
    int length;                        /* requested context length in tokens */
    float depth;                       /* needle depth in percent of the haystack (0: start, 100: end) */
    int run;                           /* repetition 0.. (a new value each run) */
    int method;                        /* index of the method in the sweep's list (0 is dense) */
    int hit;                           /* 1: the answer contains the value */
    int prompt_len;                    /* tokens in the prompt */
    int tok_begin, tok_end;            /* the needle's token positions [begin, end) */
    int detail;                        /* 1: the case's probe events come before it in the trace */
    int n_steps;                       /* decode steps compared with dense (a sparse policy with oracle), or 0 */
    const char *policy;                /* the method's policy name */
    const char *value;                 /* the needle's value, "4821735" */
    const char *answer;                /* the generated answer text */
    const int *top1_agree;             /* (n_steps) 1: sparse and dense argmax agree at that step */
    const float *logit_dist;           /* (n_steps) ||sparse - dense logits|| / ||dense logits|| */
} probe_ev_niah;

/* The measures every policy gets with --oracle (engine/kv/kv_oracle.c), for
 * one (decode step, layer, KV head): the policy's own output and the set of
 * positions it attended in full precision, against exact attention over every
 * key and value the layer received. Per query head g of the group, with
 * B_g = the tokens it attended: mass recall = exact mass on those tokens /
 * exact mass of the exact top-B_g tokens; overlap = the share of the exact
 * top-B_g among them; output error = |o - o_exact| / |o_exact|. The scalars
 * are means over the group. */
typedef struct {
    int step, layer, head;             /* head: KV head */
    int n_q;                           /* query heads in the group (array lengths) */
    int unit;                          /* the policy's block (page, chunk) in tokens, 1 for tokens */
    int ctx;                           /* positions attended by exact attention (prompt + generated) */
    int n_kept;                        /* distinct positions attended by some query head of the group */
    int n_gen;                         /* of them generated tokens (counted apart) */
    float recall, overlap, out_err;    /* group means */
    float mass_kept;                   /* exact mass on the attended tokens, group mean */
    int needle_len;                    /* tokens of the watched span (kv_opts watch_*), 0: none */
    int needle_kept;                   /* of them attended by every query head of the group */
    int needle_rank;                   /* best rank (0 = top) of a needle token under exact attention
                                          (group-mean probability); -1 without a span */
    float needle_mass;                 /* exact mass on the needle, group mean */
    const int *q_kept;                 /* (n_q) tokens each query head attended */
    const float *q_recall, *q_overlap, *q_out_err; /* (n_q) */
} probe_ev_oracle;

/* Compare mode runs several policies in lockstep on one bus; before each
 * lane's events the runner emits this, and a reader routes what follows to
 * that lane's store (probes/lanes.h). A stream without it is one lane.
 * A batched run (skv run --parallel) has one lane per sequence, all of one
 * policy, and teacher "": each sequence is fed its own tokens. Its lanes
 * share the prompt: the prefill's events come once, before the first lane
 * event, and belong to every lane. */
typedef struct {
    int lane, n_lanes;                 /* 0.. of n_lanes */
    const char *policy;                /* the lane's policy */
    const char *teacher;               /* the policy whose tokens every lane is fed; "" in a batch */
} probe_ev_lane;

/* A policy's own measure, for the views made for it (docs/PEERS.md lists
 * which policy emits which name): one named number per (step, layer, KV
 * head), with an optional array. step -1: prefill (or a fixed property);
 * head -1: the whole layer. Names in use: query_cos, corrected (FreeKV);
 * page_gap_rank, page_bound, page_max (Quest); attn_spread, quantized,
 * channels (TailorKV); lowbit_overlap, lowbit_recall (SpeCache). */
typedef struct {
    int step, layer, head;
    const char *name;
    float value;
    int n;                             /* length of vals */
    const float *vals;                 /* (n) or NULL */
} probe_ev_metric;

typedef struct probe_event {
    probe_kind kind;
    union {
        probe_ev_run run;
        probe_ev_token token;
        probe_ev_prefill_layer prefill_layer;
        probe_ev_prefill_head prefill_head;
        probe_ev_decode_head decode_head;
        probe_ev_step step;
        probe_ev_span span;
        probe_ev_needle needle;
        probe_ev_niah niah;
        probe_ev_oracle oracle;
        probe_ev_lane lane;
        probe_ev_metric metric;
    };
} probe_event;

/* ---- schema ---------------------------------------------------------- */

typedef enum {
    PROBE_F_I32,     /* int */
    PROBE_F_F32,     /* float */
    PROBE_F_F64,     /* double */
    PROBE_F_U64,     /* uint64_t */
    PROBE_F_STR,     /* const char *, NUL-terminated */
    PROBE_F_BYTES,   /* const char *, count field gives the length */
    PROBE_F_I32S,    /* const int *, count field gives the length */
    PROBE_F_F32S,    /* const float *, count field gives the length */
} probe_ftype;

typedef struct {
    const char *name;
    probe_ftype type;
    size_t off;        /* offsetof(probe_event, ...) */
    int count;         /* for BYTES and arrays: index in the same table of the count field */
} probe_field;

/* The fields of kind k in encoding order (scalars first), or NULL for a
 * kind this build does not know. */
const probe_field *probe_schema(probe_kind k, int *n_fields);
const char *probe_kind_name(probe_kind k);   /* "decode_head"; "unknown" */
const char *probe_stream_name(int stream);   /* "compute", "fetch", "rebuild" */

/* The value of key in a "key=value key=value" list (run.kv_opts,
 * step.kv_stats), or def when absent or not a number. */
double probe_pairs_get(const char *pairs, const char *key, double def);
/* probe_pairs_get as an int in [lo, hi], else def (a trace's text may say
 * anything: "nan", 1e300). */
int probe_pairs_int(const char *pairs, const char *key, int def, int lo, int hi);

/* The options of a run (run.kv_opts) that its policy put in force at other
 * values, as its step statistics of the same name say (step.kv_stats; a
 * prompt too short for rank 160 ran at rank 7): "rank=7 (asked 160) ..."
 * into buf (empty when none). Returns how many differ. */
int probe_pairs_in_force(const char *opts, const char *stats, char *buf, size_t n);

/* Checks counts and pointers (non-negative, arrays present when counted);
 * 0 or SKV_EINVAL with a message naming the kind and field. */
int probe_event_check(const probe_event *ev);

/* A deep copy in one allocation; free() it. NULL when out of memory. */
probe_event *probe_event_dup(const probe_event *ev);

/* 1 when a and b have the same kind and every field and array element is
 * bitwise equal (a NULL string equals ""). */
int probe_event_equal(const probe_event *a, const probe_event *b);

/* ---- bus --------------------------------------------------------------- */

/* Only `mask` is read outside probe.c (by probe_wants); the rest is private. */
struct probe_bus {
    unsigned mask;                     /* bit k: some subscriber wants kind k; atomic */
    struct probe_bus_priv *priv;
};
typedef struct probe_bus probe_bus;
typedef struct probe_sub probe_sub;

int probe_bus_new(probe_bus **out);
/* Frees the bus and any subscriptions still attached (their handles die
 * too). Call once every producer has stopped. */
void probe_bus_free(probe_bus *b);

/* Whether any subscriber wants kind k: a NULL check and a mask test. */
#ifdef SKV_NO_PROBES
/* Probes compiled out: only `make bench` builds this, to measure what the
 * probe points cost when nobody listens. */
static inline int probe_wants(const probe_bus *b, probe_kind k) { (void)b; (void)k; return 0; }
#else
static inline int probe_wants(const probe_bus *b, probe_kind k) {
    return b && ((__atomic_load_n(&b->mask, __ATOMIC_RELAXED) >> (unsigned)k) & 1u);
}
#endif

/* Delivers ev to every subscriber that wants its kind. May block while a
 * ring subscriber is full. Safe to call from several threads. A malformed
 * event (negative count, NULL array) is an engine bug: it asserts. Returns 0,
 * or SKV_ENOMEM when a ring could not copy the event (it is dropped there). */
int probe_emit(probe_bus *b, const probe_event *ev);

/* Seconds since the bus was created (monotonic clock); 0 for NULL. */
double probe_time(const probe_bus *b);

/* Emits one PROBE_SPAN if anyone wants it; returns as probe_emit. */
int probe_emit_span(probe_bus *b, int stream, const char *op, int layer, int step, double t0, double t1);

/* Emits one PROBE_LANE if anyone wants it: what follows is lane's (of
 * n_lanes) until the next; teacher "" for a batch's sequences. */
int probe_emit_lane(probe_bus *b, int lane, int n_lanes, const char *policy, const char *teacher);

/* Emits one PROBE_METRIC (a policy's named measure) if anyone wants it;
 * vals may be NULL when n is 0. Returns as probe_emit. */
int probe_emit_metric(probe_bus *b, const char *name, int step, int layer, int head, float value, int n,
                      const float *vals);

/* A ring of `capacity` events for kinds in mask (PROBE_MASK bits). */
int probe_subscribe_ring(probe_bus *b, unsigned mask, int capacity, probe_sub **out);

typedef void (*probe_callback)(const probe_event *ev, void *user);
/* fn(ev, user) runs on the emitting thread; ev is valid only during the call.
 * fn must not subscribe, unsubscribe or emit on the same bus. */
int probe_subscribe_callback(probe_bus *b, unsigned mask, probe_callback fn, void *user, probe_sub **out);

/* Detaches and frees s. Wakes a producer blocked on s's full ring (its event
 * for s is dropped) and waits for a callback in progress to return. Not to be
 * called from inside s's callback. */
void probe_unsubscribe(probe_sub *s);

/* The oldest event in s's ring without removing it, or NULL when empty. The
 * pointer stays valid until probe_ring_pop. Consumer side: one thread. */
const probe_event *probe_ring_peek(probe_sub *s);
/* Like peek but waits up to timeout_s seconds (< 0: forever) for an event. */
const probe_event *probe_ring_wait(probe_sub *s, double timeout_s);
/* Drops the oldest event, freeing its slot for the producer. */
void probe_ring_pop(probe_sub *s);
/* Events waiting in the ring. */
int probe_ring_pending(probe_sub *s);
/* Times a producer had to wait for a full ring to drain. */
uint64_t probe_ring_stalls(probe_sub *s);

#endif
