/* skv.c: error codes, the thread-local last-error message, checked allocation,
 * the clock and the thread count shared by the engine. */
#include "skv.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sched.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static _Thread_local char last_error[1024];

const char *skv_strerror(int code) {
    switch (code) {
    case SKV_OK: return "ok";
    case SKV_EIO: return "I/O error";
    case SKV_EFORMAT: return "bad file format";
    case SKV_EUNSUPPORTED: return "unsupported";
    case SKV_ENOMEM: return "out of memory";
    case SKV_EINVAL: return "invalid argument";
    case SKV_ERANGE: return "out of range";
    case SKV_EMISSING: return "missing";
    default: return "unknown error";
    }
}

int skv_error(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return code;
}

const char *skv_last_error(void) { return last_error[0] ? last_error : "no error recorded"; }
void skv_clear_error(void) { last_error[0] = 0; }

void skv_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "skv: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}

void *skv_malloc(size_t n) { return malloc(n ? n : 1); }

void *skv_malloc_huge(size_t n) {
    const size_t huge = (size_t)2 << 20;
    if (n < huge) return skv_malloc(n);
    size_t rounded = (n + huge - 1) & ~(huge - 1);
    if (rounded < n) return NULL;
    void *p = aligned_alloc(huge, rounded);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, rounded, MADV_HUGEPAGE); /* a hint: without it, 4 KiB pages */
#endif
    return p;
}

void *skv_calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    return calloc(count ? count : 1, size ? size : 1);
}

void *skv_aligned_alloc(size_t n) {
    size_t rounded = (n + 63) & ~(size_t)63;
    if (rounded < n) return NULL;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (p) memset(p, 0, rounded ? rounded : 64);
    return p;
}

int skv_temp_beside(const char *path, const char *suffix, char **tmp) {
    size_t n = strlen(path) + strlen(suffix) + 8;
    if (!(*tmp = malloc(n))) return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    snprintf(*tmp, n, "%s%sXXXXXX", path, suffix);
    int fd = mkstemp(*tmp);
    if (fd < 0) {
        int e = errno;
        free(*tmp);
        *tmp = NULL;
        return skv_error(SKV_EIO, "%s: cannot create a temporary file beside it: %s", path, strerror(e));
    }
    fchmod(fd, 0644); /* mkstemp makes it 0600; every output is 0644, whoever writes it */
    return fd;
}

static int exists_error(const char *path) {
    return skv_error(SKV_EIO, "%s: file exists; not overwriting it (force to replace)", path);
}

int skv_place(const char *tmp, const char *path, int force) {
    struct stat st;
    int rc = 0, renamed = 0;
    if (force) {
        if (rename(tmp, path) == 0) renamed = 1;
        else rc = skv_error(SKV_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
    } else if (link(tmp, path) != 0) {
        if (errno == EEXIST || lstat(path, &st) == 0) rc = exists_error(path);
        else if (rename(tmp, path) == 0) renamed = 1;
        else rc = skv_error(SKV_EIO, "%s: cannot rename into place: %s", path, strerror(errno));
    }
    if (!renamed) unlink(tmp); /* the spare name after a link, or the file after a failure */
    return rc;
}

int skv_save_atomic(const char *path, int force, int (*write)(FILE *f, void *ctx, const char *path), void *ctx) {
    struct stat st;
    if (!force && lstat(path, &st) == 0) return exists_error(path);
    char *tmp;
    int fd = skv_temp_beside(path, ".tmp-", &tmp);
    if (fd < 0) return fd;
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        close(fd);
        unlink(tmp);
        free(tmp);
        return skv_error(SKV_EIO, "%s: cannot open a temporary file beside it", path);
    }
    int rc = write(f, ctx, path);
    if (rc == SKV_OK && (fflush(f) != 0 || fsync(fileno(f)) != 0))
        rc = skv_error(SKV_EIO, "%s: cannot write: %s", path, strerror(errno));
    if (fclose(f) != 0 && rc == SKV_OK) rc = skv_error(SKV_EIO, "%s: cannot write: %s", path, strerror(errno));
    if (rc == SKV_OK) rc = skv_place(tmp, path, force);
    else unlink(tmp);
    free(tmp);
    return rc;
}

double skv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const char *skv_num(char *buf, size_t n, double v, int digits) {
    if (isfinite(v) && v == floor(v) && fabs(v) < 9007199254740992.0) snprintf(buf, n, "%.0f", v == 0 ? 0.0 : v);
    else snprintf(buf, n, "%.*g", digits, v);
    return buf;
}

