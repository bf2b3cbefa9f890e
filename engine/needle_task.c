/* needle_task.c: the built-in needle tasks and the --task-file reader. */
#include "needle_task.h"

#include "needle_diag.h"
#include "skv.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

const char *const needle_task_names[] = { "single", "passkey", "multikey", "multikey-alt", NULL };

/* The keys of samples/train/train.py (KEY_WORDS), in its order. */
static const char *const train_keys[] = {
    "apple", "river", "lantern", "copper", "falcon", "harbor", "meadow", "violet", "granite", "willow", "ember",
    "cedar", "orchid", "thunder", "pebble", "maple", "saffron", "anchor", "lilac", "comet", "basalt", "heron",
    "juniper", "quartz", "tundra", "walnut", "canyon", "prairie", "sparrow", "tulip", "velvet", "zephyr", "marble",
    "garnet", "raven", "bramble", "clover", "dune", "glacier",
};

/* The four kinds of make_task in train.py: fact template, question block,
 * facts per case. */
static const struct {
    const char *name, *fact, *question;
    int lo, hi;
} builtin[] = {
    { "single", "The special magic number is {value}.",
      "What is the special magic number? The special magic number is", 1, 1 },
    { "passkey", "The pass key is {value}. Remember it. {value} is the pass key.",
      "What is the pass key? The pass key is", 1, 1 },
    { "multikey", "The special magic number for {key} is {value}.",
      "What is the special magic number for {key}? The special magic number for {key} is", 2, 4 },
    { "multikey-alt", "One of the magic numbers for {key} is: {value}.",
      "What is the magic number for {key}? One of the magic numbers for {key} is:", 2, 4 },
};

static char *dup_s(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

void needle_task_free(needle_task *t) {
    if (!t) return;
    free(t->haystack);
    free(t->haystack_path);
    free(t->fact);
    free(t->question);
    free(t->answer);
    for (int i = 0; i < t->n_keys; i++) free(t->keys[i]);
    free(t->keys);
    memset(t, 0, sizeof *t);
}

void needle_tasks_free(needle_task *t, int n) {
    for (int i = 0; t && i < n; i++) needle_task_free(&t[i]);
    free(t);
}

int needle_task_keyed(const needle_task *t) { return t->fact && strstr(t->fact, "{key}") != NULL; }

char *needle_fill(const char *tmpl, const char *key, const char *value) {
    size_t n = 1;
    for (const char *p = tmpl; *p;) {
        if (!strncmp(p, "{key}", 5) && key) { n += strlen(key); p += 5; }
        else if (!strncmp(p, "{value}", 7) && value) { n += strlen(value); p += 7; }
        else { n++; p++; }
    }
    char *s = malloc(n), *o = s;
    if (!s) return NULL;
    for (const char *p = tmpl; *p;) {
        if (!strncmp(p, "{key}", 5) && key) { o = stpcpy(o, key); p += 5; }
        else if (!strncmp(p, "{value}", 7) && value) { o = stpcpy(o, value); p += 7; }
        else *o++ = *p++;
    }
    *o = 0;
    return s;
}

static int set_keys(needle_task *t, const char *const *keys, int n) {
    if (!(t->keys = calloc((size_t)n, sizeof *t->keys))) return skv_error(SKV_ENOMEM, "out of memory");
    for (int i = 0; i < n; i++) {
        if (!(t->keys[i] = dup_s(keys[i]))) return skv_error(SKV_ENOMEM, "out of memory");
        t->n_keys = i + 1;
    }
    return 0;
}

int needle_task_builtin(const char *name, needle_task *t) {
    memset(t, 0, sizeof *t);
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++) {
        if (strcmp(builtin[i].name, name)) continue;
        snprintf(t->name, sizeof t->name, "%s", name);
        t->facts_min = builtin[i].lo;
        t->facts_max = builtin[i].hi;
        int rc = 0;
        if (!(t->fact = dup_s(builtin[i].fact)) || !(t->question = dup_s(builtin[i].question)) ||
            !(t->answer = dup_s("{value}")))
            rc = skv_error(SKV_ENOMEM, "out of memory");
        if (!rc && strstr(builtin[i].fact, "{key}"))
            rc = set_keys(t, train_keys, (int)(sizeof train_keys / sizeof train_keys[0]));
        if (rc) needle_task_free(t);
        return rc;
    }
    return skv_error(SKV_EINVAL, "--task: no task '%s' (single, passkey, multikey, multikey-alt; or --task-file FILE)",
                     name);
}

