"""testhelp.py: the Python tests' harness, the twin of testhelp.h. check()
prints one PASS or FAIL line a check, finish() the closing tally
("name: N passed, N failed") and gives the exit status. ROOT is the project,
SKV the skv binary under test (SKV_BIN, as make test sets it), and the trace
reader probes/python (skvtrace) is importable."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKV = os.environ.get("SKV_BIN") or os.path.join(ROOT, "build", "skv")
sys.path.insert(0, os.path.join(ROOT, "probes", "python"))

_count = {"passed": 0, "failed": 0}


def check(descr, ok, detail=""):
    """One check: PASS descr, or FAIL descr with the first 800 characters of detail."""
    if ok:
        _count["passed"] += 1
        print("PASS " + descr)
    else:
        _count["failed"] += 1
        print("FAIL " + descr + (": " + str(detail)[:800] if detail else ""))
    sys.stdout.flush()


def finish(name):
    """Prints the tally; 1 if a check failed, else 0 (for sys.exit)."""
    print("%s: %d passed, %d failed" % (name, _count["passed"], _count["failed"]))
    return 1 if _count["failed"] else 0
