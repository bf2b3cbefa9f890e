/* hf_config.h: reads a Hugging Face config.json into a model_config.
 *
 * Supports the Llama family as transformers describes it: model_type (or
 * architectures[0]) "llama", "mistral" or "qwen2". Optional fields take
 * transformers' defaults for that model type; anything skv would compute
 * wrongly (other architectures, rope_scaling other than "llama3", sliding
 * windows, biases beyond Qwen2's q/k/v, an MLP other than SiLU-gated) is
 * refused with SKV_EUNSUPPORTED rather than silently misread. */
#ifndef SKV_HF_CONFIG_H
#define SKV_HF_CONFIG_H

#include "model.h"

#define HF_MAX_EOS 16

/* What config.json holds beyond model_config. */
typedef struct {
    int n_eos;                  /* eos_token_id as a list (a scalar is a list of 1; the first
                                   HF_MAX_EOS kept); 0 when null/absent */
    int eos[HF_MAX_EOS];        /* cfg->eos == eos[0] when n_eos > 0 */
    char torch_dtype[16];       /* "bfloat16", "float16", "float32", or "" when absent */
} hf_extra;

/* Loads path, which is a model directory (its config.json is read) or a path
 * to a .json file, into *cfg (every field set; the rest zeroed). Always:
 * rope_mode = ROPE_NEOX, rope_dim = head_dim. qkv_bias = 1 for qwen2.
 * bos and eos are -1 when the config has none (null or absent). name is
 * _name_or_path when non-empty, else the directory name for config.json,
 * else the file name without ".config.json" / ".json".
 * For mistral with a sliding_window (or qwen2 with use_sliding_window),
 * ctx_train is capped at the window, since skv attends to every position.
 * Returns 0, SKV_EFORMAT (missing field or wrong JSON type), SKV_EUNSUPPORTED
 * or SKV_EIO / SKV_EMISSING, with skv_last_error() naming the file and field. */
int hf_load_config(const char *dir_or_config_json, model_config *cfg);

/* As hf_load_config, and fills *extra when it is not NULL. */
int hf_load_config_ex(const char *dir_or_config_json, model_config *cfg, hf_extra *extra);

#endif
