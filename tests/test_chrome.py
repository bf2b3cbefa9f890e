#!/usr/bin/python3
"""test_chrome: `skv export TRACE --format chrome OUT.json` (probes/trace_chrome.c).

On a ShadowKV trace with the oracle, a compare trace, a batched trace, a
needle trace and a trace written from Python by skvtrace.Recorder (its
cuda_span included):
- the JSON parses (no NaN or Infinity), every event has the fields its phase
  needs, every process and thread is named and sorted;
- spans on one thread nest or follow each other, none is negative, every
  counter is finite;
- the spans, their sum per step and lane, the steps and the lanes equal the
  trace's as the CSV export writes it, one process per lane; fetches carry
  their layer's bytes; the counters are the step and oracle records';
- Chrome DevTools' trace engine (tests/trace-consumer, installed by make
  deps) loads each file and takes every span on its thread with the same
  durations, names and nesting: a format bug fails here, not only in our
  own reading. Without node or the package the test skips with one line,
  except under CI=true, where that fails;
- the refusals of every writer: an existing file kept without --force, a
  folder or a missing folder refused before any work, a trace cut short
  refused without --partial (and exported with it), a damaged file refused
  in one line, nothing left behind.
Prints PASS/FAIL/SKIP lines for tests/run.sh."""
import csv
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict

from testhelp import ROOT, SKV, check, finish  # noqa: E402
MODEL = os.path.join(ROOT, "samples", "model", "skv-demo.gguf")
PROMPT = os.path.join(ROOT, "samples", "prompts", "default.txt")
CONSUMER = os.path.join(ROOT, "tests", "trace-consumer")
CI = os.environ.get("CI") == "true"


def run(args):
    p = subprocess.run([SKV] + args, cwd=ROOT, capture_output=True, text=True, errors="replace")
    return p.returncode, p.stdout + p.stderr


def no_constant(name):
    raise ValueError("a number that is not finite: %s" % name)


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f, parse_constant=no_constant)


def ns(us):
    """A time in microseconds (3 decimals, as written) as integer nanoseconds."""
    return int(round(us * 1000))


def read_csv(d, name):
    p = os.path.join(d, name + ".csv")
    return list(csv.DictReader(open(p, newline="", encoding="utf-8"))) if os.path.exists(p) else []


# ---- the checks every export gets

REQUIRED = {"X": ("name", "ts", "dur", "pid", "tid", "args"), "i": ("name", "ts", "pid", "tid", "s"),
            "C": ("name", "ts", "pid", "args"), "M": ("name", "pid", "args")}
META_ARG = {"process_name": "name", "process_sort_index": "sort_index", "process_labels": "labels",
            "thread_name": "name", "thread_sort_index": "sort_index"}


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def shape_problems(doc):
    """Fields each phase needs, names, finiteness; a list of problems."""
    bad = []
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return ["no traceEvents array in an object"]
    if doc.get("displayTimeUnit") not in ("ms", "ns"):
        bad.append("displayTimeUnit %r" % doc.get("displayTimeUnit"))
    md = doc.get("metadata")
    if not isinstance(md, dict) or not md.get("skv_version") or not md.get("trace_writer"):
        bad.append("metadata lacks skv_version or trace_writer")
    pnames, tnames, psort, tsort = {}, {}, {}, {}
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        if ph not in REQUIRED:
            bad.append("phase %r" % ph)
            continue
        miss = [k for k in REQUIRED[ph] if k not in e]
        if miss:
            bad.append("%s event lacks %s: %s" % (ph, miss, e))
            continue
        if not isinstance(e["pid"], int) or ("tid" in e and not isinstance(e["tid"], int)):
            bad.append("pid/tid not integers: %s" % e)
        if ph in "XiC" and not is_num(e["ts"]):
            bad.append("ts %r" % e["ts"])
        if ph == "X":
            a = e["args"]
            if not is_num(e["dur"]) or e["dur"] < 0:
                bad.append("dur %r" % e["dur"])
            if not all(isinstance(a.get(k), int) for k in ("layer", "head", "step")):
                bad.append("span args %s" % a)
            if "bytes" in a and not (is_num(a["bytes"]) and a["bytes"] > 0 and is_num(a.get("GB/s", 1))):
                bad.append("span bytes %s" % a)
        elif ph == "i":
            if e["s"] not in ("g", "p", "t"):
                bad.append("instant scope %r" % e["s"])
        elif ph == "C":
            if not e["args"] or not all(is_num(v) for v in e["args"].values()):
                bad.append("counter args %s" % e["args"])
        else:
            key = META_ARG.get(e["name"])
            if key is None or key not in e["args"]:
                bad.append("metadata event %s" % e)
                continue
            if e["name"].startswith("thread") and "tid" not in e:
                bad.append("thread metadata without tid: %s" % e)
            v = e["args"][key]
            {"process_name": pnames, "process_sort_index": psort}.get(e["name"], {})[e["pid"]] = v
            if e["name"] == "thread_name":
                tnames[(e["pid"], e["tid"])] = v
            if e["name"] == "thread_sort_index":
                tsort[(e["pid"], e["tid"])] = v
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and (e["pid"], e["tid"]) not in tnames:
            bad.append("span on an unnamed thread %s/%s" % (e["pid"], e["tid"]))
            break
        if e.get("ph") in ("X", "i", "C") and e["pid"] not in pnames:
            bad.append("event of an unnamed process %s" % e["pid"])
            break
    if set(tnames) != set(tsort) or set(pnames) != set(psort):
        bad.append("a named process or thread without its sort index")
    return bad


