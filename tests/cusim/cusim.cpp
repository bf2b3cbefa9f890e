/* cusim.cpp: the CUDA simulator's runtime. Kernels run thread by thread as
 * cooperative fibers on the host thread that waits for them; device memory
 * is an arena the host cannot touch between launches and copies; streams
 * hold their work until the host waits for it and then run it in an
 * adversarial order; launches are checked against an H100's limits; every
 * load and store of a kernel is checked (bounds, host pointers, races in
 * shared memory); counters say what the host asked for. cusim_libs.cpp has
 * the cuBLAS, cuSOLVER and CUB calls. Compiled without coverage hooks (its
 * own loads and stores are not a kernel's). docs/TESTING.md. */
#include "cusim_internal.h"

#include <cxxabi.h>
#include <elf.h>
#include <execinfo.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

/* The H100's limits (the runtime refuses a launch past them). */
#define LIM_THREADS 1024
#define LIM_BLOCK_XY 1024
#define LIM_BLOCK_Z 64
#define LIM_GRID_X 2147483647u
#define LIM_GRID_YZ 65535u
#define LIM_SMEM_STATIC (48u << 10)
#define LIM_SMEM_OPTIN 232448u /* 227 KiB */
#define N_SM 132
#define HELD_MAX 4096          /* ops held before some are run */
#define ARENA_BYTES (1ull << 37) /* reserved address space for device memory */
#define STACK_BYTES (256u << 10)

extern "C" {
/* the sanitizer's fiber API, when a sanitizer runtime is linked */
void __sanitizer_start_switch_fiber(void **fake_stack_save, const void *bottom, size_t size) __attribute__((weak));
void __sanitizer_finish_switch_fiber(void *fake_stack_save, const void **bottom_old, size_t *size_old)
    __attribute__((weak));
extern char __start_cusim_shared[] __attribute__((weak));
extern char __stop_cusim_shared[] __attribute__((weak));
extern char __executable_start[];
extern char _end[];
}

namespace cusim {

thread_local thread_state *g_cur;
thread_local uint3 g_block_idx;
thread_local dim3 g_block_dim, g_grid_dim;

uint3 thread_idx(void) { return g_cur->tid; }
uint3 block_idx(void) { return g_block_idx; }
dim3 block_dim(void) { return g_block_dim; }
dim3 grid_dim(void) { return g_grid_dim; }
int lane_id(void) { return g_cur->lane; }

static std::recursive_mutex g_mu;
static void arena_init(void);
api_lock::api_lock() {
    g_mu.lock();
    arena_init(); /* the environment's settings before any answer */
}
api_lock::~api_lock() { g_mu.unlock(); }

static cusim_counters g_cnt;
static std::map<std::string, uint64_t> g_kernel_launches;
static cudaError_t g_last = cudaSuccess, g_sticky = cudaSuccess;
static std::string g_fault;
static size_t g_device_bytes = (size_t)80 << 30;
static int g_order = CUSIM_ORDER_ADVERSARIAL;
static std::mt19937 g_rng(1);
static double g_clock; /* the simulated device clock, s: each op advances it by the time it took */
/* SKV_CUSIM_TRACE=FILE: a line per kernel run with a hash of the values it
 * loaded from device and pinned memory, to find where two runs part */
static FILE *g_trace;
static uint64_t g_load_hash, g_runs, g_dump_at;
static FILE *g_dump;
static size_t g_watch; /* SKV_CUSIM_WATCH=ID: report writes into allocation ID */
static void watch_write(const char *who, uintptr_t a, size_t n);

cudaError_t sticky(void) { return g_sticky; }
cudaError_t set_error(cudaError_t e) {
    if (e != cudaSuccess) g_last = e;
    return e;
}
#define STICKY()                                                                                                 \
    do {                                                                                                        \
        if (g_sticky != cudaSuccess) return g_sticky;                                                           \
    } while (0)

void fault(cudaError_t err, const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, "cusim: %s\n", buf);
    fflush(stderr);
    if (g_fault.empty() || g_sticky == cudaSuccess) g_fault = buf;
    g_cnt.faults++;
    if (g_sticky == cudaSuccess) g_sticky = err;
    g_last = err;
    const char *a = getenv("SKV_CUSIM_ABORT");
    if (a && *a == '1') abort();
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---------------------------------------------------------------------
 * Device memory: one reserved range; live allocations 256-aligned with a
 * gap after each; PROT_NONE whenever no kernel or copy runs.
 * ------------------------------------------------------------------- */

struct alloc_rec {
    size_t size, id;
    int async;       /* 1: cudaMallocAsync */
    int free_queued; /* 1: a cudaFreeAsync of it waits on its stream */
};
static char *g_arena;
static size_t g_hwm;                            /* bytes of the arena ever handed out */
static std::map<uintptr_t, alloc_rec> g_allocs; /* start -> allocation */
static std::map<uintptr_t, size_t> g_holes;     /* free ranges below g_hwm, start -> bytes */
static size_t g_alloc_id;
static int g_open;                              /* the arena is readable and writable while > 0 */
static uintptr_t g_hit_lo, g_hit_hi;            /* the allocation a kernel's access last hit */
static size_t g_gap = 256;                      /* unallocated bytes after each allocation (SKV_CUSIM_GAP) */
static int g_reuse = 1;                         /* freed ranges are handed out again (SKV_CUSIM_REUSE=0: never) */
static struct sigaction g_old_segv;

static int in_arena(uintptr_t a) { return g_arena && a - (uintptr_t)g_arena < ARENA_BYTES; }

static void arena_protect(int rw) {
    if (g_hwm) mprotect(g_arena, g_hwm, rw ? PROT_READ | PROT_WRITE : PROT_NONE);
}
static void dev_open(void) {
    if (g_open++ == 0) arena_protect(1);
}
static void dev_close(void) {
    if (--g_open == 0) arena_protect(0);
}

static const alloc_rec *find_alloc(uintptr_t a, uintptr_t *start) {
    auto it = g_allocs.upper_bound(a);
    if (it == g_allocs.begin()) return NULL;
    --it;
    if (a - it->first < it->second.size) {
        *start = it->first;
        return &it->second;
    }
    *start = it->first;
    return NULL;
}

static void describe_addr(uintptr_t a, char *out, size_t n) {
    uintptr_t st = 0;
    const alloc_rec *r = find_alloc(a, &st);
    if (r)
        snprintf(out, n, "byte %zu of device allocation #%zu (%zu bytes)", (size_t)(a - st), r->id, r->size);
    else if (st && g_allocs.find(st) != g_allocs.end()) {
        const alloc_rec &p = g_allocs.find(st)->second;
        snprintf(out, n, "%zu bytes past the end of device allocation #%zu (%zu bytes)", (size_t)(a - st - p.size),
                 p.id, p.size);
    }
    else
        snprintf(out, n, "device memory that is not allocated (freed, or never handed out)");
}

static void segv_handler(int sig, siginfo_t *si, void *uc) {
    uintptr_t a = (uintptr_t)si->si_addr;
    if (in_arena(a)) {
        char what[200];
        describe_addr(a, what, sizeof what);
        int wr = 0;
#if defined(__x86_64__)
        wr = (int)((((ucontext_t *)uc)->uc_mcontext.gregs[REG_ERR] >> 1) & 1);
#endif
        char msg[400];
        int len = snprintf(msg, sizeof msg,
                           "cusim: host code %s device memory at %p (%s): device memory is not host memory "
                           "(a host memcpy or dereference of a device pointer; it faults on a GPU too)\n",
                           wr ? "wrote" : "read", (void *)a, what);
        if (write(2, msg, (size_t)len) < 0) _exit(139);
        void *bt[32];
        int nb = backtrace(bt, 32);
        backtrace_symbols_fd(bt, nb, 2);
        _exit(139);
    }
    /* not ours: the previous handler (or the default) takes it */
    sigaction(SIGSEGV, &g_old_segv, NULL);
    (void)sig;
    (void)uc;
}

static pthread_t g_first_thread; /* the thread of the first API call */

static void arena_init(void) {
    if (g_arena) return;
    g_first_thread = pthread_self();
    void *p = mmap(NULL, ARENA_BYTES, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "cusim: cannot reserve %llu bytes of address space for device memory\n", ARENA_BYTES);
        abort();
    }
    g_arena = (char *)p;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = segv_handler;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_old_segv);
    const char *tr = getenv("SKV_CUSIM_TRACE");
    if (tr && *tr) {
        char path[600];
        snprintf(path, sizeof path, "%s.%d", tr, (int)getpid());
        g_trace = fopen(path, "w");
    }
    const char *da = getenv("SKV_CUSIM_DUMP_AT");
    if (da && *da && g_trace) {
        g_dump_at = strtoull(da, NULL, 10);
        char path[600];
        snprintf(path, sizeof path, "%s.dump.%d", tr, (int)getpid());
        g_dump = fopen(path, "w");
    }
    const char *wa = getenv("SKV_CUSIM_WATCH");
    if (wa && *wa) g_watch = (size_t)strtoull(wa, NULL, 10);
    const char *gp = getenv("SKV_CUSIM_GAP");
    if (gp && *gp) g_gap = ((size_t)strtoull(gp, NULL, 10) + 255) / 256 * 256;
    const char *ru = getenv("SKV_CUSIM_REUSE");
    if (ru && *ru == '0') g_reuse = 0;
    const char *e = getenv("SKV_CUSIM_DEVICE_BYTES");
    if (e && *e) g_device_bytes = (size_t)strtoull(e, NULL, 10);
    const char *o = getenv("SKV_CUSIM_ORDER");
    if (o && *o) {
        if (!strcmp(o, "eager")) g_order = CUSIM_ORDER_EAGER;
        else if (!strncmp(o, "random", 6)) {
            g_order = CUSIM_ORDER_RANDOM;
            g_rng.seed(o[6] == ':' ? (unsigned)atoi(o + 7) : 1u);
        }
    }
}

static void *arena_alloc(size_t bytes, int async) {
    arena_init();
    size_t need = (bytes + 255) / 256 * 256 + g_gap; /* a gap after each allocation */
    uintptr_t at = 0;
    for (auto it = g_holes.begin(); it != g_holes.end(); ++it)
        if (it->second >= need) {
            at = it->first;
            size_t left = it->second - need;
            g_holes.erase(it);
            if (left) g_holes[at + need] = left;
            break;
        }
    if (!at) {
        if (g_hwm + need > ARENA_BYTES) return NULL;
        at = (uintptr_t)g_arena + g_hwm;
        size_t old = g_hwm;
        g_hwm += need;
        if (g_open) mprotect(g_arena + old, need, PROT_READ | PROT_WRITE);
    }
    g_allocs[at] = alloc_rec{bytes, ++g_alloc_id, async, 0};
    if (g_watch && g_alloc_id == g_watch)
    {
        fprintf(stderr, "cusim watch: #%zu allocated (%zu bytes) after run %llu\n", g_watch, bytes,
                (unsigned long long)g_runs);
        void *bt[16];
        backtrace_symbols_fd(bt, backtrace(bt, 16), 2);
    }
    /* new device memory holds garbage, as on a GPU: a NaN pattern, so a
     * kernel that reads what nobody wrote gives NaN, not a lucky zero */
    dev_open();
    memset((void *)at, 0xff, bytes);
    dev_close();
    g_cnt.device_bytes += bytes;
    if (g_cnt.device_bytes > g_cnt.device_peak) g_cnt.device_peak = g_cnt.device_bytes;
    g_cnt.allocs++;
    return (void *)at;
}

static void arena_free(uintptr_t at) {
    auto it = g_allocs.find(at);
    size_t need = (it->second.size + 255) / 256 * 256 + g_gap;
    if (!it->second.free_queued) g_cnt.device_bytes -= it->second.size; /* (else counted free when queued) */
    g_cnt.frees++;
    g_hit_lo = g_hit_hi = 0;
    g_allocs.erase(it);
    if (need >= (64u << 10)) {
        /* give the pages back: only those wholly inside the freed range (a
         * page it shares with a neighbour keeps the neighbour's bytes) */
        uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE), lo = (at + pg - 1) & ~(pg - 1), hi = (at + need) & ~(pg - 1);
        if (hi > lo) madvise((void *)lo, hi - lo, MADV_DONTNEED);
    }
    if (!g_reuse) return; /* never handed out again: a stale read finds no live allocation */
    /* coalesce with the neighbouring holes */
    auto nx = g_holes.lower_bound(at);
    if (nx != g_holes.end() && nx->first == at + need) {
        need += nx->second;
        g_holes.erase(nx);
    }
    auto pv = g_holes.lower_bound(at);
    if (pv != g_holes.begin()) {
        --pv;
        if (pv->first + pv->second == at) {
            pv->second += need;
            return;
        }
    }
    g_holes[at] = need;
}

