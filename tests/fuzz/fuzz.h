/* fuzz.h: what the libFuzzer harnesses share.
 *
 * Each harness fuzz_NAME.c defines fuzz_NAME_init() (once per process) and
 * fuzz_NAME(data, size) (one input), and, unless FUZZ_NO_MAIN is defined,
 * libFuzzer's LLVMFuzzerInitialize and LLVMFuzzerTestOneInput around them.
 * tests/test_fuzz_regress.c includes every harness with FUZZ_NO_MAIN and
 * replays tests/fuzz/regress/NAME/ under the normal sanitizer build, so the
 * inputs that once crashed stay fixed without clang's fuzzer.
 *
 * The loaders take paths, so an input is written to a file in a scratch
 * directory of the process (under $TMPDIR, on /dev/shm when it exists). */
#ifndef SKV_FUZZ_H
#define SKV_FUZZ_H

#include "skv.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The process's scratch directory (created once). */
static inline const char *fuzz_dir(void) {
    static char dir[256];
    if (!dir[0]) {
        struct stat sb;
        const char *base = stat("/dev/shm", &sb) == 0 && S_ISDIR(sb.st_mode) ? "/dev/shm" : getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/skv-fuzz-%d", base && *base ? base : "/tmp", (int)getpid());
        mkdir(dir, 0700);
    }
    return dir;
}

/* Writes n bytes to dir/name (created or replaced); returns its path in buf. */
static inline const char *fuzz_put(const char *name, const void *data, size_t n, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s", fuzz_dir(), name);
    FILE *f = fopen(buf, "wb");
    if (!f) return NULL;
    if (n && fwrite(data, 1, n, f) != n) {
        fclose(f);
        return NULL;
    }
    fclose(f);
    return buf;
}

/* A little-endian u32 from the input, advancing it; 0 past the end. */
static inline uint32_t fuzz_u32(const uint8_t **d, size_t *n) {
    uint32_t v = 0;
    for (int i = 0; i < 4 && *n; i++, (*d)++, (*n)--) v |= (uint32_t)**d << (8 * i);
    return v;
}

/* The input as a NUL-terminated string (caller frees). */
static inline char *fuzz_str(const uint8_t *d, size_t n) {
    char *s = malloc(n + 1);
    if (!s) return NULL;
    if (n) memcpy(s, d, n);
    s[n] = 0;
    return s;
}

/* Once per process: one OpenMP and BLAS thread (fuzzing runs one input at a time). */
static inline void fuzz_setup(void) {
    static int done;
    if (!done) {
        done = 1;
        setenv("SKV_THREADS", "1", 0);
        skv_set_threads(1);
    }
}

#ifdef FUZZ_NO_MAIN
#define FUZZ_MAIN(name)
#else
#define FUZZ_MAIN(name)                                                                 \
    int LLVMFuzzerInitialize(int *argc, char ***argv);                                  \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);                       \
    int LLVMFuzzerInitialize(int *argc, char ***argv) {                                 \
        (void)argc;                                                                     \
        (void)argv;                                                                     \
        fuzz_setup();                                                                   \
        fuzz_##name##_init();                                                           \
        return 0;                                                                       \
    }                                                                                   \
    int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return fuzz_##name(data, size); }
#endif

#endif
