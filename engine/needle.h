/* needle.h: needle in a haystack. The harness builds prompts (a haystack
 * trimmed to a length in tokens, a needle sentence carrying a random value
 * inserted at a depth, a question at the end), runs a list of KV policies
 * (dense first) on the same prompts, and scores exact retrieval of the value
 * in the greedy answer. With probes on, the sparse runs carry the oracle (a
 * dense twin and exact attention beside the sparse one) and the policy's
 * needle watch (kv_opts watch_begin/end), and a sparse miss is diagnosed
 * from those probe events alone: needle_diagnose reads a probe_store, so the
 * CLI's --explain and the inspector's needle view (from a trace) give the
 * same verdict. docs/NEEDLE.md explains how to read the report. */
#ifndef SKV_NEEDLE_H
#define SKV_NEEDLE_H

#include "kv.h"
#include "model.h"
#include "probe.h"
#include "needle_diag.h"
#include "needle_task.h"
#include "store.h"

#include <stdint.h>
#include <stdio.h>

/* Methods of a sweep are registered KV policies; method 0 is always dense,
 * the reference every other method is scored and diagnosed against. */
enum { NEEDLE_DENSE = 0 };
#define NEEDLE_MAX_METHODS 8

#define NEEDLE_DEFAULT_NEEDLE "The special magic number is {value}."
#define NEEDLE_DEFAULT_QUESTION "What is the special magic number?"

/* ---- option lists ------------------------------------------------------ */

/* "1k,2k,4k" or "1000,3000" (k = 1024 tokens) into a malloc'd array;
 * SKV_EINVAL with a message naming the bad item. */
int needle_parse_lengths(const char *s, int **out, int *n);
/* "0:100:10" (start:stop:step, stop included) or "0,25,50" in percent. */
int needle_parse_depths(const char *s, float **out, int *n);

/* ---- harness ----------------------------------------------------------- */

typedef struct {
    const char *haystack;      /* plain text, borrowed (a task's own haystack replaces it) */
    const needle_task *task;   /* what to plant and ask, borrowed; NULL: a single fact from the three below */
    const char *needle;        /* sentence with one "{value}" */
    const char *question;
    const char *answer_prefix; /* text after the question; NULL: the needle's text before {value} */
    const int *lengths;        /* (n_lengths) prompt lengths in tokens */
    int n_lengths;
    const float *depths;       /* (n_depths) needle depths in percent */
    int n_depths;
    int runs;                  /* repetitions, each with a new value */
    uint64_t seed;             /* values come from (seed, case) */
    int answer_tokens;         /* tokens generated per answer; 0: the value's tokens + 4 */
    int ctx;                   /* context positions; 0: each prompt plus its answer */
    int batch;                 /* prefill batch; 0: the session's default */
    int no_bos;
    char backend[16];          /* where the math runs; "" = the default */
    kv_opts kv;                /* budget and policy options; policy, oracle and watch are set per run */
    int probes;                /* 1: oracle + needle watch on the sparse runs, misses diagnosed */
    int check;                 /* with probes: rerun each miss with each proposed fix (from the run's
                                  recorded prefill) and record what it gave (needle_cause.check) */
    int oracle;                /* 1: the oracle beside the sparse runs without probe events (mass recall
                                  and output error in the case's measures) */
    int detail_case;           /* with probes: the case whose events are kept (its first sparse miss,
                                  else its first sparse method); -1: the sweep's first sparse miss */
    int n_methods;             /* methods[0] is "dense" */
    char methods[NEEDLE_MAX_METHODS][32]; /* registered policy names, in the order they run */
} needle_opts;

/* Defaults: the methods dense and shadowkv, one run, the default needle. */
void needle_opts_default(needle_opts *o);

/* Sets the methods from "dense,shadowkv,..." (registered policy names, no
 * repeats); dense is put first when the list lacks it. SKV_EINVAL with a
 * message naming a bad item. */
int needle_set_methods(needle_opts *o, const char *list);

/* Checks that every --kv-opt (a strict option in o->kv) belongs to some
 * method of the sweep; each method then takes the options it has. 0 or
 * SKV_EINVAL with a message. needle_run checks it too. */
int needle_check_kv_opts(const needle_opts *o);

/* A diagnosis names only options its policy has: a cause whose change is an
 * option that rep's policy (one of skv's, engine/kv) does not take keeps its
 * evidence and proposes no change. Policies skv does not know are left as
 * their recorded options made them (needle_diagnose). */
void needle_fit_options(needle_report *rep);

/* 1 and a one-line notice in buf when some length of o runs past m's trained
 * context (needle_run puts it in res->notice; callers may say it before). */
int needle_context_notice(const skv_model *m, const needle_opts *o, char *buf, size_t n);

/* The floor cause of a diagnosis (needle_diagnose's amend hook, which
 * needle_run and skv's main set): the policy's floor from the options and
 * budget its run recorded, when the budget was under it and dense
 * retrieved; what was blamed on a selection that did not run goes. */
void needle_trace_floor(const probe_store *st, needle_report *rep);

