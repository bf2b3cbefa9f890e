/* needle_diag.h: why a needle was missed, from recorded events alone.
 *
 * needle_diagnose reads a probe_store (live, or loaded from a trace on a
 * machine without the model): the PROBE_NEEDLE events of the policy's needle
 * watch, the prefill events, and the case's PROBE_NIAH events of dense and
 * the sparse policy. It weighs every needle block at every judged step,
 * layer and KV head by the exact attention mass on its needle tokens (the
 * oracle's), so a block dropped where attention never looked costs little
 * and one dropped in the heads that read the needle costs a lot; the shares
 * it compares with the thresholds below are shares of that mass. Causes are
 * named generically (model, budget, never selected, window, compressed) and
 * the report says which policy they concern. docs/NEEDLE.md explains it. */
#ifndef SKV_NEEDLE_DIAG_H
#define SKV_NEEDLE_DIAG_H

#include "store.h"

#include <stdio.h>

#define NEEDLE_VALUE_MAX 32

typedef struct needle_report needle_report;


/* Causes, named for any policy (needle_cause_name); the comment says what
 * each means under a block-selection policy such as ShadowKV. */
enum {
    NEEDLE_CAUSE_DENSE,        /* "model": the model misses it with dense attention too */
    NEEDLE_CAUSE_BUDGET,       /* "budget": needle blocks ranked below the budget */
    NEEDLE_CAUSE_OUTLIER,      /* "never selected": the policy's score misranked a needle block that
                                  exact attention ranks in, and nothing else kept it (not an outlier) */
    NEEDLE_CAUSE_LOCAL,        /* "window": a dropped needle block lies just before the always-kept window */
    NEEDLE_CAUSE_RANK,         /* "compressed": the compressed (low-rank, quantized) keys blurred the needle;
                                  or a policy read the needle at low precision where it keeps no exact copy
                                  (TailorKV's quantized layers, SpeCache), its fix more --bits */
    NEEDLE_CAUSE_FLOOR,        /* "floor": the budget is below the policy's floor: it selects nothing (the
                                  harness adds it: the floor is the policy's, engine/kv) */
    NEEDLE_N_CAUSES
};

/* What rerunning the case with a cause's change gave (the harness fills it:
 * the probes cannot rerun a model). */
enum { NEEDLE_CHECK_NONE, NEEDLE_CHECK_RETRIEVED, NEEDLE_CHECK_MISSED };

/* A cause's evidence is weak when the sparse attention's mass on the needle
 * is within this share of what exact keys would give it (docs/NEEDLE.md). */
#define NEEDLE_WEAK_SHARE 0.05

/* Thresholds of the verdict (docs/NEEDLE.md). Shares are of the needle's
 * exact attention mass summed over the judged steps, layers and KV heads. */
#define NEEDLE_MIN_SHARE 0.05      /* budget, outlier, local: dropped share at least this */
#define NEEDLE_RANK_ERR 0.20       /* rank: mass-weighted key error of the selected needle chunks */
#define NEEDLE_RANK_TARGET 0.10    /* rank fix: key error the suggested rank reaches in every layer */
#define NEEDLE_LOCAL_REACH 16      /* local: a window of max(4 x --local, this) chunks would cover it */
#define NEEDLE_NEGLIGIBLE 0.01     /* a dropped chunk with less than this share of the dropped weight does not
                                      set the budget or outliers a fix proposes (attention barely looks there) */
#define NEEDLE_MAX_TRIES 6         /* reruns of one cause's change (the smaller value, the value, the ladder) */

const char *needle_cause_name(int kind);   /* "model", "budget", "never selected", "window", "compressed", "floor" */

/* Orders rep's causes: the model cause first, the floor next (unless its
 * fix was checked and missed where another's retrieved); then fixes checked
 * to retrieve, unchecked ones, fixes checked to miss; within each, real fixes
 * before those that leave no sparsity, then by the smaller change for the
 * same option, then by score (the mass a fix restores). */
void needle_causes_sort(needle_report *rep);

