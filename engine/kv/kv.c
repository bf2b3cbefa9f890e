/* kv.c: the registry of KV policies (one line per policy), option parsing
 * driven by each policy's option table, the shared budget, and stats read
 * out by name. */
#include "kv.h"
#include "skv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The registry: adding a policy adds one line here. */
static const kv_class *const registry[] = {
    &kv_policy_dense,
    &kv_policy_shadowkv,
    &kv_policy_quest,
    &kv_policy_freekv,
    &kv_policy_specache,
    &kv_policy_tailorkv,
};

#define N_POLICIES ((int)(sizeof registry / sizeof registry[0]))

int kv_policy_count(void) { return N_POLICIES; }

const kv_class *kv_policy_at(int i) { return i >= 0 && i < N_POLICIES ? registry[i] : NULL; }

static void names(char *buf, size_t n) {
    buf[0] = 0;
    for (int i = 0; i < N_POLICIES; i++) {
        size_t len = strlen(buf);
        snprintf(buf + len, n - len, "%s%s", i ? ", " : "", registry[i]->name);
    }
}

const kv_class *kv_policy_find(const char *name) {
    for (int i = 0; i < N_POLICIES; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    char list[256];
    names(list, sizeof list);
    skv_error(SKV_EINVAL, "unknown KV policy '%s' (expected one of: %s; skv run --kv help)", name, list);
    return NULL;
}

const kv_opt_def *kv_policy_opt(const kv_class *p, const char *key) {
    for (int i = 0; i < p->n_opts; i++)
        if (!strcmp(p->opts[i].key, key)) return &p->opts[i];
    return NULL;
}

void kv_opts_default(kv_opts *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->policy, sizeof o->policy, "dense");
    o->budget = 2048; /* the ShadowKV reference code's sparse budget */
}

int kv_budget_tokens(const kv_opts *o, int prompt_len) {
    if (o->budget_pct <= 0) return o->budget;
    long b = lround((double)o->budget_pct * prompt_len / 100.0);
    return b < 1 ? 1 : b > (1 << 24) ? 1 << 24 : (int)b;
}

int kv_under_floor(const kv_opts *o, const kv_class *p, int prompt_len, char *why, size_t n) {
    if (!p || !p->floor || !p->budgeted) return 0;
    int floor = p->floor(o, why, n);
    return kv_budget_tokens(o, prompt_len) < floor ? floor : 0;
}

/* Parses value for def; 0 or SKV_EINVAL with a message naming key. */
static int parse_value(const kv_opt_def *def, const char *value, double *out) {
    if (def->type == KV_OPT_FLAG) {
        if (!*value || !strcmp(value, "1") || !strcmp(value, "true") || !strcmp(value, "on")) { *out = 1; return 0; }
        if (!strcmp(value, "0") || !strcmp(value, "false") || !strcmp(value, "off")) { *out = 0; return 0; }
        return skv_error(SKV_EINVAL, "KV option '%s' is a flag: expected 0 or 1, got '%s'", def->key, value);
    }
    char *end;
    errno = 0;
    double x = strtod(value, &end);
    int integral = def->type != KV_OPT_INT || (x == floor(x) && fabs(x) < 1e15);
    char a[40], b[40];
    if (!*value || *end || errno || !isfinite(x) || !integral || x < def->lo || x > def->hi)
        return skv_error(SKV_EINVAL, "KV option '%s' expects %s in [%s, %s], got '%s'", def->key,
                         def->type == KV_OPT_INT ? "an integer" : "a number", skv_num(a, sizeof a, def->lo, 6),
                         skv_num(b, sizeof b, def->hi, 6), value);
    *out = x;
    return 0;
}

int kv_opts_set(kv_opts *o, const char *key, const char *value, int strict) {
    const kv_opt_def *def = NULL;
    double val = 0;
    int rc = SKV_EINVAL, found = 0;
    /* The value must be valid for every policy that has the key. */
    for (int i = 0; i < N_POLICIES; i++) {
        if (!(def = kv_policy_opt(registry[i], key))) continue;
        found = 1;
        if ((rc = parse_value(def, value, &val))) return rc;
    }
    if (!found) {
        char list[256];
        names(list, sizeof list);
        return skv_error(SKV_EINVAL, "unknown KV option '%s' (no policy of %s has it; skv run --kv help lists them)",
                         key, list);
    }
    int i = 0;
    while (i < o->n_set && strcmp(o->set[i].key, key)) i++;
    if (i == KV_MAX_SET) return skv_error(SKV_EINVAL, "too many KV options (at most %d)", KV_MAX_SET);
    if (i == o->n_set) o->n_set++;
    snprintf(o->set[i].key, sizeof o->set[i].key, "%s", key);
    o->set[i].val = val;
    o->set[i].strict |= strict;
    return 0;
}

