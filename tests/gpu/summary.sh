#!/bin/sh
# summary.sh BENCH_TXT [CTX_BIG]: gpu-check's table of figures beside their
# targets (../shared/GPU.md: an H100, PyTorch 2.11; issue 45's budgets),
# from the bench lines run.sh collected (tests/gpu/run.sh; also
# tests/sim/test_gpu_steps.sh on the simulator's skv).
#
# BENCH_TXT holds, in order: "step=NAME layers=L" markers (L: the model's
# layers when it is cut to one or two, 0 the whole model), skv bench's lines
# (model=... kv=K prompt=N parallel=B ... decode_tok_s=T decode_ms=M ...;
# kv=K max_parallel=B ...: the largest batch that fits) and the CUDA
# backend's counts of each decode run under SKV_CUDA_COUNT=1 (cuda_count:
# ... launches_step=X graph_launches_step=G syncs_step=S launches_layer=Y
# calls_layer=Z;
# the first such line after a bench line is that run's). A row a (policy,
# context, batch): tok/s, kernels launched alone and host syncs a step,
# kernels a layer (captured into the step's graph or not), kernels and
# library calls a layer (issue 45's budget: a cuBLAS call launches a kernel
# or more; a decode batch over 64 would run its projections as cuBLAS GEMMs), graph
# launches a step (1 with the step graphs), the first step's ms (bench
# leaves it out of tok/s: on a device it captures the step graph), and the target. A
# one-layer row adds the whole model's tok/s projected from the one- and
# two-layer runs at the same batch (a step of 32 layers = the one-layer
# step + 31 x the second layer's time, the two-layer step less the
# one-layer one). CTX_BIG (default 122880): the
# context of the prefill row (one layer's prefill, dense against ShadowKV).
# bench_proj's lines (proj n=N path=P ... layer_us=U weight_GBps=G) make a
# second table: a batch a row, the backend's kernel beside k_matmma with two
# chunks loaded ahead (path k_matmma_pf2) and cuBLAS.
awk -v big="${2:-122880}" '
function val(line, key) {
    if (match(line, " " key "=[^ ]*")) return substr(line, RSTART + length(key) + 2, RLENGTH - length(key) - 2)
    return ""
}
function target(kv, ctx, b) {
    if (kv == "dense" && ctx == 122880) return b == 4 ? "136.9 (SDPA flash, B=4); goal >= 123 (90%)" : "136.9 at B=4 (SDPA flash)"
    if (kv == "dense" && ctx == 32768) return "511.6 at B=15 (SDPA flash)"
    if (kv == "shadowkv" && ctx == 122880) return "259.3 at B=14 (PyTorch sparse); goal 700, floor ~1100"
    if (kv == "shadowkv" && ctx == 32768) return "393.3 at B=55 (PyTorch sparse)"
    return "-"
}
function or_dash(x) { return x == "" ? "-" : x }
{ line = " " $0 }
/^step=/ { layers = val(line, "layers"); next }
/^model=/ && / decode_tok_s=/ {
    n++
    K[n] = val(line, "kv"); C[n] = val(line, "prompt"); B[n] = val(line, "parallel"); T[n] = val(line, "decode_tok_s")
    M[n] = val(line, "decode_ms"); P[n] = val(line, "prefill_tok_s"); Ly[n] = layers + 0
    W[n] = val(line, "warmup_ms"); R[n] = val(line, "prefill_record_s")
    if (B[n] == "") B[n] = 1
    last = n
    next
}
/^kv=/ && / max_parallel=/ { fit[layers + 0, val(line, "kv")] = val(line, "max_parallel"); next }
/^proj / && / layer_us=/ {
    pn = val(line, "n")
    if (!(pn in seen)) { seen[pn] = 1; pord[++np] = pn }
    if (val(line, "path") == "cublas") { cub[pn] = val(line, "layer_us"); cubg[pn] = val(line, "weight_GBps") }
    else if (val(line, "path") == "k_matmma_pf2") { pf[pn] = val(line, "layer_us"); pfg[pn] = val(line, "weight_GBps") }
    else { own[pn] = val(line, "layer_us"); owng[pn] = val(line, "weight_GBps"); ownk[pn] = val(line, "path") }
    next
}
/^cuda_count:/ {
    if (last) {
        L[last] = val(line, "launches_step"); S[last] = val(line, "syncs_step"); LL[last] = val(line, "launches_layer")
        CL[last] = val(line, "calls_layer")
        G[last] = val(line, "graph_launches_step")
    }
    last = 0
    next
}
END {
    printf "== figures beside their targets (../shared/GPU.md, H100; issue 45: <= 12 launches a layer, kernels and library calls (calls/lay), 1 sync a step; a step one graph launch) ==\n"
    printf "%-9s %7s %5s %6s %10s %9s %10s %9s %13s %9s %8s %9s  %s\n", "kv", "context", "batch", "layers", "tok/s", "launch/st",
        "launch/lay", "calls/lay", "host_sync/st", "32L tok/s", "graph/st", "warmup_ms", "target (tok/s, whole model)"
    rows = 0
    for (i = 1; i <= n; i++) {
        if (Ly[i] == 2) continue
        proj = "-"
        if (Ly[i] == 1)
            for (j = 1; j <= n; j++)
                if (Ly[j] == 2 && K[j] == K[i] && C[j] == C[i] && B[j] == B[i] && M[i] > 0 && M[j] > 0) {
                    d = M[j] - M[i] # the second layer (a noisy tiny run may time it below 0: none)
                    t = M[i] + 31 * (d > 0 ? d : 0)
                    proj = sprintf("%.1f", 1000 * B[i] / t)
                }
        printf "%-9s %7s %5s %6s %10s %9s %10s %9s %13s %9s %8s %9s  %s\n", K[i], C[i], B[i], Ly[i] ? Ly[i] : "all", T[i], or_dash(L[i]),
            or_dash(LL[i]), or_dash(CL[i]), or_dash(S[i]), proj, or_dash(G[i]), or_dash(W[i]), target(K[i], C[i], B[i])
        rows++
    }
    if (!rows) printf "(no bench line)\n"
    for (k in fit) {
        split(k, kk, SUBSEP)
        printf "largest batch that fits: kv=%s %s: %s\n", kk[2], kk[1] == 1 ? "(one layer)" : kk[1] == 2 ? "(two layers)" : "(whole model)", fit[k]
    }
    pd = ps = ""
    for (i = 1; i <= n; i++) {
        if (Ly[i] != 1 || C[i] != big || P[i] <= 0) continue
        if (K[i] == "dense" && pd == "") { pd = P[i]; rd = R[i] }
        if (K[i] == "shadowkv" && ps == "") { ps = P[i]; rs = R[i] }
    }
    if (pd != "" && ps != "")
        printf "prefill of one layer at %d tokens: dense %.1f ms (target <= 622: 2x SDPA'"'"'s 311), shadowkv %.1f ms, overhead %.1f%% (target <= 6%%); the recording for the forks apart: %s and %s s\n",
            big, 1000 * big / pd, 1000 * big / ps, 100 * (pd / ps - 1), or_dash(rd), or_dash(rs)
    if (np) {
        printf "== one layer'"'"'s decode projections (tests/gpu/bench_proj): the backend'"'"'s kernels beside k_matmma two chunks ahead (pf2) and cuBLAS; weights read at HBM'"'"'s 3080 GB/s (../shared/GPU.md) at best ==\n"
        printf "%5s %9s %9s %9s %9s %9s %10s %11s %11s\n", "batch", "kernel", "layer_us", "GB/s", "pf2_us", "pf2_GB/s",
            "cublas_us", "cublas_GB/s", "cublas/own"
        for (i = 1; i <= np; i++) {
            pn = pord[i]
            r = (pn in own) && (pn in cub) && own[pn] > 0 ? sprintf("%.2f", cub[pn] / own[pn]) : "-"
            printf "%5s %9s %9s %9s %9s %9s %10s %11s %11s\n", pn, (pn in own) ? ownk[pn] : "-", (pn in own) ? own[pn] : "-",
                (pn in own) ? owng[pn] : "-", (pn in pf) ? pf[pn] : "-", (pn in pf) ? pfg[pn] : "-",
                (pn in cub) ? cub[pn] : "-", (pn in cub) ? cubg[pn] : "-", r
        }
    }
}' "$1"
