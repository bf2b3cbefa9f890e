#!/usr/bin/python3
"""record_demo.py: records skv's demo model decoding through a KV method
written in PyTorch (quest_torch.py, shadowkv_torch.py, or dense) into an skv
trace, which `skv inspect --replay`, `skv export` and `skv needle --diagnose`
read as they read skv's own.

    /usr/bin/python3 probes/python/examples/record_demo.py --kv shadowkv --budget 64 --rank 16 \\
        --ids-from skv.trace -n 8 --oracle -o torch.trace

The prompt's token ids (and, with --feed, the tokens each step feeds) come
from a trace skv recorded of the same prompt (--ids-from), so both runs see
the same tokens; without --feed the steps decode greedily. --needle B:E
names the needle's token span for the oracle's needle measures.

It needs numpy and torch: Debian's /usr/bin/python3 has them (make deps
installs python3-numpy and python3-torch); another python3 earlier on PATH
(pyenv's, a venv's) may not, and the script says so in one line."""
import argparse
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
_missing = [m for m in ("numpy", "torch") if importlib.util.find_spec(m) is None]
if _missing:
    sys.exit("record_demo.py: %s cannot import %s: run it with Debian's /usr/bin/python3 (make deps installs "
             "python3-numpy and python3-torch)" % (sys.executable, " and ".join(_missing)))
from demo_model import ROOT, Dense, DemoModel, run  # noqa: E402
import skvtrace  # noqa: E402  (demo_model put probes/python on the path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kv", choices=["dense", "quest", "shadowkv"], required=True)
    ap.add_argument("--budget", type=int, default=64)
    ap.add_argument("--page", type=int, default=16)
    ap.add_argument("--rank", type=int, default=160)
    ap.add_argument("--chunk", type=int, default=8)
    ap.add_argument("--outliers", type=int, default=48)
    ap.add_argument("--local", type=int, default=4)
    ap.add_argument("-n", type=int, default=8, help="decode steps")
    ap.add_argument("--ids-from", required=True, help="a trace of the same prompt (its step -1 tokens)")
    ap.add_argument("--feed", action="store_true", help="feed the tokens that trace's steps fed")
    ap.add_argument("--oracle", action="store_true")
    ap.add_argument("--needle", help="B:E, the needle's token span")
    ap.add_argument("--value", help="the value planted in the needle: the answers are scored (skv needle --diagnose)")
    ap.add_argument("-o", required=True, help="the trace to write (an existing file is kept unless --force)")
    ap.add_argument("--force", action="store_true", help="replace an existing -o")
    a = ap.parse_args(argv)
    if os.path.exists(a.o) and not a.force:
        sys.exit("record_demo.py: %s exists (--force replaces it)" % a.o)
    t = skvtrace.load(a.ids_from)
    tk = t["token"]
    ids = [int(i) for i, s in zip(tk["id"], tk["step"]) if s < 0]
    feed = [int(i) for i, s in zip(tk["id"], tk["step"]) if s >= 0] if a.feed else None
    if feed is not None and len(feed) < a.n:
        sys.exit("record_demo.py: %s fed %d tokens, -n asks for %d" % (a.ids_from, len(feed), a.n))
    m = DemoModel()
    if a.kv == "quest":
        from quest_torch import Quest
        meth = Quest(m.n_layers, a.budget, page=a.page)
    elif a.kv == "shadowkv":
        from shadowkv_torch import ShadowKV
        meth = ShadowKV(m.n_layers, a.budget, m._rope, rank=a.rank, chunk=a.chunk, outliers=a.outliers,
                        local=a.local)
    else:
        meth = Dense(m.n_layers)
    needle = tuple(int(x) for x in a.needle.split(":")) if a.needle else None
    rec = skvtrace.Recorder(a.o, n_layers=m.n_layers, n_heads=m.H, n_kv_heads=m.KV, head_dim=m.d,
                            max_ctx=m.max_ctx, policy=meth.name, policy_opts=meth.opts, budget=meth.budget,
                            oracle=a.oracle, needle=needle, block={"quest": a.page, "shadowkv": a.chunk}.get(a.kv, 1),
                            model="skv-demo", producer="record_demo.py (%s_torch)" %
                            a.kv)
    try:
        fed = run(m, meth, ids, a.n, rec=rec, feed=feed, twin=Dense(m.n_layers) if a.oracle else None)
        if a.value:
            # the answer: what the method generated after the prompt (the fed
            # tokens after the first, and the token its last step chose is not kept);
            # dense's own greedy answer on the same prompt beside it
            dense = run(m, Dense(m.n_layers), ids, a.n)
            text = lambda toks: b"".join(m.text(t) for t in toks).decode("utf-8", "replace")
            rec.niah(a.value, text(fed), dense_answer=text(dense))
    except BaseException:
        rec.cut()
        raise
    rec.close()
    print("record_demo.py: wrote %s (%d records)" % (a.o, rec.w.n_records))


if __name__ == "__main__":
    try:
        main()
    except (skvtrace.TraceError, skvtrace.TraceValueError, OSError) as e:
        sys.exit("record_demo.py: %s" % (str(e).splitlines()[0] if str(e) else type(e).__name__))
