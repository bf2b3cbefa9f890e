/* tok_impl.h: the tokenizer's private parts, shared by tok.c (vocabulary,
 * special-token splitting, decoding, GGUF loading), tok_pre.c (the regex
 * pre-tokenizer), tok_bpe.c (merge-rank byte-level BPE), tok_spm.c
 * (SentencePiece-style score merging) and tok_hf.c (tokenizer.json), and
 * read by convert.c, which writes a vocabulary back out as GGUF metadata.
 *
 * Token texts live in one arena. Ids 0..n_vocab-1 are the vocabulary; ids
 * from n_vocab up to n_str-1 are extra strings that only merges mention
 * (a merge whose halves or result are not tokens), so that BPE can work on
 * integer ids throughout and still merge exactly as a string-based BPE would. */
#ifndef SKV_TOK_IMPL_H
#define SKV_TOK_IMPL_H

#include "tok.h"

#include <stddef.h>
#include <stdint.h>

/* Token types, numbered as GGUF's tokenizer.ggml.token_type. */
enum {
    TOK_T_NORMAL = 1, TOK_T_UNKNOWN = 2, TOK_T_CONTROL = 3,
    TOK_T_USER = 4, TOK_T_UNUSED = 5, TOK_T_BYTE = 6,
};

/* Per-token flag bits (tok_vocab.flags). */
enum { TOK_F_EOG = 1, TOK_F_LSTRIP = 2, TOK_F_RSTRIP = 4 };

/* A piece of a text: byte offset and length. */
typedef struct { uint32_t off, len; } tok_span;

/* ---- pre-tokenizer (tok_pre.c) ---- */

/* An ordered list of compiled regexes; each splits every piece the previous
 * ones produced (matches and the text between them both become pieces). */
typedef struct tok_pre tok_pre;

/* The regex list of a llama.cpp pre-tokenizer name: smollm, gpt2 (gpt-2),
 * llama-bpe (llama3, llama-v3), qwen2, default. Unknown names give
 * SKV_EUNSUPPORTED naming src and the name. */
int tok_pre_from_name(const char *name, const char *src, tok_pre **out);
/* An empty list (no regex yet); add regexes with tok_pre_add. */
int tok_pre_new(const char *name, tok_pre **out);
/* Compiles pattern (literal when literal != 0) and appends it; what names
 * the field in error messages. */
int tok_pre_add(tok_pre *p, const char *pattern, int literal, const char *what);
void tok_pre_free(tok_pre *p);
/* The llama.cpp name (tokenizer.ggml.pre) whose regex list is exactly p's,
 * pattern for pattern, or NULL when no name has that list. */
const char *tok_pre_gguf_name(const tok_pre *p);
/* 1 when the GGUF loader sets ignore_merges for this tokenizer.ggml.pre name
 * (the llama3 family), as llama.cpp does. */
int tok_pre_ignores_merges(const char *gguf_pre);

/* Splits len bytes of valid UTF-8 (see tok_utf8_valid) into pieces;
 * *spans is malloc'd and owned by the caller. */
int tok_pre_split(const tok_pre *p, const char *text, size_t len, tok_span **spans, int *n);

/* Length of the longest valid UTF-8 prefix of s (strict: no overlongs,
 * surrogates or code points above U+10FFFF). */
size_t tok_utf8_valid(const char *s, size_t len);

/* Bytes of the UTF-8 character starting with byte c (1 for a stray byte). */
int tok_utf8_len(unsigned char c);

/* ---- hash maps (tok.c) ---- */

typedef struct {
    uint32_t mask;      /* capacity - 1 (capacity a power of two) */
    uint32_t n;
    int32_t *id;        /* (capacity) string id or -1 */
    uint32_t *hash;     /* (capacity) hash of that string */
} tok_map;

typedef struct {
    uint32_t mask, n;
    uint64_t *key;      /* (capacity) left id << 32 | right id, UINT64_MAX when empty */
    int32_t *rank;      /* (capacity) merge rank: line number in the merge list */
    int32_t *res;       /* (capacity) id of the merged string */
} tok_pairs;

struct tok_arena_chunk;

