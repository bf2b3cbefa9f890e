/* backend.c: the registry of backends (one line per backend) and the
 * workspace helper they share.
 *
 * The CUDA backend (kernels/cuda/) is a shared object, libskv-cuda.so,
 * loaded at run time on first use (skv_backend_find("cuda"), the registry's
 * listing): skv itself links no CUDA library, so a CPU-only machine runs it.
 * When the object is missing or does not load (the CUDA libraries absent),
 * the registry holds a stand-in named "cuda" whose `available` says why in
 * one line, and skv_backend_pick falls back to the CPU as for a machine
 * without a GPU. A binary built with the backend linked in (the CUDA
 * simulator's, SKV_CUDA_STATIC) uses its table directly. */
#include "backend.h"
#include "skv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SKV_HAVE_CUDA
#ifdef SKV_CUDA_STATIC
extern const skv_backend skv_backend_cuda;
#else
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#define CUDA_SO "libskv-cuda.so"
#endif
#endif

/* The registry: the CPU reference first (the default), then the others.
 * The names are fixed, so that listing one backend or finding another by
 * name loads nothing else (a NULL entry: the CUDA backend, not loaded yet). */
static const char *const names[] = {
    "cpu",
#ifdef SKV_HAVE_CUDA
    "cuda",
#endif
};
static const skv_backend *registry[] = {
    &skv_backend_cpu,
#ifdef SKV_HAVE_CUDA
#ifdef SKV_CUDA_STATIC
    &skv_backend_cuda,
#else
    NULL,
#endif
#endif
};
#define CUDA_AT 1

#define N_BACKENDS ((int)(sizeof registry / sizeof registry[0]))

#if defined(SKV_HAVE_CUDA) && !defined(SKV_CUDA_STATIC)
static char cuda_why[200]; /* why libskv-cuda.so is not loaded */

static int cuda_missing(char *why, size_t n) {
    if (n) snprintf(why, n, "%s", cuda_why);
    return 0;
}

/* The stand-in when the backend does not load: listed, never picked. */
static const skv_backend cuda_stub = {
    .name = "cuda",
    .summary = "NVIDIA GPUs (kernels/cuda/, loaded at run time from " CUDA_SO ")",
    .available = cuda_missing,
};

/* One line from dlerror's message err about the object at path: the path
 * dropped (the caller names the object), and the errno text after "cannot
 * open shared object file" (always "No such file or directory" there). */
static void cuda_condense(const char *err, const char *path, char *out, size_t n) {
    size_t pl = strlen(path);
    if (!err) err = "unknown error";
    if (!strncmp(err, path, pl) && err[pl] == ':') err += pl + 1;
    while (*err == ' ') err++;
    snprintf(out, n, "%s", err);
    char *tail = strstr(out, "cannot open shared object file");
    if (tail) tail[strlen("cannot open shared object file")] = 0;
    for (char *c = out; *c; c++)
        if (*c == '\n' || *c == '\r') *c = ' ';
}

/* The table of libskv-cuda.so at path (or found by that name): NULL with the
 * reason in cuda_why. A table of another layout (an object left from an
 * older build) is refused. */
static const skv_backend *cuda_open(const char *path) {
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
    if (!h) {
        const char *err = dlerror();
        char e[150];
        size_t pl = strlen(path);
        if (!strchr(path, '/') && err && !strncmp(err, path, pl) && err[pl] == ':')
            snprintf(cuda_why, sizeof cuda_why, CUDA_SO " not found (beside the executable, or in the library path)");
        else {
            cuda_condense(err, path, e, sizeof e);
            snprintf(cuda_why, sizeof cuda_why, CUDA_SO " does not load: %s", e);
        }
        return NULL;
    }
    const skv_backend *b = dlsym(h, "skv_backend_cuda");
    const size_t *size = dlsym(h, "skv_backend_cuda_table_size");
    if (!b || !size || *size != sizeof(skv_backend)) {
        snprintf(cuda_why, sizeof cuda_why, CUDA_SO " is not this build's (%s): rebuild it",
                 !b || !size ? "no backend table" : "another table layout");
        return NULL;
    }
    return b;
}

/* Looks for libskv-cuda.so beside the executable (/proc/self/exe), then by
 * name in the library path (LD_LIBRARY_PATH, and the run path of the
 * executable: the build's test binaries have the build folder there). */
static void cuda_load(void) {
    char exe[PATH_MAX], path[PATH_MAX + sizeof CUDA_SO];
    const skv_backend *b = NULL;
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash = len > 0 ? (exe[len] = 0, strrchr(exe, '/')) : NULL;
    if (slash) {
        slash[1] = 0;
        snprintf(path, sizeof path, "%s%s", exe, CUDA_SO);
    }
    if (slash && access(path, F_OK) == 0) b = cuda_open(path);
    else b = cuda_open(CUDA_SO);
    registry[CUDA_AT] = b ? b : &cuda_stub;
}

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
#endif

static const skv_backend *entry(int i) {
#if defined(SKV_HAVE_CUDA) && !defined(SKV_CUDA_STATIC)
    if (i == CUDA_AT) pthread_once(&cuda_once, cuda_load);
#endif
    return registry[i];
}

void skv_workspace_free(skv_workspace *ws) {
    free(ws->buf);
    free(ws->qbuf);
    ws->buf = NULL;
    ws->len = 0;
    ws->qbuf = NULL;
    ws->qlen = 0;
}

int skv_backend_count(void) { return N_BACKENDS; }

const skv_backend *skv_backend_at(int i) { return i >= 0 && i < N_BACKENDS ? entry(i) : NULL; }

const skv_backend *skv_backend_find(const char *name) {
    if (!name || !*name) return registry[0];
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(names[i], name)) return entry(i);
    char list[256] = "";
    for (int i = 0; i < N_BACKENDS; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", names[i]);
    }
    skv_error(SKV_EINVAL, "unknown backend '%s' (this build has: %s; skv info --backends)", name, list);
    return NULL;
}

const skv_backend *skv_backend_pick(const char *name, char *notice, size_t n) {
    if (n) notice[0] = 0;
    const skv_backend *b = skv_backend_find(name);
    if (!b) return NULL;
    char why[160] = "";
    if (b->available && !b->available(why, sizeof why)) {
        if (n) snprintf(notice, n, "backend %s cannot run here (%s): running on cpu", b->name, why);
        return registry[0];
    }
    return b;
}
