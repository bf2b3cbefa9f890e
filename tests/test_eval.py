#!/usr/bin/python3
"""test_eval: skv eval and the needle tasks on the demo model.
- At a budget covering the context every policy answers exactly as dense.
- A run killed mid-way and started again finishes with every case once.
- --task-file refuses a malformed line with its line number and field.
- skv needle --task multikey names a distractor's value as such.
Prints PASS/FAIL/SKIP lines for tests/run.sh; needs only the standard library."""
import csv
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from testhelp import ROOT, SKV, check, finish  # noqa: E402
MODEL = os.path.join(ROOT, "samples", "model", "skv-demo.gguf")
def run(args, **kw):
    p = subprocess.run([SKV] + args, cwd=ROOT, capture_output=True, text=True, errors="replace", **kw)
    return p.returncode, p.stdout + p.stderr


def jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def has_number(text, value):
    return re.search(r"(?<!\d)%s(?!\d)" % re.escape(value), text or "") is not None


def main():
    if not os.path.exists(MODEL):
        print("SKIP eval tests: %s is missing" % MODEL)
        return
    tmp = tempfile.mkdtemp(prefix="skv-eval-")
    try:
        # -- every policy equals dense at a budget covering the context
        d = os.path.join(tmp, "full")
        rc, out = run(["eval", "--out", d, "--task", "single,multikey", "--lengths", "400,700", "--depths", "20,60",
                       "--seeds", "1", "--kv", "dense,shadowkv,quest,freekv,specache,tailorkv", "--budget", "100%",
                       "--kv-opt", "qlayers=0", "--rank", "64", "--no-oracle"])
        check("skv eval at 100% budget finishes", rc == 0, out[-400:])
        rows = list(csv.DictReader(open(os.path.join(d, "cases.csv")))) if rc == 0 else []
        by = {}
        for r in rows:
            by.setdefault(r["case_key"], {})[r["policy"]] = (r["hit"], r["answer"])
        bad = [(k, p) for k, ps in by.items() for p, v in ps.items() if v != ps["dense"]]
        check("at a budget covering the context every policy answers as dense on every case (%d cases x %d policies; "
              "TailorKV with no quantized layer)" % (len(by), 6), len(by) == 8 and len(rows) == 48 and not bad,
              str(bad[:3]))

        # -- killed mid-way, resumed: every case exactly once
        d = os.path.join(tmp, "resume")
        args = ["eval", "--out", d, "--task", "single,passkey", "--lengths", "500,900", "--depths", "10:90:40",
                "--seeds", "2", "--kv", "dense,shadowkv,quest", "--budget", "64", "--budgets", "32,64",
                "--no-oracle"]
        planned = 2 * 2 * 3 * 2 + 2 * 3 * 2  # grid, plus the sweep's other budget at 900
        p = subprocess.Popen([SKV] + args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        jl = os.path.join(d, "cases.jsonl")
        t0 = time.time()
        while time.time() - t0 < 120:
            if os.path.exists(jl) and sum(1 for _ in open(jl)) >= 5:
                break
            if p.poll() is not None:
                break
            time.sleep(0.05)
        killed = p.poll() is None
        if killed:
            p.send_signal(signal.SIGKILL)
        p.wait()
        n_before = sum(1 for _ in open(jl)) if os.path.exists(jl) else 0
        check("an eval killed mid-way left %d finished cases of %d" % (n_before, planned),
              killed and 0 < n_before < planned)
        rc, out = run(args)
        check("the same command again finishes the suite", rc == 0, out[-400:])
        recs = jsonl(jl)
        keys = [r["case_key"] for r in recs]
        check("every case is present exactly once after the resume (%d of %d)" % (len(set(keys)), planned),
              len(keys) == planned and len(set(keys)) == planned)
        check("the rerun reported the cases done before", ("%d done before" % n_before) in out, out[:300])
        for f in ("leaderboard.md", "cases.csv", "heatmap.png", "heatmap.svg", "budget.png", "budget.svg"):
            check("the suite wrote %s" % f, os.path.getsize(os.path.join(d, f)) > 100)
        # the budget figure dodges each policy's points about its budget: 3 policies x 2 budgets, 6 markers,
        # none hidden under another at the same accuracy (once each budget's points shared one x)
        svg = open(os.path.join(d, "budget.svg")).read()
        marks = [(float(x), c) for x, w, h, c in
                 re.findall(r'<rect x="([-\d.]+)" y="[-\d.]+" width="([\d.]+)" height="([\d.]+)" fill="(#[0-9a-f]{6})"',
                            svg)
                 if 4 <= float(w) <= 40 and 4 <= float(h) <= 40 and c not in ("#333333", "#e4e4e4", "#ffffff")]
        check("the budget figure shows each policy's point at each budget apart (%d markers, %d places, %d colours)"
              % (len(marks), len({x for x, _ in marks}), len({c for _, c in marks})),
              len(marks) == 6 and len({x for x, _ in marks}) == 6 and len({c for _, c in marks}) == 3, str(marks))
        lb = open(os.path.join(d, "leaderboard.md")).read()
        check("the leaderboard has a row per policy and a column per task@length",
              all("| %s |" % p in lb for p in ("dense", "shadowkv", "quest")) and "passkey@900" in lb, lb[:400])
        check("no policy is under its floor there (Quest's is 2 pages, 32 tokens): no floor section",
              "floor" not in lb, lb[-600:])
        # a budget under a policy's floor: said at the start and in the leaderboard
        d2 = os.path.join(tmp, "floor")
        rc, out = run(["eval", "--out", d2, "--lengths", "500", "--depths", "50", "--seeds", "1", "--kv",
                       "dense,specache", "--budget", "32", "--budgets", "32,128", "--no-oracle"])
        lb2 = open(os.path.join(d2, "leaderboard.md")).read() if rc == 0 else ""
        check("a budget under a policy's floor is a warning and a leaderboard section naming the floor",
              rc == 0 and "skv eval: warning: specache: the budget (32 tokens) is under its floor of the residual" in out
              and "## Budgets under a policy's floor" in lb2 and "- specache: the budget (32 tokens)" in lb2, out + lb2)
        svg2 = open(os.path.join(d2, "budget.svg")).read() if rc == 0 else ""
        hollow = [w for w, c in re.findall(r'<rect x="[-\d.]+" y="[-\d.]+" width="([\d.]+)" height="[\d.]+" '
                                           r'fill="(#[0-9a-f]{6})"', svg2) if c == "#ffffff" and 2 <= float(w) <= 40]
        check("the budget figure draws the one point under a floor (specache at 32) hollow, and says what hollow means",
              len(hollow) == 1 and "hollow: under the" in svg2, "%d hollow" % len(hollow))
        rc, out = run(["needle", "--lengths", "500,1k", "--depths", "50", "--kv", "dense,quest,specache"])
        check("skv needle warns of the lengths whose budget (3%: 15 and 31 tokens) is under a floor, each policy once",
              rc == 0 and "skv needle: warning: quest: the budget (15 to 31 tokens) is under its floor of 2 pages" in out
              and "skv needle: warning: specache: the budget (15 to 31 tokens) is under its floor" in out
              and out.count("under its floor") == 2, out[:1500])
        # a torn last line (a kill inside a write) is dropped and that case run again
        with open(jl, "rb") as f:
            data = f.read()
        last = data.rstrip(b"\n").rfind(b"\n")
        with open(jl, "wb") as f:
            f.write(data[:last + 1] + data[last + 1:last + 40])
        rc, out = run(args)
        recs = jsonl(jl)
        check("a torn last line is dropped and its case run again", rc == 0 and len(recs) == planned and
              len({r["case_key"] for r in recs}) == planned and "cut short" in out, out[-300:])
        rc, out = run(args[:-3] + ["--seeds", "3", "--no-oracle"])
        check("a rerun with other settings into the same folder is refused in one line",
              rc == 1 and "other settings" in out and len(out.strip().splitlines()) == 1, out)

        # -- --task-file: good and malformed lines
        tf = os.path.join(tmp, "tasks.jsonl")
        with open(tf, "w") as f:
            f.write('{"name": "city", "fact": "The secret city of {key} is Plinth{value}.", "keys": ["heron", "otter"],'
                    ' "facts": [1, 2], "question": "What is the secret city of {key}? The secret city of {key} is",'
                    ' "answer": "Plinth{value}"}\n\n')
            f.write('{"name": "lit", "fact": "The code word is marmalade.", "question": "What is the code word? The '
                    'code word is", "answer": "marmalade"}\n')
        rc, out = run(["needle", "--task-file", tf, "--task", "city", "--lengths", "400", "--depths", "50",
                       "--kv", "dense"])
        check("skv needle runs a task from --task-file", rc == 0 and "dense" in out, out[-300:])
        bads = [
            ('{"name": "x", "question": "q?"}', "field 'fact'", 1),
            ('{"name": "x", "fact": "A {value}.", "question": "q?"}\n{"name": 3, "fact": "f {value}", "question": "q"}',
             "field 'name'", 2),
            ('{"name": "x", "fact": "A {key} is {value}.", "question": "q?"}', "field 'keys'", 1),
            ('{"name": "x", "fact": "A {value}.", "question": "q?", "facts": [3, 2]}', "field 'facts'", 1),
            ('{"name": "x", "fact": "A.", "question": "q?"}', "field 'fact'", 1),
            ('\n\n{"name": "x", "fact": "A {value}.", "question": "q?", "colour": 1}', "field 'colour'", 3),
            ('{"name": "x", "fact": "A {value}.", "question": "q?"', "not a JSON object", 1),
            ('{"name": "x", "fact": "A {value}.", "question": "q?", "haystack": "nowhere.txt"}', "field 'haystack'", 1),
        ]
        for i, (text, want, line) in enumerate(bads):
            bf = os.path.join(tmp, "bad%d.jsonl" % i)
            with open(bf, "w") as f:
                f.write(text + "\n")
            rc, out = run(["needle", "--task-file", bf, "--lengths", "400", "--depths", "50"])
            lines = out.strip().splitlines()
            check("--task-file refuses a bad line with %s:%d and %s" % (os.path.basename(bf), line, want),
                  rc == 2 and len(lines) == 1 and ("%s:%d:" % (bf, line)) in out and want in out, out)

        # -- a distractor answer is named as such
        js = os.path.join(tmp, "mk.json")
        rc, out = run(["needle", "--task", "multikey", "--lengths", "1k,2k", "--depths", "10:90:20", "--runs", "2",
                       "--kv", "dense,shadowkv", "--budget", "64", "--json", js])
        check("skv needle --task multikey runs", rc == 0, out[-300:])
        named = consistent = 0
        total = 0
        for c in json.load(open(js))["cases"] if rc == 0 else []:
            facts = c["facts"]
            for pol in ("dense", "shadowkv"):
                m = c[pol]
                total += 1
                want = None
                if not m["hit"]:
                    for i, f in enumerate(facts[1:], 1):
                        if has_number(m["answer"], f["value"]):
                            want = i
                            break
                got = m["distractor"]["fact"] if m["distractor"] else None
                consistent += got == want
                named += got is not None
        check("every miss that gave another key's value names that key (%d of %d answers; %d distractor answers)"
              % (consistent, total, named), total > 0 and consistent == total)
        # The demo model tells keys apart, so a well-posed multikey question
        # rarely draws another key's value; a question that names no key
        # does, and each such answer must be named.
        amb = os.path.join(tmp, "amb.jsonl")
        with open(amb, "w") as f:
            f.write(json.dumps({"name": "ambiguous", "fact": "The special magic number for {key} is {value}.",
                                "keys": ["heron", "otter", "falcon"], "facts": [2, 3],
                                "question": "What is the special magic number? The special magic number for"}) + "\n")
        js2 = os.path.join(tmp, "amb.json")
        rc, out = run(["needle", "--task-file", amb, "--lengths", "1k", "--depths", "10:90:20", "--runs", "2",
                       "--kv", "dense", "--json", js2])
        named = consistent = total = 0
        for c in json.load(open(js2))["cases"] if rc == 0 else []:
            m = c["dense"]
            total += 1
            want = None
            if not m["hit"]:
                for i, f in enumerate(c["facts"][1:], 1):
                    if has_number(m["answer"], f["value"]):
                        want = i
                        break
            got = m["distractor"]["fact"] if m["distractor"] else None
            consistent += got == want
            named += got is not None
        check("a question naming no key draws distractor answers, each named in the JSON and the progress line "
              "(%d of %d answers; %d consistent)" % (named, total, consistent),
              rc == 0 and named > 0 and consistent == total and "a distractor" in out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


main()
sys.exit(finish("test_eval"))