struct tok_vocab {
    enum tok_kind kind;
    char src[512];          /* file the tokenizer came from, for messages */
    char pre_name[64];     /* GGUF tokenizer.ggml.pre, or the HF steps "Digits,ByteLevel" */

    int n_vocab;
    int n_str, cap_str;     /* strings: vocabulary plus merge-only extras */
    char **text;            /* (cap_str) NUL-terminated, in the arena */
    uint32_t *len;          /* (cap_str) byte lengths */
    float *score;           /* (n_vocab) SPM merge scores */
    uint8_t *type;          /* (n_vocab) TOK_T_* */
    uint8_t *flags;         /* (n_vocab) TOK_F_* */

    tok_map map;            /* string -> id; a duplicate text maps to its last id */
    tok_pairs merges;       /* (left id, right id) -> rank, result */

    int bos, eos, eot, eom, unk;
    int add_bos;
    int add_space_prefix;   /* SPM: prepend U+2581 to text at the start and after specials */
    int ignore_merges;      /* BPE: a piece that is a whole token is taken as is */
    int prefix_space;       /* BPE (HF ByteLevel add_prefix_space): prepend ' ' to each text */

    int32_t *special;       /* ids of control, user-defined and unknown tokens, longest text first */
    int n_special;

    int32_t byte_tok[256];  /* SPM: id of <0xNN> (or of the 1-byte token), -1 if none */
    int32_t byte_sym[256];  /* BPE: string id of byte b's stand-in character, -1 if none */
    uint16_t byte_cp[256];  /* GPT-2 byte -> code point table */
    int16_t cp_byte[512];   /* its inverse (code points below 512), -1 where none */

    tok_pre *pre;
    struct tok_arena_chunk *arena;
};

/* Allocates a vocabulary with n_vocab empty token slots. */
int tok_vocab_new(enum tok_kind kind, int n_vocab, const char *src, tok_vocab **out);
/* Copies len bytes into the arena as token id's text. */
int tok_set_text(tok_vocab *v, int id, const char *s, size_t len);
/* Builds the string->id map over the vocabulary (call once all texts are set). */
int tok_index(tok_vocab *v);
/* Id of string s (vocabulary or merge-only extra), or -1. */
int tok_find(const tok_vocab *v, const char *s, size_t len);
/* Adds a merge "l r" with the given rank (a repeated pair keeps its first rank). */
int tok_add_merge(tok_vocab *v, const char *l, size_t ll, const char *r, size_t rl, int rank);
/* Rank of the merge (l, r) and in *res the id of the merged string, or -1. */
int tok_merge_find(const tok_vocab *v, int32_t l, int32_t r, int32_t *res);
/* Final step of both loaders: special-token list, EOG set, byte tables. */
int tok_finish(tok_vocab *v);

/* ---- the two merge algorithms ---- */

/* Appends the ids of one raw text fragment (no special tokens in it). */
typedef struct { int32_t *ids; int n, cap; } tok_out;
int tok_out_push(tok_out *o, int32_t id);

/* Byte-level BPE of one fragment: pre-tokenize, merge by rank (tok_bpe.c). */
int tok_bpe_fragment(const tok_vocab *v, const char *text, size_t len, tok_out *out);
/* SentencePiece-style merge by score with byte fallback (tok_spm.c);
 * prefix: prepend U+2581. */
int tok_spm_fragment(const tok_vocab *v, const char *text, size_t len, int prefix, tok_out *out);

/* ---- the merge queue both BPE flavours share ---------------------------- */

/* A candidate merge of the adjacent symbols left and right. key orders the
 * queue (lowest first; ties: the leftmost pair): the merge rank for
 * byte-level BPE, the negated token score for SentencePiece. a, b, c carry
 * what the tokenizer checks for staleness when the candidate is popped. */
typedef struct {
    double key;
    int32_t left, right;
    int32_t a, b, c;
} tok_cand;

typedef struct {
    tok_cand *h;
    int n, cap;
} tok_heap;

int tok_heap_push(tok_heap *q, tok_cand c);   /* 0 or SKV_ENOMEM */
tok_cand tok_heap_pop(tok_heap *q);           /* q->n > 0 */
void tok_heap_free(tok_heap *q);

#endif
