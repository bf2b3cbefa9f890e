/* testhelp.h: a test harness in one header.
 *
 * test_cond("what is checked", cond) prints PASS or FAIL with file:line;
 * test_skip("why") prints one SKIP line; test_report() prints the binary's
 * tally and returns the exit status. tests/run.sh adds up every binary's
 * PASS/FAIL lines into the final "N passed, N failed". */
#ifndef SKV_TESTHELP_H
#define SKV_TESTHELP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <stdarg.h>
#include <sys/wait.h>

static int test_passed_, test_failed_, test_skipped_;

#define test_cond(descr, cond) do { \
    if (cond) { test_passed_++; printf("PASS %s\n", (descr)); } \
    else { test_failed_++; printf("FAIL %s (%s:%d)\n", (descr), __FILE__, __LINE__); } \
    fflush(stdout); \
} while (0)

#define test_skip(why) do { test_skipped_++; printf("SKIP %s\n", (why)); fflush(stdout); } while (0)

static inline int test_report(const char *name) {
    printf("%s: %d passed, %d failed, %d skipped\n", name, test_passed_, test_failed_, test_skipped_);
    return test_failed_ ? 1 : 0;
}

/* Path of a file under ../shared (or $SKV_SHARED), or NULL when it is absent. */
static inline const char *test_shared(const char *rel) {
    static char buf[8][1024];
    static int slot;
    const char *root = getenv("SKV_SHARED");
    if (!root || !*root) root = "../shared";
    char *p = buf[slot++ & 7];
    snprintf(p, sizeof buf[0], "%s/%s", root, rel);
    struct stat st;
    return stat(p, &st) == 0 ? p : NULL;
}

/* Relative L2 error ||a-b|| / ||b||. */
static inline double test_rel_l2(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The next of a xorshift64 sequence (*s, a nonzero seed, advances): uniform
 * in [-1, 1), from the top 53 bits. Each test keeps its own state and seed. */
static inline float test_frand(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return (float)((*s >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

/* A scratch directory unique to this test binary (created; caller may leave it). */
static inline const char *test_tmpdir(const char *name) {
    static char dir[512];
    const char *t = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/skv-test-%s-%d", t && *t ? t : "/tmp", name, (int)getpid());
    mkdir(dir, 0700);
    return dir;
}

/* The skv binary the tests drive (SKV_BIN, as make test sets it). */
static inline const char *test_skv_bin(void) {
    const char *b = getenv("SKV_BIN");
    return b && *b ? b : "./build/skv";
}

/* Runs sh -c cmd (cmd from fmt; with merge, stderr joins stdout): its stdout
 * into out (at most cap - 1 bytes; the rest read and dropped, so the command
 * never writes into a closed pipe); its exit status, -1 on a signal or when
 * it cannot start. test_popen runs the command as written (its own
 * redirections, if any), test_sh with stderr merged into out. */
static inline int test_cmd(char *out, size_t cap, int merge, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static inline int test_cmd(char *out, size_t cap, int merge, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    if (merge) strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    out[0] = 0;
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    char sink[4096];
    while (fread(sink, 1, sizeof sink, p) > 0) {}
    int st = pclose(p);
    return st != -1 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}
#define test_popen(out, cap, ...) test_cmd(out, cap, 0, __VA_ARGS__)
#define test_sh(out, cap, ...) test_cmd(out, cap, 1, __VA_ARGS__)

#endif
