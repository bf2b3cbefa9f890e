/* cmd_trace.c: `skv trace info FILE` summarises a recorded trace. */
#include "cli.h"
#include "skv.h"
#include "trace.h"

#include <string.h>

int cmd_trace(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: skv trace info FILE\n\nSummarises a trace recorded with --trace: format version, model, KV\n"
               "policy, events per kind, steps, layers and file size.\n");
        return 0;
    }
    if (argc != 3 || strcmp(argv[1], "info")) return cli_usage_error("trace", "expected: skv trace info FILE");
    if (trace_info(argv[2], stdout)) return cli_fail();
    return 0;
}
