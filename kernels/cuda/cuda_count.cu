/* cuda_count.cu: what a decode step costs the host, counted by the backend
 * itself (SKV_CUDA_COUNT=1 in the environment; otherwise one branch a
 * launch): kernel launches (SKV_LAUNCH; those a step graph's capture
 * records apart, as graph nodes), cuBLAS/cuSOLVER/CUB calls and graph
 * launches, and the calls the host waits in (cuda_util.h's
 * cuda_call_kind), per decode step, from the engine's step tags
 * (span_tag: step >= 0 in a decode step, -1 in a prefill).
 *
 * The steps of one decode run (consecutive tags whose step grows) make a
 * segment; when it ends (a prefill, a step number that starts again, the
 * process's exit) one line goes to stdout, after whatever the run printed:
 *   cuda_count: steps=N layers=L launches_step=X lib_calls_step=Y
 *     graph_launches_step=G graph_nodes_step=K syncs_step=S
 *     launches_layer=(X+K)/L calls_layer=(X+K+Y)/L
 * each the median over the N steps (the first and the last can carry
 * one-off work: the first allocations, the forks of the next batch).
 * launches_step counts the kernels launched one by one (0 when the step
 * runs as a graph), graph_nodes_step the kernels recorded into the step's
 * graph, launches_layer the kernels a layer either way, and calls_layer
 * those and the library calls a layer (issue 45's budget, before graph
 * capture: a cuBLAS call launches a kernel or more; a batch over
 * k_matmma's 64 rows runs its projections as cuBLAS GEMMs). On the CUDA
 * simulator (tests/cusim) the line adds the simulator's own counts of the same steps
 * (sim_launches_step, sim_lib_calls_step, sim_graph_launches_step,
 * sim_graph_nodes_step, sim_syncs_step: its host syncs count blocking
 * copies too), so a test can hold the two counts side by side.
 * tests/gpu/run.sh reads these lines into gpu-check's summary.
 *
 * The prefill's counts (the step -1 tags, with what follows them before the
 * first decode step: ShadowKV's compression, a fork's replay) make one more
 * line when the first decode step begins, or at the process's exit:
 *   cuda_count_prefill: chunks=P layers=L launches=X lib_calls=Y syncs=S
 *     launches_chunk_layer=X/(P*L) calls_chunk_layer=(X+Y)/(P*L)
 *     syncs_chunk_layer=S/(P*L)
 * P the forward passes (prompt chunks; 0 for a fork's replay, with no
 * per-layer figures), and the simulator's sim_launches, sim_lib_calls,
 * sim_syncs beside them. What ran before the first tag (the weights'
 * upload) is in neither line. */
#include "cuda_util.h"

#include <algorithm>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#ifndef __CUDACC__
extern "C" {
#include "cusim_api.h"
}
#endif

static int count_env(void) {
    const char *v = getenv("SKV_CUDA_COUNT");
    return v && v[0] == '1' && !v[1];
}
int cuda_count_on = count_env();

enum { C_LAUNCH, C_LIB, C_GRAPH, C_SYNC, C_NODE, C_SIM_LAUNCH, C_SIM_LIB, C_SIM_SYNC, C_SIM_GRAPH, C_SIM_NODE, C_N };

static std::mutex g_mu;
static unsigned long long g_now[C_N];      /* counts since the current step began */
static std::vector<std::vector<unsigned long long>> g_steps; /* the segment's finished steps */
static int g_step = -1, g_layers;
static int g_pre_chunks, g_pre_layers, g_pre_last = -1; /* the prefill's passes, layers, last layer tag */
static int g_exit_hooked;
#ifndef __CUDACC__
static cusim_counters g_sim0; /* the simulator's counters when the step began */
#endif

void cuda_count_call(int kind) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_now[kind == CUDA_CALL_SYNC ? C_SYNC : kind == CUDA_CALL_GRAPH ? C_GRAPH : C_LIB]++;
}

void cuda_count_launch(void) {
    std::lock_guard<std::mutex> lock(g_mu);
    g_now[cuda_graph_capturing ? C_NODE : C_LAUNCH]++;
}

/* Ends the current step: its counts join the segment's (a decode step's
 * only) and are left in last, and the next step starts from zero. */
