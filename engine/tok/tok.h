/* tok.h: tokenizers. SentencePiece-style BPE with scores and byte fallback
 * (GGUF "llama") and byte-level BPE with merges (GGUF "gpt2" with the
 * pre-tokenizers smollm, llama-bpe, qwen2, default; HF tokenizer.json).
 * Special tokens written in the text are recognised first, longest match. */
#ifndef SKV_TOK_H
#define SKV_TOK_H

#include "gguf.h"
#include <stddef.h>
#include <stdint.h>

typedef struct tok_vocab tok_vocab;

enum tok_kind { TOK_SPM = 0, TOK_BPE = 1 };

/* From GGUF metadata (tokenizer.ggml.*). 0 or negative SKV_E* with a message. */
int tok_load_gguf(const gguf_file *f, tok_vocab **out);
/* From an HF tokenizer.json (byte-level BPE); BOS/EOS/add_bos from the
 * tokenizer_config.json, config.json and generation_config.json beside it. */
int tok_load_hf(const char *path, tok_vocab **out);
void tok_free(tok_vocab *v);

enum tok_kind tok_kind(const tok_vocab *v);
int tok_n_vocab(const tok_vocab *v);
int tok_bos(const tok_vocab *v);        /* -1 if none */
int tok_eos(const tok_vocab *v);        /* -1 if none */
int tok_add_bos(const tok_vocab *v);    /* the model's default for adding BOS */
int tok_is_eog(const tok_vocab *v, int id); /* end of generation (eos, eot, <|im_end|>...) */
/* Pre-tokenizer name: tokenizer.ggml.pre ("smollm", "llama-bpe", ...; "default"
 * when absent), "none" for SPM, the steps ("Digits,ByteLevel") for tokenizer.json. */
const char *tok_pre_name(const tok_vocab *v);

/* Encodes len bytes of text. add_bos: prepend BOS (an error when the
 * vocabulary has none). SPM also prepends a space to the text and after each
 * special token, with or without BOS, as llama.cpp does.
 * parse_special: split at control tokens' text first, longest first
 * (user-defined tokens are always split out). *ids is malloc'd and
 * owned by the caller. Returns 0 or a negative SKV_E* code. */
int tok_encode(const tok_vocab *v, const char *text, size_t len, int add_bos, int parse_special,
               int32_t **ids, int *n_ids);

/* The bytes token id stands for, as it reads after prev (-1 = start of text):
 * SPM maps U+2581 to space and <0xNN> to a byte, and drops the leading space of
 * the first word (prev == -1, or prev == BOS). BPE maps the GPT-2 stand-ins back
 * to bytes. Control and unknown tokens give "" unless show_special;
 * user-defined ones give their text. Writes at most cap bytes, returns the length
 * (which may exceed cap: then call again with a larger buffer). */
int tok_piece(const tok_vocab *v, int prev, int id, int show_special, char *buf, int cap);

/* Decodes a whole sequence from its start into a malloc'd NUL-terminated
 * string (bytes may include invalid UTF-8 when tokens split characters). */
char *tok_decode(const tok_vocab *v, const int32_t *ids, int n, int show_special);

/* Raw vocabulary string of id (as stored, with stand-ins), or NULL. */
const char *tok_text(const tok_vocab *v, int id);

#endif