/* pinned host memory: start -> (bytes, mapped) */
struct pinned_rec {
    size_t size;
    int mapped;
};
static std::map<uintptr_t, pinned_rec> g_pinned;

static const pinned_rec *find_pinned(uintptr_t a, size_t n) {
    auto it = g_pinned.upper_bound(a);
    if (it == g_pinned.begin()) return NULL;
    --it;
    if (a - it->first < it->second.size && a + n - it->first <= it->second.size) return &it->second;
    return NULL;
}

int device_range(const void *p, size_t n, const char *call, const char *what) {
    uintptr_t a = (uintptr_t)p, st = 0;
    if (n == 0) return 1;
    if (in_arena(a)) {
        const alloc_rec *r = find_alloc(a, &st);
        if (r && a + n - st <= r->size) return 1;
        char d[200];
        describe_addr(r ? a + n - 1 : a, d, sizeof d);
        fault(cudaErrorIllegalAddress, "%s: %s [%p, +%zu) is outside device memory: %s", call, what, p, n, d);
        return 0;
    }
    const pinned_rec *h = find_pinned(a, n);
    if (h && h->mapped) return 1;
    fault(cudaErrorIllegalAddress, "%s: %s %p (%zu bytes) is host memory%s, not device memory", call, what, p, n,
          h ? " (pinned but not mapped)" : "");
    return 0;
}

/* ---------------------------------------------------------------------
 * Streams, events, held work and graphs.
 * ------------------------------------------------------------------- */

struct op;
} /* namespace cusim */

/* Stream capture (CUDA's rules, as far as this runtime models them): a
 * capture begins on an origin stream; work queued there, and on any stream
 * that waits on an event recorded in the capture (a fork), becomes the
 * graph's nodes instead of running, each depending on the nodes its stream
 * had captured last (its tail) and on the tails of the events it waited on.
 * The capture ends on the origin stream, after every forked stream joined
 * back (the origin waited on an event recorded after its last node).
 * Waiting for a capturing stream or a captured event, a device-wide sync,
 * an allocation while a capture of the global mode runs, a copy to or from
 * pageable memory, a stream-ordered alloc or free (graph memory nodes are
 * not modelled), or a wait that would join two captures or pull in work
 * from outside invalidate the capture: the call fails with CUDA's error and
 * every later capture call with cudaErrorStreamCaptureInvalidated; ending
 * it gives no graph. */
struct cusim_stream {
    std::deque<cusim::op *> q;
    uint64_t issued = 0, done = 0; /* tickets: op n of the stream is ticket n */
    int nonblocking = 0, legacy = 0;
    cusim_graph *capture = nullptr; /* the capture this stream records into */
    std::vector<int> tail;          /* its nodes the next one depends on */
};
struct cusim_event {
    cusim_stream *s = nullptr;
    uint64_t ticket = 0;
    int timing = 1;
    double t = 0;
    uint64_t capture_id = 0;        /* last recorded in that capture (0: not in one) */
    std::vector<int> tail;          /* the capturing stream's tail when recorded */
};
struct cusim_graph {
    std::vector<cusim::op *> ops;    /* the nodes, in capture order */
    std::vector<std::vector<int>> deps; /* each node's dependencies (node indices, in edge order) */
    int kernels = 0;
    uint64_t id = 0;                 /* the capture's id while it runs */
    cusim_stream *origin = nullptr;
    int mode = 0;
    cudaError_t invalid = cudaSuccess; /* why the capture was invalidated */
};
/* One node of an executable graph: what it runs and what
 * cudaGraphExecUpdate compares. */
struct cusim_exec_node {
    int kind;
    std::string name;
    std::function<void()> fn;
    const void *func;   /* a kernel's function */
    char mem_src, mem_dst; /* a copy's ends: 'd' device, 'p' pinned, 'h' pageable */
    int twod;           /* a 2D memset or copy */
    size_t width, height;
};
struct cusim_graph_exec {
    std::vector<cusim_exec_node> nodes;
    std::vector<std::vector<int>> deps;
    int kernels = 0;
};

namespace cusim {

enum op_kind { OP_KERNEL, OP_COPY, OP_MEMSET, OP_RECORD, OP_WAIT, OP_LIB, OP_FREE, OP_GRAPH };
struct op {
    int kind;
    std::string name;
    std::function<void()> fn;
    std::vector<std::pair<cusim_stream *, uint64_t>> deps;
    cusim_event *ev = nullptr; /* OP_RECORD */
    uint64_t ticket = 0;
    /* as a graph node (cusim_exec_node) */
    const void *func = nullptr;
    char mem_src = 0, mem_dst = 0;
    int twod = 0;
    size_t width = 0, height = 0;
};

static cusim_stream g_legacy_s;
static std::vector<cusim_stream *> g_streams; /* every live stream, the legacy one first */
/* every live event: a vector never destroyed, so that what the process
 * still holds at exit stays reachable (as the device's own state would) */
static std::vector<cusim_event *> &g_events = *new std::vector<cusim_event *>;
static size_t g_held;

static cusim_stream *S(cudaStream_t s) {
    if (g_streams.empty()) {
        g_legacy_s.legacy = 1;
        g_streams.push_back(&g_legacy_s);
    }
    if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) return &g_legacy_s;
    return s;
}

static int runnable(const op *o) {
    for (auto &d : o->deps)
        if (d.first->done < d.second) return 0;
    return 1;
}

static void run_op(cusim_stream *s) {
    op *o = s->q.front();
    s->q.pop_front();
    g_held--;
    double t0 = now_s();
    dev_open();
    if (o->kind == OP_RECORD) {
        o->ev->t = g_clock;
    } else if (o->fn && g_sticky == cudaSuccess) {
        o->fn();
    }
    dev_close();
    g_clock += now_s() - t0 + 1e-6; /* every op takes at least a microsecond */
    s->done = o->ticket;
    delete o;
}

/* A stream whose head can run, on the way to s's head: s itself, or the
 * stream one of its head's waits is blocked on (as late as they allow). */
static cusim_stream *next_for(cusim_stream *s, int depth) {
    if (s->q.empty() || depth > 64) return NULL;
    op *o = s->q.front();
    for (auto &d : o->deps)
        if (d.first->done < d.second) return next_for(d.first, depth + 1);
    return s;
}

static cusim_stream *pick_random(void) {
    std::vector<cusim_stream *> c;
    for (cusim_stream *s : g_streams)
        if (!s->q.empty() && runnable(s->q.front())) c.push_back(s);
    if (c.empty()) return NULL;
    return c[g_rng() % c.size()];
}

/* Runs held work until s has run ticket t (s NULL: until nothing is held). */
static void run_until(cusim_stream *s, uint64_t t) {
    for (;;) {
        if (s ? s->done >= t : g_held == 0) return;
        cusim_stream *n = NULL;
        if (g_order == CUSIM_ORDER_RANDOM) {
            n = pick_random();
        } else if (s) {
            n = next_for(s, 0);
        } else {
            /* everything: the newest stream first, each as far as it goes */
            for (size_t i = g_streams.size(); i-- > 0 && !n;) n = next_for(g_streams[i], 0);
        }
        if (!n) {
            fault(cudaErrorLaunchFailure, "held stream work cannot run: a wait on an event that is never recorded");
            return;
        }
        run_op(n);
    }
}

static void trim_held(void) {
    while (g_held > HELD_MAX / 2) {
        cusim_stream *n = pick_random();
        if (!n) return;
        run_op(n);
    }
}

/* ---- captures ---- */

static uint64_t g_capture_ids;
static std::vector<cusim_graph *> g_captures; /* the captures running */

static cusim_graph *active_capture(uint64_t id) {
    for (cusim_graph *g : g_captures)
        if (g->id == id) return g;
    return nullptr;
}

/* Invalidates capture g for err (the first reason stays) and returns err. */
static cudaError_t capture_fail(cusim_graph *g, cudaError_t err, const char *what) {
    if (g->invalid == cudaSuccess) {
        g->invalid = err;
        fprintf(stderr, "cusim: %s during a stream capture: the capture is invalidated (%s)\n", what,
                cudaGetErrorName(err));
    }
    return set_error(err);
}

/* A call that CUDA refuses while any capture runs (a device-wide sync), or
 * while one of a mode other than relaxed runs (unsafe == 1: an allocation
 * outside stream order): every such capture is invalidated. */
static cudaError_t capture_forbid(const char *what, int unsafe) {
    cudaError_t e = cudaSuccess;
    for (cusim_graph *g : g_captures)
        if (!unsafe || g->mode != cudaStreamCaptureModeRelaxed) e = capture_fail(g, cudaErrorStreamCaptureUnsupported, what);
    return e;
}

/* cudaSuccess, or the error of queueing on s while its capture is
 * invalidated. */
static cudaError_t capture_ok(cusim_stream *s) {
    if (s->capture && s->capture->invalid != cudaSuccess) return set_error(cudaErrorStreamCaptureInvalidated);
    return cudaSuccess;
}

/* Ends capture g on every stream that records into it and frees it
 * (keep: the graph is returned). */
static void capture_end(cusim_graph *g, int keep) {
    for (cusim_stream *o : g_streams)
        if (o->capture == g) {
            o->capture = nullptr;
            o->tail.clear();
        }
    g_captures.erase(std::remove(g_captures.begin(), g_captures.end(), g), g_captures.end());
    g->id = 0;
    if (!keep) {
        for (op *o : g->ops) delete o;
        delete g;
    }
}

/* Queues o on s (or records it into s's capture as a node after s's tail). */
static void enqueue(cusim_stream *s, op *o) {
    if (s->capture) {
        cusim_graph *g = s->capture;
        if (g->invalid != cudaSuccess) {
            delete o;
            return;
        }
        g->ops.push_back(o);
        g->deps.push_back(s->tail);
        s->tail.assign(1, (int)g->ops.size() - 1);
        if (o->kind == OP_KERNEL) {
            g->kernels++;
            g_cnt.captured_kernels++;
        }
        return;
    }
    if (s->legacy) {
        /* the legacy stream would wait for a capturing blocking stream */
        for (cusim_graph *g : g_captures)
            for (cusim_stream *b : g_streams)
                if (b->capture == g && !b->nonblocking)
                    capture_fail(g, cudaErrorStreamCaptureImplicit, "work on the legacy stream");
    }
    if (s->legacy) {
        for (cusim_stream *b : g_streams)
            if (b != s && !b->nonblocking && b->issued > b->done) o->deps.push_back({b, b->issued});
    } else if (!s->nonblocking && g_legacy_s.issued > g_legacy_s.done) {
        o->deps.push_back({&g_legacy_s, g_legacy_s.issued});
    }
    o->ticket = ++s->issued;
    s->q.push_back(o);
    g_held++;
    if (g_order == CUSIM_ORDER_EAGER) run_until(s, o->ticket);
    else if (g_held > HELD_MAX) trim_held();
}

static op *new_op(int kind, const char *name, std::function<void()> fn) {
    op *o = new op;
    o->kind = kind;
    o->name = name ? name : "";
    o->fn = std::move(fn);
    return o;
}

