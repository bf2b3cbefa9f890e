/* fuzz_safetensors.c: safetensors headers and shard indexes. The first byte
 * picks the form: even, a single file (the rest of the input); odd, a
 * directory whose model.safetensors.index.json is the rest of the input,
 * beside two small valid shards made at start. */
#include "fuzz.h"
#include "safetensors.h"

/* A valid safetensors file with one 2x2 F32 tensor named name. */
static void put_shard(const char *file, const char *name) {
    char head[256], path[64];
    int hn = snprintf(head, sizeof head, "{\"%s\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", name);
    unsigned char buf[512];
    uint64_t len = (uint64_t)hn;
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(len >> (8 * i));
    memcpy(buf + 8, head, (size_t)hn);
    memset(buf + 8 + hn, 0, 16);
    snprintf(path, sizeof path, "dir/%s", file);
    char full[400];
    snprintf(full, sizeof full, "%s/dir", fuzz_dir());
    mkdir(full, 0700);
    fuzz_put(path, buf, 8 + (size_t)hn + 16, full, sizeof full);
}

static void fuzz_safetensors_init(void) {
    put_shard("model-00001-of-00002.safetensors", "a.weight");
    put_shard("model-00002-of-00002.safetensors", "b.weight");
}

static int fuzz_safetensors(const uint8_t *data, size_t size) {
    if (!size) return 0;
    int dir = data[0] & 1;
    char path[512];
    st_set *s = NULL;
    if (!dir) {
        if (!fuzz_put("in.safetensors", data + 1, size - 1, path, sizeof path)) return 0;
        if (st_open_file(path, &s) == 0) st_close(s);
    } else {
        if (!fuzz_put("dir/model.safetensors.index.json", data + 1, size - 1, path, sizeof path)) return 0;
        snprintf(path, sizeof path, "%s/dir", fuzz_dir());
        if (st_open_dir(path, &s) == 0) st_close(s);
    }
    return 0;
}

FUZZ_MAIN(safetensors)