/* 1 and a line per sparse method of o (newline-separated) in buf when o's
 * budget at some length is under the method's floor (kv_under_floor): the
 * method selects nothing beyond what it always keeps there. */
int needle_floor_notice(const needle_opts *o, char *buf, size_t n);

/* The sweep's (method, length) cells under the method's floor as the
 * "under_floor" metric (step -1, layer 0, head -1; vals: method index and
 * context length, pairs), which the NIAH view marks; into vals (at least 2
 * n_methods n_lengths). Returns the pairs (0: none, no metric to emit). */
int needle_floor_metric(const needle_opts *o, float *vals, probe_event *ev);


typedef struct {
    int index, length, run;    /* case number; requested length; repetition */
    float depth;               /* percent */
    char task[NEEDLE_TASK_NAME_MAX]; /* the task's name (a copy: the case outlives the sweep's own task) */
    int prompt_len;            /* tokens (the length, BOS included) */
    int tok_begin, tok_end;    /* the asked fact's token positions [begin, end) */
    int insert_depth;          /* where the asked fact went, percent of the haystack tokens before it */
    char value[NEEDLE_VALUE_MAX]; /* the expected answer */
    /* The facts planted; fact 0 is the asked one, the others are distractors. */
    int n_facts;
    char keys[NEEDLE_MAX_FACTS][NEEDLE_KEY_MAX]; /* "" for a task without keys */
    char values[NEEDLE_MAX_FACTS][NEEDLE_VALUE_MAX];
    int fact_begin[NEEDLE_MAX_FACTS], fact_end[NEEDLE_MAX_FACTS]; /* token positions */
    /* Per method m (needle_opts.methods[m]): */
    char *answer[NEEDLE_MAX_METHODS]; /* generated text (owned) */
    int hit[NEEDLE_MAX_METHODS];      /* 1: the answer contains the value (not inside a longer number) */
    int distractor[NEEDLE_MAX_METHODS]; /* a miss that answered distractor fact i's value: i (>= 1), else -1 */
    /* What the run cost and how close it stayed to exact attention: */
    double t_prefill[NEEDLE_MAX_METHODS], t_decode[NEEDLE_MAX_METHODS]; /* seconds */
    int decode_steps[NEEDLE_MAX_METHODS];
    double recall[NEEDLE_MAX_METHODS], out_err[NEEDLE_MAX_METHODS]; /* oracle means; NaN without it (dense: 1, 0) */
    double fetch_bytes[NEEDLE_MAX_METHODS];   /* fetched over the decode steps; NaN: the policy does not fetch */
    double resident_bytes[NEEDLE_MAX_METHODS]; /* KV bytes resident after the answer */
    int n_steps[NEEDLE_MAX_METHODS];  /* decode steps compared with the oracle's dense twin (probes only) */
    int *top1_agree[NEEDLE_MAX_METHODS]; /* (n_steps[m]) */
    float *logit_dist[NEEDLE_MAX_METHODS]; /* (n_steps[m]) ||sparse - dense logits|| / ||dense logits|| */
    /* With probes, valid during the callback only (NULL for dense): */
    const probe_store *store[NEEDLE_MAX_METHODS];  /* method m's events and the PROBE_NIAH events of dense and m */
    const needle_report *report[NEEDLE_MAX_METHODS]; /* the diagnosis when m missed, else NULL */
} needle_case;

typedef struct {
    needle_case *cases;        /* (n_cases) in sweep order: length, then depth, then run */
    int n_cases;
    int detail;                /* with probes: the case whose events are kept below (the first
                                  miss of a sparse method, else case 0); -1 without */
    int detail_method;         /* the method of those events */
    probe_event **ev;          /* (n_ev) that case's probe events in emission order (owned) */
    int n_ev;
    int answer_tokens;         /* tokens generated per answer */
    char notice[256];          /* a note for the user ("length 1024 is past the trained context"), or "" */
} needle_result;

/* Called after each case; a non-zero return stops the sweep (returned). */
typedef int (*needle_case_fn)(const needle_case *c, void *user);

/* Called before a case runs, with its index, length, depth, run, task and
 * value set; a non-zero return skips it (it is not counted in the result).
 * skv eval skips the cases a previous run finished. */
typedef int (*needle_skip_fn)(const needle_case *c, void *user);

/* Runs the sweep on m; res is filled even on error (free it). */
int needle_run(skv_model *m, const needle_opts *o, needle_case_fn fn, void *user, needle_result *res);
/* The same with a skip test (NULL: run every case). */
int needle_run_skip(skv_model *m, const needle_opts *o, needle_skip_fn skip, needle_case_fn fn, void *user,
                    needle_result *res);
void needle_result_free(needle_result *r);

/* The PROBE_NIAH event of case c under method m of o; it points into c and o. */
probe_event needle_niah_event(const needle_opts *o, const needle_case *c, int m, int detail);

/* 1 when text contains value as a whole number (no digit right before or after). */
int needle_contains_value(const char *text, const char *value);

#endif