cudaError_t enqueue_lib(cudaStream_t st, const char *name, std::function<void()> fn) {
    STICKY();
    cusim_stream *s = S(st);
    if (capture_ok(s) != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    g_cnt.lib_calls++;
    enqueue(s, new_op(OP_LIB, name, std::move(fn)));
    return cudaSuccess;
}

static void note_sync(uint64_t *which) {
    (*which)++;
    g_cnt.host_syncs++;
}

cudaError_t host_wait(cudaStream_t st) {
    cusim_stream *s = S(st);
    if (s->capture) return capture_fail(s->capture, cudaErrorStreamCaptureUnsupported, "a host result of a library call");
    note_sync(&g_cnt.blocking_copies);
    run_until(s, s->issued);
    return g_sticky;
}

/* ---------------------------------------------------------------------
 * Shared memory: the static variables' names and bounds (from the
 * executable's symbol table), the race checker's shadow.
 * ------------------------------------------------------------------- */

struct shared_var {
    uintptr_t lo;
    size_t size;
    std::string name;
    int guard;
};
static std::vector<shared_var> g_svars;
static int g_svars_read;

static void read_shared_vars(void) {
    if (g_svars_read) return;
    g_svars_read = 1;
    if (!__start_cusim_shared || __start_cusim_shared == __stop_cusim_shared) return;
    FILE *f = fopen("/proc/self/exe", "rb");
    if (!f) return;
    std::vector<char> img;
    char buf[1 << 16];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) img.insert(img.end(), buf, buf + n);
    fclose(f);
    if (img.size() < sizeof(Elf64_Ehdr)) return;
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img.data();
    if (memcmp(eh->e_ident, ELFMAG, SELFMAG) || eh->e_shoff + (size_t)eh->e_shnum * sizeof(Elf64_Shdr) > img.size())
        return;
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(img.data() + eh->e_shoff);
    const char *shstr = img.data() + sh[eh->e_shstrndx].sh_offset;
    int sec = -1;
    for (int i = 0; i < eh->e_shnum; i++)
        if (!strcmp(shstr + sh[i].sh_name, "cusim_shared")) sec = i;
    if (sec < 0) return;
    uintptr_t bias = (uintptr_t)__start_cusim_shared - sh[sec].sh_addr;
    for (int i = 0; i < eh->e_shnum; i++) {
        if (sh[i].sh_type != SHT_SYMTAB) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(img.data() + sh[i].sh_offset);
        size_t ns = sh[i].sh_size / sizeof(Elf64_Sym);
        const char *str = img.data() + sh[sh[i].sh_link].sh_offset;
        for (size_t j = 0; j < ns; j++) {
            if (sym[j].st_shndx != sec || ELF64_ST_TYPE(sym[j].st_info) != STT_OBJECT) continue;
            const char *nm = str + sym[j].st_name;
            int st = 0;
            char *dm = abi::__cxa_demangle(nm, NULL, NULL, &st);
            shared_var v;
            v.lo = sym[j].st_value + bias;
            v.size = sym[j].st_size;
            v.name = dm ? dm : nm;
            v.guard = strstr(nm, "cusim_guard_") != NULL;
            free(dm);
            g_svars.push_back(v);
        }
    }
    std::sort(g_svars.begin(), g_svars.end(), [](const shared_var &a, const shared_var &b) { return a.lo < b.lo; });
}

static const shared_var *find_svar(uintptr_t a) {
    auto it = std::upper_bound(g_svars.begin(), g_svars.end(), a,
                               [](uintptr_t x, const shared_var &v) { return x < v.lo; });
    if (it == g_svars.begin()) return NULL;
    --it;
    return a - it->lo < it->size ? &*it : NULL;
}
static const shared_var *svar_before(uintptr_t a) {
    const shared_var *best = NULL;
    for (const shared_var &v : g_svars)
        if (!v.guard && v.lo <= a) best = &v;
    return best;
}

/* The race checker's record of 2 bytes of shared memory in this block. */
struct cell {
    uint32_t gen;
    int32_t w_tid;
    uint32_t w_bar, w_wep;
    int32_t r_tid; /* -1 none, -2 several */
    int32_t r_warp; /* the readers' warp, -1 when several warps */
    uint32_t r_bar, r_wep;
};

/* ---------------------------------------------------------------------
 * Fibers.
 * ------------------------------------------------------------------- */

struct stack_t_ {
    char *lo;
    size_t size;
};
static std::vector<stack_t_> g_stack_pool;

static stack_t_ stack_get(void) {
    if (!g_stack_pool.empty()) {
        stack_t_ s = g_stack_pool.back();
        g_stack_pool.pop_back();
        return s;
    }
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    char *p = (char *)mmap(NULL, STACK_BYTES + pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "cusim: out of memory for a thread's stack\n");
        abort();
    }
    mprotect(p, pg, PROT_NONE); /* guard page below the stack */
    return stack_t_{p + pg, STACK_BYTES};
}

enum { T_NEW, T_RUN, T_BAR, T_WARP, T_DONE };

struct sim_thread {
    thread_state st;
    int state;
    stack_t_ stack;
    void *sp;
#if !defined(__x86_64__)
    ucontext_t uc;
#endif
    void *fake; /* the sanitizer's fake stack */
    /* at a warp operation */
    int wkind, warg, wwidth, bar_pred;
    unsigned wmask;
    uint64_t wval, wres;
    const char *wwhat;
    /* cp.async (the pipeline stand-ins): copies issued and not yet waited
     * for, each with the number of its commit group */
    struct pending_copy {
        void *dst;
        const void *src;
        size_t n, zfill;
        uint32_t group;
    };
    std::vector<pending_copy> cp;
    uint32_t cp_group; /* commits so far: the group a copy issued now joins */
};

struct block_run {
    const char *kernel;
    std::vector<sim_thread> th;
    int n, warps;
    uint32_t bar;                 /* barriers passed by the block */
    std::vector<uint32_t> wep;    /* __syncwarp releases per warp */
    std::vector<uint32_t> xep;    /* warp_exchange releases per warp (not ordering points) */
    void *sched_sp;
#if !defined(__x86_64__)
    ucontext_t sched_uc;
#endif
    void *sched_fake;
    const void *sched_bottom;
    size_t sched_size;
    int aborted;
    char *dyn;
    size_t dyn_n;
    uint32_t gen;
    std::vector<cell> dyn_shadow;    /* a cell per 2 bytes of dynamic shared memory */
    std::vector<const shared_var *> touched; /* static shared variables this launch used */
    uintptr_t params_lo;
    size_t params_n;
    void (*entry)(void *);
    void *closure;
};
static block_run *g_blk;
static thread_local int g_in_kernel;
static uint32_t g_gen;
static sim_thread *g_running;

extern "C" void cusim_swap(void **save, void *to);
#if defined(__x86_64__)
/* Saves the callee-saved registers, MXCSR and the x87 control word on the
 * current stack, stores its pointer in *save, and resumes `to`. */
__asm__(".text\n"
        ".globl cusim_swap\n"
        ".type cusim_swap,@function\n"
        "cusim_swap:\n"
        "  pushq %rbp\n  pushq %rbx\n  pushq %r12\n  pushq %r13\n  pushq %r14\n  pushq %r15\n"
        "  subq $8, %rsp\n  stmxcsr (%rsp)\n  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n  fldcw 4(%rsp)\n  addq $8, %rsp\n"
        "  popq %r15\n  popq %r14\n  popq %r13\n  popq %r12\n  popq %rbx\n  popq %rbp\n"
        "  ret\n"
        ".size cusim_swap, .-cusim_swap\n"
        ".globl cusim_tramp\n"
        ".type cusim_tramp,@function\n"
        "cusim_tramp:\n"
        "  movq %r12, %rdi\n  callq *%r13\n  ud2\n"
        ".size cusim_tramp, .-cusim_tramp\n");
extern "C" void cusim_tramp(void);
#endif

static void fiber_main(void *arg);

static void to_fiber(sim_thread *t) {
    block_run *b = g_blk;
    g_cur = &t->st;
    g_running = t;
    if (__sanitizer_start_switch_fiber) __sanitizer_start_switch_fiber(&b->sched_fake, t->stack.lo, t->stack.size);
#if defined(__x86_64__)
    cusim_swap(&b->sched_sp, t->sp);
#else
    swapcontext(&b->sched_uc, &t->uc);
#endif
    if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(b->sched_fake, NULL, NULL);
    g_running = NULL;
}

/* From the running fiber back to the block's scheduler (done: for good). */
static void to_sched(int done) {
    block_run *b = g_blk;
    sim_thread *t = g_running;
    if (__sanitizer_start_switch_fiber)
        __sanitizer_start_switch_fiber(done ? NULL : &t->fake, b->sched_bottom, b->sched_size);
#if defined(__x86_64__)
    cusim_swap(&t->sp, b->sched_sp);
#else
    swapcontext(&t->uc, &b->sched_uc);
#endif
    if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(t->fake, NULL, NULL);
}

static void fiber_start(sim_thread *t) {
    t->stack = stack_get();
#if defined(__x86_64__)
    uintptr_t top = ((uintptr_t)t->stack.lo + t->stack.size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)(top - 80);
    uint32_t *ctl = (uint32_t *)sp;
    ctl[0] = 0x1F80; /* MXCSR */
    ctl[1] = 0x037F; /* x87 control word */
    sp[1] = 0;                    /* r15 */
    sp[2] = 0;                    /* r14 */
    sp[3] = (uint64_t)&fiber_main; /* r13 */
    sp[4] = (uint64_t)t;           /* r12 */
    sp[5] = 0;                    /* rbx */
    sp[6] = 0;                    /* rbp */
    sp[7] = (uint64_t)&cusim_tramp;
    t->sp = sp;
#else
    getcontext(&t->uc);
    t->uc.uc_stack.ss_sp = t->stack.lo;
    t->uc.uc_stack.ss_size = t->stack.size;
    t->uc.uc_link = NULL;
    makecontext(&t->uc, (void (*)(void))fiber_main, 1, t);
#endif
    t->state = T_RUN;
}

static void fiber_main(void *arg) {
    sim_thread *t = (sim_thread *)arg;
    if (__sanitizer_finish_switch_fiber) __sanitizer_finish_switch_fiber(NULL, &g_blk->sched_bottom, &g_blk->sched_size);
    g_blk->entry(g_blk->closure);
    t->state = T_DONE;
    to_sched(1);
    abort(); /* never resumed */
}

/* A fault inside a kernel: reported, and the running fiber leaves for
 * good (the launch stops; the sticky error tells the host). */
