#!/usr/bin/python3
"""test_gpu_check: make gpu-check's pack and run script, tried on the CPU
fallback with tiny sizes (tests/gpu/pack.sh with SKV_GPU_PACK_CPU=1, then
gpu-check.sh with SKV_GPU_CHECK_CPU=1): every step runs in order and says
ok, the results are at most 8 files under 16 MiB (a PNG timeline, a trace skv
reads, the bench lines of both policies at each size and batch, each step's
marked with its model's layers; the summary's table of figures beside their
targets, with the one-layer runs projected to the whole model); the bundle
carries libskv-cuda.so beside skv and no CUDA library; a step made to hang
is cut by its timeout and the script still ends within its budget; the pack
refuses a bundle over its size limit and a missing 8B config; the
projections' bench runs three times and says there is no device. Needs the
build's CUDA test binaries (a build with nvcc). Prints PASS/FAIL/SKIP."""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

from testhelp import ROOT, SKV, check, finish  # noqa: E402
BIN = os.path.dirname(os.path.abspath(SKV))
if not os.access(os.path.join(BIN, "tests", "gpu", "test_cuda_ops"), os.X_OK):
    print("SKIP gpu-check: %s has no CUDA test binaries (a build without nvcc)" % BIN)
    sys.exit(0)
for tool in ("xz", "timeout", "ldd", "strip"):
    if not shutil.which(tool):
        print("SKIP gpu-check: %s not found" % tool)
        sys.exit(0)

STEPS = ["device", "synth-small", "synth-2layer", "op-tests", "model-small", "model-2layer", "proj-bench", "traced-step",
         "timeline-png", "synth-1layer", "bench-1024-1l-dense", "bench-1024-1l-shadowkv", "bench-1024-2l", "synth-big",
         "bench-128-dense", "bench-128-shadowkv", "bench-256-dense", "bench-256-shadowkv", "bench-1024", "sanitizer"]
# what each bench step runs on the CPU fallback: (layers, [(kv, context, batches)], fit lines)
BENCHES = {
    "bench-1024-1l-dense": (1, [("dense", "1024", ["1", "4"])], 1),
    "bench-1024-1l-shadowkv": (1, [("shadowkv", "1024", ["1", "4"])], 1),
    "bench-1024-2l": (2, [("dense", "1024", ["1", "4"]), ("shadowkv", "1024", ["1", "4"])], 0),
    "bench-128-dense": (0, [("dense", "128", ["1", "4"])], 1),
    "bench-128-shadowkv": (0, [("shadowkv", "128", ["1", "4"])], 1),
    "bench-256-dense": (0, [("dense", "256", ["1", "4"])], 1),
    "bench-256-shadowkv": (0, [("shadowkv", "256", ["1", "4"])], 1),
    "bench-1024": (0, [("dense", "1024", ["1", "4"]), ("shadowkv", "1024", ["1", "4"])], 0),
}


def field(line, key):
    for w in line.split():
        if w.startswith(key + "="):
            return w[len(key) + 1:]
    return None


def bench_steps(path):
    """bench.txt by step: {step: (layers, [lines])}"""
    out, cur = {}, None
    for line in open(path).read().splitlines():
        if line.startswith("step="):
            cur = field(line, "step")
            out[cur] = (int(field(line, "layers")), [])
        elif cur:
            out[cur][1].append(line)
    return out


def pack(dest, **env):
    e = dict(os.environ, SKV_GPU_BIN=BIN, SKV_GPU_PACK=dest, SKV_GPU_PACK_XZ="0", **env)
    return subprocess.run(["sh", "tests/gpu/pack.sh"], cwd=ROOT, env=e, capture_output=True, text=True)


def summary(out):
    rows = {}
    with open(os.path.join(out, "summary.txt")) as f:
        for line in f:
            parts = line.split(None, 1)
            if parts and parts[0] in STEPS:
                rows[parts[0]] = parts[1].strip()
    return rows


