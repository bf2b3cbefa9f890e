#!/usr/bin/python3
"""test_pywriter: probes/python/skvtrace's writer against skv.

- its schema tables equal `skv trace schema` (the C tables), kind by kind;
- a trace written from Python with every event kind (NaN, negative and
  64-bit values, token bytes with NUL and invalid UTF-8) is accepted by
  `skv trace info`, and `skv export --format csv` gives back every value
  written, bit for bit;
- `python3 -m skvtrace rewrite IN OUT` gives back traces skv wrote byte for
  byte (each policy with the oracle, a compare run, a batch, a needle case),
  refuses an existing OUT and a damaged IN with one line;
- a Python trace cut short (a killed writer) loads its intact steps in skv;
- the writer refuses a value that does not fit its field with one line and
  writes nothing.
Prints PASS/FAIL/SKIP lines for tests/run.sh."""
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile

from testhelp import ROOT, SKV, check, finish  # noqa: E402
try:
    import numpy as np
    import skvtrace
except ImportError as e:
    print("SKIP skvtrace writer tests: %s (make deps installs python3-numpy)" % e)
    sys.exit(0)

MODEL = os.path.join(ROOT, "samples", "model", "skv-demo.gguf")
PROMPT = os.path.join(ROOT, "samples", "prompts", "default.txt")


def run(args, **kw):
    p = subprocess.run([SKV] + args, cwd=ROOT, capture_output=True, text=True, errors="replace", **kw)
    return p.returncode, p.stdout + p.stderr


def pyrun(args):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "probes", "python"))
    p = subprocess.run([sys.executable] + args, cwd=ROOT, capture_output=True, text=True, env=env)
    return p.returncode, p.stdout, p.stderr