static void kernel_fault(cudaError_t err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void kernel_fault(cudaError_t err, const char *fmt, ...) {
    char buf[900];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    block_run *b = g_blk;
    sim_thread *t = g_running;
    g_in_kernel = 0;
    if (t)
        fault(err, "kernel %s, block (%u,%u,%u), thread (%u,%u,%u): %s", b->kernel, g_block_idx.x, g_block_idx.y,
              g_block_idx.z, t->st.tid.x, t->st.tid.y, t->st.tid.z, buf);
    else
        fault(err, "kernel %s, block (%u,%u,%u): %s", b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, buf);
    b->aborted = 1;
    g_in_kernel = 1;
    if (t) {
        t->state = T_DONE;
        to_sched(1);
        abort();
    }
}

/* Whether an earlier access by thread u (at barrier count bar, its warp's
 * count wep) is ordered before the running thread's access now. */
static int ordered(const block_run *b, const sim_thread *t, int u, uint32_t bar, uint32_t wep) {
    if (u == t->st.linear) return 1;
    if (bar < b->bar) return 1;
    if (u / 32 == t->st.warp && wep < b->wep[(size_t)t->st.warp]) return 1;
    return 0;
}

static void shared_name(uintptr_t a, int dyn, char *out, size_t n) {
    if (dyn) {
        snprintf(out, n, "dynamic shared memory, byte %zu of %zu", (size_t)(a - (uintptr_t)g_blk->dyn),
                 g_blk->dyn_n);
        return;
    }
    const shared_var *v = find_svar(a);
    if (v) snprintf(out, n, "__shared__ %s, byte %zu of %zu", v->name.c_str(), (size_t)(a - v->lo), v->size);
    else snprintf(out, n, "__shared__ memory at %p", (void *)a);
}

static std::vector<cell> g_static_shadow; /* a cell per 2 bytes of the cusim_shared section */

static void shared_access(uintptr_t a, size_t n, int w, int dyn) {
    block_run *b = g_blk;
    sim_thread *t = g_running;
    if (!t) return;
    uintptr_t base = dyn ? (uintptr_t)b->dyn : (uintptr_t)__start_cusim_shared & ~(uintptr_t)1;
    std::vector<cell> &sh = dyn ? b->dyn_shadow : g_static_shadow;
    for (uintptr_t x = a & ~(uintptr_t)1; x < a + n; x += 2) {
        size_t ci = (size_t)(x - base) / 2;
        if (ci >= sh.size()) sh.resize(ci + 1, cell{});
        cell &c = sh[ci];
        if (c.gen != b->gen) {
            if (w == 2) continue; /* nothing to race with */
            if (!w) {
                char nm[300];
                shared_name(x, dyn, nm, sizeof nm);
                kernel_fault(cudaErrorLaunchFailure,
                             "reads %s, which no thread of the block has written yet: a missing __syncthreads "
                             "before the read (the writer has not run), or shared memory never initialized",
                             nm);
            }
            c.gen = b->gen;
            c.w_tid = -1;
            c.r_tid = -1;
        }
        uint32_t wep = b->wep[(size_t)t->st.warp];
        if (c.w_tid >= 0 && !ordered(b, t, c.w_tid, c.w_bar, c.w_wep)) {
            char nm[300];
            shared_name(x, dyn, nm, sizeof nm);
            kernel_fault(cudaErrorLaunchFailure,
                         "shared-memory race: %s %s, which thread %d wrote with no __syncthreads (or __syncwarp "
                         "within a warp) between: a missing barrier",
                         w ? "writes" : "reads", nm, c.w_tid);
        }
        if (w) {
            if (c.r_tid != -1 && c.r_bar == b->bar) {
                int bad;
                if (c.r_tid >= 0) bad = !ordered(b, t, c.r_tid, c.r_bar, c.r_wep);
                else bad = !(c.r_warp == t->st.warp && c.r_wep < wep);
                if (bad) {
                    char nm[300];
                    shared_name(x, dyn, nm, sizeof nm);
                    kernel_fault(cudaErrorLaunchFailure,
                                 "shared-memory race: writes %s, which %s read with no __syncthreads between: a "
                                 "missing barrier",
                                 nm, c.r_tid >= 0 ? "another thread" : "other threads");
                }
            }
            if (w == 2) continue; /* checked, not recorded (cp.async: the copy lands at the wait) */
            c.w_tid = t->st.linear;
            c.w_bar = b->bar;
            c.w_wep = wep;
            c.r_tid = -1;
        } else {
            if (c.r_tid == -1 || c.r_bar < b->bar || c.r_tid == t->st.linear) {
                if (c.r_tid != t->st.linear || c.r_bar < b->bar) {
                    c.r_tid = t->st.linear;
                    c.r_warp = t->st.warp;
                }
                c.r_bar = b->bar;
                c.r_wep = wep;
            } else {
                if (c.r_warp != t->st.warp) c.r_warp = -1;
                c.r_tid = -2;
                c.r_wep = c.r_wep > wep ? c.r_wep : wep;
            }
        }
    }
}

static void note_touched(const shared_var *v) {
    for (const shared_var *x : g_blk->touched)
        if (x == v) return;
    g_blk->touched.push_back(v);
}

/* Every load and store of an instrumented kernel file arrives here. */
static void access(const void *p, size_t n, int w) {
    uintptr_t a = (uintptr_t)p;
    if (!g_in_kernel) {
        if (__builtin_expect(in_arena(a) && !g_open, 0)) {
            char d[200];
            describe_addr(a, d, sizeof d);
            fault(cudaErrorIllegalAddress,
                  "host code %s device memory at %p (%s): a host memcpy or dereference of a device pointer",
                  w ? "wrote" : "read", p, d);
            abort();
        }
        return;
    }
    block_run *b = g_blk;
    sim_thread *t = g_running;
    if (!b || !t) return;
    /* the thread's own stack: locals, parameters */
    if (a - (uintptr_t)t->stack.lo < t->stack.size) return;
    /* A 2-, 4- or 8-byte access (an f16/bf16, a float or an int, a double, a
     * pointer or a size_t) off its size's alignment faults on a GPU. The
     * kernel files are built without vectorizing (SIM_KFLAGS), so the host
     * compiler does not join aligned floats into one 8-byte access that
     * need only be 4-byte aligned. 16-byte ones are left to vec_ld/vec_st. */
    if (__builtin_expect((n == 2 || n == 4 || n == 8) && (a & (n - 1)), 0))
        kernel_fault(cudaErrorMisalignedAddress, "%s %zu bytes at %p: not %zu-byte aligned (misaligned address)",
                     w ? "writes" : "reads", n, p, n);
    if (b->dyn && a - (uintptr_t)b->dyn < b->dyn_n + 64) {
        if (a + n - (uintptr_t)b->dyn > b->dyn_n)
            kernel_fault(cudaErrorIllegalAddress,
                         "%s %zu bytes at byte %zu of dynamic shared memory, which has %zu bytes (the launch's "
                         "third parameter): out of bounds",
                         w ? "writes" : "reads", n, (size_t)(a - (uintptr_t)b->dyn), b->dyn_n);
        shared_access(a, n, w, 1);
        return;
    }
    /* the section of static __shared__ variables, and 64 bytes either side
     * (an index past the last variable lands there) */
    if (__start_cusim_shared &&
        a + 64 - (uintptr_t)__start_cusim_shared < (uintptr_t)(__stop_cusim_shared - __start_cusim_shared) + 128) {
        const shared_var *v = find_svar(a);
        const shared_var *e = find_svar(a + n - 1);
        if (!v || v->guard || e != v) {
            const shared_var *pv = svar_before(a);
            if (pv)
                kernel_fault(cudaErrorIllegalAddress,
                             "%s __shared__ %s out of bounds: byte %zu of a %zu-byte array (index %zu of %zu)",
                             w ? "writes" : "reads", pv->name.c_str(), (size_t)(a - pv->lo), pv->size,
                             (size_t)(a - pv->lo) / n, pv->size / n);
            else
                kernel_fault(cudaErrorIllegalAddress, "%s shared memory at %p outside every __shared__ variable",
                             w ? "writes" : "reads", p);
        }
        note_touched(v);
        shared_access(a, n, w, 0);
        return;
    }
    if (g_trace && !w && (in_arena(a) || find_pinned(a, n)))
    {
        for (size_t i = 0; i < n; i++) g_load_hash = (g_load_hash ^ ((const unsigned char *)p)[i]) * 1099511628211ull;
        if (g_dump && g_runs + 1 == g_dump_at && n == 4) {
            uintptr_t st = 0;
            const alloc_rec *r = find_alloc(a, &st);
            fprintf(g_dump, "%u %zu %zu %.9g\n", g_running->st.linear, r ? r->id : 0, (size_t)(a - st), *(const float *)p);
        }
    }
    if (g_watch && w && in_arena(a)) watch_write(g_blk->kernel, a, n);
    if (in_arena(a)) {
        if (a - g_hit_lo < g_hit_hi - g_hit_lo && a + n <= g_hit_hi) return;
        uintptr_t st = 0;
        const alloc_rec *r = find_alloc(a, &st);
        if (r && a + n - st <= r->size) {
            g_hit_lo = st;
            g_hit_hi = st + r->size;
            return;
        }
        char d[200];
        describe_addr(r ? a + n - 1 : a, d, sizeof d);
        kernel_fault(cudaErrorIllegalAddress, "%s %zu bytes at %p: %s", w ? "writes" : "reads", n, p, d);
    }
    if (a - b->params_lo < b->params_n) return;
    const pinned_rec *h = find_pinned(a, n);
    if (h) {
        if (!h->mapped)
            kernel_fault(cudaErrorIllegalAddress, "%s pinned host memory at %p that was not allocated mapped",
                         w ? "writes" : "reads", p);
        return;
    }
    if (!w && a >= (uintptr_t)__executable_start && a < (uintptr_t)_end) return; /* constants */
    kernel_fault(cudaErrorIllegalAddress,
                 "%s %zu bytes of host memory at %p: a host pointer passed to a kernel (only device memory and "
                 "mapped pinned memory are reachable)",
                 w ? "writes" : "reads", n, p);
}

static void watch_write(const char *who, uintptr_t a, size_t n) {
    uintptr_t st = 0;
    const alloc_rec *r = find_alloc(a, &st);
    static uint64_t last_run = ~0ull;
    static const char *last_who;
    if (!r || r->id != g_watch) return;
    if (g_in_kernel && last_run == g_runs && last_who == who) return; /* a kernel's: once a launch */
    last_run = g_runs;
    last_who = who;
    fprintf(stderr, "cusim watch: after run %llu, %s writes %zu bytes at byte %zu of #%zu\n",
            (unsigned long long)g_runs, who, n, (size_t)(a - st), g_watch);
}

void atomic_note(const void *p, size_t n) {
    if (!g_in_kernel) return;
    int in = g_in_kernel;
    /* bounds only: atomics do not race with each other */
    uintptr_t a = (uintptr_t)p;
    if (in_arena(a)) {
        uintptr_t st = 0;
        const alloc_rec *r = find_alloc(a, &st);
        if (!r || a + n - st > r->size) {
            char d[200];
            describe_addr(a, d, sizeof d);
            kernel_fault(cudaErrorIllegalAddress, "atomic on %zu bytes at %p: %s", n, p, d);
        }
    }
    (void)in;
}

void *dyn_smem(void) { return g_blk ? g_blk->dyn : NULL; }

static std::vector<char> g_warp_scratch;
void warp_publish(const void *p, size_t n) {
    size_t at = (size_t)g_running->st.warp * 1024;
    if (g_warp_scratch.size() < at + 1024) g_warp_scratch.resize(at + 1024);
    memcpy(g_warp_scratch.data() + at, p, n < 1024 ? n : 1024);
}
void warp_fetch(void *p, size_t n) {
    size_t at = (size_t)g_running->st.warp * 1024;
    memcpy(p, g_warp_scratch.data() + at, n < 1024 ? n : 1024);
}

/* ---- barriers and warp operations ---- */

static void park(int state) {
    g_running->state = state;
    to_sched(0);
}

void syncthreads(void) {
    g_running->bar_pred = 0;
    park(T_BAR);
}

int syncthreads_count(int pred) {
    sim_thread *t = g_running;
    t->bar_pred = pred != 0;
    park(T_BAR);
    return (int)t->wres;
}

void syncwarp(unsigned mask) { warp_op(0, mask, 0, 0, 32, "__syncwarp"); }

uint64_t warp_op(int kind, unsigned mask, uint64_t value, int arg, int width, const char *what) {
    sim_thread *t = g_running;
    if (!t) return value;
    if (!(mask & (1u << t->st.lane)))
        kernel_fault(cudaErrorLaunchFailure,
                     "%s with mask 0x%08x, which leaves out lane %d, a lane that takes part (the mask must name "
                     "every lane that calls it)",
                     what, mask, t->st.lane);
    if (width < 1 || width > 32 || (width & (width - 1)))
        kernel_fault(cudaErrorLaunchFailure, "%s with width %d (a power of two up to 32)", what, width);
    t->wkind = kind;
    t->wmask = mask;
    t->wval = value;
    t->warg = arg;
    t->wwidth = width;
    t->wwhat = what;
    park(T_WARP);
    return t->wres;
}

void threadfence(void) {}

/* The lanes' all-gather for an instruction's stand-in (cusim_mma.h's
 * mma.sync): each lane gives n bytes, every lane gets the 32 lanes' (lane
 * i's at i*n) once all have arrived. Two buffers a warp, by the parity of
 * the warp's exchanges: a lane that runs on to the next exchange writes the
 * other buffer, and the one after waits for every lane to have read this
 * one. Unlike a shuffle, not a memory-ordering point: mma.sync orders no
 * shared-memory access between lanes. */
static std::vector<char> g_xchg;
void warp_exchange(const void *mine, size_t n, void *all, const char *what) {
    sim_thread *t = g_running;
    if (!t || !g_blk) {
        fault(cudaErrorLaunchFailure, "%s outside a kernel", what);
        abort();
    }
    if (n > 64) kernel_fault(cudaErrorLaunchFailure, "%s exchanges %zu bytes a lane (at most 64)", what, n);
    size_t w = (size_t)t->st.warp, need = (size_t)g_blk->warps * 2 * 2048;
    if (g_xchg.size() < need) g_xchg.resize(need);
    size_t at = (w * 2 + (g_blk->xep[w] & 1)) * 2048;
    memcpy(g_xchg.data() + at + (size_t)t->st.lane * n, mine, n);
    warp_op(W_XCHG, 0xffffffffu, 0, 0, 32, what);
    memcpy(all, g_xchg.data() + at, 32 * n);
}

/* ---- cp.async: __pipeline_memcpy_async / _commit / _wait_prior ----
 * A copy is checked when issued (the source's bounds, the destination's
 * alignment and a write's race check: another thread's unordered access to
 * it is a race whenever the copy lands) and lands when its thread waits for
 * its group: a read before the wait finds the old bytes, or unwritten shared
 * memory (a fault). Copies never waited for never land. */
static int in_shared(uintptr_t a, size_t n) {
    block_run *b = g_blk;
    if (b->dyn && a - (uintptr_t)b->dyn < b->dyn_n && a + n - (uintptr_t)b->dyn <= b->dyn_n) return 1;
    return __start_cusim_shared && a >= (uintptr_t)__start_cusim_shared && a + n <= (uintptr_t)__stop_cusim_shared;
}

void pipeline_copy(void *dst, const void *src, size_t n, size_t zfill) {
    sim_thread *t = g_running;
    if (!t || !g_blk) {
        fault(cudaErrorLaunchFailure, "__pipeline_memcpy_async outside a kernel");
        abort();
    }
    if ((n != 4 && n != 8 && n != 16) || zfill > n)
        kernel_fault(cudaErrorLaunchFailure,
                     "__pipeline_memcpy_async of %zu bytes with zfill %zu (4, 8 or 16 bytes, zfill at most that)", n,
                     zfill);
    if ((uintptr_t)dst % n || (uintptr_t)src % n)
        kernel_fault(cudaErrorIllegalAddress, "__pipeline_memcpy_async of %zu bytes from %p to %p: misaligned", n,
                     src, dst);
    if (!in_shared((uintptr_t)dst, n))
        kernel_fault(cudaErrorIllegalAddress, "__pipeline_memcpy_async to %p, which is not shared memory", dst);
    if (n > zfill) access(src, n - zfill, 0);
    access(dst, n, 2);
    t->cp.push_back(sim_thread::pending_copy{dst, src, n, zfill, t->cp_group});
}

void shared_check(const void *p, size_t n, const char *what) {
    if (!g_running || !g_blk) {
        fault(cudaErrorLaunchFailure, "%s outside a kernel", what);
        abort();
    }
    if ((uintptr_t)p % n) kernel_fault(cudaErrorIllegalAddress, "%s at %p: not %zu-byte aligned", what, p, n);
    if (!in_shared((uintptr_t)p, n)) kernel_fault(cudaErrorIllegalAddress, "%s at %p: not shared memory", what, p);
}

void vec_aligned(const void *p, size_t n, const char *what) {
    if (!g_running || !g_blk) {
        fault(cudaErrorLaunchFailure, "%s outside a kernel", what);
        abort();
    }
    if ((uintptr_t)p % n)
        kernel_fault(cudaErrorMisalignedAddress, "%s at %p: not %zu-byte aligned (misaligned address)", what, p, n);
}

void pipeline_commit(void) {
    if (g_running) g_running->cp_group++;
}

void pipeline_wait_prior(size_t k) {
    sim_thread *t = g_running;
    if (!t) return;
    size_t keep = 0;
    for (size_t i = 0; i < t->cp.size(); i++) {
        sim_thread::pending_copy c = t->cp[i];
        if ((uint64_t)c.group + k < t->cp_group) { /* a committed group older than the newest k */
            access(c.dst, c.n, 1);
            if (c.n > c.zfill) memcpy(c.dst, c.src, c.n - c.zfill);
            if (c.zfill) memset((char *)c.dst + (c.n - c.zfill), 0, c.zfill);
        } else {
            t->cp[keep++] = c;
        }
    }
    t->cp.resize(keep);
}

/* Lets the lanes of warp w that wait at a warp operation go when every
 * lane of their mask has arrived; 1 when some went, -1 on a fault. */
static int release_warp(block_run *b, int w) {
    int base = w * 32, nl = b->n - base < 32 ? b->n - base : 32;
    int went = 0;
    for (int l = 0; l < nl; l++) {
        sim_thread *t = &b->th[(size_t)base + l];
        if (t->state != T_WARP) continue;
        unsigned m = t->wmask;
        int ready = 1;
        for (int j = 0; j < 32; j++) {
            if (!(m & (1u << j))) continue;
            if (j >= nl) {
                g_running = t;
                g_cur = &t->st;
                fault(cudaErrorLaunchFailure,
                      "kernel %s, block (%u,%u,%u): %s in warp %d names lane %d (mask 0x%08x), which the block "
                      "does not have (%d threads)",
                      b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, t->wwhat, w, j, m, b->n);
                return -1;
            }
            sim_thread *u = &b->th[(size_t)base + j];
            if (u->state == T_DONE) {
                fault(cudaErrorLaunchFailure,
                      "kernel %s, block (%u,%u,%u): lane %d of warp %d waits at %s (mask 0x%08x) for lane %d, "
                      "which has exited",
                      b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, l, w, t->wwhat, m, j);
                return -1;
            }
            if (u->state != T_WARP) {
                ready = 0;
                break;
            }
            if (u->wmask != m || u->wkind != t->wkind) {
                fault(cudaErrorLaunchFailure,
                      "kernel %s, block (%u,%u,%u): lanes %d and %d of warp %d meet at %s (mask 0x%08x) and %s "
                      "(mask 0x%08x): divergent warp operations",
                      b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, l, j, w, t->wwhat, m, u->wwhat,
                      u->wmask);
                return -1;
            }
        }
        if (!ready) continue;
        /* every lane of m is here: compute the results */
        unsigned ballot = 0;
        int any = 0, all = 1;
        for (int j = 0; j < 32; j++)
            if (m & (1u << j)) {
                int p = b->th[(size_t)base + j].wval != 0;
                ballot |= (unsigned)p << j;
                any |= p;
                all &= p;
            }
        for (int j = 0; j < 32; j++) {
            if (!(m & (1u << j))) continue;
            sim_thread *u = &b->th[(size_t)base + j];
            int wd = u->wwidth, seg = j & ~(wd - 1), src = j;
            switch (u->wkind) {
            case W_SHFL: src = seg + (u->warg & (wd - 1)); break;
            case W_SHFL_XOR: src = j ^ u->warg; if (src >= seg + wd) src = j; break;
            case W_SHFL_UP: src = j - u->warg; if (src < seg) src = j; break;
            case W_SHFL_DOWN: src = j + u->warg; if (src >= seg + wd) src = j; break;
            default: break;
            }
            if (u->wkind >= W_SHFL && u->wkind <= W_SHFL_XOR) {
                if (src < 0 || src > 31 || !(m & (1u << src))) {
                    fault(cudaErrorLaunchFailure,
                          "kernel %s, block (%u,%u,%u): lane %d of warp %d reads lane %d in %s, which is not in "
                          "the mask 0x%08x",
                          b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, j, w, src, u->wwhat, m);
                    return -1;
                }
                u->wres = b->th[(size_t)base + src].wval;
            } else if (u->wkind == W_BALLOT) {
                u->wres = ballot;
            } else if (u->wkind == W_ANY) {
                u->wres = (uint64_t)any;
            } else if (u->wkind == W_ALL) {
                u->wres = (uint64_t)all;
            }
        }
        /* every warp-wide operation is a meeting point of the warp's lanes:
         * what a lane did before it is done when another lane goes on
         * (the race checker orders accesses across it, as across __syncwarp) */
        for (int j = 0; j < 32; j++)
            if (m & (1u << j)) b->th[(size_t)base + j].state = T_RUN;
        if (t->wkind == W_XCHG) /* an instruction's operand exchange (mma.sync): no memory ordering */
            b->xep[(size_t)w]++;
        else
            b->wep[(size_t)w]++;
        went = 1;
    }
    return went;
}

static void run_block(void) {
    block_run *b = g_blk;
    b->gen = ++g_gen;
    b->bar = 0;
    std::fill(b->wep.begin(), b->wep.end(), 0);
    std::fill(b->xep.begin(), b->xep.end(), 0);

    for (int i = 0; i < b->n; i++) {
        sim_thread &t = b->th[(size_t)i];
        t.state = T_NEW;
        t.fake = NULL;
        t.cp.clear();
        t.cp_group = 0;
    }
    int live = b->n;
    while (live > 0 && !b->aborted) {
        int ran = 0;
        for (int i = 0; i < b->n && !b->aborted; i++) {
            sim_thread *t = &b->th[(size_t)i];
            if (t->state == T_NEW) fiber_start(t);
            if (t->state != T_RUN) continue;
            to_fiber(t);
            ran = 1;
            if (t->state == T_DONE) {
                g_stack_pool.push_back(t->stack);
                t->stack = stack_t_{NULL, 0};
                live--;
            }
        }
        if (b->aborted || live == 0) break;
        if (ran) continue;
        int went = 0;
        for (int w = 0; w < b->warps; w++) {
            int r = release_warp(b, w);
            if (r < 0) {
                b->aborted = 1;
                break;
            }
            went |= r;
        }
        if (b->aborted) break;
        if (went) continue;
        int at_bar = 0, at_warp = 0;
        for (int i = 0; i < b->n; i++) {
            at_bar += b->th[(size_t)i].state == T_BAR;
            at_warp += b->th[(size_t)i].state == T_WARP;
        }
        if (at_bar == live) {
            /* a warp some of whose lanes exited while others wait here diverged */
            for (int w = 0; w < b->warps; w++) {
                int done = 0, bar = 0;
                for (int l = 0; l < 32 && w * 32 + l < b->n; l++) {
                    done += b->th[(size_t)w * 32 + l].state == T_DONE;
                    bar += b->th[(size_t)w * 32 + l].state == T_BAR;
                }
                if (done && bar) {
                    fault(cudaErrorLaunchFailure,
                          "kernel %s, block (%u,%u,%u): %d lanes of warp %d wait at __syncthreads while %d have "
                          "returned: a barrier not every thread of the block reaches (deadlock on a GPU)",
                          b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, bar, w, done);
                    b->aborted = 1;
                    break;
                }
            }
            if (b->aborted) break;
            int count = 0;
            for (int i = 0; i < b->n; i++) count += b->th[(size_t)i].state == T_BAR && b->th[(size_t)i].bar_pred;
            for (int i = 0; i < b->n; i++)
                if (b->th[(size_t)i].state == T_BAR) {
                    b->th[(size_t)i].state = T_RUN;
                    b->th[(size_t)i].wres = (uint64_t)count;
                }
            b->bar++;
            continue;
        }
        fault(cudaErrorLaunchTimeout,
              "kernel %s, block (%u,%u,%u): deadlock: %d threads wait at __syncthreads, %d at a warp operation and "
              "%d have returned (%d threads): a barrier not every thread of the block reaches",
              b->kernel, g_block_idx.x, g_block_idx.y, g_block_idx.z, at_bar, at_warp, b->n - live - 0, b->n);
        b->aborted = 1;
    }
    /* fibers left parked (a fault) are abandoned: their stacks go back */
    for (int i = 0; i < b->n; i++) {
        sim_thread &t = b->th[(size_t)i];
        if (t.stack.lo) {
            g_stack_pool.push_back(t.stack);
            t.stack = stack_t_{NULL, 0};
        }
    }
}

/* ---- launches ---- */

static std::map<const void *, int> g_func_smem; /* cudaFuncAttributeMaxDynamicSharedMemorySize */

cudaError_t func_set_attribute(const void *fn, const char *name, cudaFuncAttribute a, int v) {
    api_lock l;
    (void)name;
    STICKY();
    if (a == cudaFuncAttributeMaxDynamicSharedMemorySize) {
        if (v < 0 || (unsigned)v > LIM_SMEM_OPTIN) {
            fprintf(stderr, "cusim: cudaFuncSetAttribute: %d bytes of dynamic shared memory (at most %u)\n", v,
                    LIM_SMEM_OPTIN);
            return set_error(cudaErrorInvalidValue);
        }
        g_func_smem[fn] = v;
    }
    return cudaSuccess;
}

struct kernel_job {
    std::string name;
    dim3 grid, block;
    size_t smem;
    entry_fn entry;
    std::shared_ptr<void> closure;
    size_t closure_size;
};

static void run_kernel(const kernel_job &k) {
    read_shared_vars();
    block_run b;
    b.kernel = k.name.c_str();
    b.n = (int)(k.block.x * k.block.y * k.block.z);
    b.warps = (b.n + 31) / 32;
    b.th.resize((size_t)b.n);
    b.wep.assign((size_t)b.warps, 0);
    b.xep.assign((size_t)b.warps, 0);
    b.aborted = 0;
    b.dyn_n = k.smem;
    std::vector<char> dyn(k.smem + 64 + 16);
    b.dyn = k.smem ? (char *)(((uintptr_t)dyn.data() + 15) & ~(uintptr_t)15) : NULL;
    b.dyn_shadow.assign(k.smem / 2 + 40, cell{});
    if (g_static_shadow.empty() && __start_cusim_shared)
        g_static_shadow.assign((size_t)(__stop_cusim_shared - __start_cusim_shared) / 2 + 2, cell{});
    b.entry = k.entry;
    b.closure = k.closure.get();
    b.params_lo = (uintptr_t)k.closure.get();
    b.params_n = k.closure_size;
    for (int i = 0; i < b.n; i++) {
        sim_thread &t = b.th[(size_t)i];
        memset(&t, 0, sizeof t);
        t.st.tid.x = (unsigned)i % k.block.x;
        t.st.tid.y = (unsigned)i / k.block.x % k.block.y;
        t.st.tid.z = (unsigned)i / (k.block.x * k.block.y);
        t.st.linear = i;
        t.st.warp = i / 32;
        t.st.lane = i % 32;
    }
    block_run *saved = g_blk;
    g_blk = &b;
    g_block_dim = k.block;
    g_grid_dim = k.grid;
    g_in_kernel = 1;
    for (unsigned z = 0; z < k.grid.z && !b.aborted; z++)
        for (unsigned y = 0; y < k.grid.y && !b.aborted; y++)
            for (unsigned x = 0; x < k.grid.x && !b.aborted; x++) {
                g_block_idx = uint3{x, y, z};
                if (k.smem) memset(b.dyn, 0xA5, k.smem); /* uninitialized, as on a GPU */
                run_block();
            }
    g_in_kernel = 0;
    if (g_trace) fprintf(g_trace, "%llu %s %016llx\n", (unsigned long long)++g_runs, b.kernel,
                         (unsigned long long)g_load_hash);
    g_load_hash = 1469598103934665603ull;
    if (!b.aborted) {
        size_t st = 0;
        for (const shared_var *v : b.touched) st += v->size;
        if (st > LIM_SMEM_STATIC)
            fault(cudaErrorInvalidValue,
                  "kernel %s uses %zu bytes of static __shared__ memory; the limit is %u (48 KiB)", b.kernel, st,
                  LIM_SMEM_STATIC);
        else if (st + k.smem > LIM_SMEM_OPTIN)
            fault(cudaErrorInvalidValue, "kernel %s uses %zu bytes of shared memory in all; the limit is %u",
                  b.kernel, st + k.smem, LIM_SMEM_OPTIN);
    }
    g_blk = saved;
    g_cur = NULL;
}

void launch(const char *name, const void *fn, dim3 grid, dim3 block, size_t smem, cudaStream_t st, entry_fn entry,
            std::shared_ptr<void> closure, size_t closure_size) {
    api_lock l;
    arena_init();
    if (g_sticky != cudaSuccess) return;
    unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    const char *why = NULL;
    char buf[300];
    cudaError_t err = cudaErrorInvalidConfiguration;
    if (!threads || !grid.x || !grid.y || !grid.z) {
        why = "an empty grid or block";
    } else if (threads > LIM_THREADS || block.x > LIM_BLOCK_XY || block.y > LIM_BLOCK_XY || block.z > LIM_BLOCK_Z) {
        snprintf(buf, sizeof buf, "a block of (%u,%u,%u) = %llu threads (at most %d, and (1024,1024,64))", block.x,
                 block.y, block.z, threads, LIM_THREADS);
        why = buf;
    } else if (grid.x > LIM_GRID_X || grid.y > LIM_GRID_YZ || grid.z > LIM_GRID_YZ) {
        snprintf(buf, sizeof buf, "a grid of (%u,%u,%u) (y and z at most 65535)", grid.x, grid.y, grid.z);
        why = buf;
    } else {
        auto it = g_func_smem.find(fn);
        unsigned lim = it != g_func_smem.end() && (unsigned)it->second > LIM_SMEM_STATIC ? (unsigned)it->second
                                                                                         : LIM_SMEM_STATIC;
        if (smem > lim) {
            err = cudaErrorInvalidValue;
            if (smem > LIM_SMEM_OPTIN)
                snprintf(buf, sizeof buf, "%zu bytes of dynamic shared memory (at most %u on an H100)", smem,
                         LIM_SMEM_OPTIN);
            else
                snprintf(buf, sizeof buf,
                         "%zu bytes of dynamic shared memory without cudaFuncSetAttribute("
                         "cudaFuncAttributeMaxDynamicSharedMemorySize) (48 KiB without it)",
                         smem);
            why = buf;
        }
    }
    if (why) {
        fprintf(stderr, "cusim: launch of kernel %s refused: %s\n", name, why);
        set_error(err);
        return;
    }
    cusim_stream *s = S(st);
    if (capture_ok(s) != cudaSuccess) return;
    if (!s->capture) { /* a captured launch is counted in captured_kernels, and run from its graph */
        g_cnt.launches++;
        g_kernel_launches[name]++;
    }
    kernel_job job{name, grid, block, smem, entry, closure, closure_size};
    op *o = new_op(OP_KERNEL, name, [job]() { run_kernel(job); });
    o->func = fn;
    enqueue(s, o);
}

} /* namespace cusim */

