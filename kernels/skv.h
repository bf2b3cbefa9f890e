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

/* Reads a whole regular file of at most max bytes into a NUL-terminated
 * buffer the caller frees. SKV_EMISSING when it does not exist. */
int skv_read_file(const char *path, size_t max, char **out, size_t *len);

/* Monotonic clock in seconds. */
double skv_now(void);

/* Number of worker threads the engine uses (OpenMP; OpenBLAS runs single-
 * threaded inside the engine's parallel loops). */
int skv_threads(void);
void skv_set_threads(int n);

#endif
