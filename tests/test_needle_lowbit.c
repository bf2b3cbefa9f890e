/* test_needle_lowbit: a needle a policy read at low precision is not a
 * needle it dropped.
 *  - SpeCache at 1 bit (demo model, 2k, --budget 66): each miss's "kept"
 *    line splits what was not attended exactly into a share read at low
 *    precision and a share dropped (0 here: SpeCache reads every token it
 *    does not fetch at low bits), the JSON gives needle_mass_share
 *    .low_precision, and the verdict names the 1-bit reads as "compressed"
 *    with the fix --bits 2, checked (before, a low-bit read counted as
 *    dropped and only the selection was blamed);
 *  - TailorKV's layers quantized whole select nothing: a miss there is the
 *    2-bit reads' (--bits 4), never a selection's or a budget's;
 *  - needle_causes_sort: the floor comes after a fix checked to retrieve
 *    when raising the budget to the floor was checked and still missed;
 *    otherwise it stays second to the model cause.
 * Runs on the committed demo model (no ../shared needed). */
#include "needle_diag.h"
#include "skv.h"
#include "testhelp.h"

#include <cJSON.h>

#define DEMO "samples/model/skv-demo.gguf"

static const cJSON *get(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

/* skv needle -m DEMO ARGS --explain --json DIR/NAME: the JSON parsed (NULL
 * when the run or the file failed). */
static cJSON *sweep(const char *dir, const char *name, const char *args) {
    char json[1200], out[8192];
    snprintf(json, sizeof json, "%s/%s", dir, name);
    int rc = test_popen(out, sizeof out, "%s needle -m " DEMO " %s --explain --json %s --force 2>&1", test_skv_bin(),
                        args, json);
    char *text = NULL;
    size_t n = 0;
    cJSON *d = rc == 0 && !skv_read_file(json, 1 << 24, &text, &n) ? cJSON_Parse(text) : NULL;
    free(text);
    return d;
}

static void test_specache_bits(const char *dir) {
    cJSON *d = sweep(dir, "lowbit.json", "--kv specache --lengths 2k --depths 0:100:25 --budget 66 --bits 1");
    int misses = 0, kept_ok = 1, share_ok = 1, cause_ok = 1, checked = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, get(d, "cases")) {
        const cJSON *s = get(c, "specache"), *dn = get(c, "dense");
        if (!s || cJSON_IsTrue(get(s, "hit")) || !cJSON_IsTrue(get(dn, "hit"))) continue;
        misses++;
        const cJSON *dg = get(s, "diagnosis"), *sh = get(dg, "needle_mass_share");
        const char *kept = cJSON_GetStringValue(get(dg, "kept"));
        kept_ok &= kept && strstr(kept, "at low precision") && strstr(kept, "dropped 0%") != NULL;
        double lp = cJSON_GetNumberValue(get(sh, "low_precision")), dr = cJSON_GetNumberValue(get(sh, "dropped"));
        share_ok &= lp > 0.5 && dr < 0.05;
        int found = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, get(dg, "verdict")) {
            const char *cause = cJSON_GetStringValue(get(v, "cause"));
            const cJSON *ch = get(v, "change");
            const char *opt = cJSON_GetStringValue(get(ch, "option"));
            if (cause && !strcmp(cause, "compressed") && opt && !strcmp(opt, "bits") &&
                cJSON_GetNumberValue(get(ch, "value")) == 2) {
                found = 1;
                const char *ev = cJSON_GetStringValue(get(v, "evidence"));
                found &= ev && strstr(ev, "read at low precision (1 bit, layers 0, 1, 2, 3)") != NULL;
                const char *chk = cJSON_GetStringValue(get(v, "check"));
                checked += chk && !strcmp(chk, "retrieved");
            }
        }
        cause_ok &= found;
    }
    cJSON_Delete(d);
    test_cond("skv needle --kv specache --bits 1: some misses to diagnose (dense retrieved them)", misses > 0);
    test_cond("each miss's kept line says what SpeCache read at low precision, and that it dropped 0%", misses && kept_ok);
    test_cond("needle_mass_share: low_precision > 50%, dropped < 5% (a low-bit read is not a drop)", misses && share_ok);
    test_cond("each verdict names the 1-bit reads (compressed, layers 0-3) with the fix --bits 2", misses && cause_ok);
    test_cond("and --bits 2 was checked to retrieve the needle in at least one of them", checked > 0);
}

/* TailorKV at --budget 200 on the demo model: its misses come from the
 * layers it quantizes (2 bits) and selects nothing in; no cause blames a
 * selection or a budget in those layers, and --bits 4 is the fix named. */
