#!/usr/bin/python3
"""test_skvtrace: `skv export TRACE --format csv` and probes/python/skvtrace
agree on every value of a trace from each policy (and of a compare and a
needle trace), and both refuse a truncated trace and a flipped byte with a
clear error. Prints PASS/FAIL/SKIP lines for tests/run.sh."""
import csv
import math
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
    print("SKIP skvtrace tests: %s (make deps installs python3-numpy)" % e)
    sys.exit(0)

MODEL = os.path.join(ROOT, "samples", "model", "skv-demo.gguf")
PROMPT = os.path.join(ROOT, "samples", "prompts", "needle.txt")


def run(args):
    p = subprocess.run([SKV] + args, cwd=ROOT, capture_output=True, text=True, errors="replace")
    return p.returncode, p.stdout + p.stderr


def same_value(text, v, ftype):
    """A CSV cell against the reader's value, bit for bit."""
    if ftype in ("f32", "f32s", "f64"):
        dt = np.float64 if ftype == "f64" else np.float32
        a = dt(float(text)) if text not in ("nan", "inf", "-inf") else dt(text)
        b = dt(v)
        return (np.isnan(a) and np.isnan(b)) or a.tobytes() == b.tobytes()
    if ftype in ("str", "bytes"):
        return text == v
    return int(text) == int(v)


def compare(trace, d):
    """Every table of the CSV folder d against skvtrace.load(trace); returns (values compared, first mismatch)."""
    t = skvtrace.load(trace)
    n = 0
    for kind, (name, fields) in skvtrace.SCHEMA.items():
        types = {f[0]: f[1] for f in fields}
        path = os.path.join(d, name + ".csv")
        rows = list(csv.DictReader(open(path, newline="", encoding="utf-8"))) if os.path.exists(path) else []
        tab = t[name]
        if len(rows) != len(tab["record"]):
            return n, "%s: %d CSV rows, %d records read" % (name, len(rows), len(tab["record"]))
        for col in tab:
            ft = types.get(col, "i32")
            for i, r in enumerate(rows):
                if not same_value(r[col], tab[col][i], ft):
                    return n, "%s.%s row %d: CSV %r, skvtrace %r" % (name, col, i, r[col], tab[col][i])
                n += 1
        for field in t.arrays(name):
            path = os.path.join(d, "%s__%s.csv" % (name, field))
            rows = list(csv.DictReader(open(path, newline=""))) if os.path.exists(path) else []
            a = t.array(name, field)
            if len(rows) != len(a["i"]):
                return n, "%s__%s: %d CSV rows, %d elements read" % (name, field, len(rows), len(a["i"]))
            for col in a:
                ft = types[field] if col == field else "i32"
                for i, r in enumerate(rows):
                    if not same_value(r[col], a[col][i], ft):
                        return n, "%s__%s.%s row %d: CSV %r, skvtrace %r" % (name, field, col, i, r[col], a[col][i])
                    n += 1
    return n, ""