using namespace cusim;

/* ---- coverage hooks: every load and store of the kernels' files ---- */
extern "C" {
void __sanitizer_cov_load1(uint8_t *p) { cusim::access(p, 1, 0); }
void __sanitizer_cov_load2(uint16_t *p) { cusim::access(p, 2, 0); }
void __sanitizer_cov_load4(uint32_t *p) { cusim::access(p, 4, 0); }
void __sanitizer_cov_load8(uint64_t *p) { cusim::access(p, 8, 0); }
void __sanitizer_cov_load16(__int128 *p) { cusim::access(p, 16, 0); }
void __sanitizer_cov_store1(uint8_t *p) { cusim::access(p, 1, 1); }
void __sanitizer_cov_store2(uint16_t *p) { cusim::access(p, 2, 1); }
void __sanitizer_cov_store4(uint32_t *p) { cusim::access(p, 4, 1); }
void __sanitizer_cov_store8(uint64_t *p) { cusim::access(p, 8, 1); }
void __sanitizer_cov_store16(__int128 *p) { cusim::access(p, 16, 1); }
}

/* ---------------------------------------------------------------------
 * The runtime API.
 * ------------------------------------------------------------------- */

const char *cudaGetErrorString(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInsufficientDriver: return "CUDA driver version is insufficient for CUDA runtime version";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorIllegalAddress: return "an illegal memory access was encountered";
    case cudaErrorMisalignedAddress: return "misaligned address";
    case cudaErrorLaunchTimeout: return "the launch timed out and was terminated";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureMerge: return "operation would result in a merge of separate capture sequences";
    case cudaErrorStreamCaptureUnmatched: return "capture was not ended in the same stream as it began";
    case cudaErrorStreamCaptureUnjoined: return "capturing stream has unjoined work";
    case cudaErrorStreamCaptureIsolation: return "dependency created on uncaptured work in another stream";
    case cudaErrorStreamCaptureImplicit: return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorGraphExecUpdateFailure: return "the graph update was not performed because it included changes which violated constraints specific to instantiated graph update";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    }
    return "unknown error";
}
const char *cudaGetErrorName(cudaError_t e) {
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorIllegalAddress: return "cudaErrorIllegalAddress";
    case cudaErrorMisalignedAddress: return "cudaErrorMisalignedAddress";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorLaunchTimeout: return "cudaErrorLaunchTimeout";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureMerge: return "cudaErrorStreamCaptureMerge";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorGraphExecUpdateFailure: return "cudaErrorGraphExecUpdateFailure";
    default: return "cudaError";
    }
}
cudaError_t cudaGetLastError(void) {
    api_lock l;
    cudaError_t e = g_sticky != cudaSuccess ? g_sticky : g_last;
    g_last = cudaSuccess;
    return e;
}
cudaError_t cudaPeekAtLastError(void) {
    api_lock l;
    return g_sticky != cudaSuccess ? g_sticky : g_last;
}
cudaError_t cudaGetDeviceCount(int *n) {
    *n = 1;
    return cudaSuccess;
}
cudaError_t cudaSetDevice(int d) { return d == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice); }
cudaError_t cudaGetDevice(int *d) {
    *d = 0;
    return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int *v, cudaDeviceAttr a, int dev) {
    if (dev != 0) return set_error(cudaErrorInvalidDevice);
    switch (a) {
    case cudaDevAttrMaxThreadsPerBlock: *v = LIM_THREADS; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *v = (int)LIM_SMEM_STATIC; break;
    case cudaDevAttrWarpSize: *v = 32; break;
    case cudaDevAttrMultiProcessorCount: *v = N_SM; break;
    case cudaDevAttrComputeCapabilityMajor: *v = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *v = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *v = (int)LIM_SMEM_OPTIN; break;
    default: return set_error(cudaErrorInvalidValue);
    }
    return cudaSuccess;
}
cudaError_t cudaDeviceSynchronize(void) {
    api_lock l;
    STICKY();
    if (!g_captures.empty()) return capture_forbid("cudaDeviceSynchronize", 0);
    note_sync(&g_cnt.device_syncs);
    run_until(NULL, 0);
    return g_sticky;
}
cudaError_t cudaMemGetInfo(size_t *f, size_t *t) {
    api_lock l;
    STICKY();
    *t = g_device_bytes;
    *f = g_device_bytes > g_cnt.device_bytes ? g_device_bytes - g_cnt.device_bytes : 0;
    return cudaSuccess;
}

