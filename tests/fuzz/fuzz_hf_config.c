/* fuzz_hf_config.c: an HF config.json through the config reader and the
 * model shape checks. */
#include "fuzz.h"
#include "hf_config.h"
#include "model.h"

static void fuzz_hf_config_init(void) {}

static int fuzz_hf_config(const uint8_t *data, size_t size) {
    char path[512];
    if (!fuzz_put("config.json", data, size, path, sizeof path)) return 0;
    model_config cfg;
    hf_extra ex;
    memset(&cfg, 0, sizeof cfg);
    memset(&ex, 0, sizeof ex);
    if (hf_load_config_ex(path, &cfg, &ex) == 0) model_config_check(&cfg, path);
    return 0;
}

FUZZ_MAIN(hf_config)
