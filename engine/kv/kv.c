/* kv.c: KV option defaults (the ShadowKV paper's) and the policy factory. */
#include "kv.h"
#include "skv.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

void kv_opts_default(kv_opts *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->policy, sizeof o->policy, "dense");
    o->rank = 160;
    o->chunk = 8;
    o->budget = 2048;
    o->outliers = 48;
    o->local = 4;
}

int kv_budget_tokens(const kv_opts *o, int prompt_len) {
    if (o->budget_pct <= 0) return o->budget;
    long b = lround((double)o->budget_pct * prompt_len / 100.0);
    return b < 1 ? 1 : b > (1 << 24) ? 1 << 24 : (int)b;
}

int kv_new(const kv_opts *o, const kv_shape *shape, kv_cache **out) {
    if (!strcmp(o->policy, "dense")) return kv_dense_new(shape, out);
    if (!strcmp(o->policy, "shadowkv")) return kv_shadowkv_new(o, shape, out);
    return skv_error(SKV_EINVAL, "unknown KV policy '%s' (expected dense or shadowkv)", o->policy);
}