/* One rerun of a cause's change (the harness's). */
typedef struct {
    double value;              /* the option's value */
    int hit;                   /* 1: it retrieved the needle */
    char answer[96];           /* what it answered */
} needle_try;

typedef struct {
    int kind;                  /* NEEDLE_CAUSE_* */
    double score;              /* decisiveness in [0, 1]; the dense cause always comes first */
    int step, layer, head, chunk; /* where the evidence is strongest; -1 where it does not apply */
    char evidence[480];
    char fix[320];
    /* The change the fix proposes, for the harness to check: an option
     * ("budget", "rank", "outliers", "local", "bits") and its value; "" when the fix
     * is not one option (the model cause). */
    char opt[16];
    double value;              /* after the checks: the value that retrieved, else the one proposed */
    double proposed;           /* the value the fix text names */
    double smaller;            /* a smaller value of the same option worth trying first (the budget that keeps
                                  90% of what was dropped, the outliers that keep the named chunk), 0 none */
    double limit;              /* when the value misses, the harness doubles it up to this (0: no ladder) */
    int dense_needed;          /* 1: the change leaves no sparsity: dense attention would be needed, not a fix */
    int weak;                  /* 1: weak evidence (NEEDLE_WEAK_SHARE) */
    int check;                 /* NEEDLE_CHECK_*: the final rerun (a retrieval ends the ladder) */
    char check_answer[96];     /* what that rerun answered */
    int n_tries;               /* the reruns, in order: every one but the last missed */
    needle_try tries[NEEDLE_MAX_TRIES];
} needle_cause;

struct needle_report {
    int generic;               /* 1: made from PROBE_ORACLE events alone (a policy without a needle
                                  watch of its own): token-level, no chunk fields */
    int unit;                  /* the policy's block in tokens (generic reports) */
    int id;                    /* needle id in the store */
    int tok_begin, tok_end;    /* the needle's token span */
    int first_chunk, n_chunks; /* its chunks: first_chunk .. first_chunk + n_chunks - 1 */
    int chunk, prompt_len, prompt_chunks, local_start; /* tokens per chunk, prompt, its full chunks, window */
    int n_layers, n_heads;     /* KV heads */
    int k, n_cand;             /* chunks selected per KV head, candidates per head (-1 unknown) */
    int rank, budget, outliers, local; /* the run's settings */
    int n_steps;               /* decode steps with needle data */
    int last_step;             /* steps 0..last_step were judged (through the first divergence) */
    int has_oracle;
    char policy[32];           /* the sparse method the report concerns */
    int dense_hit, sparse_hit; /* -1: unknown (no PROBE_NIAH events, and no number in the watched needle) */
    int agree_steps, scored_steps; /* without PROBE_NIAH events: steps where the dense twin's argmax agreed,
                                      of the steps it scored */
    int pending;               /* without PROBE_NIAH events: the answer so far is only the value's first digits */
    char value[NEEDLE_VALUE_MAX];
    char dense_answer[96], sparse_answer[96];
    int diverge_step;          /* first decode step whose argmax differs from dense, -1 none */
    float diverge_logit;       /* logit distance there, -1 unknown */
    int n_div;                 /* layers listed below (largest output error first) */
    int div_layer[4];
    float div_err[4];
    /* shares of the needle's exact attention mass over the judged steps */
    double share_dropped, share_misranked, share_near_local, share_selected, share_outlier, share_local;
    double share_lowbit;       /* read at low precision where the policy keeps no exact copy (not dropped) */
    double key_err_selected;   /* mass-weighted key error of the selected needle chunks, -1 none */
    char kept[480];            /* what ShadowKV did with the needle's chunks */
    char divergence[400];
    int n_causes;              /* causes that apply, most decisive first */
    needle_cause causes[NEEDLE_N_CAUSES];
    int checks;                /* 1: the harness reran the case with each cause's change (cause.check);
                                  0: the fixes are unchecked (--no-check, or a trace diagnosed alone) */
    char replay[400];          /* the command that replays the case ("" unknown) */
};

/* Cause c of rep as one line: "name: evidence: fix", then what the check
 * gave ("retrieved (checked)", "still missed (checked)", "unchecked"), and
 * "weak evidence" first when it is weak. */