int kv_opts_set_num(kv_opts *o, const char *key, double v) {
    char buf[64];
    snprintf(buf, sizeof buf, "%.17g", v);
    return kv_opts_set(o, key, buf, 0);
}

int kv_opts_set_pair(kv_opts *o, const char *pair) {
    const char *eq = strchr(pair, '=');
    if (!eq || eq == pair) return skv_error(SKV_EINVAL, "--kv-opt expects key=value, got '%s'", pair);
    char key[64];
    size_t n = (size_t)(eq - pair);
    if (n >= sizeof key) return skv_error(SKV_EINVAL, "--kv-opt: the key of '%s' is too long", pair);
    memcpy(key, pair, n);
    key[n] = 0;
    return kv_opts_set(o, key, eq + 1, 1);
}

double kv_opt(const kv_opts *o, const kv_class *p, const char *key) {
    const kv_opt_def *def = kv_policy_opt(p, key);
    SKV_ASSERT(def);
    for (int i = 0; i < o->n_set; i++)
        if (!strcmp(o->set[i].key, key)) return o->set[i].val;
    return def->def;
}

/* "budget=64 rank=16 ..." for policy p under o; with a cache c, an option
 * whose statistic of the same name differs says the value in force and the
 * one asked ("rank=64 (asked 160)"). A budget in percent with no prompt
 * length (prompt_len 0: several lengths) stays a percentage. */
static void describe(const kv_opts *o, const kv_class *p, const kv_cache *c, int prompt_len, char *buf, size_t n) {
    size_t len = 0;
    buf[0] = 0;
    if (p->budgeted && o->budget_pct > 0 && prompt_len <= 0) len += snprintf(buf, n, "budget=%g%%", o->budget_pct);
    else if (p->budgeted) len += snprintf(buf, n, "budget=%d", kv_budget_tokens(o, prompt_len));
    for (int i = 0; i < p->n_opts && len < n; i++) {
        char a[40], b[40];
        double asked = kv_opt(o, p, p->opts[i].key), used = c ? kv_stat(c, p->opts[i].key) : NAN;
        if (!isnan(used) && used != asked)
            len += snprintf(buf + len, n - len, "%s%s=%s (asked %s)", len ? " " : "", p->opts[i].key,
                            skv_num(a, sizeof a, used, 6), skv_num(b, sizeof b, asked, 6));
        else
            len += snprintf(buf + len, n - len, "%s%s=%s", len ? " " : "", p->opts[i].key, skv_num(a, sizeof a, asked, 6));
    }
}

void kv_opts_describe(const kv_opts *o, const kv_class *p, int prompt_len, char *buf, size_t n) {
    describe(o, p, NULL, prompt_len, buf, n);
}

void kv_describe_in_force(const kv_cache *c, const kv_opts *o, int prompt_len, char *buf, size_t n) {
    describe(o, c->policy, c, prompt_len, buf, n);
}

void kv_policies_help(FILE *out) {
    fprintf(out, "KV policies (--kv NAME) and their options (--kv-opt key=value, or the flag shown):\n");
    for (int i = 0; i < N_POLICIES; i++) {
        const kv_class *p = registry[i];
        fprintf(out, "\n  %s: %s\n", p->name, p->summary);
        if (p->budgeted)
            fprintf(out, "    %-22s %s\n", "--budget B | B%",
                    "tokens attended per KV head, or B% of the prompt (shared by every policy; default 2048)");
        for (int j = 0; j < p->n_opts; j++) {
            const kv_opt_def *d = &p->opts[j];
            char left[64], range[64];
            if (d->type == KV_OPT_FLAG) {
                snprintf(left, sizeof left, "%s=0|1%s%s", d->key, d->flag ? ", " : "", d->flag ? d->flag : "");
                snprintf(range, sizeof range, "default %s", d->def != 0 ? "on" : "off");
            } else {
                snprintf(left, sizeof left, "%s=N%s%s", d->key, d->flag ? ", " : "", d->flag ? d->flag : "");
                char a[40], b[40], c[40];
                snprintf(range, sizeof range, "default %s, %s..%s", skv_num(a, sizeof a, d->def, 6),
                         skv_num(b, sizeof b, d->lo, 6), skv_num(c, sizeof c, d->hi, 6));
            }
            fprintf(out, "    %-22s %s (%s)\n", left, d->help, range);
        }
        if (p->floor) { /* the smallest budget that selects anything, at the defaults */
            kv_opts o;
            kv_opts_default(&o);
            char why[200];
            p->floor(&o, why, sizeof why);
            fprintf(out, "    %-22s at least %s\n", "budget floor", why);
        }
        if (!p->budgeted && !p->n_opts) fprintf(out, "    (no options)\n");
    }
    fprintf(out, "\nEvery policy also takes --oracle: exact attention beside it, for recall and error figures.\n");
}

