/* main.c: the skv command line: dispatches subcommands. */
#include <stdio.h>
#include <string.h>

static void usage(FILE *o) {
    fprintf(o, "usage: skv COMMAND [options]\n\ncommands:\n  (none yet)\n");
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    fprintf(stderr, "skv: unknown command '%s' (see skv --help)\n", argv[1]);
    return 2;
}
