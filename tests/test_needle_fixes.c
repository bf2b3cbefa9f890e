/* test_needle_fixes.c: the newcomer findings of issue 46 on skv needle and
 * the comparisons, each shown by a check that fails on the code before the
 * fix:
 *  - --explain proposes a count its own sentence states (the outliers that
 *    make "the 7th lowest" chunk an outlier are 7, not 73), and no cause ends
 *    on an unchecked "dense would be needed": every proposal of a miss is
 *    rerun, and the change that retrieved replays through --case;
 *  - advice names only options the trace's policy has (no --page for
 *    ShadowKV's chunks);
 *  - Quest and FreeKV default to every layer sparse, and a layer a policy
 *    attends densely is never named or crowned in a comparison;
 *  - an interrupted sweep's figure and trace, and an interrupted skv run
 *    --trace, say they were cut short.
 * Runs the skv binary ($SKV_BIN) on the demo model. */
#include "testhelp.h"
#include "kv.h"
#include "needle.h"
#include "needle_diag.h"
#include "skv.h"
#include "store.h"

#include <math.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/wait.h>

#define DEMO "samples/model/skv-demo.gguf"

/* Waits for pid at most secs seconds, then kills it (SIGTERM, and SIGKILL
 * 5 s later: timeout -k 5's rule, so a hang is a FAIL, not a stuck CI);
 * its exit status, or -1 when it had to be killed. */
