/* test_devpath: the device paths of the engine, run on the CPU.
 *
 * A device backend keeps the weights, activations and KV data in memory of
 * its own, and the forward pass, the dense policy and ShadowKV then take
 * their device paths: weights through weight_load, copies through copy and
 * copy2d, what the host needs downloaded, ShadowKV's offloaded values in
 * host_alloc's memory, and its decode stages queued in order from one
 * thread (decode_layer_dev). Here a stand-in device plays it: the CPU
 * backend's ops on memory of its own that host code cannot touch (below),
 * so each path must give the CPU path's logits and ShadowKV's books (hits,
 * misses, bytes fetched) exactly, and a host read of device memory fails
 * the test as it would crash on a GPU. Forks (the prefill recorder) and
 * batches run on it too, with the weights counted: one copy per process.
 * This checks the device paths' logic on any machine; tests/gpu/ checks the
 * CUDA kernels under them. */
#include "backend.h"
#include "batch.h"
#include "forward.h"
#include "kv.h"
#include "kv_shadowkv.h"
#include "model.h"
#include "sampler.h"
#include "session.h"
#include "skv.h"
#include "testhelp.h"
#include "batchhelp.h"

#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>

/* ---- the stand-in device ---------------------------------------------------
 * Its memory has an address space of its own, as a GPU's has: alloc hands
 * out addresses in a range mapped PROT_NONE (the device addresses), each a
 * fixed distance from host memory of the same size that holds the bytes.
 * Every op of its table translates the device addresses it is given (and
 * those in the arrays of pointers it is given) to that memory and runs the
 * CPU's op there; upload, download and copy do the same around their
 * memcpy. Host code that reads or writes a device pointer itself (a host
 * memcpy from the device's buffers) faults, and the handler turns the fault
 * into one FAIL line, where a GPU would crash. Weights are copied in by
 * weight_load and counted (calls and bytes), as are the bytes uploaded and
 * downloaded and the bytes allocated. */

#define ARENA_BYTES ((size_t)64 << 30) /* address space reserved; memory only as used */
#define MAX_BLK 8192

typedef struct { size_t off, len, req; int used; } dev_blk; /* req: the bytes asked */

static char *arena;                    /* the bytes */
static char *dev_base;                 /* the device addresses: arena's offsets, PROT_NONE */
static size_t arena_top;               /* bytes of the arena ever handed out (the high water) */
static dev_blk blks[MAX_BLK];          /* by address, covering [0, arena_top) */
static int n_blk;
static size_t page;

typedef struct {
    long weight_loads;                 /* weight_load calls that copied a tensor in */
    size_t weight_bytes;               /* bytes they copied */
    size_t live, peak;                 /* bytes asked of alloc (weights included) held now, and the most */
    size_t up_bytes, down_bytes;       /* upload / download */
    long ups, downs;
} dev_count;
static dev_count dc;

/* The host address of device address p (host pointers unchanged: the
 * arguments a device op takes from the host, index lists, the offload
 * store's pinned memory). */
static void *T(const void *p) {
    const char *c = p;
    return dev_base && c >= dev_base && c < dev_base + ARENA_BYTES ? arena + (c - dev_base) : (void *)(uintptr_t)c;
}

/* The same for an argument that must be the device's memory (the rows a
 * policy stores and attends over, the activations): a host pointer there is
 * counted (on a GPU the kernel would fault on it), and the first op it was
 * handed to is kept. */
static long host_args;
static const char *host_arg_op;
static void *D(const void *p, const char *op) {
    const char *c = p;
    if (c && !(dev_base && c >= dev_base && c < dev_base + ARENA_BYTES)) {
        if (!host_args++) host_arg_op = op;
        return (void *)(uintptr_t)c;
    }
    return T(p);
}

static void on_fault(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    char *a = si->si_addr;
    if (dev_base && a >= dev_base && a < dev_base + ARENA_BYTES) {
        static const char msg[] = "FAIL host code read or wrote the stand-in device's memory (a host memcpy of a "
                                  "device pointer: on a GPU, a segfault)\n";
        ssize_t w = write(1, msg, sizeof msg - 1);
        (void)w;
        _exit(1);
    }
    signal(sig, SIG_DFL); /* another fault: the default action */
}

