/* test_policy.c: the registry of KV policies: lookup, option tables parsed
 * generically (ranges, flags, defaults, the strict --kv-opt rule), the
 * description carried by the run event, and stats read by name. */
#include "kv.h"
#include "probe.h"
#include "skv.h"
#include "testhelp.h"

#include <math.h>

int main(void) {
    test_cond("the registry lists dense first, then shadowkv",
              kv_policy_count() >= 2 && !strcmp(kv_policy_at(0)->name, "dense") &&
                  !strcmp(kv_policy_at(1)->name, "shadowkv"));
    int ok = 1;
    for (int i = 0; i < kv_policy_count(); i++) {
        const kv_class *p = kv_policy_at(i);
        ok &= p->summary && *p->summary && p->create && p->append && p->attend && p->end_prefill && p->bytes &&
              p->free && (p->n_stats == 0 || p->stats) && p->n_stats <= KV_MAX_STATS && kv_policy_find(p->name) == p;
        for (int j = 0; j < p->n_opts; j++) {
            const kv_opt_def *d = &p->opts[j];
            ok &= d->key && d->help && d->lo <= d->def && d->def <= d->hi && kv_policy_opt(p, d->key) == d;
        }
    }
    test_cond("every policy has a summary, its calls, and options whose defaults lie in their ranges", ok);
    /* A key is parsed once for every policy that has it (kv_opts_set), so a
     * shared key must mean the same range everywhere. */
    int same = 1;
    for (int i = 0; i < kv_policy_count(); i++)
        for (int j = 0; j < kv_policy_at(i)->n_opts; j++) {
            const kv_opt_def *a = &kv_policy_at(i)->opts[j];
            for (int m = i + 1; m < kv_policy_count(); m++) {
                const kv_opt_def *b = kv_policy_opt(kv_policy_at(m), a->key);
                if (b && (b->type != a->type || b->lo != a->lo || b->hi != a->hi)) {
                    printf("  %s: %s and %s differ\n", a->key, kv_policy_at(i)->name, kv_policy_at(m)->name);
                    same = 0;
                }
            }
        }
    test_cond("an option key shared by several policies has one type and range", same);
    test_cond("the registry has the six policies", kv_policy_find("quest") && kv_policy_find("freekv") &&
                                                       kv_policy_find("specache") && kv_policy_find("tailorkv") &&
                                                       kv_policy_count() == 6);
    test_cond("an unknown policy is refused, listing the known ones",
              !kv_policy_find("quux") && strstr(skv_last_error(), "'quux'") && strstr(skv_last_error(), "shadowkv"));

    const kv_class *sk = kv_policy_find("shadowkv");
    kv_opts o;
    kv_opts_default(&o);
    test_cond("defaults are the ShadowKV reference code's", kv_opt(&o, sk, "rank") == 160 && kv_opt(&o, sk, "chunk") == 8 &&
                                                              kv_opt(&o, sk, "outliers") == 48 && kv_opt(&o, sk, "local") == 4 &&
                                                              kv_opt(&o, sk, "plus") == 0 && o.budget == 2048);
    test_cond("a set value is read back", kv_opts_set(&o, "rank", "16", 0) == 0 && kv_opt(&o, sk, "rank") == 16);
    test_cond("setting a key twice keeps one entry", kv_opts_set(&o, "rank", "24", 0) == 0 && o.n_set == 1 &&
                                                          kv_opt(&o, sk, "rank") == 24);
    test_cond("a flag takes no value", kv_opts_set(&o, "plus", "", 0) == 0 && kv_opt(&o, sk, "plus") == 1);
    test_cond("a flag refuses other words", kv_opts_set(&o, "plus", "maybe", 0) == SKV_EINVAL &&
                                                 strstr(skv_last_error(), "flag"));
    test_cond("an integer option refuses 2.5", kv_opts_set(&o, "chunk", "2.5", 0) == SKV_EINVAL &&
                                                    strstr(skv_last_error(), "integer"));
    test_cond("an out-of-range value names the range", kv_opts_set(&o, "chunk", "5000", 0) == SKV_EINVAL &&
                                                           strstr(skv_last_error(), "[1, 4096]"));
    test_cond("an unknown key is refused", kv_opts_set(&o, "ranks", "1", 0) == SKV_EINVAL &&
                                               strstr(skv_last_error(), "'ranks'"));
    test_cond("key=value parses", kv_opts_set_pair(&o, "outliers=3") == 0 && kv_opt(&o, sk, "outliers") == 3);
    test_cond("a pair without = is refused", kv_opts_set_pair(&o, "outliers") == SKV_EINVAL);

    char buf[256];
    o.budget_pct = 10;
    kv_opts_describe(&o, sk, 500, buf, sizeof buf);
    test_cond("the description lists the budget in tokens and every option", !strcmp(buf, "budget=50 rank=24 chunk=8 outliers=3 local=4 plus=1 overlap=1 f32_state=0"));
    test_cond("and reads back by key", probe_pairs_get(buf, "outliers", -1) == 3 && probe_pairs_get(buf, "budget", -1) == 50 &&
                                           probe_pairs_get(buf, "rank", -1) == 24 && probe_pairs_get(buf, "ran", -1) == -1 &&
                                           probe_pairs_get(NULL, "rank", -1) == -1);
    kv_opts_describe(&o, sk, 0, buf, sizeof buf);
    test_cond("with no one prompt length (a sweep of lengths) the budget stays a percentage",
              !strncmp(buf, "budget=10% rank=24 ", 19));
    kv_opts_describe(&o, kv_policy_find("dense"), 500, buf, sizeof buf);
    test_cond("dense describes its one option, the cache's precision", !strcmp(buf, "f16=0"));

    /* The strict rule: a --kv-opt the chosen policy lacks is refused by kv_new. */
    kv_opts d;
    kv_opts_default(&d);
    kv_opts_set_pair(&d, "rank=8");
    kv_shape sh = {.n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 8, .max_ctx = 32};
    kv_cache *c = NULL;
    test_cond("a strict option of another policy is refused when the cache is made",
              kv_new(&d, &sh, &c) == SKV_EINVAL && strstr(skv_last_error(), "not an option of policy dense") && !c);
    kv_opts_default(&d);
    kv_opts_set(&d, "rank", "8", 0);
    test_cond("a policy flag of another policy is ignored", kv_new(&d, &sh, &c) == 0 && c && c->policy == &kv_policy_dense);
    test_cond("a policy without a stat reports NaN", c && isnan(kv_stat(c, "hit_rate")));
    kv_free(c);

    /* --f16-kv: half the resident bytes on the CPU; refused, naming the
     * backend, where the half-precision cache ops are missing */
    kv_opts_default(&d);
    kv_opts_set(&d, "f16", "1", 1);
    float kv[2 * 8] = {0.5f, -1, 2, 0.25f, 3, -0.125f, 1, 0}, q[2 * 8] = {1, 0, 0, 0, 0, 0, 0, 1}, out[2 * 8];
    size_t res16 = 0, res32 = 0, off = 0;
    c = NULL;
    int rc = kv_new(&d, &sh, &c);
    if (!rc) rc = c->cls->append(c, 0, 0, 1, kv, kv, kv);
    if (!rc) rc = c->cls->attend(c, 0, 0, 1, q, out);
    if (c) c->cls->bytes(c, &res16, &off);
    kv_free(c);
    kv_opts_default(&d);
    c = NULL;
    if (!kv_new(&d, &sh, &c)) {
        c->cls->append(c, 0, 0, 1, kv, kv, kv);
        c->cls->bytes(c, &res32, &off);
    }
    kv_free(c);
    test_cond("dense --f16-kv stores, attends one position (its value back) and holds half the bytes",
              rc == 0 && out[0] == 0.5f && out[3] == 0.25f && out[8 + 5] == -0.125f && res16 * 2 == res32 && res32 > 0);
    skv_backend nohalf = skv_backend_cpu;
    nohalf.name = "nohalf";
    nohalf.attend_decode_h = NULL;
    kv_shape sh2 = sh;
    sh2.be = &nohalf;
    kv_opts_set(&d, "f16", "1", 1);
    c = NULL;
    test_cond("dense --f16-kv on a backend without the half-precision ops: refused with one line naming it",
              kv_new(&d, &sh2, &c) == SKV_EUNSUPPORTED && strstr(skv_last_error(), "--f16-kv") &&
                  strstr(skv_last_error(), "nohalf") && !strchr(skv_last_error(), '\n') && !c);
    return test_report("test_policy");
}
