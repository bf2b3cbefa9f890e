#!/usr/bin/python3
"""test_runner: tests/run.sh itself, on throwaway scripts (about 13 s).
- A test that hangs, ignoring SIGTERM (as a Ctrl-C regression of skv once ran
  13 minutes past its SIGTERM), becomes one "FAIL <test> timed out after N s"
  line: SIGKILL follows 10 s after the SIGTERM, the process it started dies
  with it, and the suite goes on to the next test.
- A test that exits non-zero without a FAIL line counts as a failure.
- A bad SKV_TEST_TIMEOUT is refused.
- A passing test's scratch (its own TMPDIR) is removed, a failing one's kept and named.
Prints PASS/FAIL/SKIP lines for tests/run.sh; needs only the standard library."""
import os
import shutil
import subprocess
import sys
import tempfile
import time

from testhelp import ROOT, check, finish  # noqa: E402
RUN = os.path.join(ROOT, "tests", "run.sh")
def script(d, name, body):
    path = os.path.join(d, name)
    with open(path, "w") as f:
        f.write("#!/bin/sh\n" + body)
    os.chmod(path, 0o755)
    return path


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is dead for this purpose
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def main():
    if not shutil.which("timeout"):
        print("SKIP no timeout(1) on PATH: tests/run.sh needs coreutils' timeout")
        return 0
    d = tempfile.mkdtemp(prefix="skv-test-runner-")
    try:
        pidfile = os.path.join(d, "child.pid")
        hang = script(d, "hang.sh", "echo 'PASS before the hang'\ntrap '' TERM\n"
                      "sleep 100000 &\necho $! > %s\nwait\n" % pidfile)
        after = script(d, "after.sh", "echo 'PASS after the hang'\n")
        bad = script(d, "bad.sh", "echo 'PASS said before exiting 3'\nexit 3\n")
        env = dict(os.environ, SKV_TEST_TIMEOUT="1", SKV_TEST_JOBS="1")
        t0 = time.time()
        p = subprocess.run(["sh", RUN, hang, after, bad], env=env, capture_output=True, text=True, timeout=120)
        wall = time.time() - t0
        lines = p.stdout.splitlines()
        check("run.sh: a test that hangs ignoring SIGTERM is one line 'FAIL <test> timed out after 1 s'",
              ("FAIL %s timed out after 1 s" % hang) in lines, p.stdout)
        check("... and is killed 10 s after its SIGTERM, the suite going on to the next test",
              10 <= wall < 60 and "PASS after the hang" in lines
              and lines.index("PASS after the hang") > lines.index("FAIL %s timed out after 1 s" % hang),
              "%.1f s" % wall)
        try:
            with open(pidfile) as f:
                child = int(f.read())
        except (OSError, ValueError):
            child = 0
        check("... with the process it started", child > 0 and not alive(child), "pid %d" % child)
        check("run.sh: a test that exits non-zero without a FAIL line is a failure",
              ("FAIL %s exited with status 3" % bad) in lines, p.stdout)
        check("run.sh: the closing tally counts both, and the exit status is non-zero",
              p.returncode != 0 and lines[-1] == "3 passed, 2 failed, 0 skipped", p.stdout)
        p = subprocess.run(["sh", RUN, after], env=dict(os.environ, SKV_TEST_TIMEOUT="10m"),
                           capture_output=True, text=True, timeout=60)
        check("run.sh: SKV_TEST_TIMEOUT that is not whole seconds is refused in one line",
              p.returncode == 2 and "SKV_TEST_TIMEOUT" in p.stderr and "PASS" not in p.stdout, p.stderr)
        p = subprocess.run(["sh", RUN, after], env=dict(os.environ, SKV_TEST_JOBS="0"),
                           capture_output=True, text=True, timeout=60)
        check("run.sh: SKV_TEST_JOBS under 1 is refused in one line",
              p.returncode == 2 and "SKV_TEST_JOBS" in p.stderr and "PASS" not in p.stdout, p.stderr)
        # two jobs: two tests of 3 s, each printing between its sleeps, side by side
        slow = [script(d, "slow%d.sh" % i, "".join("echo 'PASS slow%d line %d'\nsleep 1\n" % (i, j) for j in range(3)))
                for i in range(2)]
        t0 = time.time()
        p = subprocess.run(["sh", RUN, slow[0], slow[1], bad], env=dict(os.environ, SKV_TEST_JOBS="2"),
                           capture_output=True, text=True, timeout=60)
        wall = time.time() - t0
        lines = p.stdout.splitlines()
        blocks = [[x for x in lines if x.startswith("PASS slow%d" % i)] for i in range(2)]
        together = all(len(b) == 3 and lines.index(b[-1]) - lines.index(b[0]) == 2 for b in blocks)
        check("run.sh with SKV_TEST_JOBS=2: two 3 s tests run side by side (under 5.5 s for both)", wall < 5.5,
              "%.1f s" % wall)
        check("... each one's output whole, never interleaved, with its TIME line after it", together and
              all(lines[lines.index(b[-1]) + 1].startswith("TIME %s " % slow[i]) for i, b in enumerate(blocks)),
              p.stdout)
        check("... and the tally counts every test's lines, the failure too",
              p.returncode != 0 and lines[-1] == "7 passed, 1 failed, 0 skipped"
              and ("FAIL %s exited with status 3" % bad) in lines, p.stdout)
        # scratch: each test writes into its own TMPDIR; a pass's is removed, a failure's kept and named
        keep = os.path.join(d, "keep")
        os.mkdir(keep)
        body = 'mkdir "$TMPDIR/skv-test-x-$$" && echo data > "$TMPDIR/skv-test-x-$$/f" && echo "PASS wrote %s"\n%s'
        good = script(d, "good.sh", body % ("good", ""))
        fails = script(d, "fails.sh", body % ("fails", "echo 'FAIL on purpose'\n"))
        p = subprocess.run(["sh", RUN, good, fails], env=dict(os.environ, SKV_TEST_JOBS="1", TMPDIR=keep),
                           capture_output=True, text=True, timeout=60)
        kept = [os.path.join(r, f) for r, _, fs in os.walk(keep) for f in fs]
        note = [x for x in p.stdout.splitlines() if x.startswith("NOTE %s's scratch files kept in " % fails)]
        check("run.sh: a passing test's scratch files are removed, a failing one's kept and named in its output",
              len(kept) == 1 and "/fails.sh/skv-test-x-" in kept[0] and len(note) == 1
              and kept[0].startswith(note[0].split(" kept in ")[1] + "/"), p.stdout + repr(kept))
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return finish("test_runner")


if __name__ == "__main__":
    sys.exit(main())
