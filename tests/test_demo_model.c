/* test_demo_model.c: the trained demo model in samples/model/.
 *
 * samples/train/train.py trains it, exports an HF directory and turns that
 * into samples/model/skv-demo.gguf with `skv convert`; it also records the
 * last-position logits of its own PyTorch forward pass on a held-out prompt
 * (heldout-logits.json). Here skv loads the GGUF, tokenizes the same prompt
 * and must give the same ids and logits within rel. L2 1e-3: this ties the
 * trainer, the GGUF writer and the engine together. The model must also be
 * what the issue asks for (llama, GQA, >= 4 layers, >= 4096 positions) and
 * really retrieve a planted value with dense attention. */
#include "model.h"
#include "needle.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "tok.h"
#include "testhelp.h"

#include <cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MODEL_PATH "samples/model/skv-demo.gguf"
#define LOGITS_PATH "samples/model/heldout-logits.json"

static void check_logits(skv_model *m) {
    char *txt = NULL, *prompt = NULL;
    size_t n_txt, n_prompt;
    cJSON *j = NULL;
    test_cond("heldout-logits.json reads", skv_read_file(LOGITS_PATH, 1 << 24, &txt, &n_txt) == 0);
    if (!txt) return;
    j = cJSON_Parse(txt);
    test_cond("heldout-logits.json parses", j != NULL);
    const cJSON *jf = j ? cJSON_GetObjectItemCaseSensitive(j, "prompt_file") : NULL;
    const cJSON *ji = j ? cJSON_GetObjectItemCaseSensitive(j, "ids") : NULL;
    const cJSON *jl = j ? cJSON_GetObjectItemCaseSensitive(j, "logits") : NULL;
    test_cond("heldout-logits.json has prompt_file, ids and logits",
              cJSON_IsString(jf) && cJSON_IsArray(ji) && cJSON_IsArray(jl));
    if (!cJSON_IsString(jf) || !cJSON_IsArray(ji) || !cJSON_IsArray(jl)) goto done;
    test_cond("the held-out prompt reads", skv_read_file(jf->valuestring, 1 << 20, &prompt, &n_prompt) == 0);
    if (!prompt) goto done;

    int nref = cJSON_GetArraySize(ji), V = m->cfg.vocab;
    int32_t *ref_ids = malloc(sizeof(int32_t) * (size_t)nref), *ids = NULL;
    int n = 0, k = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, ji) ref_ids[k++] = it->valueint;
    int rc = tok_encode(m->tok, prompt, n_prompt, 1, 0, &ids, &n);
    int same = rc == 0 && n == nref;
    for (int i = 0; same && i < n; i++) same = ids[i] == ref_ids[i];
    char msg[256];
    snprintf(msg, sizeof msg, "skv's tokenizer gives train.py's %d ids for the held-out prompt", nref);
    test_cond(msg, same);

    session_opts o;
    session_opts_default(&o);
    o.ctx = nref + 1;
    skv_session *s = NULL;
    rc = session_new(m, &o, &s);
    if (!rc) rc = session_prefill(s, ref_ids, nref, NULL, NULL);
    test_cond("prefill of the held-out prompt runs", rc == 0);
    if (!rc) {
        float *ref = malloc(sizeof(float) * (size_t)V);
        int vi = 0;
        cJSON_ArrayForEach(it, jl) if (vi < V) ref[vi++] = (float)it->valuedouble;
        test_cond("heldout-logits.json has one logit per vocabulary entry", vi == V && cJSON_GetArraySize(jl) == V);
        double err = test_rel_l2(session_logits(s), ref, (size_t)V);
        snprintf(msg, sizeof msg, "logits equal train.py's forward pass: rel L2 %.2e <= 1e-3", err);
        test_cond(msg, err <= 1e-3);
        free(ref);
    }
    session_free(s);
    free(ids);
    free(ref_ids);
done:
    free(prompt);
    cJSON_Delete(j);
    free(txt);
}

/* Dense retrieval on the project's haystack at three depths of a 1K prompt. */
static void check_retrieval(skv_model *m) {
    char *hay = NULL;
    size_t n_hay;
    test_cond("samples/haystack.txt reads", skv_read_file("samples/haystack.txt", 1 << 24, &hay, &n_hay) == 0);
    if (!hay) return;
    needle_opts o;
    needle_opts_default(&o);
    int lengths[] = {1024};
    float depths[] = {10, 50, 90};
    o.haystack = hay;
    o.lengths = lengths;
    o.n_lengths = 1;
    o.depths = depths;
    o.n_depths = 3;
    o.runs = 1;
    o.seed = 11;
    kv_opts_set_num(&o.kv, "rank", 16);
    o.kv.budget = 32;
    needle_result res;
    int rc = needle_run(m, &o, NULL, NULL, &res);
    test_cond("needle sweep runs", rc == 0);
    if (!rc) {
        int hits = 0;
        for (int i = 0; i < res.n_cases; i++) hits += res.cases[i].hit[NEEDLE_DENSE];
        char msg[160];
        snprintf(msg, sizeof msg, "dense attention retrieves the value in %d of %d 1K-token prompts (need >= 2)", hits,
                 res.n_cases);
        test_cond(msg, hits >= 2);
        needle_result_free(&res);
    }
    free(hay);
}

int main(void) {
    skv_model *m = NULL;
    int rc = model_load(MODEL_PATH, &m);
    test_cond("samples/model/skv-demo.gguf loads", rc == 0);
    if (rc) {
        printf("  %s\n", skv_last_error());
        return test_report("test_demo_model");
    }
    const model_config *c = &m->cfg;
    test_cond("llama architecture", strcmp(c->arch, "llama") == 0);
    test_cond(">= 4 layers", c->n_layers >= 4);
    test_cond("GQA: >= 2 query heads per KV head", c->n_kv_heads > 0 && c->n_heads % c->n_kv_heads == 0 &&
                                                       c->n_heads / c->n_kv_heads >= 2);
    test_cond(">= 4096 trained positions", c->ctx_train >= 4096);
    test_cond("the tokenizer adds BOS", tok_add_bos(m->tok) && tok_bos(m->tok) >= 0);
    check_logits(m);
    check_retrieval(m);
    model_free(m);
    return test_report("test_demo_model");
}
