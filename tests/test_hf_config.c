/* test_hf_config.c: config.json reading on the three real configs in
 * ../shared/configs and the mini model, and on broken configs written here
 * (each must fail with the right code and a message naming file and field). */
#include "hf_config.h"
#include "skv.h"
#include "testhelp.h"

#include <ftw.h>

static char tmp[512];

static const char *write_cfg(const char *name, const char *text) {
    static char path[1024];
    snprintf(path, sizeof path, "%s/%s", tmp, name);
    FILE *f = fopen(path, "wb");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return path;
}

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb; (void)flag; (void)ftw;
    return remove(p);
}

/* Loads rel under ../shared/configs, or says why it is skipped. */
static int load_shared(const char *rel, model_config *c, hf_extra *x) {
    const char *p = test_shared(rel);
    if (!p) {
        char why[256];
        snprintf(why, sizeof why, "../shared/%s not found: its config checks skipped", rel);
        test_skip(why);
        return -1;
    }
    int rc = hf_load_config_ex(p, c, x);
    if (rc) printf("  %s\n", skv_last_error());
    return rc;
}

static void test_real(void) {
    model_config c;
    hf_extra x;
    if (load_shared("configs/llama-3.1-8b.config.json", &c, &x) == 0) {
        test_cond("llama-3.1-8b: arch and sizes",
                  !strcmp(c.arch, "llama") && c.dim == 4096 && c.ffn_dim == 14336 && c.n_layers == 32 &&
                  c.n_heads == 32 && c.n_kv_heads == 8 && c.head_dim == 128 && c.vocab == 128256 &&
                  c.ctx_train == 131072);
        test_cond("llama-3.1-8b: rope theta, neox, rope_dim", c.rope_theta == 500000.0f && c.rope_mode == ROPE_NEOX &&
                  c.rope_dim == 128 && c.norm_eps == 1e-5f);
        test_cond("llama-3.1-8b: llama3 rope scaling", c.rope_llama3 == 1 && c.rope_factor == 8.0f &&
                  c.rope_low_freq == 1.0f && c.rope_high_freq == 4.0f && c.rope_orig_ctx == 8192);
        test_cond("llama-3.1-8b: untied, no bias", !c.tied_embd && !c.qkv_bias);
        test_cond("llama-3.1-8b: bos and eos list", c.bos == 128000 && c.eos == 128001 && x.n_eos == 3 &&
                  x.eos[0] == 128001 && x.eos[1] == 128008 && x.eos[2] == 128009);
        test_cond("llama-3.1-8b: name from the file and dtype", !strcmp(c.name, "llama-3.1-8b") &&
                  !strcmp(x.torch_dtype, "bfloat16"));
    }
    if (load_shared("configs/qwen2.5-7b.config.json", &c, &x) == 0) {
        test_cond("qwen2.5-7b: arch and sizes",
                  !strcmp(c.arch, "qwen2") && c.dim == 3584 && c.ffn_dim == 18944 && c.n_layers == 28 &&
                  c.n_heads == 28 && c.n_kv_heads == 4 && c.head_dim == 128 && c.vocab == 152064 &&
                  c.ctx_train == 32768);
        test_cond("qwen2.5-7b: qkv bias, untied, no scaling", c.qkv_bias == 1 && !c.tied_embd && !c.rope_llama3);
        test_cond("qwen2.5-7b: theta, eps, tokens", c.rope_theta == 1000000.0f && c.norm_eps == 1e-6f &&
                  c.bos == 151643 && c.eos == 151645 && x.n_eos == 1 && c.rope_mode == ROPE_NEOX);
    }
    if (load_shared("configs/smollm2-135m.config.json", &c, &x) == 0) {
        test_cond("smollm2-135m: arch and sizes",
                  !strcmp(c.arch, "llama") && c.dim == 576 && c.ffn_dim == 1536 && c.n_layers == 30 &&
                  c.n_heads == 9 && c.n_kv_heads == 3 && c.head_dim == 64 && c.vocab == 49152 &&
                  c.ctx_train == 8192 && c.rope_dim == 64);
        test_cond("smollm2-135m: tied embeddings, theta 1e5, no scaling", c.tied_embd == 1 &&
                  c.rope_theta == 100000.0f && !c.rope_llama3 && !c.qkv_bias && c.bos == 1 && c.eos == 2);
    }
    if (load_shared("models/mini-smollm-hf", &c, &x) == 0) {
        test_cond("mini-smollm-hf (directory): 4 layers, 3 heads, 1 kv head, head_dim 64",
                  !strcmp(c.arch, "llama") && c.n_layers == 4 && c.dim == 192 && c.n_heads == 3 &&
                  c.n_kv_heads == 1 && c.head_dim == 64 && c.ffn_dim == 512 && c.vocab == 49152 && c.tied_embd &&
                  c.norm_eps == 1e-5f && c.rope_theta == 100000.0f);
        test_cond("mini-smollm-hf: name is the directory", !strcmp(c.name, "mini-smollm-hf"));
        model_config c2;
        const char *p = test_shared("models/mini-smollm-hf/config.json");
        test_cond("mini-smollm-hf/config.json path gives the same config",
                  p && hf_load_config(p, &c2) == 0 && !memcmp(&c, &c2, sizeof c));
    }
}