static void test_tailorkv(const char *dir) {
    cJSON *d = sweep(dir, "tailor.json", "--kv tailorkv --lengths 2k --depths 0:100:25 --budget 200");
    int misses = 0, ok = 1;
    const cJSON *c;
    cJSON_ArrayForEach(c, get(d, "cases")) {
        const cJSON *s = get(c, "tailorkv"), *dn = get(c, "dense");
        if (!s || cJSON_IsTrue(get(s, "hit")) || !cJSON_IsTrue(get(dn, "hit"))) continue;
        misses++;
        unsigned quant = 0; /* the layers the compressed cause names */
        int bits4 = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, get(get(s, "diagnosis"), "verdict")) {
            const char *cause = cJSON_GetStringValue(get(v, "cause")), *ev = cJSON_GetStringValue(get(v, "evidence"));
            const char *opt = cJSON_GetStringValue(get(get(v, "change"), "option"));
            if (!cause || strcmp(cause, "compressed") || !ev) continue;
            bits4 |= opt && !strcmp(opt, "bits") && cJSON_GetNumberValue(get(get(v, "change"), "value")) == 4;
            const char *p = strstr(ev, "layers ");
            if (!p) p = strstr(ev, "layer ");
            for (p = p ? strchr(p, ' ') : NULL; p && *p && *p != ')';) {
                char *e;
                long l = strtol(p + 1, &e, 10);
                if (e == p + 1) break;
                if (l >= 0 && l < 32) quant |= 1u << l;
                p = e + (*e == ',');
            }
        }
        ok &= bits4 && quant;
        cJSON_ArrayForEach(v, get(get(s, "diagnosis"), "verdict")) {
            const char *cause = cJSON_GetStringValue(get(v, "cause"));
            int l = (int)cJSON_GetNumberValue(get(v, "layer"));
            if (cause && (!strcmp(cause, "never selected") || !strcmp(cause, "budget")) && l >= 0 && l < 32 &&
                (quant >> l & 1))
                ok = 0;
        }
    }
    cJSON_Delete(d);
    test_cond("TailorKV at --budget 200: some misses to diagnose (dense retrieved them)", misses > 0);
    test_cond("each names its 2-bit layers (compressed, --bits 4), and no cause blames a selection or a budget in a "
              "layer it quantizes whole", misses && ok);
}

static void test_order(void) {
    static needle_report rep;
    memset(&rep, 0, sizeof rep);
    rep.n_causes = 3;
    rep.causes[0] = (needle_cause){.kind = NEEDLE_CAUSE_FLOOR, .score = 1, .check = NEEDLE_CHECK_MISSED};
    rep.causes[1] = (needle_cause){.kind = NEEDLE_CAUSE_BUDGET, .score = 0.9, .check = NEEDLE_CHECK_MISSED};
    rep.causes[2] = (needle_cause){.kind = NEEDLE_CAUSE_RANK, .score = 0.5, .check = NEEDLE_CHECK_RETRIEVED};
    needle_causes_sort(&rep);
    test_cond("needle_causes_sort: a fix checked to retrieve leads a floor checked to miss, which leads the other "
              "checked miss",
              rep.causes[0].kind == NEEDLE_CAUSE_RANK && rep.causes[1].kind == NEEDLE_CAUSE_FLOOR &&
                  rep.causes[2].kind == NEEDLE_CAUSE_BUDGET);
    rep.causes[0] = (needle_cause){.kind = NEEDLE_CAUSE_RANK, .score = 0.5, .check = NEEDLE_CHECK_RETRIEVED};
    rep.causes[1] = (needle_cause){.kind = NEEDLE_CAUSE_FLOOR, .score = 1, .check = NEEDLE_CHECK_NONE};
    rep.causes[2] = (needle_cause){.kind = NEEDLE_CAUSE_DENSE, .score = 1, .check = NEEDLE_CHECK_NONE};
    needle_causes_sort(&rep);
    test_cond("needle_causes_sort: the model cause first, and an unchecked floor before any other cause",
              rep.causes[0].kind == NEEDLE_CAUSE_DENSE && rep.causes[1].kind == NEEDLE_CAUSE_FLOOR &&
                  rep.causes[2].kind == NEEDLE_CAUSE_RANK);
}

int main(void) {
    const char *dir = test_tmpdir("needle_lowbit");
    test_order();
    FILE *f = fopen(DEMO, "rb");
    if (!f) test_skip("test_needle_lowbit: the sweep needs " DEMO " (run from the repository root)");
    else {
        fclose(f);
        test_specache_bits(dir);
        test_tailorkv(dir);
    }
    return test_report("test_needle_lowbit");
}