static void step_close(unsigned long long *last) {
#ifndef __CUDACC__
    cusim_counters c;
    cusim_counters_get(&c);
    g_now[C_SIM_LAUNCH] = c.launches - g_sim0.launches;
    g_now[C_SIM_LIB] = c.lib_calls - g_sim0.lib_calls;
    g_now[C_SIM_SYNC] = c.host_syncs - g_sim0.host_syncs;
    g_now[C_SIM_GRAPH] = c.graph_launches - g_sim0.graph_launches;
    g_now[C_SIM_NODE] = c.captured_kernels - g_sim0.captured_kernels;
    g_sim0 = c; /* (a test's counter reset between steps gives garbage for that step: medians absorb one) */
#endif
    if (g_step >= 0) g_steps.push_back(std::vector<unsigned long long>(g_now, g_now + C_N));
    for (int i = 0; i < C_N; i++) last[i] = g_now[i], g_now[i] = 0;
}

static unsigned long long median(int what) {
    std::vector<unsigned long long> v;
    for (const auto &s : g_steps) v.push_back(s[what]);
    std::sort(v.begin(), v.end());
    return v.empty() ? 0 : v[(v.size() - 1) / 2];
}

/* Prints the segment's line (when it has a step) and starts a new one. */
static void segment_close(void) {
    if (!g_steps.empty()) {
        unsigned long long l = median(C_LAUNCH), k = median(C_NODE);
        int layers = g_layers > 0 ? g_layers : 1;
        printf("cuda_count: steps=%zu layers=%d launches_step=%llu lib_calls_step=%llu graph_launches_step=%llu "
               "graph_nodes_step=%llu syncs_step=%llu launches_layer=%.1f calls_layer=%.1f",
               g_steps.size(), layers, l, median(C_LIB), median(C_GRAPH), k, median(C_SYNC), (double)(l + k) / layers,
               (double)(l + k + median(C_LIB)) / layers);
#ifndef __CUDACC__
        printf(" sim_launches_step=%llu sim_lib_calls_step=%llu sim_graph_launches_step=%llu sim_graph_nodes_step=%llu "
               "sim_syncs_step=%llu", median(C_SIM_LAUNCH), median(C_SIM_LIB), median(C_SIM_GRAPH), median(C_SIM_NODE),
               median(C_SIM_SYNC));
#endif
        printf("\n");
        fflush(stdout);
    }
    g_steps.clear();
    g_layers = 0;
}

/* After step_close of a prefill: its line (when anything was counted). */
static void prefill_close(const unsigned long long *c) {
    unsigned long long x = c[C_LAUNCH] + c[C_NODE], y = c[C_LIB], sy = c[C_SYNC];
    if (g_pre_chunks || x || y || sy) {
        printf("cuda_count_prefill: chunks=%d layers=%d launches=%llu lib_calls=%llu syncs=%llu", g_pre_chunks,
               g_pre_layers, x, y, sy);
        if (g_pre_chunks && g_pre_layers) {
            double pl = (double)g_pre_chunks * g_pre_layers;
            printf(" launches_chunk_layer=%.1f calls_chunk_layer=%.1f syncs_chunk_layer=%.2f", x / pl, (x + y) / pl,
                   sy / pl);
        }
#ifndef __CUDACC__
        printf(" sim_launches=%llu sim_lib_calls=%llu sim_syncs=%llu", c[C_SIM_LAUNCH] + c[C_SIM_NODE], c[C_SIM_LIB],
               c[C_SIM_SYNC]);
#endif
        printf("\n");
        fflush(stdout);
    }
    g_pre_chunks = g_pre_layers = 0;
    g_pre_last = -1;
}

/* Ends the current step or prefill (step_close), and a prefill's line. */
static void step_or_prefill_close(void) {
    unsigned long long c[C_N];
    int pre = g_step < 0;
    step_close(c);
    if (pre) prefill_close(c);
}

static void at_exit(void) {
    std::lock_guard<std::mutex> lock(g_mu);
    step_or_prefill_close();
    segment_close();
}

void cuda_count_tag(int layer, int step) {
    if (!cuda_count_on) return;
    std::lock_guard<std::mutex> lock(g_mu);
    if (!g_exit_hooked) {
        g_exit_hooked = 1;
        atexit(at_exit);
#ifndef __CUDACC__
        cusim_counters_get(&g_sim0);
#endif
        for (int i = 0; i < C_N; i++) g_now[i] = 0; /* the weights' upload: before any step */
    }
    if (step != g_step) {
        step_or_prefill_close();
        if (step < 0 || step < g_step) segment_close(); /* a prefill, or another run's first step */
        g_step = step;
    }
    if (step >= 0) {
        if (layer + 1 > g_layers) g_layers = layer + 1;
    } else if (layer != g_pre_last) {
        if (layer == 0) g_pre_chunks++; /* a forward pass begins */
        if (layer + 1 > g_pre_layers) g_pre_layers = layer + 1;
        g_pre_last = layer;
    }
}
