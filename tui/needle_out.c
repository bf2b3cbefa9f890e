/* needle_out.c: the case JSON and task choice shared by skv needle and skv eval. */
#include "needle_out.h"

#include "cli.h"
#include "skv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static cJSON *ints(const int *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; a && i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(v[i]));
    return a;
}

void needle_answer_note(const needle_case *c, int m, char *buf, size_t n) {
    if (n) buf[0] = 0;
    int d = c->distractor[m];
    if (d < 1 || d >= c->n_facts) return;
    if (c->keys[d][0]) snprintf(buf, n, "answered %s's value %s, a distractor", c->keys[d], c->values[d]);
    else snprintf(buf, n, "answered distractor %d's value %s", d, c->values[d]);
}

int needle_check_flags(const cli_gen *g, const char *cmd, const needle_opts *o) {
    const char *meth[NEEDLE_MAX_METHODS];
    for (int i = 0; i < o->n_methods; i++) meth[i] = o->methods[i];
    return cli_check_policy_flags(g, cmd, meth, o->n_methods);
}

cJSON *needle_case_json(const needle_opts *o, const needle_case *c) {
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    cJSON_AddNumberToObject(j, "index", c->index);
    cJSON_AddStringToObject(j, "task", c->task);
    cJSON_AddNumberToObject(j, "length", c->length);
    cJSON_AddNumberToObject(j, "depth", c->depth);
    cJSON_AddNumberToObject(j, "run", c->run);
    cJSON_AddStringToObject(j, "value", c->value);
    if (c->keys[0][0]) cJSON_AddStringToObject(j, "asked_key", c->keys[0]);
    cJSON_AddNumberToObject(j, "prompt_len", c->prompt_len);
    cJSON_AddNumberToObject(j, "budget_tokens", kv_budget_tokens(&o->kv, c->prompt_len)); /* the budget it ran at */
    cJSON *nd = cJSON_AddObjectToObject(j, "needle");
    if (nd) {
        cJSON_AddNumberToObject(nd, "tok_begin", c->tok_begin);
        cJSON_AddNumberToObject(nd, "tok_end", c->tok_end);
        cJSON_AddNumberToObject(nd, "inserted_depth", c->insert_depth);
    }
    cJSON *fa = cJSON_AddArrayToObject(j, "facts");
    for (int i = 0; fa && i < c->n_facts; i++) {
        cJSON *f = cJSON_CreateObject();
        if (!f) break;
        if (c->keys[i][0]) cJSON_AddStringToObject(f, "key", c->keys[i]);
        cJSON_AddStringToObject(f, "value", c->values[i]);
        cJSON_AddNumberToObject(f, "tok_begin", c->fact_begin[i]);
        cJSON_AddNumberToObject(f, "tok_end", c->fact_end[i]);
        cJSON_AddBoolToObject(f, "asked", i == 0);
        cJSON_AddItemToArray(fa, f);
    }
    for (int k = 0; k < o->n_methods; k++) {
        cJSON *mm = cJSON_AddObjectToObject(j, o->methods[k]);
        if (!mm) continue;
        cJSON_AddStringToObject(mm, "answer", c->answer[k] ? c->answer[k] : "");
        cJSON_AddBoolToObject(mm, "hit", c->hit[k]);
        int d = c->distractor[k];
        if (d >= 1 && d < c->n_facts) {
            cJSON *dj = cJSON_AddObjectToObject(mm, "distractor");
            if (dj) {
                cJSON_AddNumberToObject(dj, "fact", d);
                if (c->keys[d][0]) cJSON_AddStringToObject(dj, "key", c->keys[d]);
                cJSON_AddStringToObject(dj, "value", c->values[d]);
            }
        } else {
            cJSON_AddNullToObject(mm, "distractor");
        }
        cJSON_AddNumberToObject(mm, "t_prefill", c->t_prefill[k]);
        cJSON_AddNumberToObject(mm, "t_decode", c->t_decode[k]);
        cJSON_AddNumberToObject(mm, "decode_steps", c->decode_steps[k]);
        if (isfinite(c->recall[k])) cJSON_AddNumberToObject(mm, "mass_recall", c->recall[k]);
        else cJSON_AddNullToObject(mm, "mass_recall");
        if (isfinite(c->out_err[k])) cJSON_AddNumberToObject(mm, "output_error", c->out_err[k]);
        else cJSON_AddNullToObject(mm, "output_error");
        if (isfinite(c->fetch_bytes[k])) cJSON_AddNumberToObject(mm, "fetch_bytes", c->fetch_bytes[k]);
        else cJSON_AddNullToObject(mm, "fetch_bytes");
        cJSON_AddNumberToObject(mm, "resident_bytes", c->resident_bytes[k]);
        if (c->n_steps[k]) {
            cJSON_AddItemToObject(mm, "top1_agree", ints(c->top1_agree[k], c->n_steps[k]));
            cJSON *ld = cJSON_AddArrayToObject(mm, "logit_dist");
            for (int s = 0; ld && s < c->n_steps[k]; s++) cJSON_AddItemToArray(ld, cJSON_CreateNumber(c->logit_dist[k][s]));
        }
    }
    return j;
}

int needle_tasks_choose(const char *cmd, const char *names, const char *file, needle_task **out, int *n) {
    *out = NULL;
    *n = 0;
    needle_task *all = NULL;
    int n_all = 0;
    if (file && needle_task_load(file, &all, &n_all)) return cli_usage_error(cmd, "%s", skv_last_error());
    if (!names) {
        if (file) { *out = all; *n = n_all; return 0; }
        names = "single";
    }
    int cap = 1;
    for (const char *p = names; *p; p++) cap += *p == ',';
    needle_task *t = calloc((size_t)cap, sizeof *t);
    if (!t) { needle_tasks_free(all, n_all); return cli_usage_error(cmd, "out of memory"); }
    int cnt = 0, rc = 0;
    for (const char *p = names; !rc;) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char name[NEEDLE_TASK_NAME_MAX];
        if (!len || len >= sizeof name) {
            rc = cli_usage_error(cmd, "--task: '%s' is not a comma-separated list of task names", names);
            break;
        }
        memcpy(name, p, len);
        name[len] = 0;
        for (int i = 0; i < cnt && !rc; i++)
            if (!strcmp(t[i].name, name)) rc = cli_usage_error(cmd, "--task: %s is listed twice", name);
        if (rc) break;
        if (file) {
            int found = -1;
            for (int i = 0; i < n_all; i++)
                if (!strcmp(all[i].name, name)) found = i;
            if (found < 0) {
                rc = cli_usage_error(cmd, "--task: %s has no task '%s'", file, name);
                break;
            }
            t[cnt++] = all[found];
            memset(&all[found], 0, sizeof all[found]);
        } else if (needle_task_builtin(name, &t[cnt])) {
            rc = cli_usage_error(cmd, "%s", skv_last_error());
            break;
        } else {
            cnt++;
        }
        if (!e) break;
        p = e + 1;
    }
    needle_tasks_free(all, n_all);
    if (rc) { needle_tasks_free(t, cnt); return rc; }
    *out = t;
    *n = cnt;
    return 0;
}
