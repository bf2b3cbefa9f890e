/* test_cli: bad input to the skv binary gets one line on stderr and a
 * non-zero exit, never a crash: bad flags, missing and damaged models
 * (truncated, wrong architecture, missing tensor, wrong shape, unsupported
 * dtype), a prompt over the context. The damaged models are copies of
 * stories260k made with the project's GGUF writer. */
#include "gguf.h"
#include "gguf_write.h"
#include "skv.h"
#include "testhelp.h"

#include <sys/wait.h>

/* Runs skv with args; returns the exit status (-1 on a signal) and the
 * output (stdout+stderr) in out. */
static int run(const char *args, char *out, size_t cap) {
    return test_sh(out, cap, "%s %s", test_skv_bin(), args);
}

static int lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* Expects a non-zero exit, exactly one line of output, containing want. */
static void expect_error(const char *what, const char *args, const char *want) {
    char out[8192], msg[512];
    int rc = run(args, out, sizeof out);
    snprintf(msg, sizeof msg, "%s: exit %d, one line mentioning '%s'", what, rc, want);
    int ok = rc > 0 && lines(out) == 1 && strstr(out, want) != NULL;
    test_cond(msg, ok);
    if (!ok) printf("  got: %s", out);
}

typedef struct { const gguf_file *src; int drop; const char *reshape; enum ggml_type retype; const char *retype_name; } copy_opts;

static int fill_copy(void *user, int idx, uint64_t off, void *dst, size_t n) {
    const gguf_tensor *t = user ? (const gguf_tensor *)user + idx : NULL;
    if (!t) return -1;
    memcpy(dst, (const uint8_t *)t->data + off, n);
    return 0;
}

/* Writes a copy of src with one change: arch renamed, a tensor dropped, a
 * tensor reshaped (same bytes), or a tensor's type changed (same bytes). */
static int write_variant(const gguf_file *src, const char *path, const char *arch, const char *drop,
                         const char *reshape, const char *retype) {
    gguf_writer *w = gguf_writer_new();
    for (uint64_t i = 0; i < src->n_kv; i++) gguf_writer_set_kv(w, &src->kv[i]);
    if (arch) gguf_writer_set_str(w, "general.architecture", arch);
    gguf_tensor *kept = calloc(src->n_tensors, sizeof *kept);
    int nk = 0;
    for (uint64_t i = 0; i < src->n_tensors; i++) {
        const gguf_tensor *t = &src->tensors[i];
        if (drop && !strcmp(t->name, drop)) continue;
        uint64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
        int nd = t->n_dims;
        enum ggml_type ty = t->type;
        if (reshape && !strcmp(t->name, reshape)) { ne[0] = t->ne[1]; ne[1] = t->ne[0]; }
        if (retype && !strcmp(t->name, retype)) ty = GGML_I32;
        gguf_writer_add_tensor(w, t->name, ty, nd, ne);
        kept[nk++] = *t;
    }
    int rc = gguf_writer_write(w, path, fill_copy, kept);
    gguf_writer_free(w);
    free(kept);
    return rc;
}