static cudaError_t malloc_common(void **p, size_t bytes, int async) {
    *p = NULL;
    arena_init();
    if (g_cnt.device_bytes + bytes > g_device_bytes) {
        fprintf(stderr,
                "cusim: %s of %zu bytes refused: %zu of the device's %zu bytes are in use (cudaErrorMemoryAllocation)\n",
                async ? "cudaMallocAsync" : "cudaMalloc", bytes, (size_t)g_cnt.device_bytes, g_device_bytes);
        return set_error(cudaErrorMemoryAllocation);
    }
    void *a = arena_alloc(bytes ? bytes : 1, async);
    if (!a) return set_error(cudaErrorMemoryAllocation);
    *p = a;
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **p, size_t bytes) {
    api_lock l;
    STICKY();
    cudaError_t e = capture_forbid("cudaMalloc", 1);
    if (e != cudaSuccess) return e;
    return malloc_common(p, bytes, 0);
}
cudaError_t cudaMallocAsync(void **p, size_t bytes, cudaStream_t st) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    if (s->capture) /* a graph memory node: not modelled */
        return capture_fail(s->capture, cudaErrorStreamCaptureUnsupported,
                            "cudaMallocAsync (a graph allocation node, which the simulator does not model)");
    return malloc_common(p, bytes, 1);
}
cudaError_t cudaFree(void *p) {
    api_lock l;
    STICKY();
    if (!p) return cudaSuccess;
    if (!g_allocs.count((uintptr_t)p)) {
        fprintf(stderr, "cusim: cudaFree(%p): not the start of a live device allocation\n", p);
        return set_error(cudaErrorInvalidValue);
    }
    if (g_allocs[(uintptr_t)p].free_queued) {
        fault(cudaErrorInvalidValue, "cudaFree(%p): a cudaFreeAsync of it is already queued (freed twice)", p);
        return g_sticky;
    }
    if (!g_captures.empty()) return capture_forbid("cudaFree (a device-wide sync)", 0);
    note_sync(&g_cnt.device_syncs); /* cudaFree waits for the device */
    run_until(NULL, 0);
    arena_free((uintptr_t)p);
    return g_sticky;
}
cudaError_t cudaFreeAsync(void *p, cudaStream_t st) {
    api_lock l;
    STICKY();
    if (!p) return cudaSuccess;
    if (!g_allocs.count((uintptr_t)p)) {
        fprintf(stderr, "cusim: cudaFreeAsync(%p): not the start of a live device allocation\n", p);
        return set_error(cudaErrorInvalidValue);
    }
    uintptr_t a = (uintptr_t)p;
    alloc_rec &r = g_allocs[a];
    if (r.free_queued) {
        fault(cudaErrorInvalidValue, "cudaFreeAsync(%p): a free of it is already queued (freed twice)", p);
        return g_sticky;
    }
    if (S(st)->capture)
        return capture_fail(S(st)->capture, cudaErrorStreamCaptureUnsupported,
                            "cudaFreeAsync (a graph free node, which the simulator does not model)");
    r.free_queued = 1;
    /* counted free now: the pool hands it to the next allocation in its
     * stream's order, as a GPU's stream-ordered allocator does */
    g_cnt.device_bytes -= r.size;
    cusim_stream *s = S(st);
    /* On a stream with nothing held (and not one the legacy stream must
     * wait for) the free takes effect now, as early as stream order allows:
     * work of another stream that still reads the memory without an event
     * wait between them finds it gone. Otherwise it runs in its turn. */
    int now = !s->capture && s->q.empty() && (s->nonblocking || g_legacy_s.issued <= g_legacy_s.done) &&
              (!s->legacy || [&]() {
                  for (cusim_stream *b : g_streams)
                      if (b != s && !b->nonblocking && b->issued > b->done) return false;
                  return true;
              }());
    if (now) {
        arena_free(a);
        return cudaSuccess;
    }
    enqueue(s, new_op(OP_FREE, "free", [a]() {
                if (g_allocs.count(a)) arena_free(a);
            }));
    return cudaSuccess;
}
cudaError_t cudaHostAlloc(void **p, size_t bytes, unsigned flags) {
    api_lock l;
    STICKY();
    cudaError_t ce = capture_forbid("cudaHostAlloc", 1);
    if (ce != cudaSuccess) return ce;
    arena_init();
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), n = (bytes + pg - 1) / pg * pg;
    void *h = aligned_alloc(pg, n ? n : pg);
    if (!h) return set_error(cudaErrorMemoryAllocation);
    g_pinned[(uintptr_t)h] = pinned_rec{bytes ? bytes : 1, (flags & cudaHostAllocMapped) != 0};
    g_cnt.pinned_bytes += bytes;
    g_cnt.pinned_allocs++;
    if (!pthread_equal(pthread_self(), g_first_thread)) {
        g_cnt.pinned_allocs_other++;
        g_cnt.pinned_bytes_other += bytes;
    }
    *p = h;
    return cudaSuccess;
}
cudaError_t cudaMallocHost(void **p, size_t bytes) { return cudaHostAlloc(p, bytes, cudaHostAllocMapped); }
cudaError_t cudaFreeHost(void *p) {
    api_lock l;
    STICKY();
    auto it = g_pinned.find((uintptr_t)p);
    if (it == g_pinned.end()) return set_error(cudaErrorInvalidValue);
    if (!g_captures.empty()) return capture_forbid("cudaFreeHost (a device-wide sync)", 0);
    note_sync(&g_cnt.device_syncs);
    run_until(NULL, 0);
    g_cnt.pinned_bytes -= it->second.size;
    g_pinned.erase(it);
    free(p);
    return g_sticky;
}
cudaError_t cudaHostGetDevicePointer(void **d, void *h, unsigned flags) {
    api_lock l;
    (void)flags;
    STICKY();
    const pinned_rec *r = find_pinned((uintptr_t)h, 1);
    if (!r || !r->mapped) {
        fprintf(stderr, "cusim: cudaHostGetDevicePointer(%p): not mapped pinned memory\n", h);
        return set_error(cudaErrorInvalidValue);
    }
    *d = h;
    return cudaSuccess;
}