static void dev_setup(void) {
    page = (size_t)sysconf(_SC_PAGESIZE);
    arena = mmap(NULL, ARENA_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    dev_base = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (arena == MAP_FAILED || dev_base == MAP_FAILED) arena = dev_base = NULL;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_fault;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}

/* First fit over the freed blocks, else the top; zeroed (a freed block's
 * pages were given back, so they read as zero again). */
static void *dev_alloc(size_t bytes) {
    if (!arena) return NULL;
    size_t len = ((bytes ? bytes : 16) + page - 1) / page * page;
    for (int i = 0; i < n_blk; i++) {
        if (blks[i].used || blks[i].len < len) continue;
        if (blks[i].len > len && n_blk < MAX_BLK) { /* split: the rest stays free */
            memmove(&blks[i + 2], &blks[i + 1], sizeof *blks * (size_t)(n_blk - i - 1));
            blks[i + 1] = (dev_blk){blks[i].off + len, blks[i].len - len, 0, 0};
            blks[i].len = len;
            n_blk++;
        }
        blks[i].used = 1;
        blks[i].req = bytes;
        dc.live += bytes;
        dc.peak = dc.live > dc.peak ? dc.live : dc.peak;
        return dev_base + blks[i].off;
    }
    if (arena_top + len > ARENA_BYTES || n_blk == MAX_BLK) return NULL;
    blks[n_blk++] = (dev_blk){arena_top, len, bytes, 1};
    arena_top += len;
    dc.live += bytes;
    dc.peak = dc.live > dc.peak ? dc.live : dc.peak;
    return dev_base + arena_top - len;
}

static void dev_free(void *p) {
    if (!p) return;
    size_t off = (size_t)((char *)p - dev_base);
    for (int i = 0; i < n_blk; i++) {
        if (blks[i].off != off || !blks[i].used) continue;
        blks[i].used = 0;
        dc.live -= blks[i].req;
        madvise(arena + off, blks[i].len, MADV_DONTNEED);
        if (i + 1 < n_blk && !blks[i + 1].used) { /* merge with the free neighbours */
            blks[i].len += blks[i + 1].len;
            memmove(&blks[i + 1], &blks[i + 2], sizeof *blks * (size_t)(n_blk - i - 2));
            n_blk--;
        }
        if (i > 0 && !blks[i - 1].used) {
            blks[i - 1].len += blks[i].len;
            memmove(&blks[i], &blks[i + 1], sizeof *blks * (size_t)(n_blk - i - 1));
            n_blk--;
        }
        return;
    }
    SKV_ASSERT(!"dev_free: not a pointer of the stand-in device");
}

static const skv_backend *cpu = &skv_backend_cpu;

static void dev_upload(void *dst, const void *src, size_t n) {
    dc.ups++;
    dc.up_bytes += n;
    memcpy(D(dst, "upload"), src, n);
}
static void dev_download(void *dst, const void *src, size_t n) {
    dc.downs++;
    dc.down_bytes += n;
    memcpy(dst, D(src, "download"), n);
}
static void dev_copy(void *dst, const void *src, size_t n) { memcpy(D(dst, "copy"), D(src, "copy"), n); }
static void dev_copy2d(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h) {
    cpu->copy2d(T(dst), dp, T(src), sp, w, h);
}

/* A weight copied into the device's memory, counted. */
static int dev_weight_load(enum ggml_type t, const void *host, int rows, int cols, skv_weight *w) {
    size_t bytes = ggml_row_size(t, (uint64_t)cols) * (size_t)rows;
    void *d = dev_alloc(bytes);
    if (!d) return skv_error(SKV_ENOMEM, "devsim: out of memory for a weight");
    memcpy(T(d), host, bytes);
    dc.weight_loads++;
    dc.weight_bytes += bytes;
    w->type = t;
    w->data = d;
    w->owned = d;
    return 0;
}
static void dev_weight_free(skv_weight *w) {
    dev_free(w->owned);
    memset(w, 0, sizeof *w);
}

/* Every op: the CPU's, on the device addresses translated. */
#define F(p) ((float *)T(p))
#define CF(p) ((const float *)T(p))
#define CH(p) ((const uint16_t *)T(p))

/* A float argument that must be the device's memory, for the op OP. */
#define DF(p) ((float *)D(p, OP))
#define OP "matmul"
static void d_matmul(enum ggml_type t, const void *W, int rows, int cols, const float *x, int n, float *y,
                     skv_workspace *ws) { cpu->matmul(t, D(W, OP), rows, cols, DF(x), n, DF(y), ws); }
static void d_matmul_k(int k, const enum ggml_type *t, const void *const *W, const int *rows, int cols,
                       const float *x, int n, float *const *y, skv_workspace *ws) {
    const void *w[8];
    float *yy[8];
    SKV_ASSERT(k <= 8);
    for (int i = 0; i < k; i++) { w[i] = D(W[i], OP); yy[i] = DF(y[i]); }
    cpu->matmul_k(k, t, w, rows, cols, DF(x), n, yy, ws);
}
#undef OP
#define OP "embed"
static void d_embed(enum ggml_type t, const void *table, int dim, const int32_t *ids, int n, float *x) {
    cpu->embed(t, D(table, OP), dim, T(ids), n, DF(x));
}
#undef OP
#define OP "rmsnorm"
static void d_rmsnorm(float *out, const float *x, const float *w, int n, int dim, float eps) {
    cpu->rmsnorm(DF(out), DF(x), DF(w), n, dim, eps);
}
#undef OP
#define OP "rope"
static void d_rope(const rope_ctx *r, float *x, int n, int n_heads, int pos0) { cpu->rope(r, DF(x), n, n_heads, pos0); }
#undef OP
#define OP "add_bias"
static void d_add_bias(float *y, const float *b, int n, int width) { cpu->add_bias(DF(y), DF(b), n, width); }
#undef OP
#define OP "add"
static void d_add(float *y, const float *x, size_t len) { cpu->add(DF(y), DF(x), len); }
#undef OP
#define OP "swiglu"
static void d_swiglu(float *gate, const float *up, size_t len) { cpu->swiglu(DF(gate), DF(up), len); }
#undef OP
#define OP "add_rmsnorm"
static void d_add_rmsnorm(float *x, const float *y, float *out, const float *w, int n, int dim, float eps) {
    cpu->add_rmsnorm(DF(x), DF(y), DF(out), DF(w), n, dim, eps);
}
#undef OP
#define OP "rope_qk"
static void d_rope_qk(const rope_ctx *r, float *q, int n_heads, float *k, int n_kv, float *k_pre, int n, int pos0,
                      const int *pos) {
    cpu->rope_qk(r, DF(q), n_heads, DF(k), n_kv, k_pre ? DF(k_pre) : NULL, n, pos0, pos);
}
#undef OP
#define OP "matmul_swiglu"
static void d_matmul_swiglu(enum ggml_type tg, const void *Wg, enum ggml_type tu, const void *Wu, int rows, int cols,
                            const float *x, int n, float *gate, float *up, skv_workspace *ws) {
    cpu->matmul_swiglu(tg, D(Wg, OP), tu, D(Wu, OP), rows, cols, DF(x), n, DF(gate), DF(up), ws);
}
#undef OP
#define OP "attend_rows"
static void d_attend_rows(const float *q, const float *K, const float *V, int n, int d, int stride, float scale,
                          float *out) { cpu->attend_rows(DF(q), DF(K), DF(V), n, d, stride, scale, DF(out)); }
#undef OP
#define OP "attend_group"
static void d_attend_group(const float *q, int g, const void *K, const void *V, int elt, int n, int d, int stride,
                           float scale, float *out, float *m, float *l) {
    cpu->attend_group(DF(q), g, D(K, OP), D(V, OP), elt, n, d, stride, scale, DF(out), DF(m), DF(l));
}
#undef OP
#define OP "attend_merge"
static void d_attend_merge(int parts, int g, int d, const float *o, const float *m, const float *l, float *out) {
    cpu->attend_merge(parts, g, d, DF(o), DF(m), DF(l), DF(out));
}
#undef OP
#define OP "attend_causal"
static void d_attend_causal(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const float *K,
                            const float *V, int stride, size_t head_stride, float *out) {
    cpu->attend_causal(DF(q), nq, pos, n_heads, n_kv_heads, d, DF(K), DF(V), stride, head_stride, DF(out));
}
#undef OP
#define OP "kv_store"
static void d_kv_store(float *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    cpu->kv_store(DF(cache), head_stride, n_kv, d, pos, n, DF(src));
}
#undef OP
#define OP "attend_decode"
static int d_attend_decode(const float *q, int n_heads, int n_kv, int d, const float *K, const float *V, int rows,
                           int stride, size_t head_stride, float *out) {
    return cpu->attend_decode(DF(q), n_heads, n_kv, d, DF(K), DF(V), rows, stride, head_stride, DF(out));
}
#undef OP
#define OP "kv_store_h"
static void d_kv_store_h(uint16_t *cache, size_t head_stride, int n_kv, int d, int pos, int n, const float *src) {
    cpu->kv_store_h(D(cache, OP), head_stride, n_kv, d, pos, n, DF(src));
}
#undef OP
#define OP "attend_decode_h"
static int d_attend_decode_h(const float *q, int n_heads, int n_kv, int d, const uint16_t *K, const uint16_t *V,
                             int rows, int stride, size_t head_stride, float *out) {
    return cpu->attend_decode_h(DF(q), n_heads, n_kv, d, D(K, OP), D(V, OP), rows, stride, head_stride, DF(out));
}
#undef OP
#define OP "attend_causal_h"
static void d_attend_causal_h(const float *q, int nq, int pos, int n_heads, int n_kv_heads, int d, const uint16_t *K,
                              const uint16_t *V, int stride, size_t head_stride, float *out) {
    cpu->attend_causal_h(DF(q), nq, pos, n_heads, n_kv_heads, d, D(K, OP), D(V, OP), stride, head_stride, DF(out));
}
#undef OP
/* The sparse stages below take host arguments too (index lists, the pinned
 * offload store): their addresses are translated, not checked. */
static int d_svd(const float *K, int s, int n, int r, float *U, float *SVt, float *Vt, float *sv, float *rel_err) {
    return cpu->svd(CF(K), s, n, r, F(U), F(SVt), F(Vt), F(sv), F(rel_err));
}
static void d_landmarks(const float *K, int stride, int d, int c, int n_chunks, float *lm) {
    cpu->landmarks(CF(K), stride, d, c, n_chunks, F(lm));
}
static void d_cos_min(const float *K, int stride, int d, int c, int n_chunks, const float *lm, float *cos_min) {
    cpu->cos_min(CF(K), stride, d, c, n_chunks, CF(lm), F(cos_min));
}
static void d_score(const float *q, int nq, size_t q_stride, int group, int d, const uint16_t *lm, int n_lm,
                    float scale, float *tmp, float *score) {
    cpu->score(CF(q), nq, q_stride, group, d, CH(lm), n_lm, scale, F(tmp), F(score));
}
static int d_topk(const float *score, int n, int k, int *idx) { return cpu->topk(CF(score), n, k, T(idx)); }
static void d_gather(const uint16_t *src, int rows, int cols, const int *src_idx, int n, void *dst, int dst_elt,
                     const size_t *dst_off, int dst_stride) {
    cpu->gather(CH(src), rows, cols, T(src_idx), n, T(dst), dst_elt, T(dst_off), dst_stride);
}
static void d_pack_h(const float *x, size_t n, uint16_t *y, int elt) {
    cpu->pack_h((const float *)D(x, "pack_h"), n, (uint16_t *)D(y, "pack_h"), elt);
}
/* src and cand the device's; dst the device's (landmarks, outliers) or host_alloc's (the store) */
static void d_sk_gather_chunks(const float *src, size_t src_row, size_t src_head, const int *cand, int h, int n_cand,
                               int rows, int d, void *dst, size_t dst_head, int dst_elt) {
    cpu->sk_gather_chunks((const float *)D(src, "sk_gather_chunks"), src_row, src_head,
                          (const int *)D(cand, "sk_gather_chunks"), h, n_cand, rows, d, T(dst), dst_head, dst_elt);
}
static void d_rebuild(const uint16_t *U, int r, const float *svt, int d, int t0, int n, const rope_ctx *rope,
                      const float *cs, const float *sn, void *out, int out_elt) {
    cpu->rebuild(CH(U), r, CF(svt), d, t0, n, rope, CF(cs), CF(sn), T(out), out_elt);
}
/* The fused books, counted: the device path with them must call them. */
static int n_fused_books;
static void d_sk_books(int h, int k, int n_cand, const int *sel, int *slot_id, int *where, unsigned *stamp,
                       unsigned *epoch, int *slot_of, int *miss, int *n_miss) {
    n_fused_books++;
    cpu->sk_books(h, k, n_cand, T(sel), T(slot_id), T(where), T(stamp), T(epoch), T(slot_of), T(miss), T(n_miss));
}
/* The heads' row pointers (a host array of device addresses), translated. */
static uint16_t **rows_of(int h, uint16_t *const *P) {
    uint16_t **p = malloc(sizeof *p * (size_t)h);
    SKV_ASSERT(p);
    for (int i = 0; i < h; i++) p[i] = T(P[i]);
    return p;
}
static void d_sk_gather_misses(const uint16_t *store, int c, int d, int h, int k, int n_cand, size_t blk0,
                               const int *sel, const int *slot_of, const int *miss, const int *n_miss,
                               uint16_t *const *V, int row_slot) {
    uint16_t **v = rows_of(h, V);
    cpu->sk_gather_misses(CH(store), c, d, h, k, n_cand, blk0, T(sel), T(slot_of), T(miss), T(n_miss), v, row_slot);
    free(v);
}
static void d_sk_rebuild_misses(const uint16_t *U, int r, const float *SVt, int d, int c, int h, int k, int n_cand,
                                const int *cand, const int *sel, const int *slot_of, const int *miss,
                                const int *n_miss, const rope_ctx *rope, const float *cs, const float *sn,
                                uint16_t *const *K, int row_slot) {
    uint16_t **kk = rows_of(h, K);
    cpu->sk_rebuild_misses(CH(U), r, CF(SVt), d, c, h, k, n_cand, T(cand), T(sel), T(slot_of), T(miss), T(n_miss),
                           rope, CF(cs), CF(sn), kk, row_slot);
    free(kk);
}
static void d_project(const float *Vt, int r, int n, const float *x, float *y, float *coef) {
    cpu->project(CF(Vt), r, n, CF(x), F(y), F(coef));
}

static skv_backend devsim, devsim_host_books;

/* The stand-in device's table: the CPU's ops on its own guarded memory.
 * The CPU-only stages (page bounds, KIVI) are left out: a policy that needs
 * them is refused on a device. */
static void devsim_make(void) {
    devsim = skv_backend_cpu;
    devsim.name = "devsim";
    devsim.alloc = dev_alloc;
    devsim.free = dev_free;
    devsim.upload = dev_upload;
    devsim.download = dev_download;
    devsim.copy = dev_copy;
    devsim.copy2d = dev_copy2d;
    devsim.weight_load = dev_weight_load;
    devsim.weight_free = dev_weight_free;
    devsim.matmul = d_matmul;
    devsim.matmul_k = d_matmul_k;
    devsim.embed = d_embed;
    devsim.rmsnorm = d_rmsnorm;
    devsim.rope = d_rope;
    devsim.add_bias = d_add_bias;
    devsim.add = d_add;
    devsim.swiglu = d_swiglu;
    devsim.add_rmsnorm = d_add_rmsnorm;
    devsim.rope_qk = d_rope_qk;
    devsim.matmul_swiglu = d_matmul_swiglu;
    devsim.attend_rows = d_attend_rows;
    devsim.attend_group = d_attend_group;
    devsim.attend_merge = d_attend_merge;
    devsim.attend_causal = d_attend_causal;
    devsim.kv_store = d_kv_store;
    devsim.attend_decode = d_attend_decode;
    devsim.kv_store_h = d_kv_store_h;
    devsim.attend_decode_h = d_attend_decode_h;
    devsim.attend_causal_h = d_attend_causal_h;
    devsim.svd = d_svd;
    devsim.landmarks = d_landmarks;
    devsim.cos_min = d_cos_min;
    devsim.score = d_score;
    devsim.topk = d_topk;
    devsim.gather = d_gather;
    devsim.pack_h = d_pack_h;
    devsim.sk_gather_chunks = d_sk_gather_chunks;
    devsim.rebuild = d_rebuild;
    devsim.sk_books = d_sk_books;
    devsim.sk_gather_misses = d_sk_gather_misses;
    devsim.sk_rebuild_misses = d_sk_rebuild_misses;
    devsim.project = d_project;
    devsim.page_bounds = NULL;
    devsim.page_score = NULL;
    devsim.kivi = NULL;
    /* the device path that keeps the books on the host (a backend without the fused ops) */
    devsim_host_books = devsim;
    devsim_host_books.name = "devsim-host-books";
    devsim_host_books.sk_books = NULL;
    devsim_host_books.sk_gather_misses = NULL;
    devsim_host_books.sk_rebuild_misses = NULL;
}

typedef struct {
    double worst_prefill, worst_decode;
    uint64_t hits, misses, fetch_bytes;
    int rc;
} run_out;

/* Prefill n random tokens then steps greedy tokens on backend be; logits
 * after each into lg (steps + 1, vocab). */
static void run(skv_model *m, const skv_backend *be, const char *policy, const int32_t *ids, int n, int steps,
                float *lg, run_out *o) {
    memset(o, 0, sizeof *o);
    forward_state f;
    kv_cache *kv = NULL;
    int V = m->cfg.vocab;
    if ((o->rc = forward_init(&f, m, be, 256))) return;
    kv_opts ko;
    kv_opts_default(&ko);
    snprintf(ko.policy, sizeof ko.policy, "%s", policy);
    ko.budget = 64;
    kv_opts_set_num(&ko, "rank", 16);
    kv_opts_set_num(&ko, "chunk", 8);
    kv_opts_set_num(&ko, "outliers", 3);
    kv_shape sh = {.n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
                   .head_dim = m->cfg.head_dim, .max_ctx = n + steps + 4, .rope = &f.rope, .be = be};
    if ((o->rc = kv_new(&ko, &sh, &kv))) { forward_free(&f); return; }
    for (int i = 0; i < n && !o->rc; i += 256)
        o->rc = forward_batch(&f, kv, ids + i, n - i < 256 ? n - i : 256, i);
    if (!o->rc) o->rc = kv->cls->end_prefill(kv);
    memcpy(lg, f.logits, sizeof(float) * V);
    for (int s = 0; s < steps && !o->rc; s++) {
        int best = 0;
        for (int i = 1; i < V; i++) if (f.logits[i] > f.logits[best]) best = i;
        kv->step = s;
        f.step = s;
        o->rc = forward_batch(&f, kv, &best, 1, n + s);
        memcpy(lg + (size_t)(s + 1) * V, f.logits, sizeof(float) * V);
    }
    kv_shadowkv_stats st;
    if (!strcmp(policy, "shadowkv") && !kv_shadowkv_stats_get(kv, &st)) {
        o->hits = st.hits;
        o->misses = st.misses;
        o->fetch_bytes = st.fetch_bytes;
    }
    kv_free(kv);
    forward_free(&f);
}

/* ---- forks and batches on the device path ------------------------------- */

static session_opts sk_opts(const skv_backend *be, int n) {
    session_opts so;
    session_opts_default(&so);
    snprintf(so.kv.policy, sizeof so.kv.policy, "shadowkv");
    so.kv.budget = 64;
    kv_opts_set_num(&so.kv, "rank", 16);
    kv_opts_set_num(&so.kv, "chunk", 8);
    kv_opts_set_num(&so.kv, "outliers", 3);
    so.ctx = n + 32;
    so.batch = 256;
    so.be = be;
    so.record_prefill = 1;
    return so;
}

/* Greedy decode of s alone: steps tokens into tok, the logits before each
 * into lg (steps, vocab). */
static int greedy(skv_session *s, int steps, int32_t *tok, float *lg) {
    int V = s->m->cfg.vocab, rc = 0;
    for (int t = 0; t < steps && !rc; t++) {
        memcpy(lg + (size_t)t * V, session_logits(s), sizeof(float) * (size_t)V);
        tok[t] = sampler_argmax(session_logits(s), V);
        rc = session_decode(s, tok[t]);
    }
    return rc;
}

/* The device bytes held after a batch of B forks of src (budget 64) takes
 * one step, beside what was held before (the batch then freed). */
static int batch_bytes(skv_session *src, int B, const int32_t *ids, double *bytes) {
    size_t live0 = dc.live;
    skv_session *f[4] = {0};
    skv_batch *b = NULL;
    int rc = 0;
    for (int i = 0; i < B && !rc; i++) rc = session_fork(src, &src->o.kv, &f[i]);
    if (!rc && (rc = batch_new(f, B, &b)) == 0) memset(f, 0, sizeof f);
    int32_t tok[4] = {ids[0], ids[1], ids[2], ids[3]};
    if (!rc) rc = batch_decode(b, tok);
    *bytes = (double)dc.live - (double)live0;
    batch_free(b);
    for (int i = 0; i < B; i++) session_free(f[i]);
    return rc;
}

/* One recorded prefill forked into 4 ShadowKV sequences of other budgets on
 * the device path: the recorder reads the device's rows through download and
 * replays them through upload (a host read of device memory would fault),
 * the weights are loaded once for the source, the forks and the batch, and
 * each fork, alone or in a batch of 4, decodes as it does on the CPU path. */
static void test_forks(skv_model *m, const int32_t *ids, int n) {
    enum { NF = 4, ST = 8 };
    static const int budgets[NF] = {32, 64, 96, 160};
    const model_config *c = &m->cfg;
    int V = c->vocab, rc = 0;
    size_t rows_bytes = sizeof(float) * 3 * (size_t)c->n_kv_heads * c->head_dim * (size_t)n * c->n_layers;
    float *lc = malloc(sizeof(float) * NF * ST * (size_t)V), *ld = malloc(sizeof(float) * NF * ST * (size_t)V);
    int32_t tc[NF][ST], td[NF][ST], tb[NF][ST];
    char msg[320];
    /* the CPU path: each fork decoded alone */
    session_opts sc = sk_opts(&skv_backend_cpu, n), sd = sk_opts(&devsim, n);
    skv_session *src = NULL, *f[NF] = {0};
    rc = session_new(m, &sc, &src);
    if (!rc) rc = session_prefill(src, ids, n, NULL, NULL);
    for (int i = 0; i < NF && !rc; i++) {
        kv_opts ko = sc.kv;
        ko.budget = budgets[i];
        if (!(rc = session_fork(src, &ko, &f[i]))) rc = greedy(f[i], ST, tc[i], lc + (size_t)i * ST * V);
        session_free(f[i]);
        f[i] = NULL;
    }
    session_free(src);
    src = NULL;
    test_cond("forks on the CPU path run", rc == 0);

    /* the device path */
    dev_count d0 = dc;
    rc = session_new(m, &sd, &src);
    long loads = dc.weight_loads - d0.weight_loads;
    size_t wbytes = dc.weight_bytes - d0.weight_bytes, down0 = dc.down_bytes;
    if (!rc) rc = session_prefill(src, ids, n, NULL, NULL);
    snprintf(msg, sizeof msg, "device path: the prefill recorder reads the device's rows with download (%zu B "
             "downloaded, the prompt's keys and values are %zu B; rc %d)", dc.down_bytes - down0, rows_bytes, rc);
    test_cond(msg, rc == 0 && dc.down_bytes - down0 >= rows_bytes);
    size_t up0 = dc.up_bytes;
    long ha0 = host_args;
    for (int i = 0; i < NF && !rc; i++) {
        kv_opts ko = sd.kv;
        ko.budget = budgets[i];
        rc = session_fork(src, &ko, &f[i]);
    }
    snprintf(msg, sizeof msg, "... and replays them into 4 forks with upload (%zu B uploaded, 4 x %zu B; host "
             "pointers handed to device ops: %ld; rc %d %s)", dc.up_bytes - up0, rows_bytes, host_args - ha0, rc,
             rc ? skv_last_error() : "");
    test_cond(msg, rc == 0 && dc.up_bytes - up0 >= NF * rows_bytes && host_args == ha0);
    int shared = !rc;
    for (int i = 0; i < NF && !rc; i++) shared &= f[i]->fwd.w == src->fwd.w;
    snprintf(msg, sizeof msg, "4 forks on the device path: the weights loaded once (%ld tensors, %zu B; after the forks "
             "%ld, %zu B), one copy borrowed by all 5 sessions", loads, wbytes, dc.weight_loads - d0.weight_loads,
             dc.weight_bytes - d0.weight_bytes);
    test_cond(msg, shared && loads > 0 && wbytes == src->fwd.w->bytes && dc.weight_loads - d0.weight_loads == loads &&
              dc.weight_bytes - d0.weight_bytes == wbytes && src->fwd.w->refs == 1 + NF);
    int same = !rc;
    for (int i = 0; i < NF && !rc; i++) {
        rc = greedy(f[i], ST, td[i], ld + (size_t)i * ST * V);
        session_free(f[i]);
        f[i] = NULL;
    }
    same = same && !rc && !memcmp(lc, ld, sizeof(float) * NF * ST * (size_t)V) && !memcmp(tc, td, sizeof tc);
    snprintf(msg, sizeof msg, "... each fork (budgets 32-160) decoded alone: the CPU path's logits bit for bit, %d steps",
             ST);
    test_cond(msg, same);

    /* a batch of the 4 forks on the device path */
    skv_batch *b = NULL;
    for (int i = 0; i < NF && !rc; i++) {
        kv_opts ko = sd.kv;
        ko.budget = budgets[i];
        rc = session_fork(src, &ko, &f[i]);
    }
    if (!rc && (rc = batch_new(f, NF, &b)) == 0) memset(f, 0, sizeof f);
    double worst = 0;
    for (int t = 0; t < ST && !rc; t++) {
        int32_t tok[NF];
        double e = test_batch_step(b, NF, V, lc, ST, t, tok, &tb[0][0]);
        worst = e > worst ? e : worst;
        rc = batch_decode(b, tok);
    }
    snprintf(msg, sizeof msg, "a batch of the 4 forks on the device path: each sequence's greedy tokens alone (%d steps; "
             "logits within rel L2 %.1e, bound 1e-4; rc %d)", ST, worst, rc);
    test_cond(msg, rc == 0 && !memcmp(tb, tc, sizeof tc) && worst <= 1e-4);
    snprintf(msg, sizeof msg, "... with the weights still loaded once (%ld tensors), borrowed by the batch too",
             dc.weight_loads - d0.weight_loads);
    test_cond(msg, b && dc.weight_loads - d0.weight_loads == loads && src->fwd.w->refs == 2 + NF);
    batch_free(b);
    for (int i = 0; i < NF; i++) session_free(f[i]);

    /* the device memory of a batch: the weights once, plus B x a sequence's
     * state (its KV, its session's activations, its row of the batch's) */
    double m1 = 0, m2 = 0, m4 = 0;
    if (!rc) rc = batch_bytes(src, 1, ids, &m1);
    if (!rc) rc = batch_bytes(src, 2, ids, &m2);
    if (!rc) rc = batch_bytes(src, 4, ids, &m4);
    double per = m2 - m1, once = m1 - per;
    snprintf(msg, sizeof msg, "a batch's device bytes are linear in B beside the weights (%.0f, %.0f, %.0f B for B = 1, "
             "2, 4: %.0f B a sequence, %.0f B once; the weights' %zu B not among them)", m1, m2, m4, per, once, wbytes);
    test_cond(msg, rc == 0 && per > 0 && m4 - m2 == 2 * per && once >= 0 && per + once < (double)wbytes &&
              dc.weight_loads - d0.weight_loads == loads);
    int pool = -1, fit4 = batch_fit((double)wbytes + once, per, (double)wbytes + once + 4 * per, 0, 0, &pool);
    int fit3 = batch_fit((double)wbytes + once, per, (double)wbytes + once + 4 * per - 1, 0, 0, &pool);
    snprintf(msg, sizeof msg, "batch_fit counts that: the weights once and 4 sequences fit in exactly their bytes "
             "(%d), one byte less fits 3 (%d)", fit4, fit3);
    test_cond(msg, fit4 == 4 && fit3 == 3);
    session_free(src);
    snprintf(msg, sizeof msg, "the last session freed gives the weights back: the device holds %zd B more than before",
             (ssize_t)(dc.live - d0.live));
    test_cond(msg, dc.live == d0.live);
    free(lc);
    free(ld);
}

int main(void) {
    dev_setup();
    devsim_make();
    const char *path = "build/default-model.gguf";
    skv_model *m;
    if (model_load(path, &m)) {
        char msg[512];
        snprintf(msg, sizeof msg, "device paths: %s not loadable (%s); make builds it", path, skv_last_error());
        test_skip(msg);
        return test_report("test_devpath");
    }
    int n = 700, steps = 12, V = m->cfg.vocab;
    int32_t *ids = malloc(sizeof(int32_t) * n);
    uint64_t x = 0x853c49e6748fea9bull;
    for (int i = 0; i < n; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        ids[i] = (int32_t)(x % (uint64_t)V);
    }
    float *a = malloc(sizeof(float) * (steps + 1) * V), *b = malloc(sizeof(float) * (steps + 1) * V);
    const char *pol[] = {"dense", "shadowkv"};
    for (int p = 0; p < 2; p++) {
        run_out oc, od;
        run(m, &skv_backend_cpu, pol[p], ids, n, steps, a, &oc);
        run(m, &devsim, pol[p], ids, n, steps, b, &od);
        char msg[256];
        snprintf(msg, sizeof msg, "%s: a session on a device-memory backend runs (rc %d, %s)", pol[p], od.rc,
                 od.rc ? skv_last_error() : "ok");
        test_cond(msg, oc.rc == 0 && od.rc == 0);
        snprintf(msg, sizeof msg, "%s: the device path's logits after the prompt and %d decode steps equal the CPU "
                 "path's bit for bit", pol[p], steps);
        test_cond(msg, !memcmp(a, b, sizeof(float) * (steps + 1) * V));
        if (p == 1) {
            snprintf(msg, sizeof msg, "shadowkv: the same books on both paths (hits %llu/%llu, misses %llu/%llu, "
                     "fetched %llu/%llu B)", (unsigned long long)oc.hits, (unsigned long long)od.hits,
                     (unsigned long long)oc.misses, (unsigned long long)od.misses,
                     (unsigned long long)oc.fetch_bytes, (unsigned long long)od.fetch_bytes);
            test_cond(msg, oc.misses > 0 && oc.hits == od.hits && oc.misses == od.misses &&
                      oc.fetch_bytes == od.fetch_bytes);
            snprintf(msg, sizeof msg, "shadowkv: the device path kept its books in the device's memory (fused books "
                     "called %d times: once a layer a step)", n_fused_books);
            test_cond(msg, n_fused_books == steps * m->cfg.n_layers);
            run_out oh;
            run(m, &devsim_host_books, pol[p], ids, n, steps, b, &oh);
            snprintf(msg, sizeof msg, "shadowkv: without the fused ops the device path keeps the books on the host, "
                     "with the same logits and books (hits %llu, misses %llu)", (unsigned long long)oh.hits,
                     (unsigned long long)oh.misses);
            test_cond(msg, oh.rc == 0 && !memcmp(a, b, sizeof(float) * (steps + 1) * V) && oh.hits == oc.hits &&
                      oh.misses == oc.misses && oh.fetch_bytes == oc.fetch_bytes);
        }
    }
    /* a batch on the device path: 3 ShadowKV sequences (their own caches,
     * prompts of different lengths) decoded together by forward_rows, one
     * pass of the weights a step, give the CPU path's batch bit for bit (the
     * same rows through the same ops), and each sequence's decode alone
     * within rounding (a GEMM of 3 rows sums in another order than 1) */
    {
        enum { B = 3 };
        int lens[B] = {300, 420, 520}, st = 6, same = 1, rc = 0;
        double worst = 0;
        forward_state fd, fc;
        kv_cache *kd[B] = {0}, *kcb[B] = {0}, *kc = NULL;
        float *alone = malloc(sizeof(float) * (size_t)B * st * V), *rows = malloc(sizeof(float) * (size_t)B * V);
        float *rows_c = malloc(sizeof(float) * (size_t)B * V);
        int32_t tok[B][8];
        rc = forward_init(&fd, m, &devsim, 600);
        if (!rc) rc = forward_init(&fc, m, &skv_backend_cpu, 600);
        kv_opts ko;
        kv_opts_default(&ko);
        snprintf(ko.policy, sizeof ko.policy, "shadowkv");
        ko.budget = 64;
        kv_opts_set_num(&ko, "rank", 16);
        kv_opts_set_num(&ko, "outliers", 3);
        for (int b = 0; b < B && !rc; b++) {
            kv_shape sh = {.n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
                           .head_dim = m->cfg.head_dim, .max_ctx = 600, .rope = &fc.rope, .be = &skv_backend_cpu};
            /* alone, on the CPU path: greedy tokens and their logits */
            if ((rc = kv_new(&ko, &sh, &kc))) break;
            rc = forward_batch(&fc, kc, ids + b * 50, lens[b], 0);
            if (!rc) rc = kc->cls->end_prefill(kc);
            for (int s = 0; s < st && !rc; s++) {
                int best = 0;
                for (int i = 1; i < V; i++) if (fc.logits[i] > fc.logits[best]) best = i;
                tok[b][s] = best;
                kc->step = s;
                fc.step = s;
                rc = forward_batch(&fc, kc, &tok[b][s], 1, lens[b] + s);
                memcpy(alone + ((size_t)s * B + b) * V, fc.logits, sizeof(float) * V);
            }
            kv_free(kc);
            kc = NULL;
            /* its caches for the two batches, prefilled alone */
            if (!rc) rc = kv_new(&ko, &sh, &kcb[b]);
            if (!rc) rc = forward_batch(&fc, kcb[b], ids + b * 50, lens[b], 0);
            if (!rc) rc = kcb[b]->cls->end_prefill(kcb[b]);
            sh.rope = &fd.rope;
            sh.be = &devsim;
            if (!rc) rc = kv_new(&ko, &sh, &kd[b]);
            if (!rc) rc = forward_batch(&fd, kd[b], ids + b * 50, lens[b], 0);
            if (!rc) rc = kd[b]->cls->end_prefill(kd[b]);
        }
        for (int s = 0; s < st && !rc; s++) {
            int32_t t[B];
            int pos[B];
            for (int b = 0; b < B; b++) {
                t[b] = tok[b][s];
                pos[b] = lens[b] + s;
                kd[b]->step = kcb[b]->step = s;
            }
            fd.step = fc.step = s;
            rc = forward_rows(&fd, kd, t, pos, B, rows);
            if (!rc) rc = forward_rows(&fc, kcb, t, pos, B, rows_c);
            same &= !rc && !memcmp(rows, rows_c, sizeof(float) * (size_t)B * V);
            for (int b = 0; b < B && !rc; b++) {
                double e = test_rel_l2(rows + (size_t)b * V, alone + ((size_t)s * B + b) * V, V);
                worst = e > worst ? e : worst;
            }
        }
        char msg[256];
        snprintf(msg, sizeof msg, "a batch of %d ShadowKV sequences on the device path (forward_rows, %d steps): the CPU "
                 "path's batch bit for bit (rc %d)", B, st, rc);
        test_cond(msg, rc == 0 && same);
        snprintf(msg, sizeof msg, "... and each sequence's decode alone within rel L2 %.1e (bound 1e-4)", worst);
        test_cond(msg, rc == 0 && worst <= 1e-4);
        for (int b = 0; b < B; b++) {
            kv_free(kd[b]);
            kv_free(kcb[b]);
        }
        forward_free(&fd);
        forward_free(&fc);
        free(alone);
        free(rows);
        free(rows_c);
    }
    /* the policies that read host memory are refused there, in one line */
    {
        forward_state f;
        forward_init(&f, m, &devsim, 16);
        kv_opts ko;
        kv_opts_default(&ko);
        snprintf(ko.policy, sizeof ko.policy, "quest");
        kv_shape sh = {.n_layers = m->cfg.n_layers, .n_heads = m->cfg.n_heads, .n_kv_heads = m->cfg.n_kv_heads,
                       .head_dim = m->cfg.head_dim, .max_ctx = 64, .rope = &f.rope, .be = &devsim};
        kv_cache *kv = NULL;
        int rc = kv_new(&ko, &sh, &kv);
        test_cond("a policy without a device path is refused on a device backend, naming --backend cpu",
                  rc == SKV_EUNSUPPORTED && strstr(skv_last_error(), "--backend cpu") && !kv);
        /* ShadowKV's f32 state is the CPU's alone: refused at creation */
        snprintf(ko.policy, sizeof ko.policy, "shadowkv");
        kv_opts_set_num(&ko, "f32_state", 1);
        rc = kv_new(&ko, &sh, &kv);
        test_cond("shadowkv f32_state is refused on a device backend in one line naming --backend cpu",
                  rc == SKV_EUNSUPPORTED && strstr(skv_last_error(), "f32_state") &&
                      strstr(skv_last_error(), "--backend cpu") && !strchr(skv_last_error(), '\n') && !kv);
        kv_free(kv);
        forward_free(&f);
    }
    test_forks(m, ids, n);
    char msg[200];
    snprintf(msg, sizeof msg, "every device op was handed the device's memory where a GPU reads it (host pointers: "
             "%ld, first to %s)", host_args, host_arg_op ? host_arg_op : "none");
    test_cond(msg, host_args == 0);
    free(a); free(b); free(ids);
    model_free(m);
    return test_report("test_devpath");
}