def run_check(packdir, out, budget, **env):
    e = dict(os.environ, OUT=out, SKV_GPU_CHECK_CPU="1", SKV_GPU_BUDGET=str(budget), **env)
    t0 = time.time()
    p = subprocess.run(["sh", os.path.join(packdir, "gpu-check.sh")], env=e, capture_output=True, text=True)
    return p, time.time() - t0


tmp = tempfile.mkdtemp(prefix="skv-gpucheck-")
try:
    # refusals first: they leave nothing to carry
    p = pack(os.path.join(tmp, "nocfg"), SKV_SHARED=os.path.join(tmp, "absent"))
    check("gpu-check pack: a missing 8B config is refused with one line naming it",
          p.returncode != 0 and "llama-3.1-8b.config.json" in p.stderr and p.stderr.count("\n") == 1, p.stderr)
    big = os.path.join(tmp, "big")
    p = pack(big, SKV_GPU_PACK_CPU="1", SKV_GPU_PACK_MAX_MIB="1")
    check("gpu-check pack: a bundle over the size limit is refused and removed",
          p.returncode != 0 and "over the 1 MiB" in p.stderr and not os.path.exists(os.path.join(big, "skv-gpu.tar.xz")),
          p.stderr)

    pk = os.path.join(tmp, "pack")
    p = pack(pk, SKV_GPU_PACK_CPU="1", SKV_GPU_PACK_MAX_MIB="400")
    names = sorted(os.listdir(pk)) if os.path.isdir(pk) else []
    check("gpu-check pack: a bundle and its run script, nothing else", p.returncode == 0 and
          names == ["gpu-check.sh", "skv-gpu.tar.xz"], p.stdout + p.stderr + " " + str(names))
    if p.returncode == 0:
        lst = subprocess.run(["sh", "-c", "xz -dc '%s' | tar -tf -" % os.path.join(pk, "skv-gpu.tar.xz")],
                             capture_output=True, text=True).stdout.split()
        want = ["./bin/skv", "./bin/libskv-cuda.so", "./bin/test_cuda_ops", "./bin/test_cuda_model", "./bin/bench_proj",
                "./run.sh", "./summary.sh", "./configs/default-model.config.json"]
        check("gpu-check bundle: the binaries, the CUDA backend's object beside skv, run.sh, summary.sh, the configs "
              "and their libraries (no CUDA library)",
              all(w in lst for w in want) and any(x.startswith("./lib/lib") for x in lst) and
              not any(x.startswith(("./lib/libcudart", "./lib/libcublas", "./lib/libcusolver")) for x in lst),
              " ".join(lst))

        out = os.path.join(tmp, "out")
        p, secs = run_check(pk, out, 240)
        rows = summary(out) if os.path.exists(os.path.join(out, "summary.txt")) else {}
        check("gpu-check on the CPU fallback: exit 0, every step in order, each ok (sanitizer: not found here)",
              p.returncode == 0 and list(rows) == STEPS and
              all(rows[s].startswith("ok") for s in STEPS[:-1]) and rows["sanitizer"].split()[0] in ("ok", "skipped:"),
              p.stdout[-2000:] + p.stderr[-2000:])
        files = os.listdir(out) if os.path.isdir(out) else []
        check("gpu-check results: at most 8 files, each under 16 MiB", 0 < len(files) <= 8 and
              all(os.path.getsize(os.path.join(out, f)) < 16 << 20 for f in files), str(files))
        png = os.path.join(out, "timeline.png")
        check("gpu-check results: the timeline is a PNG", os.path.exists(png) and
              open(png, "rb").read(8) == b"\x89PNG\r\n\x1a\n")
        tr = subprocess.run([SKV, "trace", "info", os.path.join(out, "gpu.trace")], capture_output=True, text=True)
        check("gpu-check results: skv trace info reads the traced step", tr.returncode == 0, tr.stderr)
        summ = open(os.path.join(out, "summary.txt")).read()
        # bench_proj three times (the backend's kernels, k_matmma two chunks ahead, cuBLAS), each saying
        # there is no device here
        check("gpu-check summary: the projections' step ran bench_proj three times, each line in the summary",
              summ.count("bench_proj: no CUDA device") == 3, summ)
        pre = [l for l in summ.splitlines() if l.startswith("prefill of one layer at 1024 tokens: dense")]
        rec = re.search(r"the recording for the forks apart: ([0-9.]+) and ([0-9.]+) s$", pre[0]) if pre else None
        check("gpu-check summary: one layer's prefill, dense against ShadowKV, with the overhead and the recording "
              "for the forks said apart", len(pre) == 1 and "overhead" in pre[0] and rec is not None, summ)
        steps = bench_steps(os.path.join(out, "bench.txt")) if "bench.txt" in files else {}
        bad = []
        for name, (layers, runs, fits) in BENCHES.items():
            got_layers, lines = steps.get(name, (None, []))
            res = [l for l in lines if l.startswith("model=") and "decode_tok_s=" in l]
            for kv, ctx, batches in runs:
                got = sorted(field(l, "parallel") for l in res if field(l, "kv") == kv and field(l, "prompt") == ctx)
                if got != sorted(batches):
                    bad.append("%s: kv=%s prompt=%s batches %s, expected %s" % (name, kv, ctx, got, batches))
            nfit = len([l for l in lines if l.startswith("kv=") and "max_parallel=" in l])
            if got_layers != layers or nfit != fits * len(runs):
                bad.append("%s: layers=%s (expected %d), %d fit lines (expected %d)" % (name, got_layers, layers, nfit,
                                                                                       fits * len(runs)))
        check("gpu-check results: dense and shadowkv at each size and batch (1, 4, the largest that fits), "
              "each bench step marked with its model's layers", not bad, "; ".join(bad))
        # the table: a row a bench line but the two-layer ones (they only project), each with its target;
        # the one-layer rows with the whole model's tok/s projected from the two-layer ones
        rows = [l.split() for l in summ.splitlines() if l.split()[:1] in (["dense"], ["shadowkv"]) and len(l.split()) >= 11]

        def positive(x):
            try:
                return float(x) > 0
            except ValueError:
                return False
        want = sum(len(b) for n, (ly, runs, f) in BENCHES.items() if ly != 2 for k, c, b in runs)
        one = [r for r in rows if r[3] == "1"]
        check("gpu-check summary: the table of figures beside their targets, a row a (policy, context, batch), "
              "launches, calls and syncs '-' on the CPU, the first step's ms, the one-layer rows projected to 32 "
              "layers (%d rows)" % len(rows),
              "== figures beside their targets" in summ and len(rows) == want and
              all(r[5] == "-" and r[6] == "-" and r[7] == "-" and r[8] == "-" and positive(r[11]) for r in rows) and
              len(one) == 4 and
              all(positive(r[9]) for r in one) and "largest batch that fits: kv=dense (one layer)" in summ, summ)

        out2 = os.path.join(tmp, "out-hang")
        budget = 15
        p, secs = run_check(pk, out2, budget, SKV_GPU_CHECK_HANG="synth-small")
        rows = summary(out2) if os.path.exists(os.path.join(out2, "summary.txt")) else {}
        check("gpu-check: a hung step is cut by its timeout, the later ones are skipped, and the run ends in its "
              "budget (%.0f s of %d)" % (secs, budget),
              p.returncode != 0 and rows.get("synth-small", "").startswith("TIMED OUT") and
              rows.get("traced-step", "").startswith("skipped: no time left") and secs < budget + 10,
              str(rows))
finally:
    shutil.rmtree(tmp, ignore_errors=True)

sys.exit(finish("test_gpu_check"))
