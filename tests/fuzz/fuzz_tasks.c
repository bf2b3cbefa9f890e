/* fuzz_tasks.c: a --task-file (JSON Lines of needle tasks) through the task
 * reader, and each task it accepts through the template filler. */
#include "fuzz.h"
#include "needle_task.h"

static void fuzz_tasks_init(void) {}

static int fuzz_tasks(const uint8_t *data, size_t size) {
    char path[512];
    if (!fuzz_put("tasks.jsonl", data, size, path, sizeof path)) return 0;
    needle_task *t = NULL;
    int n = 0;
    if (needle_task_load(path, &t, &n) == 0) {
        for (int i = 0; i < n; i++) {
            char *s = needle_fill(t[i].question, t[i].n_keys ? t[i].keys[0] : NULL, "1234567");
            free(s);
            s = needle_fill(t[i].fact, t[i].n_keys ? t[i].keys[t[i].n_keys - 1] : NULL, "7654321");
            free(s);
        }
        needle_tasks_free(t, n);
    }
    return 0;
}

FUZZ_MAIN(tasks)