/* Where a copy's end lies: 'd' device, 'p' pinned, 'h' pageable host. */
static char where(const void *p, size_t n) {
    if (in_arena((uintptr_t)p)) return 'd';
    if (find_pinned((uintptr_t)p, n ? n : 1)) return 'p';
    return 'h';
}

static cudaError_t memset_common(void *p, int v, size_t n, cudaStream_t st, int sync) {
    STICKY();
    if (!device_range(p, n, sync ? "cudaMemset" : "cudaMemsetAsync", "the destination")) return g_sticky;
    cusim_stream *s = S(sync ? NULL : st);
    if (capture_ok(s) != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    g_cnt.bytes_memset += n;
    const char *call = sync ? "cudaMemset" : "cudaMemsetAsync";
    op *o = new_op(OP_MEMSET, "memset", [p, v, n, call]() {
        if (!device_range(p, n, call, "the destination, when the memset ran,")) return;
        if (g_watch) watch_write(call, (uintptr_t)p, n);
        memset(p, v, n);
    });
    o->width = n;
    o->height = 1;
    enqueue(s, o);
    if (sync) run_until(s, s->issued);
    return g_sticky;
}
cudaError_t cudaMemset(void *p, int v, size_t n) {
    api_lock l;
    return memset_common(p, v, n, NULL, 1);
}
cudaError_t cudaMemsetAsync(void *p, int v, size_t n, cudaStream_t s) {
    api_lock l;
    return memset_common(p, v, n, s, 0);
}

/* A 2D copy (a 1D one is one row): checks both ends against the kind,
 * counts the bytes, and queues it; the host waits when the call is
 * synchronous or lands in pageable memory. */
static cudaError_t copy_common(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t height,
                               cudaMemcpyKind kind, cudaStream_t st, int sync, const char *call) {
    STICKY();
    if (!width || !height) return cudaSuccess;
    g_cnt.copies++;
    if (dpitch < width || spitch < width) {
        fprintf(stderr, "cusim: %s: pitch below the width\n", call);
        return set_error(cudaErrorInvalidValue);
    }
    size_t dspan = dpitch * (height - 1) + width, sspan = spitch * (height - 1) + width;
    char wd = where(dst, dspan), ws = where(src, sspan);
    cusim_stream *s = S(sync ? NULL : st);
    if (capture_ok(s) != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    if (s->capture && (wd == 'h' || ws == 'h'))
        return capture_fail(s->capture, cudaErrorStreamCaptureUnsupported, "a copy to or from pageable host memory");
    int dev_d = wd == 'd', dev_s = ws == 'd';
    if (kind != cudaMemcpyDefault) {
        int want_d = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
        int want_s = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
        if (want_d != dev_d || want_s != dev_s) {
            fault(cudaErrorInvalidValue,
                  "%s: kind %d but the destination is %s memory and the source %s memory", call, (int)kind,
                  dev_d ? "device" : "host", dev_s ? "device" : "host");
            return g_sticky;
        }
    }
    if (dev_d && !device_range(dst, dspan, call, "the destination")) return g_sticky;
    if (dev_s && !device_range(src, sspan, call, "the source")) return g_sticky;
    size_t bytes = width * height;
    if (dev_d && dev_s) g_cnt.bytes_d2d += bytes;
    else if (dev_d) g_cnt.bytes_h2d += bytes;
    else if (dev_s) g_cnt.bytes_d2h += bytes;
    std::function<void()> fn;
    /* at run time, both device ends must still be live: a copy queued before
     * its buffer was freed (on a stream it was not ordered with) reads or
     * writes whatever now owns that memory */
    std::function<int()> live = [=]() {
        return (!dev_d || device_range(dst, dspan, call, "the destination, when the copy ran,")) &&
               (!dev_s || device_range(src, sspan, call, "the source, when the copy ran,"));
    };
    if (ws == 'h' && !sync) {
        /* pageable source: staged now, as the driver stages it */
        std::shared_ptr<std::vector<char>> stage = std::make_shared<std::vector<char>>(bytes);
        for (size_t r = 0; r < height; r++) memcpy(stage->data() + r * width, (const char *)src + r * spitch, width);
        fn = [dst, dpitch, width, height, stage, live, call]() {
            if (!live()) return;
            if (g_watch) {
                watch_write(call, (uintptr_t)dst, dpitch * (height - 1) + width);
                fprintf(stderr, "cusim watch:   staged first %g\n", *(const float *)stage->data());
            }
            for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, stage->data() + r * width, width);
        };
    } else {
        fn = [dst, dpitch, src, spitch, width, height, live, call]() {
            if (!live()) return;
            if (g_watch) {
                watch_write(call, (uintptr_t)dst, dpitch * (height - 1) + width);
                uintptr_t st = 0, d0 = 0;
                const alloc_rec *r = find_alloc((uintptr_t)src, &st), *rd = find_alloc((uintptr_t)dst, &d0);
                if ((rd && rd->id == g_watch) || (r && r->id == g_watch))
                    fprintf(stderr, "cusim watch:   %s: #%zu byte %zu (first %g) -> #%zu byte %zu, %zu bytes\n", call,
                            r ? r->id : 0, r ? (size_t)((uintptr_t)src - st) : 0, *(const float *)src,
                            rd ? rd->id : 0, rd ? (size_t)((uintptr_t)dst - d0) : 0, dpitch * (height - 1) + width);
            }
            for (size_t r = 0; r < height; r++) memcpy((char *)dst + r * dpitch, (const char *)src + r * spitch, width);
        };
    }
    op *o = new_op(OP_COPY, call, std::move(fn));
    o->mem_src = ws;
    o->mem_dst = wd;
    o->twod = height > 1;
    o->width = width;
    o->height = height;
    enqueue(s, o);
    if (s->capture) return cudaSuccess;
    if (sync || wd == 'h') {
        note_sync(&g_cnt.blocking_copies);
        run_until(s, s->issued);
    }
    return g_sticky;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t n, cudaMemcpyKind k) {
    api_lock l;
    return copy_common(dst, n, src, n, n, 1, k, NULL, 1, "cudaMemcpy");
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, cudaMemcpyKind k, cudaStream_t s) {
    api_lock l;
    return copy_common(dst, n, src, n, n, 1, k, s, 0, "cudaMemcpyAsync");
}
cudaError_t cudaMemcpy2D(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k) {
    api_lock l;
    return copy_common(dst, dp, src, sp, w, h, k, NULL, 1, "cudaMemcpy2D");
}
cudaError_t cudaMemcpy2DAsync(void *dst, size_t dp, const void *src, size_t sp, size_t w, size_t h, cudaMemcpyKind k,
                              cudaStream_t s) {
    api_lock l;
    return copy_common(dst, dp, src, sp, w, h, k, s, 0, "cudaMemcpy2DAsync");
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags) {
    api_lock l;
    STICKY();
    S(NULL);
    cusim_stream *n = new cusim_stream;
    n->nonblocking = (flags & cudaStreamNonBlocking) != 0;
    g_streams.push_back(n);
    *s = n;
    return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t st) {
    api_lock l;
    cusim_stream *s = S(st);
    if (s->legacy) return set_error(cudaErrorInvalidResourceHandle);
    run_until(s, s->issued); /* its work still completes */
    g_streams.erase(std::remove(g_streams.begin(), g_streams.end(), s), g_streams.end());
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t st) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    if (s->capture) return capture_fail(s->capture, cudaErrorStreamCaptureUnsupported, "cudaStreamSynchronize");
    note_sync(&g_cnt.stream_syncs);
    run_until(s, s->issued);
    return g_sticky;
}
cudaError_t cudaStreamQuery(cudaStream_t st) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    if (s->capture) return capture_fail(s->capture, cudaErrorStreamCaptureUnsupported, "cudaStreamQuery");
    return s->done >= s->issued ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t st, cudaEvent_t e, unsigned flags) {
    api_lock l;
    (void)flags;
    STICKY();
    cusim_stream *s = S(st);
    if (capture_ok(s) != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    g_cnt.event_waits++;
    if (e->capture_id) {
        cusim_graph *g = active_capture(e->capture_id);
        if (!g) /* recorded in a capture that has ended */
            return s->capture ? capture_fail(s->capture, cudaErrorCapturedEvent, "a wait on an event of an ended capture")
                              : set_error(cudaErrorCapturedEvent);
        if (g->invalid != cudaSuccess) return set_error(cudaErrorStreamCaptureInvalidated);
        if (s->capture && s->capture != g) {
            capture_fail(g, cudaErrorStreamCaptureMerge, "a wait that would merge two captures");
            return capture_fail(s->capture, cudaErrorStreamCaptureMerge, "a wait that would merge two captures");
        }
        if (!s->capture) { /* a stream waiting on a captured event joins the capture (a fork) */
            if (s->legacy) return capture_fail(g, cudaErrorStreamCaptureImplicit, "the legacy stream joining a capture");
            s->capture = g;
            s->tail.clear();
        }
        for (int n : e->tail) /* the join: after the event's nodes too */
            if (std::find(s->tail.begin(), s->tail.end(), n) == s->tail.end()) s->tail.push_back(n);
        return cudaSuccess;
    }
    if (s->capture) {
        /* work recorded outside the capture: only a never-recorded event
         * (empty) may be waited on without cudaEventWaitExternal */
        if (!e->s) return cudaSuccess;
        return capture_fail(s->capture, cudaErrorStreamCaptureIsolation, "a wait on an event recorded outside the capture");
    }
    if (!e->s || e->s->done >= e->ticket) return cudaSuccess;
    op *o = new_op(OP_WAIT, "wait", nullptr);
    o->deps.push_back({e->s, e->ticket});
    enqueue(s, o);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags) {
    api_lock l;
    STICKY();
    cusim_event *n = new cusim_event;
    n->timing = !(flags & cudaEventDisableTiming);
    g_events.push_back(n); /* the device owns its events until destroyed (or the process ends) */
    *e = n;
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    api_lock l;
    g_events.erase(std::remove(g_events.begin(), g_events.end(), e), g_events.end());
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t st) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    if (capture_ok(s) != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    if (s->capture) { /* no node: the event stands for the stream's tail in the capture */
        e->capture_id = s->capture->id;
        e->tail = s->tail;
        return cudaSuccess;
    }
    e->capture_id = 0;
    e->tail.clear();
    op *o = new_op(OP_RECORD, "record", nullptr);
    o->ev = e;
    enqueue(s, o); /* (run and freed already when eager) */
    e->s = s;
    e->ticket = s->issued;
    return cudaSuccess;
}
/* A host wait for or query of an event last recorded in a capture. */
static cudaError_t captured_event(cudaEvent_t e, const char *what) {
    cusim_graph *g = active_capture(e->capture_id);
    return g ? capture_fail(g, cudaErrorCapturedEvent, what) : set_error(cudaErrorCapturedEvent);
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    api_lock l;
    STICKY();
    if (e->capture_id) return captured_event(e, "cudaEventSynchronize on a captured event");
    note_sync(&g_cnt.event_syncs);
    if (e->s) run_until(e->s, e->ticket);
    return g_sticky;
}
cudaError_t cudaEventQuery(cudaEvent_t e) {
    api_lock l;
    STICKY();
    if (e->capture_id) return captured_event(e, "cudaEventQuery on a captured event");
    return !e->s || e->s->done >= e->ticket ? cudaSuccess : cudaErrorNotReady;
}
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t a, cudaEvent_t b) {
    api_lock l;
    STICKY();
    if (a->capture_id || b->capture_id) return set_error(cudaErrorCapturedEvent);
    if (!a->timing || !b->timing || !a->s || !b->s) return set_error(cudaErrorInvalidResourceHandle);
    if (a->s->done < a->ticket || b->s->done < b->ticket) return set_error(cudaErrorNotReady);
    *ms = (float)((b->t - a->t) * 1e3);
    return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t st, cudaStreamCaptureMode mode) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    if (s->legacy || s->capture) return set_error(cudaErrorStreamCaptureUnsupported);
    cusim_graph *g = new cusim_graph;
    g->id = ++g_capture_ids;
    g->origin = s;
    g->mode = mode;
    g_captures.push_back(g);
    s->capture = g;
    s->tail.clear();
    return cudaSuccess;
}

