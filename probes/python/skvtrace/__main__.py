"""python3 -m skvtrace: the trace tools of the Python package. From the
repository root, with Debian's python3 (it has numpy):

    PYTHONPATH=probes/python /usr/bin/python3 -m skvtrace info run.skvtrace

    python3 -m skvtrace rewrite IN OUT [--force]
        reads the trace IN and writes it again at OUT through the Python
        writer; for a trace skv wrote, OUT is IN byte for byte
    python3 -m skvtrace info FILE
        who wrote the trace, and its records per kind

Errors are one line on stderr and exit status 1 (2 for a bad command line).
"""
import sys

from . import TraceError, TraceValueError, load, rewrite


def main(argv):
    usage = "usage: python3 -m skvtrace rewrite IN OUT [--force] | info FILE"
    if len(argv) >= 1 and argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    try:
        if len(argv) in (3, 4) and argv[0] == "rewrite" and (len(argv) == 3 or argv[3] == "--force"):
            n = rewrite(argv[1], argv[2], force=len(argv) == 4)
            print("skvtrace: wrote %s (%d records)" % (argv[2], n))
            return 0
        if len(argv) == 2 and argv[0] == "info":
            t = load(argv[1])
            m = t.meta
            who = m.get("writer") or ("skv %s" % m.get("skv_version", "?"))
            if m.get("writer_version"):
                who += " %s" % m["writer_version"]
            if m.get("producer"):
                who += ", producer %s" % m["producer"]
            print("%s: format %s, written by %s" % (argv[1], t.version, who))
            for k in t.kinds():
                print("  %-14s %d" % (k, len(t[k]["record"])))
            return 0
    except (TraceError, TraceValueError, OSError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if isinstance(e, OSError) and not isinstance(e, TraceError):
            msg = "%s: %s" % (getattr(e, "filename", "") or "", e.strerror or e)
        print("skvtrace: %s" % msg, file=sys.stderr)
        return 1
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
