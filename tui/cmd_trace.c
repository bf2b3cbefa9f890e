/* cmd_trace.c: `skv trace info FILE` summarises a recorded trace; `skv
 * trace schema` prints the event schema every trace is written from (for
 * writers in other languages: probes/python/skvtrace checks its own tables
 * against it). */
#include "cli.h"
#include "probe.h"
#include "skv.h"
#include "trace.h"

#include <cJSON.h>
#include <stdlib.h>
#include <string.h>

/* The schema tables of probe.c as JSON: {"version": 3, "kinds": [{"kind": 1,
 * "name": "run", "fields": [["random_weights", "i32"], ["text", "bytes",
 * "n_text"], ...]}, ...]}, in kind order; an array's third element is its
 * count field. */
static int print_schema(void) {
    static const char *const type_names[] = {
        [PROBE_F_I32] = "i32", [PROBE_F_F32] = "f32", [PROBE_F_F64] = "f64", [PROBE_F_U64] = "u64",
        [PROBE_F_STR] = "str", [PROBE_F_BYTES] = "bytes", [PROBE_F_I32S] = "i32s", [PROBE_F_F32S] = "f32s",
    };
    cJSON *root = cJSON_CreateObject(), *kinds = root ? cJSON_AddArrayToObject(root, "kinds") : NULL;
    if (!kinds || !cJSON_AddNumberToObject(root, "version", TRACE_VERSION)) {
        cJSON_Delete(root);
        return skv_error(SKV_ENOMEM, "out of memory");
    }
    for (int k = 1; k < PROBE_KIND_COUNT; k++) {
        int nf;
        const probe_field *fs = probe_schema((probe_kind)k, &nf);
        if (!fs) continue;
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToArray(kinds, o);
        cJSON_AddNumberToObject(o, "kind", k);
        cJSON_AddStringToObject(o, "name", probe_kind_name((probe_kind)k));
        cJSON *fl = cJSON_AddArrayToObject(o, "fields");
        for (int i = 0; fl && i < nf; i++) {
            cJSON *f = cJSON_CreateArray();
            cJSON_AddItemToArray(fl, f);
            cJSON_AddItemToArray(f, cJSON_CreateString(fs[i].name));
            cJSON_AddItemToArray(f, cJSON_CreateString(type_names[fs[i].type]));
            if (fs[i].type == PROBE_F_BYTES || fs[i].type == PROBE_F_I32S || fs[i].type == PROBE_F_F32S)
                cJSON_AddItemToArray(f, cJSON_CreateString(fs[fs[i].count].name));
        }
    }
    char *s = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!s) return skv_error(SKV_ENOMEM, "out of memory");
    printf("%s\n", s);
    free(s);
    return 0;
}

int cmd_trace(int argc, char **argv) {
    if (argc >= 2 && (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))) {
        printf("usage: skv trace info FILE\n       skv trace schema\n\n"
               "info: summarises a trace (recorded with --trace, or written by probes/python/skvtrace):\n"
               "format version, who wrote it, model, KV policy, events per kind, steps, layers and file size.\n"
               "schema: prints the event schema traces are written from, as JSON (each kind's number,\n"
               "name and fields in payload order; docs/TRACE.md), for writers in other languages.\n");
        return 0;
    }
    if (argc == 2 && !strcmp(argv[1], "schema")) return print_schema() ? cli_fail() : 0;
    if (argc != 3 || strcmp(argv[1], "info"))
        return cli_usage_error("trace", "expected: skv trace info FILE, or skv trace schema");
    if (trace_info(argv[2], stdout)) return cli_fail();
    return 0;
}