tmp = tempfile.mkdtemp(prefix="skv-pywriter-")
try:
    # ---- 1. the schema is the C one
    rc, out = run(["trace", "schema"])
    try:
        cs = json.loads(out)
        c_tab = {k["kind"]: (k["name"], [tuple(f) for f in k["fields"]]) for k in cs["kinds"]}
    except ValueError:
        c_tab = None
    py_tab = {k: (n, [tuple(f) for f in fs]) for k, (n, fs) in skvtrace.SCHEMA.items()}
    check("skvtrace.SCHEMA equals skv trace schema (%d kinds)" % len(py_tab),
          rc == 0 and c_tab == py_tab and cs.get("version") == 3, out[:300] if c_tab is None else
          [k for k in set(c_tab) | set(py_tab) if c_tab.get(k) != py_tab.get(k)])

    # ---- 2. every kind from Python, back through skv's CSV export
    rng = np.random.RandomState(5)
    f32 = lambda n: rng.standard_normal(n).astype(np.float32)
    i32 = lambda n, hi=1000: rng.randint(-5, hi, n).astype(np.int32)
    events = [
        ("run", dict(random_weights=1, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, max_ctx=64, prompt_len=6,
                     budget=16, oracle=1, model="py-model \u00e9", arch="llama", format="pytorch", kv_policy="mine",
                     backend="torch", kv_opts="budget=16 page=4")),
        ("lane", dict(lane=0, n_lanes=1, policy="mine", teacher="dense")),
    ]
    for p in range(6):
        events.append(("token", dict(pos=p, id=p * 7, step=-1, text=[b"a", b"\x00b", b"\xff\xfe", "\u00e9".encode(),
                                                                     b"\\", b""][p])))
    for l in range(2):
        events.append(("prefill_layer", dict(layer=l, seq_len=6, rank=3, rel_err=0.25, t_svd=1e-3, t_landmarks=2e-4,
                                              t_cosmin=1.5e-5, t_outliers=0.0, t_offload=3.25, sv=f32(6))))
        for h in range(2):
            events.append(("prefill_head", dict(layer=l, head=h, chunk=2, n_outliers=1, n_landmarks=2, local_start=2,
                                                cos_min=np.array([0.5, np.nan, -1], np.float32), outliers=[1])))
    for s in range(3):
        events.append(("token", dict(pos=6 + s, id=100 + s, step=s, text=b"x")))
        for l in range(2):
            for h in range(2):
                events.append(("decode_head", dict(step=s, layer=l, head=h, block=4, fetch_bytes=2 ** 40 + s,
                                                   hits=1, misses=2, has_oracle=1, recall=0.75, sel=[0, 1],
                                                   score=np.array([1.5, -np.inf], np.float32),
                                                   rank_exact=i32(3), rank_landmark=i32(3))))
                events.append(("oracle", dict(step=s, layer=l, head=h, unit=4, ctx=7 + s, n_kept=5, n_gen=s,
                                              recall=0.5, overlap=0.25, out_err=1e-7, mass_kept=0.875, needle_len=2,
                                              needle_kept=1, needle_rank=3, needle_mass=0.125, q_kept=[5, 4],
                                              q_recall=f32(2), q_overlap=f32(2), q_out_err=f32(2))))
                events.append(("metric", dict(step=s, layer=l, head=h, value=float(s), name="page_bound",
                                              vals=f32(2))))
            events.append(("span", dict(stream=l, layer=l, step=s, t0=0.1 * s, t1=0.1 * s + 0.05, op="attention")))
        events.append(("step", dict(step=s, token=100 + s, seconds=0.01, kv_resident=2 ** 33, kv_offloaded=0,
                                    hit_rate=0.5, has_oracle=1, top1_agree=s % 2, n_fetch=1, fetch_bytes=4096,
                                    kv_stats="k=1 steps=%d" % (s + 1))))
    events.append(("needle", dict(id=0, tok_begin=1, tok_end=3, step=0, layer=1, head=0, mass_exact=0.5,
                                  mass_sparse=0.25, chunks=[0, 1], rank=[2, -1], selected=[1, 0], k=1,
                                  key_err=0.125, mass_ideal=-1, out_err=0.5, part=[0, 2], rank_exact=[1, 3],
                                  cos_min=f32(2), mass_chunk=f32(2))))
    events.append(("niah", dict(index=0, length=6, depth=50.0, run=0, method=1, hit=0, prompt_len=6, tok_begin=1,
                                tok_end=3, detail=1, policy="mine", value="42", answer="4 2",
                                top1_agree=[1, 0, 1], logit_dist=f32(3))))
    every = os.path.join(tmp, "every.skvtrace")
    with skvtrace.TraceWriter(every, producer="test_pywriter") as w:
        for k, f in events:
            w.write(k, f)
    kinds_written = {k for k, _ in events}
    check("a Python trace holds every event kind (%d kinds)" % len(kinds_written),
          kinds_written == {n for n, _ in skvtrace.SCHEMA.values()}, sorted(kinds_written))
    rc, out = run(["trace", "info", every])
    check("skv trace info accepts the Python trace and names its writer",
          rc == 0 and "written by skvtrace (Python" in out and "producer test_pywriter" in out and "checksum ok" in out,
          out)
    csvdir = os.path.join(tmp, "csv")
    rc, out = run(["export", every, "--format", "csv", csvdir])
    bad = []
    if rc == 0:
        by_kind = {}
        for k, f in events:
            by_kind.setdefault(k, []).append(f)
        for kind, recs in by_kind.items():
            fields = dict((f[0], f) for f in skvtrace.SCHEMA[skvtrace.writer.KIND_OF[kind]][1])
            with open(os.path.join(csvdir, kind + ".csv"), newline="") as fh:
                rows = list(csv.DictReader(fh))
            if len(rows) != len(recs):
                bad.append("%s: %d rows for %d events" % (kind, len(rows), len(recs)))
                continue
            for row, ev in zip(rows, recs):
                for fn, spec in fields.items():
                    ft = spec[1]
                    if ft in ("i32s", "f32s"):
                        continue
                    v = ev[fn] if fn in ev else len(ev[[g[0] for g in fields.values() if len(g) > 2 and g[2] == fn][0]])
                    txt = row[fn]
                    if ft in ("f32", "f64"):
                        dt = np.float32 if ft == "f32" else np.float64
                        a = dt(float(txt)) if txt not in ("nan", "inf", "-inf") else dt(txt)
                        ok = (np.isnan(a) and np.isnan(dt(v))) or a.tobytes() == dt(v).tobytes()
                    elif ft == "bytes":
                        ok = txt == skvtrace._bytes_text(bytes(v))
                    elif ft == "str":
                        ok = txt == v
                    else:
                        ok = int(txt) == int(v)
                    if not ok:
                        bad.append("%s.%s: wrote %r, CSV %r" % (kind, fn, v, txt))
            for fn, spec in fields.items():
                if spec[1] not in ("i32s", "f32s"):
                    continue
                with open(os.path.join(csvdir, "%s__%s.csv" % (kind, fn)), newline="") as fh:
                    rows = list(csv.DictReader(fh))
                got = {}
                for r in rows:
                    got.setdefault(int(r["record"]), []).append(r[fn])
                recnos = sorted(got)
                want = [np.asarray(ev[fn], np.int32 if spec[1] == "i32s" else np.float32) for ev in recs]
                nonempty = [x for x in want if len(x)]
                if len(recnos) != len(nonempty):
                    bad.append("%s__%s: %d records with elements, wrote %d" % (kind, fn, len(recnos), len(nonempty)))
                    continue
                for rn, x in zip(recnos, nonempty):
                    vals = got[rn]
                    if spec[1] == "i32s":
                        ok = [int(t) for t in vals] == x.tolist()
                    else:
                        y = np.array([np.float32(float(t)) for t in vals], np.float32)
                        ok = len(y) == len(x) and all((np.isnan(a) and np.isnan(b)) or a == b for a, b in zip(y, x))
                    if not ok:
                        bad.append("%s__%s record %d: wrote %s, CSV %s" % (kind, fn, rn, x.tolist(), vals))
    check("skv export --format csv gives back every value the Python writer wrote", rc == 0 and not bad,
          out if rc else bad[:5])

    # ---- 3. rewrite: byte for byte on traces skv wrote
    cases = [("dense", ["--kv", "dense", "--oracle"]), ("quest", ["--kv", "quest", "--budget", "32", "--oracle"]),
             ("shadowkv", ["--kv", "shadowkv", "--budget", "32", "--rank", "8", "--outliers", "2", "--oracle"]),
             ("freekv", ["--kv", "freekv", "--budget", "32", "--oracle"]),
             ("specache", ["--kv", "specache", "--budget", "32", "--oracle"]),
             ("tailorkv", ["--kv", "tailorkv", "--budget", "32", "--oracle"]),
             ("compare", ["--kv", "quest,shadowkv", "--budget", "32", "--rank", "8"]),
             ("batch", ["--kv", "shadowkv", "--budget", "32", "--rank", "8", "--parallel", "3"])]
    for name, args in cases:
        src = os.path.join(tmp, name + ".trace")
        rc, out = run(["run", "-m", MODEL, "-f", PROMPT, "-n", "4", "--trace", src] + args)
        if rc:
            check("skv run --trace for %s" % name, False, out)
            continue
        dst = os.path.join(tmp, name + ".rw")
        prc, pout, perr = pyrun(["-m", "skvtrace", "rewrite", src, dst])
        same = prc == 0 and open(src, "rb").read() == open(dst, "rb").read()
        check("python3 -m skvtrace rewrite: the %s trace comes back byte for byte (%d bytes)" % (
            name, os.path.getsize(src)), same, pout + perr)
    src = os.path.join(tmp, "needle.trace")
    rc, out = run(["needle", "--lengths", "1k", "--depths", "50", "--kv", "shadowkv", "--budget", "64", "--rank", "8",
                   "--explain", "--no-check", "--trace", src])
    dst = os.path.join(tmp, "needle.rw")
    prc, pout, perr = pyrun(["-m", "skvtrace", "rewrite", src, dst])
    check("python3 -m skvtrace rewrite: a needle case (niah, needle events, notes) comes back byte for byte",
          rc == 0 and prc == 0 and open(src, "rb").read() == open(dst, "rb").read(), out[-300:] + pout + perr)
    prc, pout, perr = pyrun(["-m", "skvtrace", "rewrite", src, dst])
    check("rewrite refuses an existing OUT with one line", prc == 1 and "exists" in perr and
          perr.count("\n") == 1, perr)
    dmg = os.path.join(tmp, "damaged.trace")
    b = bytearray(open(src, "rb").read())
    b[len(b) // 2] ^= 0x40
    open(dmg, "wb").write(bytes(b))
    prc, pout, perr = pyrun(["-m", "skvtrace", "rewrite", dmg, os.path.join(tmp, "dmg.rw")])
    check("rewrite refuses a damaged trace with one line and writes nothing",
          prc == 1 and perr.count("\n") == 1 and "CRC" in perr and not os.path.exists(os.path.join(tmp, "dmg.rw")),
          perr)

    # ---- 4. cut short: a writer killed after its second step
    cut = os.path.join(tmp, "cut.skvtrace")
    script = r'''
import os, sys
import skvtrace
w = skvtrace.TraceWriter(sys.argv[1])
w.write("run", random_weights=0, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, max_ctx=32, prompt_len=4,
        budget=8, oracle=0, model="m", arch="llama", format="pytorch", kv_policy="mine", backend="torch", kv_opts="")
for p in range(4):
    w.write("token", pos=p, id=p, step=-1, text=b"t")
for s in range(3):
    w.write("decode_head", step=s, layer=0, head=0, block=2, fetch_bytes=0, hits=0, misses=0, has_oracle=0,
            recall=0.0, sel=[0], score=[1.0], rank_exact=[], rank_landmark=[])
    if s < 2:
        w.write("step", step=s, token=1, seconds=0.0, kv_resident=0, kv_offloaded=0, hit_rate=0.0, has_oracle=0,
                top1_agree=0, n_fetch=0, fetch_bytes=0, kv_stats="")
os._exit(3)   # killed: step 2 never ended, the footer never written
'''
    prc, pout, perr = pyrun(["-c", script, cut])
    rc, out = run(["trace", "info", cut])
    t = skvtrace.load(cut, partial=True) if os.path.exists(cut) else None
    csv2 = os.path.join(tmp, "csv-cut")
    rc2, out2 = run(["export", cut, "--format", "csv", csv2, "--partial"])
    n_dh = sum(1 for _ in open(os.path.join(csv2, "decode_head.csv"))) - 1 if rc2 == 0 else -1
    check("a Python trace cut short loads its two complete steps in skv (trace info, csv --partial) and skvtrace",
          prc == 3 and rc == 0 and "cut short" in out and rc2 == 0 and n_dh == 2 and t is not None and
          len(t["step"]["step"]) == 2, "%s %s %s" % (out, out2, n_dh))

    # ---- 5. refusals
    ok_run = dict(events[0][1])
    bad_cases = [
        ("run", dict(ok_run, n_layers=2 ** 31), "does not fit i32"),
        ("run", dict(ok_run, n_layers=1.5), "expected an integer"),
        ("run", dict(ok_run, model="a\0b"), "NUL"),
        ("run", {k: v for k, v in ok_run.items() if k != "arch"}, "missing"),
        ("run", dict(ok_run, colour=1), "no field colour"),
        ("step", dict(events[-3][1], kv_resident=-1), "does not fit u64"),
        ("oracle", dict(events[[k for k, _ in events].index("oracle")][1], q_kept=[1.5, 2.0]), "expected integers"),
        ("oracle", dict(events[[k for k, _ in events].index("oracle")][1], q_recall=np.ones((2, 2))), "1-D"),
        ("oracle", dict(events[[k for k, _ in events].index("oracle")][1], recall=1e39), "does not fit f32"),
        ("oracle", dict(events[[k for k, _ in events].index("oracle")][1], n_q=3), "has 2 elements"),
        ("colour", {}, "unknown event kind"),
    ]
    w = skvtrace.TraceWriter(os.path.join(tmp, "refuse.skvtrace"))
    size0 = os.path.getsize(os.path.join(tmp, "refuse.skvtrace"))
    msgs = []
    for kind, f, want in bad_cases:
        try:
            w.write(kind, f)
            msgs.append("accepted: %s %s" % (kind, want))
        except skvtrace.TraceValueError as e:
            if want not in str(e) or "\n" in str(e):
                msgs.append("%s: %r (want %r)" % (kind, str(e), want))
    w.flush()
    check("the writer refuses %d bad values with one line each and writes nothing" % len(bad_cases),
          not msgs and w.n_records == 0 and os.path.getsize(os.path.join(tmp, "refuse.skvtrace")) == size0, msgs)
    w.abort()
    check("abort removes what was written", not os.path.exists(os.path.join(tmp, "refuse.skvtrace")))
    keep = os.path.join(tmp, "keep.skvtrace")
    shutil.copy(every, keep)
    w = skvtrace.TraceWriter(keep)
    w.write("run", ok_run)
    same_while = open(keep, "rb").read() == open(every, "rb").read()
    w.close()
    check("an existing trace stays whole until the new one closes, then is replaced",
          same_while and skvtrace.load(keep).meta["records"] == 1)
finally:
    shutil.rmtree(tmp, ignore_errors=True)

sys.exit(finish("test_pywriter"))