/* Writes text as name and expects code with a message naming the file and needle. */
static void expect_fail(const char *what, const char *name, const char *text, int want, const char *needle) {
    model_config c;
    const char *path = write_cfg(name, text);
    int rc = hf_load_config(path, &c);
    const char *msg = skv_last_error();
    printf("  %s -> %s\n", what, msg);
    char d[256];
    snprintf(d, sizeof d, "%s fails with %s naming the file and '%s'", what, skv_strerror(want), needle);
    test_cond(d, rc == want && strstr(msg, name) && strstr(msg, needle) && !strchr(msg, '\n'));
}

#define BASE_HEAD "{\"model_type\": \"llama\", \"intermediate_size\": 64, \"num_hidden_layers\": 2, " \
                  "\"num_attention_heads\": 4, \"vocab_size\": 100"

static void test_broken(void) {
    model_config c;
    hf_extra x;
    const char *p = write_cfg("minimal.json", BASE_HEAD ", \"hidden_size\": 32}");
    int rc = hf_load_config_ex(p, &c, &x);
    test_cond("a minimal config takes transformers' llama defaults",
              rc == 0 && c.n_kv_heads == 4 && c.head_dim == 8 && c.rope_theta == 10000.0f && c.ctx_train == 2048 &&
              c.norm_eps == 1e-6f && !c.tied_embd && c.bos == -1 && c.eos == -1 && x.n_eos == 0 &&
              !strcmp(c.name, "minimal") && c.rope_factor == 1.0f);

    p = write_cfg("arch-only.json", "{\"architectures\": [\"Qwen2ForCausalLM\"], \"hidden_size\": 32, "
                  "\"intermediate_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4, "
                  "\"num_key_value_heads\": 2, \"vocab_size\": 100, \"_name_or_path\": \"Qwen/tiny\"}");
    rc = hf_load_config(p, &c);
    test_cond("architectures stands in for model_type",
              rc == 0 && !strcmp(c.arch, "qwen2") && c.qkv_bias && c.ctx_train == 32768 && !strcmp(c.name, "Qwen/tiny"));

    p = write_cfg("mistral.json", "{\"model_type\": \"mistral\", \"hidden_size\": 32, \"intermediate_size\": 64, "
                  "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 1, "
                  "\"vocab_size\": 100, \"max_position_embeddings\": 32768, \"sliding_window\": 4096, "
                  "\"head_dim\": null, \"eos_token_id\": null, \"rope_scaling\": {\"rope_type\": \"default\"}}");
    rc = hf_load_config(p, &c);
    test_cond("mistral: sliding window caps ctx_train, nulls take defaults",
              rc == 0 && !strcmp(c.arch, "mistral") && c.ctx_train == 4096 && c.head_dim == 8 && c.eos == -1 &&
              !c.rope_llama3);

    expect_fail("missing hidden_size", "nohidden.json", BASE_HEAD "}", SKV_EFORMAT, "hidden_size");
    expect_fail("hidden_size a string", "strhidden.json", BASE_HEAD ", \"hidden_size\": \"32\"}", SKV_EFORMAT,
                "hidden_size");
    expect_fail("hidden_size fractional", "frachidden.json", BASE_HEAD ", \"hidden_size\": 32.5}", SKV_EFORMAT,
                "hidden_size");
    expect_fail("hidden_size zero", "zerohidden.json", BASE_HEAD ", \"hidden_size\": 0}", SKV_EFORMAT,
                "hidden_size");
    expect_fail("model_type gpt_neox", "neox.json",
                "{\"model_type\": \"gpt_neox\", \"hidden_size\": 32, \"intermediate_size\": 64, "
                "\"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"vocab_size\": 100}",
                SKV_EUNSUPPORTED, "gpt_neox");
    expect_fail("no model_type and an unknown class", "phi.json",
                "{\"architectures\": [\"PhiForCausalLM\"], \"hidden_size\": 32}", SKV_EUNSUPPORTED, "PhiForCausalLM");
    expect_fail("rope_scaling yarn", "yarn.json",
                BASE_HEAD ", \"hidden_size\": 32, \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0}}",
                SKV_EUNSUPPORTED, "yarn");
    expect_fail("llama3 scaling without factor", "l3.json",
                BASE_HEAD ", \"hidden_size\": 32, \"rope_scaling\": {\"rope_type\": \"llama3\", "
                "\"low_freq_factor\": 1, \"high_freq_factor\": 4, \"original_max_position_embeddings\": 8192}}",
                SKV_EFORMAT, "rope_scaling.factor");
    expect_fail("rope_scaling a string", "rsstr.json", BASE_HEAD ", \"hidden_size\": 32, \"rope_scaling\": \"x\"}",
                SKV_EFORMAT, "rope_scaling");
    expect_fail("tie_word_embeddings a number", "tie.json",
                BASE_HEAD ", \"hidden_size\": 32, \"tie_word_embeddings\": 1}", SKV_EFORMAT, "tie_word_embeddings");
    expect_fail("eos list with a string", "eos.json", BASE_HEAD ", \"hidden_size\": 32, \"eos_token_id\": [2, \"x\"]}",
                SKV_EFORMAT, "eos_token_id[1]");
    expect_fail("kv heads not dividing heads", "gqa.json",
                BASE_HEAD ", \"hidden_size\": 32, \"num_key_value_heads\": 3}", SKV_EFORMAT, "num_key_value_heads");
    expect_fail("hidden_act gelu", "gelu.json", BASE_HEAD ", \"hidden_size\": 32, \"hidden_act\": \"gelu\"}",
                SKV_EUNSUPPORTED, "hidden_act");
    expect_fail("llama attention_bias", "abias.json", BASE_HEAD ", \"hidden_size\": 32, \"attention_bias\": true}",
                SKV_EUNSUPPORTED, "attention_bias");
    expect_fail("not JSON", "garbage.json", "{\"model_type\": llama", SKV_EFORMAT, "JSON");
    expect_fail("top level an array", "array.json", "[1, 2]", SKV_EFORMAT, "object");

    char dir[600];
    snprintf(dir, sizeof dir, "%s/noconfig", tmp);
    mkdir(dir, 0700);
    rc = hf_load_config(dir, &c);
    printf("  directory without config.json -> %s\n", skv_last_error());
    test_cond("a directory without config.json is SKV_EMISSING naming config.json",
              rc == SKV_EMISSING && strstr(skv_last_error(), "noconfig/config.json"));
}

int main(void) {
    snprintf(tmp, sizeof tmp, "%s", test_tmpdir("hf_config"));
    test_real();
    test_broken();
    nftw(tmp, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return test_report("test_hf_config");
}
