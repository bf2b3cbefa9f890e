/* backend.c: the registry of backends (one line per backend) and the
 * workspace helper they share. */
#include "backend.h"
#include "skv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SKV_HAVE_CUDA
extern const skv_backend skv_backend_cuda;
#endif

/* The registry: the CPU reference first (the default), then the others. */
static const skv_backend *const registry[] = {
    &skv_backend_cpu,
#ifdef SKV_HAVE_CUDA
    &skv_backend_cuda,
#endif
};

#define N_BACKENDS ((int)(sizeof registry / sizeof registry[0]))

void skv_workspace_free(skv_workspace *ws) {
    free(ws->buf);
    free(ws->qbuf);
    ws->buf = NULL;
    ws->len = 0;
    ws->qbuf = NULL;
    ws->qlen = 0;
}

int skv_backend_count(void) { return N_BACKENDS; }

const skv_backend *skv_backend_at(int i) { return i >= 0 && i < N_BACKENDS ? registry[i] : NULL; }

const skv_backend *skv_backend_find(const char *name) {
    if (!name || !*name) return registry[0];
    for (int i = 0; i < N_BACKENDS; i++)
        if (!strcmp(registry[i]->name, name)) return registry[i];
    char list[256] = "";
    for (int i = 0; i < N_BACKENDS; i++) {
        size_t len = strlen(list);
        snprintf(list + len, sizeof list - len, "%s%s", i ? ", " : "", registry[i]->name);
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