def nesting_problems(doc):
    """Spans on one thread must nest in or follow each other."""
    by = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            by[(e["pid"], e["tid"])].append((ns(e["ts"]), ns(e["ts"]) + ns(e["dur"]), e["name"]))
    for key, spans in by.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        stack = []
        for a, b, name in spans:
            while stack and stack[-1] <= a:
                stack.pop()
            if stack and b > stack[-1]:
                return "thread %s: %s [%d, %d] ns overlaps its parent's end %d" % (key, name, a, b, stack[-1])
            stack.append(b)
    return ""


def lane_of(doc, csvdir):
    """pid -> the trace's lane, by the process's name (policy, or "seq i")."""
    lanes = read_csv(csvdir, "lane")
    batched = any(r["teacher"] == "" for r in lanes)
    pol = {}
    for r in lanes:
        pol.setdefault(r["policy"], int(r["lane"]))
    out = {}
    for e in doc["traceEvents"]:
        if e["ph"] == "M" and e["name"] == "process_name":
            n = e["args"]["name"]
            out[e["pid"]] = int(n.split()[1]) if batched else pol.get(n, 0)
    return out


def compare_with_csv(name, doc, csvdir):
    """Spans, per-step sums, steps, lanes and counters against the CSV tables."""
    lane = lane_of(doc, csvdir)
    spans = read_csv(csvdir, "span")
    xs = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    check("%s: a complete event for every span record (%d)" % (name, len(spans)), len(xs) == len(spans),
          "%d events" % len(xs))
    want, got = defaultdict(float), defaultdict(float)
    for r in spans:
        want[(int(r["lane"]), int(r["step"]))] += float(r["t1"]) - float(r["t0"])
    for e in xs:
        got[(lane[e["pid"]], e["args"]["step"])] += e["dur"] / 1e6
    worst = max((abs(want[k] - got.get(k, 0)) for k in want), default=0)
    check("%s: the spans' time per lane and step equals the trace's (%d steps, worst %.2g s)" % (name, len(want), worst),
          set(want) == set(got) and worst < 1e-9 * (1 + len(spans)), sorted(set(want) ^ set(got))[:5])
    steps = read_csv(csvdir, "step")
    n_lanes = len({int(r["lane"]) for r in spans} | {int(r["lane"]) for r in steps}) or 1
    pids = {e["pid"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    check("%s: one process per lane (%d)" % (name, n_lanes), len(pids) == n_lanes, sorted(pids))
    marks = defaultdict(set)
    for e in doc["traceEvents"]:
        if e["ph"] == "i":
            marks[lane[e["pid"]]].add(e["args"]["step"])
    want_steps = defaultdict(set)
    for r in steps:
        want_steps[int(r["lane"])].add(int(r["step"]))
    check("%s: a step instant for every step of every lane (%d)" % (name, sum(len(v) for v in want_steps.values())),
          dict(marks) == dict(want_steps), (dict(marks), dict(want_steps)))
    hit = [e for e in doc["traceEvents"] if e["ph"] == "C" and e["name"] == "hit rate"]
    with_rate = [r for r in steps if r["hit_rate"] != "nan"]  # a policy without a cache (Quest) has none
    check("%s: a hit-rate counter for every step record with a hit rate (%d of %d)" % (name, len(with_rate), len(steps)),
          len(hit) == len(with_rate), "%d of %d" % (len(hit), len(with_rate)))
    if name == "compare":  # shadowkv,quest: Quest keeps no cache, so its steps have no hit rate (not 0)
        check("compare: Quest's steps have no hit rate, ShadowKV's have one", 2 * len(with_rate) == len(steps) > 0,
              "%d of %d" % (len(with_rate), len(steps)))
    fetched = defaultdict(float)
    for r in steps:
        fetched[(int(r["lane"]), int(r["step"]))] = float(r["fetch_bytes"])
    cb = {(lane[e["pid"]], step_at(doc, e)): e["args"]["bytes"] for e in doc["traceEvents"]
          if e["ph"] == "C" and e["name"] == "bytes fetched"}
    check("%s: the bytes-fetched counters are the step records'" % name, cb == dict(fetched),
          [(k, cb.get(k), fetched[k]) for k in fetched if cb.get(k) != fetched[k]][:3])
    # a value fetch carries its layer's bytes of that step (the decode-head records')
    dh = defaultdict(float)
    for r in read_csv(csvdir, "decode_head"):
        dh[(int(r["lane"]), int(r["step"]), int(r["layer"]))] += float(r["fetch_bytes"])
    fb = defaultdict(float)
    for e in xs:
        if e["name"] == "fetch_v" and "bytes" in e["args"]:
            fb[(lane[e["pid"]], e["args"]["step"], e["args"]["layer"])] += e["args"]["bytes"]
    return all(abs(fb[k] - dh[k]) <= 0.5 * len(xs) for k in fb), len(fb)


def step_at(doc, counter):
    """The step a counter event belongs to: the step instant of its process at its time."""
    cache = doc.setdefault("_steps", {})
    if not cache:
        for e in doc["traceEvents"]:
            if e["ph"] == "i":
                cache[(e["pid"], e["ts"])] = e["args"]["step"]
    return cache.get((counter["pid"], counter["ts"]))


# ---- the real consumer: Chrome DevTools' trace engine under node

def consumer_state():
    """(runnable, why not)."""
    node = shutil.which("node") or shutil.which("nodejs")
    if not node:
        return None, "node is not installed (make deps installs nodejs)"
    pkg = os.path.join(CONSUMER, "node_modules", "@paulirish", "trace_engine", "package.json")
    if not os.path.exists(pkg):
        return None, "tests/trace-consumer/node_modules lacks @paulirish/trace_engine (make deps runs npm ci there)"
    return node, ""


def consumer_load(node, path):
    p = subprocess.run([node, os.path.join(CONSUMER, "load.mjs"), path], cwd=CONSUMER, capture_output=True, text=True,
                       timeout=300)
    if p.returncode:
        return None, (p.stderr or p.stdout).strip()[-400:]
    return json.loads(p.stdout), ""


def consumer_agrees(doc, seen):
    """What DevTools' engine took, against our own reading of the file."""
    want = defaultdict(lambda: [0, 0, ""])
    tnames, pnames = {}, {}
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            w = want[(e["pid"], e["tid"])]
            w[0] += 1
            w[1] += ns(e["dur"])
        elif e["ph"] == "M" and e["name"] == "thread_name":
            tnames[(e["pid"], e["tid"])] = e["args"]["name"]
        elif e["ph"] == "M" and e["name"] == "process_name":
            pnames[e["pid"]] = e["args"]["name"]
    got = {}
    for pid, pr in seen["processes"].items():
        if pr["name"] != pnames.get(int(pid)):
            return "process %s named %r by the engine, %r in the file" % (pid, pr["name"], pnames.get(int(pid)))
        for tid, th in pr["threads"].items():
            got[(int(pid), int(tid))] = th
    if set(got) != set(want):
        return "threads with spans: engine %s, file %s" % (sorted(got), sorted(want))
    for k, (n, dur, _) in want.items():
        th = got[k]
        if th["entries"] != n or abs(ns(th["dur_us"]) - dur) > n:
            return "thread %s: engine took %d spans, %.3f us; the file has %d, %.3f us" % (
                k, th["entries"], th["dur_us"], n, dur / 1000)
        if th["in_tree"] != n:
            return "thread %s: the engine placed %d of %d spans in its call tree (they do not nest)" % (
                k, th["in_tree"], n)
        if th["name"] != tnames.get(k):
            return "thread %s named %r by the engine, %r in the file" % (k, th["name"], tnames.get(k))
    return ""


def check_export(name, doc, csvdir, node, out):
    """Every check of one export: its shape, its nesting, the CSV's counts and sums, the consumer."""
    bad = shape_problems(doc)
    check("%s: every event has its phase's fields; processes and threads named and sorted" % name, not bad, bad[:3])
    nest = nesting_problems(doc)
    check("%s: spans on one thread nest or follow each other" % name, not nest, nest)
    ok, n_fetch = compare_with_csv(name, doc, csvdir)
    check("%s: each value fetch carries its layer's bytes of the step (%d)" % (name, n_fetch), ok)
    if node:
        seen, err = consumer_load(node, out)
        check("%s: Chrome DevTools' trace engine loads the file" % name, seen is not None, err)
        if seen is not None:
            diff = consumer_agrees(doc, seen)
            check("%s: the engine takes every span, on its named thread, with its time and nesting" % name,
                  not diff, diff)


# ---- a trace written from Python, with cuda_span

class FakeCudaEvent:
    """torch.cuda.Event(enable_timing=True) on the host clock: what cuda_span reads."""

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self, stream=None):
        self.t = time.perf_counter()

    def elapsed_time(self, end):
        return (end.t - self.t) * 1000.0


def write_python_trace(path):
    """A run recorded by skvtrace.Recorder from numpy arrays: host spans on
    compute (attention enclosing select) and a cuda_span fetch on the fetch
    stream, the oracle on. torch is replaced by a stand-in with host-timed
    events (no GPU here); the recorder's cuda_span path is the real one."""
    import numpy as np
    import skvtrace
    fake = types.ModuleType("torch")
    fake.cuda = types.SimpleNamespace(Event=FakeCudaEvent, synchronize=lambda: None)
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake
    try:
        rng = np.random.RandomState(3)
        L, H, KV, d, P = 2, 2, 1, 8, 24
        rec = skvtrace.Recorder(path, n_layers=L, n_heads=H, n_kv_heads=KV, head_dim=d, max_ctx=64, policy="pyquest",
                                policy_opts="budget=8 page=4", budget=8, oracle=True, block=4, model="tiny",
                                producer="test_chrome.py")
        rec.prompt(list(range(P)), ["t%d" % i for i in range(P)])
        K = rng.standard_normal((P + 4, KV, d)).astype(np.float32)
        V = rng.standard_normal((P + 4, KV, d)).astype(np.float32)
        for s in range(3):
            rec.begin_step(100 + s, "x")
            T = rec.ctx
            c0 = FakeCudaEvent()
            for layer in range(L):
                with rec.span("attention", layer, 0):
                    if layer == 0:
                        c0.record()  # a copy that starts inside layer 0's attention and ends after the last layer's
                    with rec.span("select", layer, 0):
                        rec.select(layer, 0, pages=[0, 2], page_size=4, scores=[2.0, 1.0], also=[T - 1],
                                   fetch_bytes=1024 * (layer + 1), hits=1, misses=1)
                    a, b = FakeCudaEvent(), FakeCudaEvent()
                    a.record()
                    time.sleep(0.0005)
                    b.record()
                    rec.cuda_span("fetch_v", a, b, layer, 1)
                    q = rng.standard_normal((H, d)).astype(np.float32)
                    rec.attention(layer, q, q, K[:T], V[:T])
            c1 = FakeCudaEvent()
            time.sleep(0.0005)
            c1.record()
            rec.cuda_span("copy", c0, c1, -1, 0)
            rec.end_step(top1_agree=True)
        rec.close()
    finally:
        if saved is not None:
            sys.modules["torch"] = saved
        else:
            del sys.modules["torch"]


def main():
    if not os.path.exists(MODEL):
        print("SKIP chrome export tests: %s is missing" % MODEL)
        return
    tmp = tempfile.mkdtemp(prefix="skv-chrome-")
    try:
        runs = {
            "shadowkv": ["run", "-m", MODEL, "-f", PROMPT, "-n", "4", "--kv", "shadowkv", "--budget", "3%", "--oracle"],
            "compare": ["run", "-m", MODEL, "-f", PROMPT, "-n", "3", "--kv", "shadowkv,quest", "--budget", "3%"],
            "batch": ["run", "-m", MODEL, "-f", PROMPT, "-n", "3", "--parallel", "3", "--kv", "shadowkv", "--budget",
                      "3%"],
            "needle": ["needle", "--task", "multikey", "--lengths", "600", "--depths", "50", "--kv", "dense,shadowkv"],
        }
        traces = {}
        for name, args in runs.items():
            tr = os.path.join(tmp, name + ".skvt")
            rc, out = run(args + ["--trace", tr])
            check("a %s trace is written" % name, rc == 0 and os.path.exists(tr), out[-300:])
            traces[name] = tr
        py = os.path.join(tmp, "python.skvt")
        if importlib.util.find_spec("numpy"):
            write_python_trace(py)
            traces["python"] = py
        else:
            print("SKIP the Python-written trace: no numpy (make deps installs python3-numpy)")

        node, why = consumer_state()
        if not node:
            if CI:
                check("the trace consumer is installed (CI=true)", False, why)
            else:
                print("SKIP loading the exports with Chrome DevTools' trace engine: %s" % why)
        docs = {}
        for name, tr in traces.items():
            if not os.path.exists(tr):
                continue
            out = os.path.join(tmp, name + ".json")
            rc, msg = run(["export", tr, "--format", "chrome", out])
            check("skv export %s --format chrome" % name, rc == 0 and os.path.exists(out), msg[-300:])
            if rc:
                continue
            csvdir = os.path.join(tmp, name + "-csv")
            rc, msg = run(["export", tr, "--format", "csv", csvdir])
            check("skv export %s --format csv (the reference)" % name, rc == 0, msg[-300:])
            try:
                doc = load_json(out)
            except ValueError as e:
                check("%s: the JSON parses, every number finite" % name, False, e)
                continue
            check("%s: the JSON parses, every number finite" % name, True)
            try:
                check_export(name, doc, csvdir, node, out)
                docs[name] = doc
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
                check("%s: the checks read the file" % name, False, "%s: %s" % (type(e).__name__, e))

        # what each kind of trace must show
        if "shadowkv" in docs:
            d = docs["shadowkv"]
            xs = [e for e in d["traceEvents"] if e["ph"] == "X"]
            names = {e["args"]["name"] for e in d["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
            check("shadowkv: threads compute, fetch and rebuild", {"compute", "fetch", "rebuild"} <= names, names)
            check("shadowkv: fetches carry bytes and GB/s",
                  any(e["name"] == "fetch_v" and e["args"].get("GB/s", 0) > 0 for e in xs))
            rec = [e for e in d["traceEvents"] if e["ph"] == "C" and e["name"] == "mass recall"]
            err = [e for e in d["traceEvents"] if e["ph"] == "C" and e["name"] == "output error"]
            orc = read_csv(os.path.join(tmp, "shadowkv-csv"), "oracle")
            mean = defaultdict(list)
            for r in orc:
                mean[int(r["step"])].append(float(r["recall"]))
            got = {step_at(d, e): e["args"]["recall"] for e in rec}
            check("shadowkv: mass recall and output error counters, recall the oracle's mean per step",
                  len(err) == len(mean) and set(got) == set(mean) and
                  all(abs(got[s] - sum(v) / len(v)) < 1e-6 for s, v in mean.items()), (got, len(err)))
            md = d["metadata"]
            check("shadowkv: the metadata names the model, the policy's options and skv's version",
                  md.get("model") == "skv-demo" and "rank=" in md.get("policies", "") and md.get("skv_version") and
                  md.get("skv_trace", {}).get("run", {}).get("kv_policy") == "shadowkv", md)
        if "compare" in docs:
            pn = sorted(e["args"]["name"] for e in docs["compare"]["traceEvents"]
                        if e["ph"] == "M" and e["name"] == "process_name")
            check("compare: the processes are the policies", pn == ["quest", "shadowkv"], pn)
        if "batch" in docs:
            pn = sorted(e["args"]["name"] for e in docs["batch"]["traceEvents"]
                        if e["ph"] == "M" and e["name"] == "process_name")
            check("batch: a process per sequence", pn == ["seq %d (shadowkv)" % i for i in range(3)], pn)
        if "needle" in docs:
            nr = [e for e in docs["needle"]["traceEvents"] if e["ph"] == "C" and e["name"] == "needle rank"]
            check("needle: a needle-rank counter at every step", nr and len(nr) == len(
                read_csv(os.path.join(tmp, "needle-csv"), "step")) and all("landmark_best" in e["args"] for e in nr), nr[:2])
        if "python" in docs:
            d = docs["python"]
            xs = [e for e in d["traceEvents"] if e["ph"] == "X"]
            cuda = [e for e in xs if e["name"] == "fetch_v"]
            check("python: the recorder's cuda_span fetches are on the fetch thread, with bytes",
                  len(cuda) == 6 and all(e["tid"] == 2 and e["args"]["bytes"] == 1024 * (e["args"]["layer"] + 1)
                                         for e in cuda), cuda[:2])
            ov = [e for e in xs if e["name"] == "copy"]
            tn = {e["tid"]: e["args"]["name"] for e in d["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
            check("python: a span overlapping another on its stream without nesting goes on an overlap track",
                  len(ov) == 3 and all(tn.get(e["tid"]) == "compute (overlap 1)" for e in ov), (ov[:1], tn))
            check("python: the metadata names the Python writer",
                  "skvtrace (Python" in d["metadata"].get("trace_writer", ""), d["metadata"].get("trace_writer"))

        # --format perfetto is the same export
        src = traces["compare"]
        a, b = os.path.join(tmp, "a.json"), os.path.join(tmp, "b.json")
        rc1, _ = run(["export", src, "--format", "chrome", a])
        rc2, _ = run(["export", src, "--format", "perfetto", b])
        check("--format perfetto writes the same file as --format chrome",
              rc1 == 0 and rc2 == 0 and open(a, "rb").read() == open(b, "rb").read())

        # refusals, before any work
        before = open(a, "rb").read()
        rc, out = run(["export", src, "--format", "chrome", a])
        check("an existing file is kept without --force (one line, exit 1)",
              rc == 1 and "exists" in out and out.count("\n") == 1 and open(a, "rb").read() == before, out)
        rc, out = run(["export", src, "--format", "chrome", a, "--force"])
        check("--force replaces it", rc == 0, out)
        rc, out = run(["export", src, "--format", "chrome", tmp])
        check("a folder as the output is refused", rc == 1 and "directory" in out, out)
        rc, out = run(["export", src, "--format", "chrome", os.path.join(tmp, "no", "such", "t.json")])
        check("an output in a missing folder is refused", rc == 1 and "does not exist" in out, out)
        rc, out = run(["export", os.path.join(tmp, "nope.skvt"), "--format", "chrome", os.path.join(tmp, "n.json")])
        check("a missing trace: one line, exit 1", rc == 1 and out.count("\n") == 1, out)
        junk = os.path.join(tmp, "junk.skvt")
        open(junk, "wb").write(b"SKVTRACE" + b"\x03\x00\x00\x00" * 3 + os.urandom(200))
        rc, out = run(["export", junk, "--format", "chrome", os.path.join(tmp, "j.json")])
        check("a damaged trace: one line, exit 1, no file", rc == 1 and out.count("\n") == 1 and
              not os.path.exists(os.path.join(tmp, "j.json")), out)
        rc, out = run(["export", src, "--format", "chrome", "--view", "timeline", os.path.join(tmp, "v.json")])
        check("--view with --format chrome is a usage error (exit 2)", rc == 2, out)

        # a span that ends before it starts: one line naming the record
        try:
            import skvtrace
            neg = os.path.join(tmp, "neg.skvt")
            with skvtrace.TraceWriter(neg, producer="test_chrome.py") as w:
                w.write("span", stream=0, layer=0, step=0, t0=0.5, t1=0.25, op="attention")
                w.write("step", step=0, token=1, seconds=0.01, kv_resident=0, kv_offloaded=0, hit_rate=0.0,
                        has_oracle=0, top1_agree=0, n_fetch=0, fetch_bytes=0, kv_stats="")
            rc, out = run(["export", neg, "--format", "chrome", os.path.join(tmp, "neg.json")])
            check("a span that ends before it starts is refused in one line naming its record",
                  rc == 1 and "record 0 (span 'attention'" in out and out.count("\n") == 1 and
                  not os.path.exists(os.path.join(tmp, "neg.json")), out)
            # a field out of its range (a stream past the 1024 the export takes): one line naming the record, the field and the range
            odd = os.path.join(tmp, "stream.skvt")
            with skvtrace.TraceWriter(odd, producer="test_chrome.py") as w:
                w.write("step", step=0, token=1, seconds=0.01, kv_resident=0, kv_offloaded=0, hit_rate=0.0,
                        has_oracle=0, top1_agree=0, n_fetch=0, fetch_bytes=0, kv_stats="")
                w.write("span", stream=5000, layer=0, step=0, t0=0.25, t1=0.5, op="attention")
            rc, out = run(["export", odd, "--format", "chrome", os.path.join(tmp, "stream.json")])
            check("a span on a stream no run has is refused in one line naming its record, field and range",
                  rc == 1 and "record 1 (span): stream = 5000, expected 0..1023" in out and out.count("\n") == 1 and
                  not os.path.exists(os.path.join(tmp, "stream.json")), out)
        except ImportError:
            pass

        # issue 46: python3 -m skvtrace rewrite leaves no temporary file behind, whatever fails
        if importlib.util.find_spec("numpy"):
            import skvtrace
            rw = os.path.join(tmp, "rw")
            os.mkdir(rw)
            os.mkdir(os.path.join(rw, "out"))
            env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "probes", "python"))
            p = subprocess.run([sys.executable, "-m", "skvtrace", "rewrite", traces["compare"],
                                os.path.join(rw, "out"), "--force"], cwd=ROOT, capture_output=True, text=True, env=env)
            check("skvtrace rewrite IN FOLDER --force: refused in one line, nothing left behind",
                  p.returncode == 1 and "is a directory" in p.stderr and p.stderr.count("\n") == 1 and
                  sorted(os.listdir(rw)) == ["out"], (p.stderr, os.listdir(rw)))
            p = subprocess.run([sys.executable, "-m", "skvtrace", "rewrite", traces["compare"],
                                os.path.join(rw, "no", "t.skvt")], cwd=ROOT, capture_output=True, text=True, env=env)
            check("skvtrace rewrite into a missing folder: refused in one line",
                  p.returncode == 1 and "does not exist" in p.stderr and p.stderr.count("\n") == 1, p.stderr)
            dst = os.path.join(rw, "t.skvt")
            shutil.copy(traces["compare"], dst)
            real = os.replace

            def failing(a, b):
                raise OSError(13, "Permission denied")
            skvtrace.writer.os.replace = failing
            try:
                skvtrace.rewrite(traces["compare"], dst, force=True)
                err = ""
            except skvtrace.TraceError as e:
                err = str(e)
            finally:
                skvtrace.writer.os.replace = real
            check("skvtrace rewrite --force whose rename fails: one error, the old file kept, no temporary file",
                  "cannot put the trace in place" in err and sorted(os.listdir(rw)) == ["out", "t.skvt"] and
                  open(dst, "rb").read() == open(traces["compare"], "rb").read(), (err, os.listdir(rw)))

        # a trace cut short: refused without --partial, exported with it (the CSV export's spans)
        full = open(traces["shadowkv"], "rb").read()
        cut = os.path.join(tmp, "cut.skvt")
        open(cut, "wb").write(full[: len(full) * 2 // 3])
        rc, out = run(["export", cut, "--format", "chrome", os.path.join(tmp, "cut.json")])
        check("a cut trace is refused without --partial, in one line", rc == 1 and "--partial" in out and
              out.count("\n") == 1 and not os.path.exists(os.path.join(tmp, "cut.json")), out)
        rc, out = run(["export", cut, "--format", "chrome", os.path.join(tmp, "cut.json"), "--partial"])
        rc2, _ = run(["export", cut, "--format", "csv", os.path.join(tmp, "cut-csv"), "--partial"])
        if rc == 0 and rc2 == 0:
            d = load_json(os.path.join(tmp, "cut.json"))
            n = sum(1 for e in d["traceEvents"] if e["ph"] == "X")
            want = len(read_csv(os.path.join(tmp, "cut-csv"), "span"))
            check("--partial exports what is intact (%d spans, as the CSV export)" % want,
                  n == want and "cut short" in d["metadata"].get("cut_short", "") and not shape_problems(d) and
                  not nesting_problems(d), (n, want))
        else:
            check("--partial exports what is intact", False, out)
        left = [f for f in os.listdir(tmp) if f.startswith(".") or "tmp" in f]
        check("nothing is left behind (no temporary files)", not left, left)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
sys.exit(finish("test_chrome"))