static int wait_or_kill(pid_t pid, double secs) {
    int st = 0;
    for (double t = 0; t < secs + 5; t += 0.1) {
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
        if (t >= secs && t < secs + 0.1) kill(-pid, SIGTERM);
        usleep(100000);
    }
    kill(-pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* Starts sh -c cmd (which execs skv) in its own process group, waits until
 * file log holds want (at most 150 s: a condition, not a time, so a loaded
 * machine does not fail it), sends one SIGINT (a Ctrl-C) and returns the
 * exit status (at most 120 s more, then it is killed). */
static int interrupt_when(const char *cmd, const char *log, const char *want) {
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
    for (int i = 0; i < 1500; i++) {
        char buf[1 << 15] = "";
        FILE *f = fopen(log, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof buf - 1, f);
            buf[n] = 0;
            fclose(f);
        }
        if (strstr(buf, want)) break;
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : -1; /* ended first */
        usleep(100000);
    }
    kill(-pid, SIGINT);
    return wait_or_kill(pid, 120);
}

/* The verdict lines ("    N. cause: ...") of a --explain output. */
static int verdict_lines(const char *out, char lines[][2400], int max) {
    int n = 0;
    for (const char *p = out; p && *p && n < max;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        if (len > 7 && !strncmp(p, "    ", 4) && p[4] >= '1' && p[4] <= '9' && p[5] == '.') {
            if (len >= 2400) len = 2399;
            memcpy(lines[n], p, len);
            lines[n++][len] = 0;
        }
        p = e ? e + 1 : NULL;
    }
    return n;
}

/* The first integer capture of pattern in s, -1 when it does not match. */
static int capture(const char *s, const char *pattern) {
    regex_t re;
    regmatch_t m[2];
    if (regcomp(&re, pattern, REG_EXTENDED)) return -1;
    int v = -1;
    if (!regexec(&re, s, 2, m, 0) && m[1].rm_so >= 0) v = atoi(s + m[1].rm_so);
    regfree(&re);
    return v;
}

/* ---- finding 1: the fix a sentence proposes agrees with it, and is checked ---- */

static void test_explain_case8(const char *dir) {
    static char out[1 << 16];
    char json[600];
    snprintf(json, sizeof json, "%s/c8.json", dir);
    /* the sweep (the demo model's preset: no -m); case 8 (1k, depth 80%) as the sweep runs it; Quest
     * with the paper's 2 dense layers */
    int rc = test_sh(out, sizeof out, "timeout -k 5 300 %s needle --kv shadowkv,quest --budget 64 --lengths 1k,2k,4000 "
                "--depths 0:100:10 --case 8 --explain --kv-opt dense_layers=2 --json %s --force", test_skv_bin(), json);
    test_cond("needle --case 8 --explain runs (shadowkv misses case 8 at --budget 64)",
              rc == 0 && strstr(out, "shadowkv missed"));
    static char lines[8][2400];
    int n = verdict_lines(out, lines, 8);
    int agree = n > 0, checked_last = n > 0, outl = -1, retrieved = 0;
    for (int i = 0; i < n; i++) {
        const char *l = lines[i];
        /* a count agrees with the rank its sentence states */
        if (strstr(l, "never selected")) {
            int ord = capture(l, "the ([0-9]+)(st|nd|rd|th) lowest of");
            const char *fix = strstr(l, "was misranked: ");
            int prop = -1;
            regex_t re;
            regmatch_t m[3];
            if (fix && !regcomp(&re, "outliers (to |would need --outliers |would take --outliers )?([0-9]+)", REG_EXTENDED)) {
                prop = regexec(&re, fix, 3, m, 0) ? -1 : atoi(fix + m[2].rm_so);
                regfree(&re);
            }
            char needs[64];
            snprintf(needs, sizeof needs, "needs %d)", ord);
            if (ord < 1 || prop < 0 || (prop != ord && !strstr(l, needs))) agree = 0;
            if (strstr(l, "raise --outliers to")) outl = prop;
        }
        /* every cause's last word is a check (a miss that dense retrieved is rerun) */
        size_t len = strlen(l);
        if (len < 2 || strcmp(l + len - 2, "\")") || !strstr(l, "(checked: answered")) checked_last = 0;
        const char *dn = strstr(l, "dense would be needed");
        if (dn && !strstr(dn, "(checked")) checked_last = 0;
        const char *last = NULL;
        for (const char *p = strstr(l, "(checked: answered"); p; p = strstr(p + 1, "(checked: answered")) last = p;
        if (last && last >= l + 10 && !strncmp(last - 10, "retrieved ", 10)) retrieved = 1;
    }
    test_cond("--explain case 8: the outliers proposed equal the chunk's place its sentence states (7th lowest: 7)",
              agree && outl == 7);
    test_cond("--explain case 8: every cause ends on a rerun's answer (no unchecked 'dense would be needed' last)",
              checked_last);
    test_cond("--explain case 8: a proposed change retrieved (checked)", retrieved);
    /* the checked change replays from scratch */
    if (outl > 0) {
        rc = test_sh(out, sizeof out, "timeout -k 5 300 %s needle --kv shadowkv --budget 64 --lengths 1k,2k,4000 "
                "--depths 0:100:10 --case 8 --outliers %d", test_skv_bin(), outl);
        test_cond("--case 8 --budget 64 --outliers 7 retrieves from scratch, as the check said",
                  rc == 0 && strstr(out, "shadowkv hit"));
    } else {
        test_cond("--case 8 --budget 64 --outliers 7 retrieves from scratch, as the check said", 0);
    }
    /* finding 3: the split between quest and shadowkv is not named in a layer quest attends densely */
    rc = test_sh(out, sizeof out, "timeout -k 5 300 %s needle --kv shadowkv,quest --budget 64 --lengths 1k,2k,4000 "
            "--depths 0:100:10 --case 8 --explain --no-check --kv-opt dense_layers=2", test_skv_bin());
    const char *sp = strstr(out, "found the needle");
    int layer = sp ? capture(sp, "diverged on the needle at step [0-9]+, layer ([0-9]+)") : -2;
    test_cond("quest (layers 0-1 dense) and shadowkv: the split is named in a layer both select (>= 2), and the "
              "dense layers are said to be left out",
              sp && layer >= 2 && strstr(sp, "which quest attended densely"));
}

/* ---- finding 4: advice names only options the policy has ---- */

static int add(probe_store *st, probe_event ev) { return probe_store_add(st, &ev); }

/* Oracle events only (a trace of any policy, e.g. the PyTorch recorder's):
 * a 16-token needle ranked 3 by exact attention, inside the 48 tokens each
 * query head attended, yet left out: "never selected", in blocks of unit. */
static probe_store *planted_generic(const char *policy, const char *opts, int unit) {
    probe_store *st;
    if (probe_store_new(&st)) return NULL;
    int bad = add(st, (probe_event){ .kind = PROBE_RUN, .run = { .model = "planted", .n_layers = 2, .n_heads = 4,
                                                                 .n_kv_heads = 2, .head_dim = 16, .max_ctx = 1024,
                                                                 .prompt_len = 640, .kv_policy = policy, .budget = 64,
                                                                 .kv_opts = opts, .oracle = 1 } });
    int qk[2] = { 48, 48 };
    float qr[2] = { 0.5f, 0.6f }, qo[2] = { 0.4f, 0.5f }, qe[2] = { 0.2f, 0.3f };
    for (int s = 0; s < 2; s++)
        for (int l = 0; l < 2; l++)
            for (int h = 0; h < 2; h++)
                bad |= add(st, (probe_event){ .kind = PROBE_ORACLE, .oracle = {
                    .step = s, .layer = l, .head = h, .n_q = 2, .unit = unit, .ctx = 641 + s, .n_kept = 48, .n_gen = 1,
                    .recall = 0.55f, .overlap = 0.45f, .out_err = 0.25f, .mass_kept = 0.5f, .needle_len = 16,
                    .needle_kept = 0, .needle_rank = 3, .needle_mass = 0.1f, .q_kept = qk, .q_recall = qr,
                    .q_overlap = qo, .q_out_err = qe } });
    int agree[2] = { 1, 0 };
    float dist[2] = { 0.01f, 0.4f };
    for (int m = 0; m < 2; m++)
        bad |= add(st, (probe_event){ .kind = PROBE_NIAH, .niah = {
            .index = 0, .length = 640, .depth = 50, .method = m, .hit = !m, .prompt_len = 640, .tok_begin = 300,
            .tok_end = 316, .detail = 1, .n_steps = m ? 2 : 0, .policy = m ? policy : "dense", .value = "4821735",
            .answer = m ? " 4821" : " 4821735.", .top1_agree = m ? agree : NULL, .logit_dist = m ? dist : NULL } });
    if (bad) { probe_store_free(st); return NULL; }
    return st;
}

/* 1 when every cause of rep proposes an option the policy's table (engine/kv) has. */
static int options_exist(const needle_report *rep) {
    const kv_class *p = kv_policy_find(rep->policy);
    for (int i = 0; p && i < rep->n_causes; i++) {
        const needle_cause *c = &rep->causes[i];
        if (!c->opt[0] || !strcmp(c->opt, "budget")) continue;
        int has = 0;
        for (int j = 0; j < p->n_opts; j++) has |= !strcmp(p->opts[j].key, c->opt);
        if (!has) return 0;
        char flag[40];
        snprintf(flag, sizeof flag, "--%s", c->opt);
        if (!strstr(c->fix, flag)) return 0;
    }
    return p != NULL;
}

static void test_options(void) {
    static needle_report rep;
    /* the PyTorch ShadowKV's recorded options (probes/python/examples/shadowkv_torch.py) */
    probe_store *st = planted_generic("shadowkv", "budget=64 rank=8 chunk=8 outliers=4 local=4 plus=0 overlap=1", 8);
    int rc = st ? needle_diagnose(st, 0, &rep) : -1;
    needle_fit_options(&rep);
    int page = 0;
    for (int i = 0; i < rep.n_causes; i++) page |= strstr(rep.causes[i].fix, "--page") != NULL;
    test_cond("a ShadowKV trace's 'never selected' proposes --chunk (an option of shadowkv), never --page",
              rc == 0 && rep.n_causes >= 1 && rep.causes[0].kind == NEEDLE_CAUSE_OUTLIER && !page &&
                  !strcmp(rep.causes[0].opt, "chunk") && options_exist(&rep));
    probe_store_free(st);
    st = planted_generic("quest", "budget=64 page=16 dense_layers=0 group_max=0", 16);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    needle_fit_options(&rep);
    test_cond("a Quest trace's 'never selected' still proposes --page (Quest has it)",
              rc == 0 && rep.n_causes >= 1 && !strcmp(rep.causes[0].opt, "page") && options_exist(&rep));
    probe_store_free(st);
    /* a producer that named its policy shadowkv but recorded a page: skv's shadowkv has no --page */
    st = planted_generic("shadowkv", "budget=64 page=16", 16);
    rc = st ? needle_diagnose(st, 0, &rep) : -1;
    needle_fit_options(&rep);
    page = 0;
    for (int i = 0; i < rep.n_causes; i++) page |= strstr(rep.causes[i].fix, "--page") != NULL;
    test_cond("a change the policy's option table lacks is not proposed (shadowkv with a recorded page)",
              rc == 0 && rep.n_causes >= 1 && !page && options_exist(&rep) && strstr(rep.causes[0].fix, "no change is proposed"));
    probe_store_free(st);
}

/* ---- a distractor's answer: which fact did the policy keep? ---- */

/* One layer, one KV head, two steps: the asked fact (the watched needle,
 * 16 tokens) with needle_kept[s] of them kept and exact mass tmass[s], and
 * distractor 1 with the "distractors" metric's share kept and mass (no
 * metric when dshare is NULL). */
static probe_store *planted_facts(const int *needle_kept, const float *tmass, const float *dshare, const float *dmass) {
    probe_store *st;
    if (probe_store_new(&st)) return NULL;
    int bad = add(st, (probe_event){ .kind = PROBE_RUN, .run = { .model = "planted", .n_layers = 1, .n_heads = 2,
                                                                 .n_kv_heads = 1, .head_dim = 16, .max_ctx = 1024,
                                                                 .prompt_len = 640, .kv_policy = "shadowkv", .budget = 64,
                                                                 .oracle = 1 } });
    int qk[2] = { 48, 48 };
    float q[2] = { 0.5f, 0.5f };
    for (int s = 0; s < 2; s++) {
        bad |= add(st, (probe_event){ .kind = PROBE_ORACLE, .oracle = {
            .step = s, .layer = 0, .head = 0, .n_q = 2, .unit = 8, .ctx = 641 + s, .n_kept = 48, .n_gen = 1,
            .recall = 0.5f, .overlap = 0.5f, .out_err = 0.2f, .mass_kept = 0.5f, .needle_len = 16,
            .needle_kept = needle_kept[s], .needle_rank = 3, .needle_mass = tmass[s], .q_kept = qk, .q_recall = q,
            .q_overlap = q, .q_out_err = q } });
        float v[2] = { dshare ? dshare[s] : 0, dmass[s] };
        if (dshare)
            bad |= add(st, (probe_event){ .kind = PROBE_METRIC, .metric = {
                .step = s, .layer = 0, .head = 0, .name = "distractors", .value = 1, .n = 2, .vals = v } });
    }
    if (bad) { probe_store_free(st); return NULL; }
    return st;
}

static void test_distractor(void) {
    needle_distractor d;
    const int none[2] = { 0, 0 }, all[2] = { 16, 16 }, half[2] = { 16, 0 };
    const float tm[2] = { 0.3f, 0.1f }, one[2] = { 1, 1 }, zero[2] = { 0, 0 }, dm[2] = { 0.2f, 0.2f };
    probe_store *st = planted_facts(none, tm, one, dm);
    int rc = st ? needle_distractor_check(st, 1, -1, "Anna", "Ben", &d) : -1;
    test_cond("a policy that kept the distractor whole and none of the asked fact is said to have kept the "
              "distractor and dropped the asked fact, naming both keys",
              rc == 0 && d.target_kept == 0 && fabs(d.distractor_kept - 1) < 1e-6 && d.steps == 2 &&
                  strstr(d.text, "kept the distractor and dropped the asked fact") && strstr(d.text, "Anna") &&
                  strstr(d.text, "Ben"));
    test_cond("the exact masses are the means per (step, layer, KV head)",
              rc == 0 && fabs(d.target_mass - 0.2) < 1e-6 && fabs(d.distractor_mass - 0.2) < 1e-6);
    probe_store_free(st);
    st = planted_facts(half, tm, one, dm);
    rc = st ? needle_distractor_check(st, 1, -1, "Anna", "Ben", &d) : -1;
    test_cond("the asked fact's share kept is weighted by its exact mass at each step (0.3 kept, 0.1 dropped: 75%), "
              "and keeping both makes the mix-up the model's",
              rc == 0 && fabs(d.target_kept - 0.75) < 1e-6 && strstr(d.text, "kept both facts"));
    rc = st ? needle_distractor_check(st, 1, 0, "Anna", "Ben", &d) : -1;
    test_cond("last_step 0 reads step 0 alone", rc == 0 && d.steps == 1 && fabs(d.target_kept - 1) < 1e-6);
    probe_store_free(st);
    st = planted_facts(all, tm, zero, dm);
    rc = st ? needle_distractor_check(st, 1, -1, NULL, NULL, &d) : -1;
    test_cond("kept the asked fact and dropped the distractor, yet answered it: said so, with generic names",
              rc == 0 && strstr(d.text, "kept the asked fact and dropped the distractor") &&
                  strstr(d.text, "the distractor's"));
    rc = st ? needle_distractor_check(st, 2, -1, "Anna", "Ben", &d) : -1;
    test_cond("a fact the metric does not hold (2 of 1) is no record, not a guess",
              rc == SKV_EMISSING && strstr(d.text, "no record"));
    probe_store_free(st);
    st = planted_facts(none, tm, NULL, dm);
    rc = st ? needle_distractor_check(st, 1, -1, "Anna", "Ben", &d) : -1;
    test_cond("without the distractors metric (a run without --oracle): SKV_EMISSING and why",
              rc == SKV_EMISSING && strstr(d.text, "--oracle"));
    probe_store_free(st);
}

/* ---- finding 3: one default, dense layers marked ---- */

static void test_dense_layers(const char *dir) {
    kv_opts o;
    kv_opts_default(&o);
    test_cond("Quest and FreeKV default to every layer sparse (dense_layers 0, as skv eval runs them)",
              kv_opt_int(&o, &kv_policy_quest, "dense_layers") == 0 && kv_opt_int(&o, &kv_policy_freekv, "dense_layers") == 0);
    static char out[1 << 16];
    char trace[600], svg[600];
    snprintf(trace, sizeof trace, "%s/cmp.skvt", dir);
    snprintf(svg, sizeof svg, "%s/cmp.svg", dir);
    int rc = test_sh(out, sizeof out, "timeout -k 5 120 %s run -m %s -f samples/prompts/needle.txt -n 3 --kv shadowkv,quest "
                "--kv-opt dense_layers=4 --budget 64 --oracle --trace %s --force >/dev/null 2>&1 && timeout -k 5 60 %s export "
                "--trace %s --view compare -o %s --force", test_skv_bin(), DEMO, trace, test_skv_bin(), trace, svg);
    FILE *f = fopen(svg, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    int quest = 0;
    for (const char *p = strstr(out, ">quest<"); p; p = strstr(p + 1, ">quest<")) quest++;
    /* the policy table, the dense column (4 layers) and the plot's legend: never a "most mass" or "least error" cell */
    test_cond("Compare view: Quest attending every layer densely is listed as dense, never crowned in a layer",
              rc == 0 && strstr(out, "Per layer (dense: attended whole") && quest >= 5 && quest <= 6);
}

/* ---- finding 6: an interrupted sweep or run says so in its figure and trace ---- */

static void test_interrupted(const char *dir) {
    char cmd[4096], log[600], trace[600], png[600], svg[600], rtrace[600], rlog[600], rout[600];
    static char out[1 << 16];
    snprintf(log, sizeof log, "%s/int.log", dir);
    snprintf(trace, sizeof trace, "%s/int.skvt", dir);
    snprintf(png, sizeof png, "%s/int.png", dir);
    snprintf(svg, sizeof svg, "%s/int.svg", dir);
    snprintf(cmd, sizeof cmd, "exec %s needle --lengths 1k --depths 0:30:10 --runs 2 --png %s --trace %s --force "
             ">/dev/null 2>%s", test_skv_bin(), png, trace, log);
    int rc = interrupt_when(cmd, log, "case 1 (");
    test_cond("needle sweep stopped by Ctrl-C after a case: exit 130", rc == 130);
    struct stat sb;
    test_cond("the interrupted sweep wrote its PNG", stat(png, &sb) == 0 && sb.st_size > 0);
    rc = test_sh(out, sizeof out, "timeout -k 5 60 %s trace info %s", test_skv_bin(), trace);
    test_cond("skv trace info of the interrupted needle trace says it was interrupted after N of 8 cases",
              rc == 0 && capture(out, "interrupted after ([0-9]+) of 8 cases") >= 1 && strstr(out, "checksum ok"));
    /* the PNG is the niah view of the same events (emit_all): its export from the trace shows the same title */
    rc = test_sh(out, sizeof out, "timeout -k 5 60 %s export --trace %s --view niah -o %s --force", test_skv_bin(), trace, svg);
    FILE *f = fopen(svg, "r");
    size_t n = f ? fread(out, 1, sizeof out - 1, f) : 0;
    out[n] = 0;
    if (f) fclose(f);
    test_cond("the interrupted sweep's figure says it was cut short (\"cut short: N of 8 cases\")",
              rc == 0 && capture(out, "cut short: ([0-9]+) of 8 cases") >= 1);

    snprintf(rtrace, sizeof rtrace, "%s/run.skvt", dir);
    snprintf(rlog, sizeof rlog, "%s/run.log", dir);
    snprintf(rout, sizeof rout, "%s/run.out", dir);
    snprintf(cmd, sizeof cmd, "exec %s run -m %s -f samples/prompts/needle.txt -n 400 --trace %s --force >%s 2>%s",
             test_skv_bin(), DEMO, rtrace, rout, rlog);
    rc = interrupt_when(cmd, rout, " ");
    test_cond("skv run --trace stopped by Ctrl-C: exit 130", rc == 130);
    rc = test_sh(out, sizeof out, "timeout -k 5 60 %s trace info %s", test_skv_bin(), rtrace);
    test_cond("skv trace info of the interrupted run says \"interrupted at step N of 400\"",
              rc == 0 && capture(out, "interrupted at step ([0-9]+) of 400") >= 0);
    char done[600];
    snprintf(done, sizeof done, "%s/done.skvt", dir);
    rc = test_sh(out, sizeof out, "timeout -k 5 120 %s run -m %s -f samples/prompts/needle.txt -n 2 --trace %s --force "
            ">/dev/null 2>&1 && timeout -k 5 60 %s trace info %s", test_skv_bin(), DEMO, done, test_skv_bin(), done);
    test_cond("a run that finished is not marked interrupted", rc == 0 && !strstr(out, "interrupted"));
}

int main(void) {
    struct stat sb;
    if (stat(DEMO, &sb) != 0) {
        test_skip("test_needle_fixes: the demo model " DEMO " is missing (run from the repository root)");
        return test_report("test_needle_fixes");
    }
    const char *dir = test_tmpdir("needle-fixes");
    test_options();
    test_distractor();
    test_dense_layers(dir);
    test_interrupted(dir);
    test_explain_case8(dir);
    return test_report("test_needle_fixes");
}
