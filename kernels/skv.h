/* skv.h: status codes and the last-error message shared by every engine module.
 *
 * Recoverable errors return a negative SKV_E* code and leave a one-line
 * message (naming the file, the field and what was expected) in a
 * thread-local buffer that skv_last_error() returns. Broken invariants use
 * SKV_ASSERT, which prints file:line and aborts. */
#ifndef SKV_H
#define SKV_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

enum {
    SKV_OK = 0,
    SKV_EIO = -1,          /* cannot open, read, map or write a file */
    SKV_EFORMAT = -2,      /* a file is truncated, corrupt or not what it claims */
    SKV_EUNSUPPORTED = -3, /* a valid file uses something skv does not handle */
    SKV_ENOMEM = -4,       /* allocation failed */
    SKV_EINVAL = -5,       /* bad argument or option */
    SKV_ERANGE = -6,       /* a size or position out of range (prompt over the context) */
    SKV_EMISSING = -7,     /* a required tensor, key or file is absent */
};

const char *skv_strerror(int code);

/* Records the message for the calling thread and returns code, so that
 * `return skv_error(SKV_EFORMAT, "%s: ...", path)` reads as one statement. */
int skv_error(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *skv_last_error(void);
void skv_clear_error(void);

void skv_assert_fail(const char *expr, const char *file, int line) __attribute__((noreturn));
#define SKV_ASSERT(e) ((e) ? (void)0 : skv_assert_fail(#e, __FILE__, __LINE__))

/* Checked allocation helpers: NULL on overflow or failure. */
void *skv_malloc(size_t n);
void *skv_calloc(size_t count, size_t size);
void *skv_aligned_alloc(size_t n);   /* 64-byte aligned, zeroed; free with free() */
/* n bytes (not zeroed) for data read in scattered pieces (ShadowKV's
 * landmarks, factors and RoPE tables): from 2 MiB up, 2 MiB aligned
 * and marked for transparent huge pages, so reading a piece at a random
 * place does not also walk the page tables; below that, malloc. Free with
 * free(). */
void *skv_malloc_huge(size_t n);

/* Reads a whole regular file of at most max bytes into a NUL-terminated
 * buffer the caller frees. SKV_EMISSING when it does not exist. */
int skv_read_file(const char *path, size_t max, char **out, size_t *len);

/* ---- files: never overwrite or lose a user's file ---------------------- */

/* Creates a temporary file beside path, named path + suffix + 6 random
 * characters; *tmp gets the malloc'd name. Returns the open descriptor, or a
 * negative SKV_E* code with a message naming path. */
int skv_temp_beside(const char *path, const char *suffix, char **tmp);

/* Moves the finished temporary file tmp to path. With force it replaces
 * what is there (rename); without, link() refuses to replace, which closes
 * the race between an existence check and now (rename where links are
 * unsupported). tmp is gone afterwards either way. 0 or SKV_EIO. */
int skv_place(const char *tmp, const char *path, int force);

/* Writes path atomically: refuses an existing path without force, runs
 * write(f, ctx, path) into a temporary file beside it (mode 0644), flushes
 * and fsyncs it, then skv_place. On any error nothing is left behind and an
 * existing file is untouched. */
int skv_save_atomic(const char *path, int force, int (*write)(FILE *f, void *ctx, const char *path), void *ctx);

/* Makes folder path and any missing parents (mkdir -p); 0, or SKV_EIO
 * with a message when it cannot, or when path exists and is not a folder. */
int skv_make_dir(const char *path);

/* A writer for skv_save_atomic: the NUL-terminated text ctx, then a newline. */
int skv_put_text(FILE *f, void *ctx, const char *path);

/* Monotonic clock in seconds. */
double skv_now(void);

/* The memory the machine has available for new work (/proc/meminfo's
 * MemAvailable), bytes; 0 when unknown. */
double skv_mem_available(void);

/* v as text in buf (n bytes): a whole number below 2^53 in full ("1957888",
 * never "1.95789e+06"), anything else with `digits` significant digits
 * (%g). Returns buf, for use inside a printf. */
const char *skv_num(char *buf, size_t n, double v, int digits);

/* Number of worker threads the engine uses (OpenMP; OpenBLAS runs single-
 * threaded inside the engine's parallel loops). */
int skv_threads(void);
/* The default thread count: physical cores this process may use, one per
 * core (SMT siblings counted once), as llama.cpp chooses. */
int skv_default_threads(void);
void skv_set_threads(int n);

#endif
