/* lanes.c: routing a compare run's events into one store per lane. */
#include "lanes.h"

#include "skv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct probe_lanes {
    probe_store *st[PROBE_MAX_LANES];
    char policy[PROBE_MAX_LANES][32];
    char teacher[32];
    int n, cur;
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

void probe_lanes_free(probe_lanes *L) {
    if (!L) return;
    for (int i = 0; i < PROBE_MAX_LANES; i++) probe_store_free(L->st[i]);
    free(L);
}

int probe_lanes_add(probe_lanes *L, const probe_event *ev) {
    if (ev->kind != PROBE_LANE) return probe_store_add(L->st[L->cur], ev);
    const probe_ev_lane *e = &ev->lane;
    if (e->lane < 0 || e->lane >= PROBE_MAX_LANES || e->n_lanes < 1 || e->n_lanes > PROBE_MAX_LANES ||
        e->lane >= e->n_lanes)
        return skv_error(SKV_ERANGE, "lanes: lane %d of %d (at most %d lanes)", e->lane, e->n_lanes, PROBE_MAX_LANES);
    for (int i = L->n; i <= e->lane; i++)
        if (!L->st[i] && probe_store_new(&L->st[i])) return skv_error(SKV_ENOMEM, "out of memory");
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
