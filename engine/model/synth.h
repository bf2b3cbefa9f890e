/* synth.h: writes a GGUF model of any real shape with random weights:
 * seeded, key projections of planted low rank (so pre-RoPE keys have a
 * decaying spectrum, as real models' do), and a byte-level vocabulary. Used
 * for benchmarks and GPU tests at real shapes. */
#ifndef SKV_SYNTH_H
#define SKV_SYNTH_H

#include "gguf.h"
#include "model.h"

typedef struct {
    enum ggml_type dtype;   /* f32, f16, bf16, q8_0 for the matrices */
    uint64_t seed;
    int key_rank;           /* planted rank of each layer's key projection; 0 = n_kv*hd/4 */
} synth_opts;

/* Writes cfg's model to path (temp file, then rename). */
int synth_write(const model_config *cfg, const synth_opts *o, const char *path);

#endif
