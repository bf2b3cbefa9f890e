#!/usr/bin/python3
"""fuzz_skvtrace: a bounded mutation loop over probes/python/skvtrace, the
Python trace reader (make fuzz runs it beside the libFuzzer harnesses).
Seeds are the traces of tests/fuzz/seeds.sh and tests/fuzz/regress/trace;
each round flips bytes, cuts, splices or repeats a slice of one, then loads
it whole and with partial=True. Anything but a clean load or the reader's
own TraceError is a finding: the input is saved as
build-fuzz/crash-skvtrace-N and the loop exits 1.
usage: fuzz_skvtrace.py SECONDS"""
import glob
import os
import random
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "probes", "python"))
try:
    import skvtrace
except ImportError as e:
    print("fuzz_skvtrace: skipped: %s (make deps installs python3-numpy)" % e)
    sys.exit(0)


def mutate(rng, seeds):
    b = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(6)
        if not b:
            b += os.urandom(rng.randint(1, 64))
        elif op == 0:  # flip bytes
            for _ in range(rng.randint(1, 8)):
                b[rng.randrange(len(b))] = rng.randrange(256)
        elif op == 1:  # cut
            del b[rng.randrange(len(b)):]
        elif op == 2:  # insert stray bytes
            at = rng.randrange(len(b) + 1)
            b[at:at] = os.urandom(rng.randint(1, 16))
        elif op == 3:  # splice another seed's tail
            o = rng.choice(seeds)
            b = b[:rng.randrange(len(b) + 1)] + o[rng.randrange(len(o) + 1):]
        elif op == 4:  # repeat a slice
            i = rng.randrange(len(b))
            j = min(len(b), i + rng.randint(1, 256))
            b[i:i] = b[i:j] * rng.randint(1, 4)
        else:  # a u32 field set to an extreme
            if len(b) >= 4:
                i = rng.randrange(len(b) - 3)
                b[i:i + 4] = rng.choice([b"\xff\xff\xff\xff", b"\x00\x00\x00\x00", b"\xff\xff\xff\x7f",
                                         b"\x00\x00\x00\x80"])
    return bytes(b)


def main():
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 30
    files = glob.glob(os.path.join(ROOT, "build-fuzz", "corpus", "trace", "*")) + \
        glob.glob(os.path.join(ROOT, "tests", "fuzz", "regress", "trace", "*"))
    seeds = [open(f, "rb").read() for f in files if os.path.isfile(f)]
    if not seeds:
        print("fuzz_skvtrace: no seed traces (run tests/fuzz/seeds.sh)")
        return 1
    rng = random.Random(int(os.environ.get("FUZZ_SEED", "1")))
    work = os.path.join(ROOT, "build-fuzz", "skvtrace-in.skvt")
    os.makedirs(os.path.dirname(work), exist_ok=True)
    t_end, n = time.time() + secs, 0
    while time.time() < t_end:
        data = mutate(rng, seeds)
        with open(work, "wb") as f:
            f.write(data)
        for partial in (False, True):
            try:
                skvtrace.load(work, partial=partial)
            except skvtrace.TraceError:
                pass
            except Exception:  # noqa: BLE001 - anything else is the finding
                out = os.path.join(ROOT, "build-fuzz", "crash-skvtrace-%d" % n)
                with open(out, "wb") as f:
                    f.write(data)
                print("fuzz_skvtrace: CRASH on input %d (partial=%s), saved as %s" % (n, partial, out))
                traceback.print_exc()
                return 1
        n += 1
    print("%-12s %12d %10.0f %8s %8s" % ("skvtrace.py", n, n / secs, "-", "-"))
    return 0


sys.exit(main())
