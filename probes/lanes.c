/* lanes.c: routing a compare or batched run's events into one store per lane. */
#include "lanes.h"

#include "skv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct probe_lanes {
    probe_store *st[PROBE_MAX_LANES];
    char policy[PROBE_MAX_LANES][32];
    char label[PROBE_MAX_LANES][40];
    char teacher[32];
    int n, cur;
    int seen_lane;       /* a lane event came */
    int batched;         /* its teacher was "" */
    /* The prefill's events before the first lane event: a batch's shared
     * prompt, given to each sequence's store as it appears. Kept until the
     * first decode event of a stream without lanes (a single run). */
    probe_event **prefix;
    int n_prefix, cap_prefix, prefix_done;
};

int probe_lanes_new(probe_lanes **out) {
    probe_lanes *L = skv_calloc(1, sizeof *L);
    if (!L || probe_store_new(&L->st[0])) {
        free(L);
        *out = NULL;
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    L->n = 1;
    *out = L;
    return 0;
}

static void prefix_free(probe_lanes *L) {
    for (int i = 0; i < L->n_prefix; i++) free(L->prefix[i]);
    free(L->prefix);
    L->prefix = NULL;
    L->n_prefix = L->cap_prefix = 0;
}

void probe_lanes_free(probe_lanes *L) {
    if (!L) return;
    for (int i = 0; i < PROBE_MAX_LANES; i++) probe_store_free(L->st[i]);
    prefix_free(L);
    free(L);
}

/* The step an event belongs to (-1: the prefill); niah and lane events
 * belong to none (-2). */
static int event_step(const probe_event *ev) {
    switch (ev->kind) {
    case PROBE_RUN: case PROBE_PREFILL_LAYER: case PROBE_PREFILL_HEAD: return -1;
    case PROBE_TOKEN: return ev->token.step;
    case PROBE_DECODE_HEAD: return ev->decode_head.step;
    case PROBE_STEP: return ev->step.step;
    case PROBE_SPAN: return ev->span.step;
    case PROBE_NEEDLE: return ev->needle.step;
    case PROBE_ORACLE: return ev->oracle.step;
    case PROBE_METRIC: return ev->metric.step;
    default: return -2;
    }
}

/* Before any lane event: keeps a copy of each prefill event, in case lane
 * events of a batch follow. */
static int keep_prefix(probe_lanes *L, const probe_event *ev) {
    int step = event_step(ev);
    if (step >= 0) { /* decoding began without lanes: one run, nothing to share */
        prefix_free(L);
        L->prefix_done = 1;
        return 0;
    }
    if (step != -1) return 0;
    if (L->n_prefix == L->cap_prefix) {
        int cap = L->cap_prefix ? 2 * L->cap_prefix : 256;
        probe_event **p = realloc(L->prefix, sizeof *p * (size_t)cap);
        if (!p) return skv_error(SKV_ENOMEM, "out of memory");
        L->prefix = p;
        L->cap_prefix = cap;
    }
    if (!(L->prefix[L->n_prefix] = probe_event_dup(ev))) return skv_error(SKV_ENOMEM, "out of memory");
    L->n_prefix++;
    return 0;
}

int probe_lanes_add(probe_lanes *L, const probe_event *ev) {
    int rc;
    if (ev->kind != PROBE_LANE) {
        if (!L->seen_lane && !L->prefix_done && (rc = keep_prefix(L, ev))) return rc;
        return probe_store_add(L->st[L->cur], ev);
    }
    const probe_ev_lane *e = &ev->lane;
    if (e->lane < 0 || e->lane >= PROBE_MAX_LANES || e->n_lanes < 1 || e->n_lanes > PROBE_MAX_LANES ||
        e->lane >= e->n_lanes)
        return skv_error(SKV_ERANGE, "lanes: lane %d of %d (at most %d lanes)", e->lane, e->n_lanes, PROBE_MAX_LANES);
    if (!L->seen_lane) {
        L->seen_lane = 1;
        L->batched = !e->teacher || !e->teacher[0];
        if (!L->batched) prefix_free(L);
    }
    for (int i = L->n; i <= e->lane; i++) {
        if (!L->st[i] && probe_store_new(&L->st[i])) return skv_error(SKV_ENOMEM, "out of memory");
        /* lane 0 took the prompt's events as they came */
        for (int k = 0; L->batched && i > 0 && k < L->n_prefix; k++)
            if ((rc = probe_store_add(L->st[i], L->prefix[k]))) return rc;
        if (L->batched) snprintf(L->label[i], sizeof L->label[i], "seq %d", i);
    }
    if (L->batched) snprintf(L->label[0], sizeof L->label[0], "seq 0");
    if (e->lane + 1 > L->n) L->n = e->lane + 1;
    L->cur = e->lane;
    snprintf(L->policy[e->lane], sizeof L->policy[0], "%s", e->policy ? e->policy : "");
    snprintf(L->teacher, sizeof L->teacher, "%s", e->teacher ? e->teacher : "");
    return 0;
}

int probe_lanes_drain(probe_lanes *L, probe_sub *ring, int max) {
    int n = 0;
    const probe_event *ev;
    while ((max < 0 || n < max) && (ev = probe_ring_peek(ring))) {
        int rc = probe_lanes_add(L, ev);
        probe_ring_pop(ring);
        if (rc) return rc;
        n++;
    }
    return n;
}

int probe_lanes_count(const probe_lanes *L) { return L->n; }

probe_store *probe_lanes_store(const probe_lanes *L, int i) { return i >= 0 && i < L->n ? L->st[i] : NULL; }

const char *probe_lanes_policy(const probe_lanes *L, int i) {
    if (i < 0 || i >= L->n) return "";
    if (L->policy[i][0]) return L->policy[i];
    const probe_ev_run *r = probe_store_run(L->st[i]);
    return r && r->kv_policy ? r->kv_policy : "";
}

const char *probe_lanes_teacher(const probe_lanes *L) { return L->teacher; }

int probe_lanes_batched(const probe_lanes *L) { return L->batched; }

const char *probe_lanes_label(const probe_lanes *L, int i) {
    if (i < 0 || i >= L->n) return "";
    return L->batched ? L->label[i] : probe_lanes_policy(L, i);
}