int needle_task_custom(const char *needle, const char *question, const char *answer_prefix, needle_task *t) {
    memset(t, 0, sizeof *t);
    const char *at = strstr(needle, "{value}");
    if (!at) return skv_error(SKV_EINVAL, "the needle '%s' has no {value} to fill in", needle);
    snprintf(t->name, sizeof t->name, "custom");
    t->facts_min = t->facts_max = 1;
    char *pre = NULL;
    if (!answer_prefix) { /* the needle's text before {value}, trailing spaces cut */
        size_t n = (size_t)(at - needle);
        while (n && (needle[n - 1] == ' ' || needle[n - 1] == '\t')) n--;
        if (!(pre = malloc(n + 1))) return skv_error(SKV_ENOMEM, "out of memory");
        memcpy(pre, needle, n);
        pre[n] = 0;
        answer_prefix = pre;
    }
    size_t qn = strlen(question), pn = strlen(answer_prefix);
    t->question = malloc(qn + pn + 2);
    t->fact = dup_s(needle);
    t->answer = dup_s("{value}");
    if (t->question) {
        memcpy(t->question, question, qn);
        if (pn) { t->question[qn] = ' '; memcpy(t->question + qn + 1, answer_prefix, pn + 1); }
        else t->question[qn] = 0;
    }
    free(pre);
    if (!t->question || !t->fact || !t->answer) {
        needle_task_free(t);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    /* The default needle and question are the built-in task 'single': say so. */
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++)
        if (builtin[i].lo == 1 && builtin[i].hi == 1 && !strcmp(builtin[i].fact, t->fact) &&
            !strcmp(builtin[i].question, t->question))
            snprintf(t->name, sizeof t->name, "%s", builtin[i].name);
    return 0;
}

/* ---- --task-file ---------------------------------------------------------- */

static const char *const file_fields[] = { "name", "haystack", "fact", "keys", "facts", "question", "answer", NULL };

