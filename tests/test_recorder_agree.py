#!/usr/bin/python3
"""test_recorder_agree: the PyTorch recorder's per-step top1_agree (does the
method's next token equal exact attention's?) equals skv's own, step by step.

skv run --oracle records, per decode step, whether the policy's argmax equals
dense's; probes/python/examples/record_demo.py --oracle records the same from
the PyTorch Quest and ShadowKV fed skv's tokens (--feed). Three settings on the
demo model and samples/prompts/needle.txt cover both answers and a switch
between them: ShadowKV at budget 16, rank 8, no outliers (disagrees, then
agrees), Quest at budget 16 (one page: disagrees at every step) and at 64
(agrees at every step). Needs Debian's python3-torch (make deps). Prints
PASS/FAIL/SKIP lines for tests/run.sh."""
import os
import shutil
import subprocess
import sys
import tempfile

from testhelp import ROOT, SKV, check, finish  # noqa: E402
try:
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import regex  # noqa: F401  (samples/train/train.py's tokenizer regexes)
    import skvtrace
except ImportError as e:
    print("SKIP PyTorch recorder top1_agree test: %s (make deps installs python3-torch and python3-regex)" % e)
    sys.exit(0)

MODEL = os.path.join(ROOT, "samples", "model", "skv-demo.gguf")
PROMPT = os.path.join(ROOT, "samples", "prompts", "needle.txt")
REC = os.path.join(ROOT, "probes", "python", "examples", "record_demo.py")
STEPS = 8
SETTINGS = [("shadowkv", ["--budget", "16", "--rank", "8", "--outliers", "0"]),
            ("quest", ["--budget", "16"]),
            ("quest", ["--budget", "64"])]


def main():
    if not os.path.exists(SKV):
        print("SKIP no skv binary at %s (set SKV_BIN or run make)" % SKV)
        return 0
    tmp = tempfile.mkdtemp(prefix="skv-recagree-")
    seen = set()
    try:
        for i, (pol, opts) in enumerate(SETTINGS):
            what = "%s %s" % (pol, " ".join(opts))
            ct, pt = os.path.join(tmp, "%d.skv" % i), os.path.join(tmp, "%d.torch" % i)
            p = subprocess.run([SKV, "run", "-m", MODEL, "-f", PROMPT, "-n", str(STEPS + 1), "--kv", pol, "--oracle",
                                "--trace", ct] + opts, cwd=ROOT, capture_output=True, text=True, errors="replace")
            if p.returncode:
                check("skv run --kv %s --oracle --trace" % what, False, p.stdout + p.stderr)
                continue
            p = subprocess.run([sys.executable, REC, "--kv", pol, "--ids-from", ct, "--feed", "-n", str(STEPS),
                                "--oracle", "-o", pt] + opts, cwd=ROOT, capture_output=True, text=True)
            if p.returncode:
                check("record_demo.py --kv %s" % what, False, p.stdout + p.stderr)
                continue
            a, b = skvtrace.load(ct)["step"], skvtrace.load(pt)["step"]
            sa, sb = a["top1_agree"].tolist(), b["top1_agree"].tolist()
            seen.update(sa)
            check("PyTorch %s: top1_agree equals skv's at each of the %d steps (%s)" % (what, STEPS, sa),
                  len(sa) == STEPS and sa == sb and a["has_oracle"].tolist() == b["has_oracle"].tolist() == [1] * STEPS
                  and a["token"].tolist() == b["token"].tolist(), (sa, sb))
        check("the settings cover steps that agree with dense and steps that do not", seen == {0, 1}, seen)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return finish("test_recorder_agree")


if __name__ == "__main__":
    sys.exit(main())
