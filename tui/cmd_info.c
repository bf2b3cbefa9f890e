/* cmd_info.c: `skv info -m MODEL`: config, tensors with types and shapes,
 * and memory; `skv info --backends`: the backend registry. */
#include "backend.h"
#include "cli.h"
#include "model.h"
#include "skv.h"
#include "tok.h"

#include <string.h>

static void print_tensor(const char *name, const skv_tensor *t) {
    if (!t->data) return;
    char b[32];
    cli_bytes(b, sizeof b, ggml_row_size(t->type, t->cols) * (double)t->rows);
    char shape[40]; /* (out, in) as PyTorch gives a weight; a norm's vector [n] */
    if (t->rows == 1) snprintf(shape, sizeof shape, "[%d]", t->cols);
    else snprintf(shape, sizeof shape, "[%d, %d]", t->rows, t->cols);
    printf("  %-28s %-5s %s %s\n", name, ggml_type_name(t->type), shape, b);
}

/* The backends built into this binary and whether each can run here. */
static int list_backends(void) {
    printf("backends (--backend NAME; the first is the default):\n");
    for (int i = 0; i < skv_backend_count(); i++) {
        const skv_backend *b = skv_backend_at(i);
        char why[160] = "";
        int ok = !b->available || b->available(why, sizeof why);
        printf("  %-6s %s\n         %s%s\n", b->name, b->summary, ok ? "available" : "not available here: ",
               ok ? "" : why);
    }
    return 0;
}

int cmd_info(int argc, char **argv) {
    const char *path = NULL;
    int all = 0, backends = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            printf("usage: skv info [-m] MODEL [--all]\n       skv info --backends\n\nPrints the config, tokenizer, tensors "
                   "(layer 0 only unless --all) with types and shapes, and memory.\n--backends lists the backends built "
                   "into this binary and whether each can run on this machine.\n");
            return 0;
        }
        if ((!strcmp(argv[i], "-m") || !strcmp(argv[i], "--model")) && i + 1 < argc) path = argv[++i];
        else if (!strcmp(argv[i], "--all")) all = 1;
        else if (!strcmp(argv[i], "--backends")) backends = 1;
        else if (argv[i][0] != '-' && !path) path = argv[i];   /* skv info MODEL */
        else return cli_usage_error("info", "unknown option '%s'", argv[i]);
    }
    if (backends && !path) return list_backends();
    if (!path) return cli_usage_error("info", "no model: give -m MODEL (or --backends)");
    skv_model *m;
    if (model_load(path, &m)) return cli_fail();
    const model_config *c = &m->cfg;
    printf("model:        %s\nformat:       %s\nname:         %s\narchitecture: %s\n", m->path, m->format, c->name, c->arch);
    printf("layers:       %d\nhidden:       %d\nffn:          %d\nheads:        %d (KV heads %d, GQA %d:1)\n"
           "head dim:     %d\nvocab:        %d\ncontext:      %d\n",
           c->n_layers, c->dim, c->ffn_dim, c->n_heads, c->n_kv_heads, c->n_heads / c->n_kv_heads, c->head_dim,
           c->vocab, c->ctx_train);
    printf("rope:         %s pairs, theta %g, %d dims%s\n", c->rope_mode == ROPE_NEOX ? "rotate-half" : "adjacent",
           c->rope_theta, c->rope_dim, c->rope_llama3 ? ", llama3 scaling" : "");
    printf("norm eps:     %g\nqkv bias:     %s\ntied embd:    %s\n", c->norm_eps, c->qkv_bias ? "yes" : "no",
           c->tied_embd ? "yes" : "no");
    printf("tokenizer:    %s (%s), %d tokens, bos %d, eos %d, add bos %s\n",
           tok_kind(m->tok) == TOK_SPM ? "sentencepiece-bpe" : "byte-level-bpe", tok_pre_name(m->tok),
           tok_n_vocab(m->tok), tok_bos(m->tok), tok_eos(m->tok), tok_add_bos(m->tok) ? "yes" : "no");
    printf("tensors:\n");
    print_tensor("token_embd", &m->tok_embd);
    print_tensor("output_norm", &m->out_norm);
    if (!c->tied_embd) print_tensor("output", &m->output);
    static const char *names[] = {"attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "ffn_norm", "w_gate", "w_up", "w_down"};
    for (int l = 0; l < (all ? c->n_layers : 1); l++) {
        const skv_tensor *t = &m->layers[l].attn_norm;
        for (int j = 0; j < 12; j++) {
            char nm[64];
            snprintf(nm, sizeof nm, "blk.%d.%s", l, names[j]);
            print_tensor(nm, &t[j]);
        }
    }
    if (!all && c->n_layers > 1) printf("  ... (%d more layers; --all lists them)\n", c->n_layers - 1);
    double kvtok = 2.0 * c->n_layers * c->n_kv_heads * c->head_dim * sizeof(float);
    char w[32], tok[32], ctx[32], ctx16[32];
    cli_bytes(w, sizeof w, (double)model_weight_bytes(m));
    cli_bytes(tok, sizeof tok, kvtok);
    cli_bytes(ctx, sizeof ctx, kvtok * c->ctx_train);
    cli_bytes(ctx16, sizeof ctx16, kvtok / 2 * c->ctx_train);
    printf("memory:       weights %s; dense KV cache %s per token in f32, %s at %d tokens (%s in f16, --f16-kv)\n",
           w, tok, ctx, c->ctx_train, ctx16);
    model_free(m);
    return 0;
}
