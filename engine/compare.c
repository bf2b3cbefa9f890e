/* compare.c: KV policies in lockstep (compare.h). */
#include "compare.h"
#include "probe.h"
#include "skv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int compare_parse(const char *list, char names[][32], int max) {
    int n = 0;
    const char *p = list;
    if (!list || !*list) return skv_error(SKV_EINVAL, "--kv: empty list of policies");
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (!len || len >= 32) return skv_error(SKV_EINVAL, "--kv: bad item in '%s'", list);
        if (n == max) return skv_error(SKV_EINVAL, "--kv: at most %d policies in '%s'", max, list);
        memcpy(names[n], p, len);
        names[n][len] = 0;
        if (!kv_policy_find(names[n])) return SKV_EINVAL;
        for (int i = 0; i < n; i++)
            if (!strcmp(names[i], names[n])) return skv_error(SKV_EINVAL, "--kv: '%s' is listed twice", names[n]);
        n++;
        p = e ? e + 1 : p + len;
        if (e && !*p) return skv_error(SKV_EINVAL, "--kv: '%s' ends with a comma", list);
    }
    return n;
}

void compare_free(compare_run *c) {
    if (!c) return;
    for (int i = 0; i < c->n; i++) session_free(c->s[i]);
    free(c);
}

int compare_new(skv_model *m, const session_opts *base, char names[][32], int n, compare_run **out) {
    *out = NULL;
    if (n < 1 || n > COMPARE_MAX) return skv_error(SKV_EINVAL, "compare: 1 to %d policies", COMPARE_MAX);
    for (int i = 0; i < base->kv.n_set; i++) {
        if (!base->kv.set[i].strict) continue;
        int has = 0;
        for (int j = 0; j < n && !has; j++) has = kv_policy_opt(kv_policy_find(names[j]), base->kv.set[i].key) != NULL;
        if (!has)
            return skv_error(SKV_EINVAL, "KV option '%s' is not an option of any compared policy (skv run --kv help)",
                             base->kv.set[i].key);
    }
    compare_run *c = skv_calloc(1, sizeof *c);
    if (!c) return skv_error(SKV_ENOMEM, "out of memory");
    c->n = n;
    c->bus = base->bus;
    for (int i = 0; i < n; i++) {
        snprintf(c->policy[i], sizeof c->policy[i], "%s", names[i]);
        if (!strcmp(names[i], "dense") && c->teacher == 0 && strcmp(names[0], "dense")) c->teacher = i;
    }
    for (int i = 0; i < n; i++) {
        session_opts so = *base;
        snprintf(so.kv.policy, sizeof so.kv.policy, "%s", names[i]);
        for (int j = 0; j < so.kv.n_set; j++) so.kv.set[j].strict = 0;
        int rc = session_new(m, &so, &c->s[i]);
        if (rc) {
            compare_free(c);
            return rc;
        }
    }
    *out = c;
    return 0;
}

static void emit_lane(compare_run *c, int i) {
    if (c->n > 1) probe_emit_lane(c->bus, i, c->n, c->policy[i], c->policy[c->teacher]); /* one policy: one lane */
}

typedef struct {
    int (*fn)(void *, int, int);
    void *user;
    int base, total;
} lane_progress;

static int on_progress(void *user, int done, int total) {
    lane_progress *p = user;
    (void)total;
    return p->fn(p->user, p->base + done, p->total);
}

int compare_prefill(compare_run *c, const int32_t *ids, int n, int (*progress)(void *, int, int), void *user) {
    lane_progress lp = {progress, user, 0, n * c->n};
    for (int i = 0; i < c->n; i++) {
        emit_lane(c, i);
        lp.base = i * n;
        int rc = session_prefill(c->s[i], ids, n, progress ? on_progress : NULL, &lp);
        if (rc) return rc;
    }
    return 0;
}

int compare_next(compare_run *c) { return session_sample(c->s[c->teacher]); }

int compare_decode(compare_run *c, int32_t token) {
    int V = c->s[0]->m->cfg.vocab;
    for (int i = 0; i < c->n; i++) c->agree[i] += sampler_argmax(session_logits(c->s[i]), V) == token;
    for (int i = 0; i < c->n; i++) {
        emit_lane(c, i);
        int rc = session_decode(c->s[i], token);
        if (rc) return rc;
    }
    c->steps++;
    return 0;
}

void compare_emit_last(compare_run *c, int32_t token) {
    for (int i = 0; i < c->n; i++) {
        emit_lane(c, i);
        session_emit_last(c->s[i], token);
    }
}