void needle_cause_text(const needle_report *rep, const needle_cause *c, char *buf, size_t n);

/* The report's first line: "shadowkv retrieved 4817093, as dense did", or
 * "shadowkv missed 4817093 (answered "..."); dense retrieved it". */
void needle_headline(const needle_report *rep, char *buf, size_t n);

/* Diagnoses needle id from st: from the PROBE_NEEDLE events of a policy
 * with a chunk-level needle watch (ShadowKV), else from the oracle's
 * PROBE_ORACLE events, which every policy run with --oracle and a watched
 * span has (token level: is the needle attended, where does exact attention
 * rank it, what budget would have kept it). Its PROBE_NIAH events, when
 * present, give the answers. SKV_EMISSING when st has no needle data.
 * The amend hook, when set, then adds what this layer cannot know. */
int needle_diagnose(const probe_store *st, int id, needle_report *rep);

/* What the probes cannot see, added to every diagnosis by a layer above:
 * a policy's floor (engine/kv's table; needle_trace_floor, which the
 * harness and the CLI set). NULL: nothing. */
typedef void (*needle_amend_fn)(const probe_store *st, needle_report *rep);
void needle_diag_set_amend(needle_amend_fn fn);

/* Where two policies' kept sets parted on the needle, from their oracle
 * events (both run with --oracle watching the same span, on the same
 * prompt); a is the policy that found the needle, b the one that missed it.
 * The first decode step at which, in some layer and KV head, a attended more
 * of the needle's tokens than b, by at least 0.1% of attention mass (share
 * of the needle's tokens times the exact attention mass on the needle
 * there); within that step the (layer, head) where it weighs most. When b never kept less than a, the
 * largest difference either way, and the text says the miss did not come
 * from dropping the needle. A layer that one of them quantizes (the
 * "quantized" metric) is named: its tokens were read at low precision.
 * Step 0's query is the same for both (same prompt), so a split there is the
 * policies' own doing; later steps may also differ by the tokens each
 * generated. */
typedef struct {
    int step, layer, head;
    int needle_len;            /* tokens of the watched span */
    int kept_a, kept_b;        /* of them attended by every query head of the group, per policy */
    int rank;                  /* the needle's best exact rank there (policy a's event), -1 */
    float mass;                /* exact attention mass on the needle there (policy a's event) */
    int steps_compared;        /* steps both stores have */
    char text[640];            /* one sentence naming both policies */
} needle_split;

/* Fills out from a (policy name_a) and b. Returns 0 when a split was found,
 * SKV_EMISSING when either store lacks needle oracle events or their kept
 * sets never differ (out->text says which). */
int needle_diverge(const probe_store *a, const char *name_a, const probe_store *b, const char *name_b,
                   needle_split *out);

/* A multi-fact task whose answer was a distractor's value: did the policy
 * keep that distractor and drop the asked fact? From the oracle's events
 * (the asked fact is the watched needle) and its "distractors" metric
 * (fact = 1.. the distractor, as needle_case numbers them), over decode
 * steps 0..last_step: the share of each fact's tokens the policy kept,
 * weighted by the exact attention mass on that fact at each (step, layer,
 * KV head), and the exact masses summed. The text says which of the two the
 * policy kept. 0, or SKV_EMISSING without those events. */
typedef struct {
    double target_kept, distractor_kept;   /* mass-weighted shares in [0, 1] */
    double target_mass, distractor_mass;   /* exact mass, mean per (step, layer, KV head) */
    int steps;                             /* decode steps read */
    char text[400];
} needle_distractor;

int needle_distractor_check(const probe_store *st, int fact, int last_step, const char *target_key,
                            const char *distractor_key, needle_distractor *out);

/* The report: span, settings, answers, the divergence, the verdict and
 * what the policy kept; with verbose, first the tables behind them (per
 * layer and KV head at prefill; per step, layer and KV head the needle's
 * state and masses). */
void needle_report_print(FILE *f, const probe_store *st, const needle_report *rep, int verbose);

#endif