int main(void) {
    char out[8192];
    int rc = run("--help", out, sizeof out);
    test_cond("skv --help exits 0 and lists run", rc == 0 && strstr(out, "run"));
    {
        /* every command skv --help lists has its own --help: usage on stdout, exit 0, nothing on stderr */
        static char list[8192], one[16384];
        int n = 0, ok = test_popen(list, sizeof list, "%s --help 2>/dev/null", test_skv_bin()) == 0;
        const char *at = strstr(list, "commands:\n");
        for (const char *ln = at ? strchr(at, '\n') + 1 : NULL; ok && ln && *ln == ' ';) {
            char cmd[32];
            if (sscanf(ln, " %31s", cmd) == 1) {
                /* test_popen: these redirections as written (test_sh would merge stderr back) */
                int rc = test_popen(one, sizeof one, "%s %s --help 2>&1 >/dev/null", test_skv_bin(), cmd);
                char want[64];
                snprintf(want, sizeof want, "usage: skv %s", cmd);
                int good = rc == 0 && !one[0];
                if (good) good = test_popen(one, sizeof one, "%s %s --help 2>/dev/null", test_skv_bin(), cmd) == 0 &&
                                 !strncmp(one, want, strlen(want));
                if (!good) printf("  skv %s --help: exit %d, '%.80s'\n", cmd, rc, one);
                ok &= good;
                n++;
            }
            ln = strchr(ln, '\n');
            if (ln) ln++;
        }
        test_cond("each of the commands skv --help lists (12 or more) has --help: usage on stdout, exit 0, stderr empty",
                  ok && n >= 12);
    }
    expect_error("no command", "", "usage");
    expect_error("unknown command", "frobnicate", "unknown command");
    expect_error("unknown flag", "run -m x.gguf -p hi --bogus", "unknown option '--bogus'");
    expect_error("bad -n", "run -m x.gguf -p hi -n abc", "-n expects an integer");
    expect_error("unknown backend", "run -m x.gguf -p hi --backend tpu", "unknown backend 'tpu'");
    {
        char out[8192];
        int rc = run("info --backends", out, sizeof out);
        test_cond("info --backends lists the cpu backend as available", rc == 0 && strstr(out, "cpu") &&
                  strstr(out, "available"));
    }
    {
        /* skv info on the demo model (4 layers of f32, hidden 128, 2 KV
         * heads of 32): layer 0's tensors with type, shape and size in a
         * unit that fits (a norm is 512 B, not "0.00 MiB"), then memory */
        char out[16384];
        int rc = run("info -m samples/model/skv-demo.gguf", out, sizeof out);
        test_cond("info lists layer 0's tensors with type, shape and a size in a unit that fits",
                  rc == 0 && strstr(out, "blk.0.wq") && strstr(out, "f32   [128, 128] 64.0 KiB") &&
                      strstr(out, "blk.0.attn_norm              f32   [128] 512 B") && !strstr(out, "0.00 MiB") && !strstr(out, "blk.1.") &&
                      strstr(out, "3 more layers; --all lists them"));
        test_cond("info gives the weights and the dense KV cache a token and at the context, f32 and f16",
                  rc == 0 && strstr(out, "weights 4.00 MiB") && strstr(out, "2.0 KiB per token in f32") &&
                      strstr(out, "8.00 MiB at 4096 tokens (4.00 MiB in f16"));
        rc = run("info samples/model/skv-demo.gguf --all", out, sizeof out);
        test_cond("info --all lists every layer's tensors", rc == 0 && strstr(out, "blk.3.w_down") &&
                                                                 !strstr(out, "more layers"));
    }
    expect_error("info without a model", "info", "no model");
    expect_error("bad --temp", "run -m x.gguf -p hi --temp -1", "--temp expects a number");
    expect_error("bad --kv", "run -m x.gguf -p hi --kv sparse", "unknown KV policy 'sparse'");
    expect_error("--kv-opt with an unknown key", "run -m x.gguf -p hi --kv-opt bogus=1", "unknown KV option 'bogus'");
    expect_error("--kv-opt with a bad value", "run -m x.gguf -p hi --kv-opt rank=abc", "'rank' expects an integer");
    expect_error("--kv-opt out of range", "run -m x.gguf -p hi --kv-opt chunk=0", "[1, 4096]");
    expect_error("--kv-opt without =", "run -m x.gguf -p hi --kv-opt rank", "key=value");
    expect_error("a policy flag with a bad value", "run -m x.gguf -p hi --rank -3", "--rank");
    expect_error("--kv-opt that the policy in force lacks",
                 "run -m samples/model/skv-demo.gguf -p hi -n 1 --kv dense --kv-opt rank=16",
                 "not an option of policy dense");
    expect_error("a depth step so small its count overflows an int",
                 "needle --lengths 128 --depths 0:90:.00000001", "at most 1000");
    expect_error("bench with a list of policies and no --parallel", "bench -m x.gguf --kv dense,quest",
                 "goes with --parallel");
    expect_error("a compare list with a repeat", "run -m x.gguf -p hi --kv quest,quest", "twice");
    {
        char out[16384];
        int rc = run("run -m samples/model/skv-demo.gguf -p 'The special magic number is 42. What is it?' -n 4 "
                     "--kv dense,quest,freekv --budget 16", out, sizeof out);
        test_cond("skv run --kv dense,quest,freekv runs them in lockstep and prints one line per policy",
                  rc == 0 && strstr(out, "3 policies in lockstep, each fed dense's tokens") && strstr(out, "quest ") &&
                      strstr(out, "freekv ") && strstr(out, "(teacher)"));
    }
    expect_error("a needle --kv-opt that no method of the sweep has",
                 "needle -m samples/model/skv-demo.gguf --lengths 1k --depths 50 --kv dense,quest --kv-opt sink=8",
                 "not an option of any method of the sweep");
    {
        char out[16384];
        int rc = run("run --kv help", out, sizeof out);
        test_cond("--kv help lists the six policies, each with its options",
                  rc == 0 && strstr(out, "quest:") && strstr(out, "freekv:") && strstr(out, "specache:") &&
                      strstr(out, "tailorkv:") && strstr(out, "tau=N") && strstr(out, "qlayers=N") &&
                      strstr(out, "group_max=0|1"));
    }
    {
        char out[16384];
        int rc = run("run --kv help", out, sizeof out);
        test_cond("--kv help lists dense and shadowkv with shadowkv's options and defaults",
                  rc == 0 && strstr(out, "dense:") && strstr(out, "shadowkv:") && strstr(out, "rank=N, --rank") &&
                      strstr(out, "default 160") && strstr(out, "plus=0|1, --shadowkv-plus") && strstr(out, "--budget"));
    }
    expect_error("flag without value", "run -m x.gguf -p", "-p needs a value");
    expect_error("bad --budget", "run -m x.gguf -p hi --budget 3x%", "--budget expects a number");
    expect_error("--budget 0%", "run -m x.gguf -p hi --budget 0%", "--budget expects a number in");
    expect_error("--budget over 100%", "run -m x.gguf -p hi --budget 101%", "--budget expects a number in");
    expect_error("no model (skv logits; skv run takes the demo model)", "logits -p hi", "no model");
    expect_error("missing model file", "run -m /nonexistent/model.gguf -p hi", "/nonexistent/model.gguf");

    const char *good = test_shared("models/stories260k.gguf");
    if (!good) {
        test_skip("test_cli: ../shared/models missing, damaged-model cases skipped");
        return test_report("test_cli");
    }
    const char *dir = test_tmpdir("cli");
    char path[1024], args[2048];

    /* Truncated copy. */
    snprintf(path, sizeof path, "%s/trunc.gguf", dir);
    FILE *in = fopen(good, "rb"), *o = fopen(path, "wb");
    char buf[65536];
    size_t n = fread(buf, 1, sizeof buf, in);
    fwrite(buf, 1, n / 2, o);
    fclose(in);
    fclose(o);
    snprintf(args, sizeof args, "run -m %s -p hi", path);
    expect_error("truncated GGUF", args, "trunc.gguf");
    snprintf(args, sizeof args, "info -m %s", path);
    expect_error("truncated GGUF (info)", args, "trunc.gguf");

    gguf_file *src;
    rc = gguf_open(good, &src);
    test_cond("stories260k opens", rc == 0);
    if (rc) return test_report("test_cli");
    static const struct { const char *name, *arch, *drop, *reshape, *retype, *want; } cases[] = {
        {"arch.gguf", "gptj", NULL, NULL, NULL, "architecture 'gptj' is not supported"},
        {"drop.gguf", NULL, "blk.2.ffn_up.weight", NULL, NULL, "'blk.2.ffn_up.weight' is missing"},
        {"shape.gguf", NULL, NULL, "blk.1.attn_k.weight", NULL, "layer 1 wk' has shape"},
        {"dtype.gguf", NULL, NULL, NULL, "blk.0.attn_norm.weight", "cannot compute with"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, cases[i].name);
        rc = write_variant(src, path, cases[i].arch, cases[i].drop, cases[i].reshape, cases[i].retype);
        char msg[256];
        snprintf(msg, sizeof msg, "wrote damaged copy %s", cases[i].name);
        test_cond(msg, rc == 0);
        snprintf(args, sizeof args, "run -m %s -p hi -n 2", path);
        expect_error(cases[i].name, args, cases[i].want);
        unlink(path);
    }
    gguf_close(src);

    snprintf(args, sizeof args, "run -m %s -p \"Once upon a time there was a girl who liked to play\" -c 8", good);
    expect_error("prompt over the context", args, "more than the context of 8");
    snprintf(args, sizeof args, "run -m %s -f /nonexistent/prompt.txt", good);
    expect_error("missing prompt file", args, "/nonexistent/prompt.txt");
    snprintf(args, sizeof args, "run -m %s -p hi -n 4", good);
    rc = run(args, out, sizeof out);
    test_cond("a good run exits 0", rc == 0);
    /* --offload-file never overwrites: an existing file is refused and kept */
    char keep[600];
    snprintf(keep, sizeof keep, "%s/mine.bin", dir);
    FILE *kf = fopen(keep, "w");
    if (kf) { fputs("user data", kf); fclose(kf); }
    snprintf(args, sizeof args, "run -m %s -p \"Once upon a time there was a girl\" -n 2 --kv shadowkv --rank 4 "
             "--budget 8 --outliers 0 --local 1 --offload-file %s", good, keep);
    expect_error("--offload-file on an existing file", args, "will not overwrite");
    char back[32] = "";
    kf = fopen(keep, "r");
    if (kf) { if (!fgets(back, sizeof back, kf)) back[0] = 0; fclose(kf); }
    test_cond("--offload-file: the existing file is left as it was", !strcmp(back, "user data"));
    unlink(keep);
    snprintf(args, sizeof args, "bench -m %s --trace %s/t.skvt", good, dir);
    expect_error("bench --trace (bench records none)", args, "records no trace");
    /* ShadowKV's bench prints its stage clocks on a second line: numbers
     * that add up to no more than the step */
    {
        char out[8192];
        snprintf(args, sizeof args, "bench -m %s -t 1 --prompt-tokens 200 -n 4 --kv shadowkv --rank 8 --budget 16 "
                 "--outliers 1 --local 1", good);
        int rc2 = run(args, out, sizeof out);
        double sel = -1, rb = -1, att = -1, rest = -1, hit = -1, ms = -1;
        const char *st = strstr(out, "stages: "), *dm = strstr(out, "decode_ms=");
        int got = st && dm && sscanf(st, "stages: select_ms=%lf rebuild_ms=%lf attend_ms=%lf rest_ms=%lf hit_pct=%lf",
                                     &sel, &rb, &att, &rest, &hit) == 5 && sscanf(dm, "decode_ms=%lf", &ms) == 1;
        test_cond("bench --kv shadowkv: a stages line (select, rebuild, attend, rest, hit %) that adds up to the step",
                  rc2 == 0 && lines(out) == 2 && got && sel > 0 && rb >= 0 && att > 0 && rest > 0 && hit >= 0 &&
                      hit <= 100 && fabs(sel + rb + att + rest - ms) < 0.01);
        if (!got) printf("  got: %s", out);
        snprintf(args, sizeof args, "bench -m %s -t 1 --prompt-tokens 200 -n 4", good);
        rc2 = run(args, out, sizeof out);
        test_cond("bench --kv dense: one line, no stages", rc2 == 0 && lines(out) == 1 && !strstr(out, "stages:"));
    }
    rmdir(dir);
    return test_report("test_cli");
}