/* One JSON object into t; errors name path:line and the field. */
static int task_from_json(const cJSON *o, const char *path, int line, const char *dir, needle_task *t) {
    memset(t, 0, sizeof *t);
    if (!cJSON_IsObject(o)) {
        needle_task_free(t);
        return skv_error(SKV_EINVAL, "%s:%d: a task is a JSON object, one per line", path, line);
    }
    for (const cJSON *f = o->child; f; f = f->next) {
        int known = 0;
        for (int i = 0; file_fields[i]; i++) known |= !strcmp(f->string, file_fields[i]);
        if (!known) {
            needle_task_free(t);
            return skv_error(SKV_EINVAL, "%s:%d: field '%s': unknown (fields: name, haystack, fact, keys, facts, "
                             "question, answer)", path, line, f->string);
        }
    }
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) >= NEEDLE_TASK_NAME_MAX)
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'name': a non-empty string of at most %d bytes is required",
                                             path, line, NEEDLE_TASK_NAME_MAX - 1);
    for (const char *p = name->valuestring; *p; p++)
        if (*p == ',' || *p == '"' || (unsigned char)*p < 32)
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'name': '%s' has a comma, quote or control character",
                                                 path, line, name->valuestring);
    snprintf(t->name, sizeof t->name, "%s", name->valuestring);
    const cJSON *fact = cJSON_GetObjectItemCaseSensitive(o, "fact");
    if (!cJSON_IsString(fact) || !fact->valuestring[0])
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'fact': a string is required (the sentence to plant, with {value} and {key})",
                                             path, line);
    const cJSON *q = cJSON_GetObjectItemCaseSensitive(o, "question");
    if (!cJSON_IsString(q) || !q->valuestring[0])
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'question': a string is required (asked after the haystack; {key} is the asked key)",
                                             path, line);
    const cJSON *ans = cJSON_GetObjectItemCaseSensitive(o, "answer");
    if (ans && (!cJSON_IsString(ans) || !ans->valuestring[0]))
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'answer': a non-empty string is expected", path, line);
    const char *answer = ans ? ans->valuestring : "{value}";
    /* the expected answer, a value filled in, is held in a case's value field */
    if (strlen(answer) >= NEEDLE_VALUE_MAX || strstr(answer, "{key}")) /* {value} and a value are both 7 bytes */
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'answer': at most %d bytes once {value} is filled "
                                             "in, and no {key}", path, line, NEEDLE_VALUE_MAX - 1);
    if (strstr(answer, "{value}") && !strstr(fact->valuestring, "{value}"))
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'fact': has no {value}, so 'answer' must be the literal "
                                             "expected answer", path, line);
    if (!(t->fact = dup_s(fact->valuestring)) || !(t->question = dup_s(q->valuestring)) || !(t->answer = dup_s(answer)))
        return needle_task_free(t), skv_error(SKV_ENOMEM, "out of memory");
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(o, "keys");
    int keyed = strstr(t->fact, "{key}") != NULL;
    if (keys) {
        if (!cJSON_IsArray(keys) || cJSON_GetArraySize(keys) < 1)
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'keys': a non-empty array of strings is expected", path, line);
        int n = cJSON_GetArraySize(keys), i = 0;
        if (!(t->keys = calloc((size_t)n, sizeof *t->keys))) return needle_task_free(t), skv_error(SKV_ENOMEM, "out of memory");
        for (const cJSON *k = keys->child; k; k = k->next, i++) {
            if (!cJSON_IsString(k) || !k->valuestring[0] || strstr(k->valuestring, "{") ||
                strlen(k->valuestring) >= NEEDLE_KEY_MAX)
                return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'keys': item %d is not a string of 1 to %d "
                                                     "bytes without braces", path, line, i, NEEDLE_KEY_MAX - 1);
            for (int j = 0; j < i; j++)
                if (!strcmp(t->keys[j], k->valuestring))
                    return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'keys': '%s' is listed twice", path, line,
                                                         k->valuestring);
            if (!(t->keys[i] = dup_s(k->valuestring))) return needle_task_free(t), skv_error(SKV_ENOMEM, "out of memory");
            t->n_keys = i + 1;
        }
        if (!keyed)
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'fact': keys are given but the fact has no {key}", path, line);
    } else if (keyed || strstr(t->question, "{key}")) {
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'keys': required, since the fact or question uses {key}",
                                             path, line);
    }
    const cJSON *nf = cJSON_GetObjectItemCaseSensitive(o, "facts");
    t->facts_min = t->facts_max = 1;
    if (nf) {
        double lo, hi;
        if (cJSON_IsNumber(nf)) lo = hi = nf->valuedouble;
        else if (cJSON_IsArray(nf) && cJSON_GetArraySize(nf) == 2 && cJSON_IsNumber(nf->child) &&
                 cJSON_IsNumber(nf->child->next)) {
            lo = nf->child->valuedouble;
            hi = nf->child->next->valuedouble;
        } else {
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'facts': a count or [min, max] is expected", path, line);
        }
        if (!(lo >= 1 && hi >= lo && hi <= NEEDLE_MAX_FACTS) || lo != (int)lo || hi != (int)hi)
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'facts': counts are whole numbers 1..%d, min <= max",
                                                 path, line, NEEDLE_MAX_FACTS);
        t->facts_min = (int)lo;
        t->facts_max = (int)hi;
    }
    if (t->facts_max > 1 && !keyed)
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'facts': several facts need a {key} in the fact to tell them apart",
                                             path, line);
    if (keyed && t->n_keys < t->facts_max)
        return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'keys': %d keys for up to %d facts", path, line, t->n_keys,
                                             t->facts_max);
    const cJSON *hay = cJSON_GetObjectItemCaseSensitive(o, "haystack");
    if (hay) {
        if (!cJSON_IsString(hay) || !hay->valuestring[0])
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'haystack': a file name is expected", path, line);
        const char *hp = hay->valuestring;
        size_t dn = hp[0] == '/' ? 0 : strlen(dir);
        if (!(t->haystack_path = malloc(dn + strlen(hp) + 2))) return needle_task_free(t), skv_error(SKV_ENOMEM, "out of memory");
        if (dn) sprintf(t->haystack_path, "%s/%s", dir, hp);
        else strcpy(t->haystack_path, hp);
        size_t len;
        int rc = skv_read_file(t->haystack_path, (size_t)64 << 20, &t->haystack, &len);
        if (rc) {
            char msg[300];
            snprintf(msg, sizeof msg, "%s", skv_last_error());
            return needle_task_free(t), skv_error(SKV_EINVAL, "%s:%d: field 'haystack': %s", path, line, msg);
        }
    }
    return 0;
}