int kv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    *out = NULL;
    const kv_class *p = kv_policy_find(o->policy);
    if (!p) return SKV_EINVAL;
    for (int i = 0; i < o->n_set; i++)
        if (o->set[i].strict && !kv_policy_opt(p, o->set[i].key))
            return skv_error(SKV_EINVAL, "KV option '%s' is not an option of policy %s (skv run --kv help)",
                             o->set[i].key, p->name);
    if (shape->be && shape->be != &skv_backend_cpu && !p->device)
        return skv_error(SKV_EUNSUPPORTED, "policy %s keeps its data in host memory and runs on the cpu backend "
                         "only (--backend cpu); on %s this build runs --kv dense", p->name, shape->be->name);
    int rc = p->create(o, shape, out);
    if (!rc) (*out)->policy = p;
    return rc;
}

int kv_end_step(kv_cache *c) {
    for (kv_cache *k = c; k; k = k->wrapped)
        if (k->cls->end_step) return k->cls->end_step(k);
    return 0;
}

void kv_begin_prefill(kv_cache *c, int n) {
    for (kv_cache *k = c; k; k = k->wrapped)
        if (k->cls->begin_prefill) {
            k->cls->begin_prefill(k, n);
            return;
        }
}

double kv_stat(const kv_cache *c, const char *key) {
    const kv_class *p = c->policy ? c->policy : c->cls;
    double val[KV_MAX_STATS];
    for (int i = 0; i < p->n_stats; i++)
        if (!strcmp(p->stat_defs[i].key, key)) {
            c->cls->stats(c, val);
            return val[i];
        }
    return NAN;
}

void kv_stats_describe(const kv_cache *c, char *buf, size_t n) {
    const kv_class *p = c->policy ? c->policy : c->cls;
    double val[KV_MAX_STATS];
    size_t len = 0;
    buf[0] = 0;
    if (!p->n_stats) return;
    c->cls->stats(c, val);
    for (int i = 0; i < p->n_stats && len < n; i++)
    {
        char num[40];
        len += snprintf(buf + len, n - len, "%s%s=%s", len ? " " : "", p->stat_defs[i].key,
                        skv_num(num, sizeof num, val[i], 6));
    }
}

int kv_attend_all(const kv_shape *sh, const float *q, const float *K, const float *V, int rows, int stride,
                  size_t head_stride, float *out) {
    const skv_backend *be = sh->be ? sh->be : &skv_backend_cpu;
    return be->attend_decode(q, sh->n_heads, sh->n_kv_heads, sh->head_dim, K, V, rows, stride, head_stride, out);
}

int kv_grow_cap(const char *who, int have, int need, int max_ctx, int *cap) {
    if (need > max_ctx) return skv_error(SKV_ERANGE, "%s: position %d is past the context of %d", who, need - 1, max_ctx);
    int c = have > 0 ? have : 256;
    while (c < need) c = c > max_ctx / 2 ? max_ctx : 2 * c;
    *cap = c < max_ctx ? c : max_ctx;
    return 0;
}

int kv_policy_alloc(const kv_class *p, const kv_shape *shape, const kv_opts *o, size_t size, size_t layer_size,
                    void **cache, void **layers) {
    *cache = *layers = NULL;
    if (shape->n_kv_heads < 1 || shape->n_heads % shape->n_kv_heads || shape->head_dim < 1)
        return skv_error(SKV_EINVAL, "%s: %d query heads do not split into %d KV heads", p->name, shape->n_heads,
                         shape->n_kv_heads);
    if (o->budget < 0) return skv_error(SKV_EINVAL, "%s: the budget must be >= 0 (got %d)", p->name, o->budget);
    kv_cache *c = skv_calloc(1, size);
    void *L = c ? skv_calloc((size_t)shape->n_layers, layer_size) : NULL;
    if (!L) {
        free(c);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    c->cls = c->policy = p;
    c->shape = *shape;
    if (!c->shape.be) c->shape.be = &skv_backend_cpu;
    c->step = -1;
    *cache = c;
    *layers = L;
    return 0;
}
