/* fuzz_trace.c: a trace file through the reader (header, checksums, records,
 * the range checks of the store), then every view drawn from every lane it
 * loaded, into a terminal canvas and into an SVG figure (the export path,
 * without writing the file). */
#include "canvas.h"
#include "fuzz.h"
#include "lanes.h"
#include "trace.h"
#include "view.h"

static void fuzz_trace_init(void) {}

static int fuzz_trace(const uint8_t *data, size_t size) {
    char path[512];
    if (!fuzz_put("in.skvt", data, size, path, sizeof path)) return 0;
    probe_lanes *L = NULL;
    if (probe_lanes_new(&L)) return 0;
    if (trace_load_lanes(path, L) == 0) {
        int n = probe_lanes_count(L);
        const probe_store *st[PROBE_MAX_LANES];
        const char *names[PROBE_MAX_LANES];
        for (int i = 0; i < n && i < PROBE_MAX_LANES; i++) {
            st[i] = probe_lanes_store(L, i);
            names[i] = probe_lanes_policy(L, i);
        }
        canvas *cells = NULL, *svg = NULL;
        canvas_cells_new(&cells, 100, 30, 0);
        canvas_svg_new(&svg, 640, 400, NULL);
        view_cursor cur;
        view_cursor_init(&cur);
        cur.layer = data[size / 2 % (size ? size : 1)] % 4;
        for (int v = 0; view_classes[v]; v++) {
            if (!view_available(view_classes[v])) continue;
            paint_result res;
            if (cells) {
                canvas_clear(cells);
                view_draw_lanes(view_classes[v], cells, (canvas_rect){0, 0, 100, 30}, st, names, n, &cur, &res);
            }
            if (svg) {
                canvas_clear(svg);
                view_draw_lanes(view_classes[v], svg, (canvas_rect){0, 0, 640, 400}, st, names, n, &cur, &res);
            }
            if (view_classes[v]->move) view_classes[v]->move(&cur, st[0], 1, 1);
        }
        canvas_free(cells);
        canvas_free(svg);
    }
    probe_lanes_free(L);
    return 0;
}

FUZZ_MAIN(trace)