int needle_task_load(const char *path, needle_task **out, int *n) {
    *out = NULL;
    *n = 0;
    char *text = NULL;
    size_t len = 0;
    int rc = skv_read_file(path, (size_t)16 << 20, &text, &len);
    if (rc) return rc;
    if (strlen(text) != len) {
        free(text);
        return skv_error(SKV_EINVAL, "%s: not a text file (a NUL byte)", path);
    }
    char *dir = malloc(strlen(path) + 2);
    if (!dir) { free(text); return skv_error(SKV_ENOMEM, "out of memory"); }
    strcpy(dir, path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else strcpy(dir, ".");
    needle_task *t = NULL;
    int cnt = 0, cap = 0, line = 0;
    for (char *p = text; *p && !rc;) {
        char *e = strchr(p, '\n');
        if (e) *e = 0;
        line++;
        char *s = p;
        while (*s == ' ' || *s == '\t' || *s == '\r') s++;
        if (*s) {
            cJSON *o = cJSON_ParseWithOpts(s, NULL, 1);
            if (!o) {
                rc = skv_error(SKV_EINVAL, "%s:%d: not a JSON object (near '%.24s')", path, line,
                               cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : s);
                break;
            }
            if (cnt == cap) {
                needle_task *nt = realloc(t, sizeof *t * (size_t)(cap = cap ? cap * 2 : 8));
                if (!nt) { cJSON_Delete(o); rc = skv_error(SKV_ENOMEM, "out of memory"); break; }
                t = nt;
            }
            rc = task_from_json(o, path, line, dir, &t[cnt]);
            cJSON_Delete(o);
            if (!rc) {
                for (int i = 0; i < cnt; i++)
                    if (!strcmp(t[i].name, t[cnt].name)) {
                        rc = skv_error(SKV_EINVAL, "%s:%d: field 'name': task '%s' is already defined", path, line, t[cnt].name);
                        needle_task_free(&t[cnt]);
                        break;
                    }
                if (!rc) cnt++;
            }
        }
        p = e ? e + 1 : p + strlen(p);
    }
    free(text);
    free(dir);
    if (!rc && cnt == 0) rc = skv_error(SKV_EINVAL, "%s: no tasks (one JSON object per line)", path);
    if (rc) { needle_tasks_free(t, cnt); return rc; }
    *out = t;
    *n = cnt;
    return 0;
}
