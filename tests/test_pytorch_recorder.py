#!/usr/bin/python3
"""test_pytorch_recorder: KV methods written in PyTorch, recorded with
skvtrace.Recorder, give the same data as skv's own policies.

On the demo model and samples/prompts/needle.txt, 8 decode steps fed the same
tokens: the PyTorch Quest and ShadowKV of probes/python/examples select the
same blocks as `skv run --kv quest|shadowkv --oracle` at every step, layer
and KV head, and their oracle measures (recall, overlap, output error, mass
kept) agree within float32 noise (ShadowKV's out_err: bf16 rounding). The views draw from the Python traces
(skv export --view; skv inspect --replay names the writer and leaves out the
tabs without events), `skv needle --diagnose` explains a needle the PyTorch
ShadowKV missed, a recorder stopped mid-run leaves a trace skv loads, the
last token (sampled after the last step) is recorded as generated text, and the
recorder refuses bad input with one line. Needs Debian's python3-torch (make
deps). Prints PASS/FAIL/SKIP."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from testhelp import ROOT, SKV, check, finish  # noqa: E402
try:
    import numpy as np
    import torch  # noqa: F401
    import regex  # noqa: F401  (samples/train/train.py's tokenizer regexes)
    import skvtrace
except ImportError as e:
    print("SKIP PyTorch recorder tests: %s (make deps installs python3-torch and python3-regex)" % e)
    sys.exit(0)

MODEL = os.path.join(ROOT, "samples", "model", "skv-demo.gguf")
PROMPT = os.path.join(ROOT, "samples", "prompts", "needle.txt")
REC = os.path.join(ROOT, "probes", "python", "examples", "record_demo.py")
STEPS = 8


def run(args):
    p = subprocess.run([SKV] + args, cwd=ROOT, capture_output=True, text=True, errors="replace")
    return p.returncode, p.stdout + p.stderr


def record(args):
    p = subprocess.run([sys.executable, REC] + args, cwd=ROOT, capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def selections(t):
    d = {}
    dh, arr = t["decode_head"], t.array("decode_head", "sel")
    for r, s, l, h in zip(dh["record"], dh["step"], dh["layer"], dh["head"]):
        d[(int(s), int(l), int(h))] = sorted(arr["sel"][arr["record"] == r].tolist())
    return d


tmp = tempfile.mkdtemp(prefix="skv-torchrec-")
traces = {}
try:
    policies = {"quest": ["--budget", "64"], "shadowkv": ["--budget", "64", "--rank", "16", "--outliers", "4"]}
    for pol, opts in policies.items():
        ct, pt = os.path.join(tmp, pol + ".skv"), os.path.join(tmp, pol + ".torch")
        rc, out = run(["run", "-m", MODEL, "-f", PROMPT, "-n", str(STEPS + 1), "--kv", pol, "--oracle",
                       "--trace", ct] + opts)
        if rc:
            check("skv run --kv %s --oracle --trace" % pol, False, out)
            continue
        t0 = time.time()
        rc, out = record(["--kv", pol, "--ids-from", ct, "--feed", "-n", str(STEPS), "--oracle", "-o", pt] + opts)
        if rc:
            check("record_demo.py --kv %s" % pol, False, out)
            continue
        a, b = skvtrace.load(ct), skvtrace.load(pt)
        traces[pol] = pt
        sa, sb = selections(a), selections(b)
        diff = [k for k in sa if sa[k] != sb.get(k)]
        check("PyTorch %s selects what skv's does at every step, layer and KV head (%d selections, %d steps; "
              "recorded in %.1f s)" % (pol, len(sa), len(set(k[0] for k in sa)), time.time() - t0),
              len(sa) > 0 and sa.keys() == sb.keys() and not diff and len(set(k[0] for k in sa)) == STEPS,
              [(k, sa[k], sb.get(k)) for k in diff[:3]] or (len(sa), len(sb)))
        oa, ob = a["oracle"], b["oracle"]
        keys = lambda o: list(zip(o["step"].tolist(), o["layer"].tolist(), o["head"].tolist()))
        worst = {}
        same_keys = keys(oa) == keys(ob)
        if same_keys:
            for f in ("recall", "overlap", "out_err", "mass_kept"):
                worst[f] = float(np.abs(oa[f].astype(np.float64) - ob[f].astype(np.float64)).max())
            for f in ("n_kept", "n_gen", "ctx", "unit"):
                worst[f] = int(np.abs(oa[f].astype(np.int64) - ob[f].astype(np.int64)).max())
        # ShadowKV's attention rows are bf16 in both: where the two f32
        # paths (LAPACK and torch's SVD, each's matmul order) land on either
        # side of a bf16 rounding, a value moves one bf16 step (2^-8
        # relative) and the output by a share of it: out_err within 2^-12
        tol = {f: 2e-5 for f in ("recall", "overlap", "out_err", "mass_kept")}
        if pol == "shadowkv":
            tol["out_err"] = 2 ** -12
        check("PyTorch %s's oracle agrees with skv's --oracle within float32 noise%s (largest differences: %s)" % (
              pol, ", out_err within bf16 rounding (2^-12)" if pol == "shadowkv" else "",
              ", ".join("%s %.1e" % (k, v) for k, v in worst.items() if isinstance(v, float))),
              same_keys and len(keys(oa)) == STEPS * 4 * 2 and
              all(worst[f] <= tol[f] for f in tol) and
              all(worst[f] == 0 for f in ("n_kept", "n_gen", "ctx", "unit")), worst or (len(keys(oa)), len(keys(ob))))
        # hit_rate NaN where the policy keeps no cache (Quest), in both
        books = all(np.array_equal(a["step"][f], b["step"][f], equal_nan=f == "hit_rate")
                    for f in ("n_fetch", "fetch_bytes", "hit_rate"))
        check("PyTorch %s: the steps feed the same tokens, agree with dense, and fetch and hit what skv's do "
              "(misses a step: %s)" % (pol, b["step"]["n_fetch"].tolist()),
              a["step"]["token"].tolist() == b["step"]["token"].tolist() and
              b["step"]["has_oracle"].tolist() == [1] * STEPS and books,
              (a["step"]["token"], b["step"]["token"], a["step"]["n_fetch"], b["step"]["n_fetch"]))

    # ---- the views draw from the Python traces
    # Quest keeps no cache: its Cache view says so, as skv's own trace does (below, with the needle view)
    want = {"quest": ["selection", "timeline", "tokens", "compare", "bounds"],
            "shadowkv": ["spectrum", "chunkmap", "selection", "cache", "timeline", "tokens", "compare"]}
    for pol, pt in traces.items():
        bad = []
        for v in want[pol]:
            png = os.path.join(tmp, "%s-%s.png" % (pol, v))
            rc, out = run(["export", "--trace", pt, "--view", v, "-o", png, "--layer", "2"])
            if rc or open(png, "rb").read(8) != b"\x89PNG\r\n\x1a\n":
                bad.append("%s: %s" % (v, out.strip()))
        rc, out = run(["export", "--trace", pt, "--view", "needle", "-o", os.path.join(tmp, "n.png")])
        check("skv export draws %s from the PyTorch %s trace; a view without its events says so in one line" % (
              ", ".join(want[pol]), pol), not bad and rc != 0 and out.strip().count("\n") == 0 and "no" in out,
              bad or out)
        if pol == "quest":
            rc, out = run(["export", "--trace", pt, "--view", "cache", "-o", os.path.join(tmp, "c.png")])
            check("the PyTorch quest trace's Cache view says Quest keeps no cache, in one line",
                  rc != 0 and out.strip().count("\n") == 0 and "quest keeps no cache" in out, out)
    if shutil.which("tmux") and "quest" in traces:
        sess = "skvrec%d" % os.getpid()
        errf = os.path.join(tmp, "inspect.err")
        subprocess.run(["tmux", "new-session", "-d", "-s", sess, "-x", "200", "-y", "40",
                        "%s inspect --replay %s 2>%s; sleep 30" % (SKV, traces["quest"], errf)], check=False)
        screen = ""
        for _ in range(50):
            time.sleep(0.2)
            screen = subprocess.run(["tmux", "capture-pane", "-p", "-t", sess], capture_output=True,
                                    text=True).stdout
            if "Selection" in screen and "written by" in screen:
                break
        subprocess.run(["tmux", "send-keys", "-t", sess, "q"], check=False)
        time.sleep(0.5)
        subprocess.run(["tmux", "kill-session", "-t", sess], check=False, capture_output=True)
        tabs = screen.splitlines()[0] if screen else ""
        err = open(errf).read() if os.path.exists(errf) else ""
        check("skv inspect --replay on the PyTorch trace names its writer and leaves out the tabs without events",
              "written by skvtrace (Python" in screen and "Selection" in tabs and "Bounds" in tabs and
              "Spectrum" not in tabs and "Needle" not in tabs and "no tab for Spectrum (no prefill_layer events)" in err,
              screen[:600] + err)
    else:
        print("SKIP skv inspect --replay on a PyTorch trace: tmux not found (make deps installs it)")

    # ---- skv needle --diagnose on a needle the PyTorch ShadowKV missed
    case = os.path.join(tmp, "case.skv")
    rc, out = run(["needle", "--lengths", "1k", "--depths", "10:90:20", "--kv", "shadowkv", "--budget", "64",
                   "--rank", "8", "--case", "4", "--explain", "--no-check", "--trace", case])
    if rc == 0:
        t = skvtrace.load(case)
        n = t["niah"]
        b, e, value = int(n["tok_begin"][0]), int(n["tok_end"][0]), str(n["value"][0])
        pt = os.path.join(tmp, "needle.torch")
        rc, out = record(["--kv", "shadowkv", "--budget", "64", "--rank", "8", "--outliers", "4", "--ids-from", case,
                          "-n", "11", "--oracle", "--needle", "%d:%d" % (b, e), "--value", value, "-o", pt])
        rc2, out2 = run(["needle", "--diagnose", pt])
        check("skv needle --diagnose explains the needle the PyTorch ShadowKV missed (value %s, tokens %d..%d)" % (
              value, b, e - 1), rc == 0 and rc2 == 0 and "dense hit, shadowkv missed" in out2 and "verdict:" in out2
              and "tokens %d..%d" % (b, e - 1) in out2, out + out2)
    else:
        check("skv needle --case 4 --trace (the needle case)", False, out)

    # ---- a recorder stopped mid-run; and its refusals
    sys.path.insert(0, os.path.join(ROOT, "probes", "python", "examples"))
    rec_path = os.path.join(tmp, "cut.torch")
    R = skvtrace.Recorder(rec_path, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, max_ctx=64, policy="mine",
                          budget=8, oracle=True)
    R.prompt(list(range(10)), [b"t"] * 10)
    rng = np.random.RandomState(1)
    for s in range(3):
        R.begin_step(7, b"x")
        T = R.ctx
        K, V = rng.standard_normal((T, 2, 8)).astype(np.float32), rng.standard_normal((T, 2, 8)).astype(np.float32)
        for l in range(2):
            for h in range(2):
                R.select(l, h, pages=[0, 1], page_size=4, also=np.arange(T - 2, T))
            q = rng.standard_normal((4, 8)).astype(np.float32)
            R.attention(l, q, q, K, V)
        if s < 2:
            R.end_step(top1_agree=True)
    R.cut()
    rc, out = run(["export", "--trace", rec_path, "--view", "selection", "-o", os.path.join(tmp, "cut.png")])
    t = skvtrace.load(rec_path, partial=True)
    check("a recorder stopped mid-step leaves a trace skv loads to its last complete step",
          rc == 0 and "cut short" in out and len(t["step"]["step"]) == 2, out)

    # ---- the last token: sampled after the last step, fed to none
    lp = os.path.join(tmp, "last.torch")
    R = skvtrace.Recorder(lp, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, max_ctx=64, policy="mine")
    R.prompt(list(range(5)), [b"p"] * 5)
    for s in range(2):
        R.begin_step(7, b" fed")
        R.end_step()
    R.last_token(9, b" last")
    late = []
    for what, fn in (("a second last token", lambda: R.last_token(9)), ("a step after it", lambda: R.begin_step(9))):
        try:
            fn()
            late.append("accepted: " + what)
        except skvtrace.TraceValueError as e:
            if "last token" not in str(e):
                late.append("%s: %r" % (what, str(e)))
    R.close()
    rc, out = run(["trace", "info", lp])
    rc2, out2 = run(["export", "--trace", lp, "--view", "tokens", "-o", os.path.join(tmp, "last.svg")])
    svg = open(os.path.join(tmp, "last.svg")).read() if rc2 == 0 else ""
    check("Recorder.last_token: the token after the last step is in the trace, as a generated token, counting "
          "no step; a second one or a step after it refused",
          rc == 0 and "steps      2\n" in out and "token          8" in out and "5 prompt + 3 generated" in svg
          and " last" in svg and not late, (out, out2, late))

    R = skvtrace.Recorder(os.path.join(tmp, "bad.torch"), n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                          max_ctx=32, policy="mine", oracle=True)
    msgs = []

    def refuse(what, fn, want):
        try:
            fn()
            msgs.append("accepted: " + what)
        except skvtrace.TraceValueError as e:
            if want not in str(e) or "\n" in str(e):
                msgs.append("%s: %r (want %r)" % (what, str(e), want))

    refuse("a step before the prompt", lambda: R.begin_step(1), "give the prompt first")
    R.prompt(list(range(6)))
    refuse("a step out of order", lambda: R.begin_step(1, step=3), "out of order")
    refuse("select outside a step", lambda: R.select(0, 0, indices=[1]), "no decode step")
    R.begin_step(1)
    refuse("a layer out of range", lambda: R.select(2, 0, indices=[1]), "layer 2 is out of range")
    refuse("a KV head out of range", lambda: R.select(0, 5, indices=[1]), "KV head 5 is out of range")
    refuse("a position past the sequence", lambda: R.select(0, 0, indices=[7]), "past the sequence")
    refuse("a page past the sequence", lambda: R.select(0, 0, pages=[2], page_size=4), "past the sequence")
    refuse("float indices", lambda: R.select(0, 0, indices=np.array([1.0])), "must be integers")
    refuse("a mask of the wrong length", lambda: R.select(0, 0, mask=np.ones(3, bool)), "expected shape (7,)")
    Q = np.zeros((4, 8), np.float32)
    KV = np.zeros((7, 2, 8), np.float32)
    refuse("q of the wrong shape", lambda: R.attention(0, np.zeros((4, 7), np.float32), Q, KV, KV), "attention q")
    refuse("k of the wrong length", lambda: R.attention(0, Q, Q, KV[:6], KV), "expected shape (7, 2, 8)")
    refuse("integer keys", lambda: R.attention(0, Q, Q, KV.astype(np.int32), KV), "expected floats")
    check("the recorder refuses 12 kinds of bad input with one line each", not msgs, msgs)
    R.w.abort()
finally:
    shutil.rmtree(tmp, ignore_errors=True)

sys.exit(finish("test_pytorch_recorder"))
