/* test_reference: every reference in ../shared/reference (llama.cpp outputs
 * for the shared models) is reproduced: identical token ids, last-position
 * logits within the README's relative L2 tolerance, and greedy tokens. */
#include "model.h"
#include "session.h"
#include "skv.h"
#include "tok.h"
#include "testhelp.h"

#include <cJSON.h>
#include <dirent.h>

typedef struct { const char *model; double tol; int greedy; } tolerance;

/* From ../shared/reference/README.md. greedy = -1: all tokens. */
static const tolerance tols[] = {
    {"stories260k", 1e-4, -1}, {"mini-smollm-f32", 1e-4, -1}, {"mini-smollm-hf", 1e-4, -1},
    {"mini-smollm-f16", 3e-3, 8}, {"mini-smollm-bf16", 1.5e-2, 8}, {"mini-smollm-q8_0", 3e-2, 1},
    {"mini-smollm-q6_k", 3e-2, 1}, {"mini-smollm-q4_k_m", 3e-2, 1}, {"mini-smollm-q4_0", 3e-2, 1},
};

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n + 1);
    if (b && fread(b, 1, n, f) != (size_t)n) { free(b); b = NULL; }
    if (b) b[n] = 0;
    fclose(f);
    return b;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* With f16kv the dense cache keeps its rows in half precision (--f16-kv):
 * checked against the f32-cache references at the f16 model's tolerance. */
static void check_file(skv_model *m, const char *refpath, const char *label0, const tolerance *t, int f16kv) {
    char label[256];
    snprintf(label, sizeof label, "%.200s%s", label0, f16kv ? " (f16 KV cache)" : "");
    char *txt = slurp(refpath);
    cJSON *j = txt ? cJSON_Parse(txt) : NULL;
    free(txt);
    char msg[512];
    if (!j) { snprintf(msg, sizeof msg, "%s: reference JSON parses", label); test_cond(msg, 0); return; }
    const char *prompt = cJSON_GetObjectItem(j, "prompt")->valuestring;
    int add_bos = cJSON_IsTrue(cJSON_GetObjectItem(j, "add_bos"));
    cJSON *jt = cJSON_GetObjectItem(j, "tokens"), *jl = cJSON_GetObjectItem(j, "last_logits"),
          *jg = cJSON_GetObjectItem(j, "greedy");
    int nref = cJSON_GetArraySize(jt);
    int32_t *ids = NULL;
    int n = 0;
    int rc = tok_encode(m->tok, prompt, strlen(prompt), add_bos, 1, &ids, &n);
    int same = rc == 0 && n == nref, ti = 0;
    cJSON *tj;
    cJSON_ArrayForEach(tj, jt) if (same && ti < n) same = ids[ti++] == tj->valueint;
    snprintf(msg, sizeof msg, "%s: %d token ids equal llama.cpp's", label, nref);
    test_cond(msg, same);
    /* Run the reference's own ids so a tokenizer mismatch does not hide the forward check. */
    int32_t *rids = malloc(sizeof(int32_t) * nref), ri = 0;
    cJSON *jti;
    cJSON_ArrayForEach(jti, jt) rids[ri++] = jti->valueint;
    session_opts o;
    session_opts_default(&o);
    int ng = cJSON_GetArraySize(jg);
    o.ctx = nref + ng + 1 > m->cfg.ctx_train ? nref + ng + 1 : m->cfg.ctx_train;
    if (f16kv) kv_opts_set(&o.kv, "f16", "1", 1);
    skv_session *s = NULL;
    rc = session_new(m, &o, &s);
    if (!rc) rc = session_prefill(s, rids, nref, NULL, NULL);
    snprintf(msg, sizeof msg, "%s: prefill runs", label);
    test_cond(msg, rc == 0);
    if (rc) { printf("  %s\n", skv_last_error()); goto done; }
    int V = m->cfg.vocab;
    float *ref = malloc(sizeof(float) * V);
    int vi = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, jl) if (vi < V) ref[vi++] = (float)it->valuedouble;
    snprintf(msg, sizeof msg, "%s: reference has %d logits", label, V);
    test_cond(msg, vi == V && cJSON_GetArraySize(jl) == V);
    const float *l = session_logits(s);
    double err = test_rel_l2(l, ref, V), maxabs = 0;
    for (int i = 0; i < V; i++) maxabs = fmax(maxabs, fabs((double)l[i] - ref[i]));
    snprintf(msg, sizeof msg, "%s: last_logits rel L2 %.2e <= %.1e (max abs %.2e)", label, err, t->tol, maxabs);
    test_cond(msg, err <= t->tol && (t->tol > 1e-4 || maxabs <= 5e-3));
    free(ref);
    int want = t->greedy < 0 || t->greedy > ng ? ng : t->greedy, match = 0;
    for (int i = 0; i < ng; i++) {
        int tok = sampler_argmax(session_logits(s), V);
        if (tok != cJSON_GetArrayItem(jg, i)->valueint) break;
        match++;
        if (i + 1 < ng && session_decode(s, tok)) break;
    }
    snprintf(msg, sizeof msg, "%s: greedy %d of %d equal (need %d)", label, match, ng, want);
    test_cond(msg, match >= want);
done:
    session_free(s);
    free(rids);
    free(ids);
    cJSON_Delete(j);
}

int main(void) {
    const char *rd = test_shared("reference");
    char refdir[1024];
    snprintf(refdir, sizeof refdir, "%s", rd ? rd : "");
    if (!rd || !test_shared("models")) {
        test_skip("test_reference: ../shared/reference or ../shared/models missing");
        return test_report("test_reference");
    }
    DIR *d = opendir(refdir);
    char *files[256];
    int nf = 0;
    struct dirent *e;
    while (d && (e = readdir(d)) && nf < 256)
        if (strstr(e->d_name, ".json")) files[nf++] = strdup(e->d_name);
    if (d) closedir(d);
    qsort(files, nf, sizeof files[0], cmp_str);
    for (size_t ti = 0; ti < sizeof tols / sizeof tols[0]; ti++) {
        const tolerance *t = &tols[ti];
        char mp[512];
        snprintf(mp, sizeof mp, "models/%s%s", t->model, strcmp(t->model, "mini-smollm-hf") ? ".gguf" : "");
        const char *path = test_shared(mp);
        char msg[600];
        skv_model *m = NULL;
        int rc = path ? model_load(path, &m) : -1;
        snprintf(msg, sizeof msg, "%s loads", t->model);
        test_cond(msg, rc == 0);
        if (rc) { printf("  %s\n", skv_last_error()); continue; }
        size_t ml = strlen(t->model);
        for (int i = 0; i < nf; i++) {
            if (strncmp(files[i], t->model, ml) || files[i][ml] != '.') continue;
            char rp[2048];
            snprintf(rp, sizeof rp, "%s/%s", refdir, files[i]);
            check_file(m, rp, files[i], t, 0);
            /* the f16 cache on the fp32 models, at the f16 model's tolerance */
            if (t->tol <= 1e-4 && strcmp(t->model, "mini-smollm-hf")) check_file(m, rp, files[i], &tols[3], 1);
        }
        model_free(m);
    }
    for (int i = 0; i < nf; i++) free(files[i]);
    return test_report("test_reference");
}