/* The nodes n depends on, n itself included, into seen. */
static void ancestors(const cusim_graph *g, int n, std::vector<char> &seen) {
    std::vector<int> todo(1, n);
    while (!todo.empty()) {
        int i = todo.back();
        todo.pop_back();
        if (seen[i]) continue;
        seen[i] = 1;
        for (int d : g->deps[i]) todo.push_back(d);
    }
}

cudaError_t cudaStreamEndCapture(cudaStream_t st, cudaGraph_t *out) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    *out = nullptr;
    cusim_graph *g = s->capture;
    if (!g) return set_error(cudaErrorIllegalState);
    if (g->origin != s) return capture_fail(g, cudaErrorStreamCaptureUnmatched, "cudaStreamEndCapture on a forked stream");
    if (g->invalid != cudaSuccess) {
        capture_end(g, 0);
        return set_error(cudaErrorStreamCaptureInvalidated);
    }
    /* every forked stream joined: its last nodes are the origin's ancestors */
    std::vector<char> seen(g->ops.size(), 0);
    for (int n : s->tail) ancestors(g, n, seen);
    for (cusim_stream *o : g_streams)
        if (o != s && o->capture == g)
            for (int n : o->tail)
                if (!seen[n]) {
                    fprintf(stderr, "cusim: cudaStreamEndCapture: a forked stream's work (%s) was not joined back into "
                            "the origin stream\n", g->ops[n]->name.c_str());
                    capture_end(g, 0);
                    return set_error(cudaErrorStreamCaptureUnjoined);
                }
    capture_end(g, 1);
    *out = g;
    return cudaSuccess;
}
cudaError_t cudaStreamIsCapturing(cudaStream_t st, cudaStreamCaptureStatus *c) {
    api_lock l;
    cusim_graph *g = S(st)->capture;
    *c = !g ? cudaStreamCaptureStatusNone
            : g->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    return cudaSuccess;
}

static cusim_exec_node exec_node(const op *o) {
    cusim_exec_node n;
    n.kind = o->kind;
    n.name = o->name;
    n.fn = o->fn;
    n.func = o->func;
    n.mem_src = o->mem_src;
    n.mem_dst = o->mem_dst;
    n.twod = o->twod;
    n.width = o->width;
    n.height = o->height;
    return n;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *x, cudaGraph_t g, unsigned long long flags) {
    api_lock l;
    (void)flags;
    STICKY();
    if (!g) return set_error(cudaErrorInvalidValue);
    cusim_graph_exec *e = new cusim_graph_exec;
    for (const op *o : g->ops) e->nodes.push_back(exec_node(o));
    e->deps = g->deps;
    e->kernels = g->kernels;
    g_cnt.graph_instantiations++;
    *x = e;
    return cudaSuccess;
}

/* cudaGraphExecUpdate's checks (CUDA 12's rules for the nodes modelled):
 * the same node count and, node by node in capture order, the same type
 * and the same dependencies (else the topology changed); a kernel node may
 * change its function, grid, block, shared memory and arguments; a copy
 * may change its addresses and sizes but not whether each end is device or
 * host memory; a 2D memset only its address and value. */
static cudaGraphExecUpdateResult update_check(const cusim_graph_exec *x, const cusim_graph *g) {
    if (x->nodes.size() != g->ops.size()) return cudaGraphExecUpdateErrorTopologyChanged;
    for (size_t i = 0; i < g->ops.size(); i++) {
        const cusim_exec_node &a = x->nodes[i];
        const op *b = g->ops[i];
        if (a.kind != b->kind) return cudaGraphExecUpdateErrorNodeTypeChanged;
        if (x->deps[i] != g->deps[i]) return cudaGraphExecUpdateErrorTopologyChanged;
        if (a.kind == OP_COPY && ((a.mem_src == 'd') != (b->mem_src == 'd') || (a.mem_dst == 'd') != (b->mem_dst == 'd')))
            return cudaGraphExecUpdateErrorParametersChanged;
        if (a.kind == OP_MEMSET && (a.twod || b->twod) && (a.width != b->width || a.height != b->height))
            return cudaGraphExecUpdateErrorParametersChanged;
    }
    return cudaGraphExecUpdateSuccess;
}

cudaError_t cudaGraphExecUpdate(cudaGraphExec_t x, cudaGraph_t g, cudaGraphExecUpdateResultInfo *info) {
    api_lock l;
    STICKY();
    if (!x || !g || !info) return set_error(cudaErrorInvalidValue);
    info->errorNode = nullptr;
    info->errorFromNode = nullptr;
    info->result = update_check(x, g);
    if (info->result != cudaGraphExecUpdateSuccess) return set_error(cudaErrorGraphExecUpdateFailure);
    for (size_t i = 0; i < g->ops.size(); i++) x->nodes[i] = exec_node(g->ops[i]);
    x->kernels = g->kernels;
    g_cnt.graph_updates++;
    return cudaSuccess;
}

/* The order a launch runs a graph's nodes in: capture order when eager;
 * otherwise each next node is, of those whose dependencies have run, the
 * last captured (adversarial: work of a forked stream as late as its joins
 * allow, so a node that misses a dependency reads stale data) or a seeded
 * random one. */
static std::vector<int> graph_order(const cusim_graph_exec *x) {
    size_t n = x->nodes.size();
    std::vector<int> order;
    if (g_order == CUSIM_ORDER_EAGER) {
        for (size_t i = 0; i < n; i++) order.push_back((int)i);
        return order;
    }
    std::vector<char> ran(n, 0);
    for (size_t k = 0; k < n; k++) {
        std::vector<int> ready;
        for (size_t i = 0; i < n; i++) {
            if (ran[i]) continue;
            int ok = 1;
            for (int d : x->deps[i]) ok &= ran[d];
            if (ok) ready.push_back((int)i);
        }
        int pick = g_order == CUSIM_ORDER_RANDOM ? ready[g_rng() % ready.size()] : ready.back();
        ran[pick] = 1;
        order.push_back(pick);
    }
    return order;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t x, cudaStream_t st) {
    api_lock l;
    STICKY();
    cusim_stream *s = S(st);
    if (s->capture) /* a child graph node: not modelled */
        return capture_fail(s->capture, cudaErrorStreamCaptureUnsupported, "cudaGraphLaunch into a capture");
    g_cnt.graph_launches++;
    g_cnt.graph_kernels += (uint64_t)x->kernels;
    std::vector<std::function<void()>> fns;
    for (int i : graph_order(x)) {
        const cusim_exec_node &n = x->nodes[(size_t)i];
        if (n.kind == OP_KERNEL) g_kernel_launches[n.name]++;
        if (n.fn) fns.push_back(n.fn);
    }
    enqueue(s, new_op(OP_GRAPH, "graph", [fns]() {
                for (auto &f : fns)
                    if (g_sticky == cudaSuccess) f();
            }));
    return cudaSuccess;
}
cudaError_t cudaGraphExecDestroy(cudaGraphExec_t x) {
    api_lock l;
    delete x; /* a launch queued holds copies of its nodes' work */
    return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t g) {
    api_lock l;
    if (!g) return cudaSuccess;
    for (op *o : g->ops) delete o;
    delete g;
    return cudaSuccess;
}

cudaError_t cudaDeviceReset(void) {
    cusim_reset();
    return cudaSuccess;
}

/* ---- the test API ---- */

extern "C" {
void cusim_counters_get(cusim_counters *c) {
    api_lock l;
    *c = g_cnt;
}
void cusim_counters_reset(void) {
    api_lock l;
    uint64_t live = g_cnt.device_bytes, pinned = g_cnt.pinned_bytes, faults = g_cnt.faults;
    memset(&g_cnt, 0, sizeof g_cnt);
    g_cnt.device_bytes = live;
    g_cnt.device_peak = live;
    g_cnt.pinned_bytes = pinned;
    g_cnt.faults = faults;
    g_kernel_launches.clear();
}
uint64_t cusim_launches_of(const char *prefix) {
    api_lock l;
    uint64_t n = 0;
    for (auto &k : g_kernel_launches)
        if (!prefix || !strncmp(k.first.c_str(), prefix, strlen(prefix))) n += k.second;
    return n;
}
void cusim_counters_print(void *file) {
    api_lock l;
    FILE *f = file ? (FILE *)file : stdout;
    for (auto &k : g_kernel_launches) fprintf(f, "%s %llu\n", k.first.c_str(), (unsigned long long)k.second);
}
int cusim_set_device_bytes(size_t bytes) {
    api_lock l;
    arena_init();
    if (bytes < g_cnt.device_bytes) return -1;
    g_device_bytes = bytes;
    return 0;
}
void cusim_set_order(int mode, unsigned seed) {
    api_lock l;
    arena_init();
    g_order = mode;
    g_rng.seed(seed);
}
const char *cusim_last_fault(void) { return g_fault.c_str(); }
void cusim_reset(void) {
    api_lock l;
    while (!g_captures.empty()) capture_end(g_captures.back(), 0);
    for (cusim_stream *s : g_streams) {
        while (!s->q.empty()) {
            delete s->q.front();
            s->q.pop_front();
        }
        s->done = s->issued;
    }
    g_held = 0;
    std::vector<uintptr_t> live;
    for (auto &a : g_allocs) live.push_back(a.first);
    for (uintptr_t a : live) arena_free(a);
    g_sticky = cudaSuccess;
    g_last = cudaSuccess;
    g_fault.clear();
}
int cusim_pointer_kind(const void *p) {
    api_lock l;
    uintptr_t a = (uintptr_t)p, st = 0;
    if (in_arena(a) && find_alloc(a, &st)) return 1;
    const pinned_rec *h = find_pinned(a, 1);
    return h && h->mapped ? 2 : 0;
}
}