def main():
    if not os.path.exists(MODEL):
        print("SKIP skvtrace tests: %s is missing" % MODEL)
        return
    tmp = tempfile.mkdtemp(prefix="skvtrace-")
    try:
        traces = []
        for pol in ("dense", "shadowkv", "quest", "freekv", "specache", "tailorkv"):
            tr = os.path.join(tmp, pol + ".skvt")
            rc, out = run(["run", "-m", MODEL, "-f", PROMPT, "-n", "4", "--kv", pol, "--budget", "3%", "--oracle",
                           "--trace", tr])
            check("skv run --kv %s --oracle --trace writes a trace" % pol, rc == 0, out[-300:])
            traces.append((pol, tr))
        tr = os.path.join(tmp, "compare.skvt")
        rc, out = run(["run", "-m", MODEL, "-f", PROMPT, "-n", "3", "--kv", "shadowkv,quest", "--budget", "3%",
                       "--trace", tr])
        check("a compare trace is written", rc == 0, out[-300:])
        traces.append(("compare", tr))
        tr = os.path.join(tmp, "needle.skvt")
        rc, out = run(["needle", "--task", "multikey", "--lengths", "600", "--depths", "50", "--kv",
                       "dense,shadowkv", "--trace", tr])
        check("a needle trace is written", rc == 0, out[-300:])
        traces.append(("needle", tr))
        kinds_seen = set()
        for name, tr in traces:
            if not os.path.exists(tr):
                continue
            d = os.path.join(tmp, name + "-csv")
            rc, out = run(["export", tr, "--format", "csv", d])
            check("skv export %s --format csv" % name, rc == 0, out[-300:])
            n, bad = compare(tr, d)
            check("%s: skv export's CSV and skvtrace.load agree on every value (%d compared)" % (name, n),
                  not bad and n > 0, bad)
            t = skvtrace.load(tr)
            kinds_seen.update(t.kinds())
            if name == "shadowkv":
                ok = "version" not in t.meta or True
                check("shadowkv trace: metadata read (format_version 3)", t.meta.get("format_version") == 3 and ok)
                try:
                    import pandas  # noqa: F401
                    f = t.frame("oracle")
                    check("frame('oracle') is a DataFrame with the oracle's columns",
                          len(f) == len(t["oracle"]["recall"]) and "recall" in f.columns)
                except ImportError:
                    print("SKIP pandas is missing: frame() not checked")
        want = {"run", "token", "prefill_layer", "prefill_head", "decode_head", "step", "oracle", "lane", "metric",
                "needle", "niah"}
        check("the traces cover every kind the policies write (%s)" % ",".join(sorted(want)),
              want <= kinds_seen, "missing " + ",".join(sorted(want - kinds_seen)))

        # a truncated trace and a flipped byte: clear errors in both
        src = dict(traces)["shadowkv"]
        data = open(src, "rb").read()
        cut = os.path.join(tmp, "cut.skvt")
        open(cut, "wb").write(data[:len(data) * 6 // 10])
        flip = os.path.join(tmp, "flip.skvt")
        b = bytearray(data)
        b[len(b) // 2] ^= 0x40
        open(flip, "wb").write(bytes(b))
        for what, path, word in (("truncated", cut, "cut short"), ("flipped byte", flip, "CRC")):
            rc, out = run(["export", path, "--format", "csv", os.path.join(tmp, what + "-csv")])
            lines = out.strip().splitlines()
            check("skv export --format csv refuses a %s trace in one line naming it" % what,
                  rc == 1 and len(lines) == 1 and path in out, out)
            try:
                skvtrace.load(path)
                check("skvtrace.load refuses a %s trace" % what, False, "it loaded")
            except skvtrace.TraceError as e:
                check("skvtrace.load refuses a %s trace: %s" % (what, e), word in str(e) and path in str(e), str(e))
            try:
                t = skvtrace.load(path, partial=True)
                check("skvtrace.load(partial=True) keeps the intact part of a %s trace" % what,
                      len(t["token"]["record"]) > 0 and t.notice != "")
            except skvtrace.TraceError as e:
                check("skvtrace.load(partial=True) keeps the intact part of a %s trace" % what, False, str(e))
        rc, out = run(["export", cut, "--format", "csv", os.path.join(tmp, "cut-partial"), "--partial"])
        check("skv export --partial exports what is intact of a cut trace", rc == 0, out)
        notcsv = os.path.join(tmp, "x.txt")
        open(notcsv, "wb").write(b"hello world, not a trace at all" * 4)
        try:
            skvtrace.load(notcsv)
            check("skvtrace.load refuses a file that is not a trace", False)
        except skvtrace.TraceError as e:
            check("skvtrace.load refuses a file that is not a trace: %s" % e, "not an skv trace" in str(e))
        edge_cases(tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def write_trace(path, records, meta, footer=True, meta_at=None):
    """A format-3 trace by hand: header, records (kind, payload), the
    metadata record (bytes, or None for none) and a footer."""
    import struct
    import zlib
    b = bytearray(b"SKVTRACE" + struct.pack("<II", 3, 0))
    for kind, payload in records:
        rec = struct.pack("<II", kind, len(payload)) + payload
        b += rec + struct.pack("<I", zlib.crc32(rec) & 0xFFFFFFFF)
    at = len(b)
    if meta is not None:
        rec = struct.pack("<II", 0x7FFFFFFF, len(meta)) + meta
        b += rec + struct.pack("<I", zlib.crc32(rec) & 0xFFFFFFFF)
    if footer:
        b += b"SKVTEND\x00" + struct.pack("<QQ", len(records), at if meta_at is None else meta_at)
        b += struct.pack("<I", zlib.crc32(bytes(b)) & 0xFFFFFFFF)
    open(path, "wb").write(bytes(b))


def edge_cases(tmp):
    """The reader's own error, never RecursionError; partial loads what skv
    export --partial loads."""
    deep = os.path.join(tmp, "deep.skvt")
    write_trace(deep, [], b"[" * 100000 + b"]" * 100000)
    try:
        skvtrace.load(deep)
        check("skvtrace.load refuses deeply nested metadata", False, "it loaded")
    except skvtrace.TraceError as e:
        check("skvtrace.load refuses deeply nested metadata with its own error: %s" % str(e)[:80], "metadata" in str(e))
    except RecursionError:
        check("skvtrace.load refuses deeply nested metadata with its own error", False, "RecursionError")
    head = os.path.join(tmp, "head.skvt")
    write_trace(head, [], None, footer=False)
    nometa = os.path.join(tmp, "nometa.skvt")
    write_trace(nometa, [], None, footer=True, meta_at=16)
    for what, path in (("a header-only", head), ("a footer-without-metadata", nometa)):
        rc, out = run(["export", path, "--format", "csv", os.path.join(tmp, what + "-csv"), "--partial"])
        try:
            t = skvtrace.load(path, partial=True)
            ok = t.notice != "" and t.meta == {}
        except skvtrace.TraceError as e:
            ok, out = False, str(e)
        check("skvtrace.load(partial=True) loads %s trace, as skv export --partial does (exit %d)" % (what, rc),
              ok and rc == 0, out[-200:])


main()
sys.exit(finish("test_skvtrace"))