static int n_threads;

/* Physical cores among the CPUs this process may run on, as llama.cpp picks
 * its default: one thread per core, not per hardware thread (SMT siblings
 * share a core's execution units, and a second thread there mostly waits).
 * Counted from the sibling lists under /sys; the number of usable CPUs when
 * those are missing. */
int skv_default_threads(void) {
    cpu_set_t set;
    int n_cpus = omp_get_num_procs();
    if (sched_getaffinity(0, sizeof set, &set) != 0) return n_cpus > 0 ? n_cpus : 1;
    char seen[CPU_SETSIZE];
    memset(seen, 0, sizeof seen);
    int cores = 0, cpus = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        cpus++;
        if (seen[c]) continue;
        char path[128], buf[256];
        snprintf(path, sizeof path, "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        FILE *f = fopen(path, "r");
        if (!f) return cpus > 0 ? CPU_COUNT(&set) : 1;
        int ok = fgets(buf, sizeof buf, f) != NULL;
        fclose(f);
        if (!ok) return CPU_COUNT(&set);
        cores++;
        /* mark every sibling of c ("0,64" or "0-1") as seen */
        for (char *p = buf; *p;) {
            char *end;
            long a = strtol(p, &end, 10), b = a;
            if (end == p) break;
            if (*end == '-') b = strtol(end + 1, &end, 10);
            for (long x = a; x <= b && x < CPU_SETSIZE; x++) if (x >= 0) seen[x] = 1;
            p = *end == ',' ? end + 1 : end;
            if (*p == '\n') break;
        }
    }
    return cores > 0 ? cores : 1;
}

int skv_threads(void) {
    if (!n_threads) {
        const char *e = getenv("SKV_THREADS");
        n_threads = e && atoi(e) > 0 ? atoi(e) : skv_default_threads();
        if (n_threads < 1) n_threads = 1;
        omp_set_num_threads(n_threads);
        /* All parallelism is OpenMP's: OpenBLAS runs single-threaded inside
         * our parallel loops, so its own thread pool never competes with ours. */
        openblas_set_num_threads(1);
    }
    return n_threads;
}

void skv_set_threads(int n) {
    n_threads = n > 0 ? n : 1;
    omp_set_num_threads(n_threads);
    openblas_set_num_threads(1);
}

/* Reads a whole small file into a NUL-terminated buffer the caller frees. */
int skv_read_file(const char *path, size_t max, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return skv_error(errno == ENOENT ? SKV_EMISSING : SKV_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(f);
        return skv_error(SKV_EIO, "%s: not a readable regular file", path);
    }
    if ((uint64_t)st.st_size > max) {
        fclose(f);
        return skv_error(SKV_EFORMAT, "%s: %lld bytes, more than the %zu expected", path, (long long)st.st_size, max);
    }
    size_t n = (size_t)st.st_size;
    char *buf = skv_malloc(n + 1);
    if (!buf) {
        fclose(f);
        return skv_error(SKV_ENOMEM, "%s: out of memory", path);
    }
    size_t got = fread(buf, 1, n, f);
    fclose(f);
    if (got != n) {
        free(buf);
        return skv_error(SKV_EIO, "%s: short read (%zu of %zu bytes)", path, got, n);
    }
    buf[n] = 0;
    *out = buf;
    *len = n;
    return 0;
}

int skv_make_dir(const char *path) {
    char tmp[4096];
    if (!path || !*path || strlen(path) >= sizeof tmp) return skv_error(SKV_EIO, "%s: not a usable folder name", path ? path : "");
    strcpy(tmp, path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) && errno != EEXIST) return skv_error(SKV_EIO, "%s: cannot make it: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) && errno != EEXIST) return skv_error(SKV_EIO, "%s: cannot make it: %s", tmp, strerror(errno));
    struct stat sb;
    if (stat(tmp, &sb) || !S_ISDIR(sb.st_mode)) return skv_error(SKV_EIO, "%s: not a folder", tmp);
    return 0;
}

int skv_put_text(FILE *f, void *ctx, const char *path) {
    if (fputs(ctx, f) < 0 || fputc('\n', f) == EOF) return skv_error(SKV_EIO, "%s: cannot write it", path);
    return 0;
}

double skv_mem_available(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    double kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    if (f) fclose(f);
    return kb * 1024;
}
