#!/bin/sh
# Seeds for the fuzz harnesses, made fresh under build-fuzz/corpus/NAME/ from
# the sample model and small synthetic files (nothing large is committed):
# a small synthetic GGUF and the demo model's header, HF files from
# ../shared when present, traces of short runs under every policy, and the
# command lines of the README.
set -eu
SKV=build-fuzz/skv
C=build-fuzz/corpus
SHARED=${SKV_SHARED:-../shared}
for h in cli csv encode eval gguf hf_config hf_dir safetensors tokenizer trace tasks; do mkdir -p "$C/$h"; done

# gguf: a tiny synthetic model, and the first 64 KiB of the demo model
cat > "$C/tiny.json" <<'J'
{"architectures": ["LlamaForCausalLM"], "hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4,
 "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 300, "max_position_embeddings": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
J
$SKV synth --config "$C/tiny.json" --dtype q8_0 --seed 3 -o "$C/gguf/tiny-q8.gguf" --force >/dev/null 2>&1 || true
$SKV synth --config "$C/tiny.json" --dtype f16 --seed 4 -o "$C/gguf/tiny-f16.gguf" --force >/dev/null 2>&1 || true
head -c 65536 samples/model/skv-demo.gguf > "$C/gguf/demo-head.gguf"
cp "$C/tiny.json" "$C/hf_config/tiny.json"

# tasks: a --task-file with every field, and one line of each kind of mistake
cat > "$C/tasks/good.jsonl" <<'J'
{"name": "city", "fact": "The secret city of {key} is Plinth{value}.", "keys": ["heron", "otter", "raven"], "facts": [1, 3], "question": "What is the secret city of {key}? The secret city of {key} is", "answer": "Plinth{value}"}
{"name": "lit", "fact": "The code word is marmalade.", "question": "What is the code word?", "answer": "marmalade", "haystack": "nowhere.txt"}
J
printf '{"name": "x", "fact": "A {key} {value}", "keys": ["a"], "facts": 2, "question": "q {key}"}\n' > "$C/tasks/few-keys.jsonl"

# HF files from ../shared (the config, the tokenizer, a small safetensors)
if [ -d "$SHARED/models/mini-smollm-hf" ]; then
    H="$SHARED/models/mini-smollm-hf"
    cp "$H/config.json" "$C/hf_config/mini-smollm.json"
    # a small tokenizer.json of the same shape: the first 400 tokens and the merges among them
    python3 - "$H/tokenizer.json" "$C/tokenizer/mini-smollm.json" <<'P' 2>/dev/null || true
import json, sys
t = json.load(open(sys.argv[1]))
m = t.get('model', {})
v = {k: i for k, i in m.get('vocab', {}).items() if i < 400}
keep = []
for x in m.get('merges', []):
    a, b = x.split(' ', 1) if isinstance(x, str) else x
    if a in v and b in v and a + b in v:
        keep.append(x)
m['vocab'], m['merges'] = v, keep
t['added_tokens'] = [a for a in t.get('added_tokens', []) if a.get('id', 0) < 400]
json.dump(t, open(sys.argv[2], 'w'), separators=(',', ':'))
P
    printf '\000' > "$C/safetensors/mini-smollm"; head -c 32768 "$H/model.safetensors" >> "$C/safetensors/mini-smollm"
    python3 - "$H" "$C/hf_dir/mini-smollm" "$C/tokenizer/mini-smollm.json" <<'P' 2>/dev/null || true
import struct, sys
d, out = sys.argv[1], sys.argv[2]
parts = [open(d + '/config.json', 'rb').read(), open(sys.argv[3], 'rb').read(),
         open(d + '/model.safetensors', 'rb').read()[:20000]]
open(out, 'wb').write(struct.pack('<I', len(parts[0])) + parts[0] + struct.pack('<I', len(parts[1])) + parts[1] + parts[2])
P
fi
printf '\001{"weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}' \
    > "$C/safetensors/index"

# encode: text of several scripts, with and without special tokens
printf '\000Hello world, 1234.' > "$C/encode/ascii"
printf '\003caf\303\251 na\303\257ve \346\227\245\346\234\254\350\252\236 \360\237\230\200 <|im_start|>user' > "$C/encode/utf8"
printf '\005\377\376 broken \300 utf8 \t\n  spaces   ' > "$C/encode/bad"

# traces: short runs under each policy, and a compare run
M=build/default-model.gguf
[ -f "$M" ] || M=build-fuzz/default-model.gguf
[ -f "$M" ] || $SKV synth --config samples/default-model.config.json --dtype f32 --seed 7 -o "$M" --force >/dev/null 2>&1
P="The quick brown fox jumps over the lazy dog and a needle hides in a haystack of words."
for pol in dense shadowkv quest freekv specache tailorkv; do
    own=""; [ "$pol" = shadowkv ] && own="--rank 4 --outliers 1 --local 1"   # the policy's own flags
    $SKV run -m "$M" -p "$P" -n 3 --kv $pol --budget 8 $own --oracle \
        --trace "$C/trace/$pol.skvt" >/dev/null 2>&1 || true
done
$SKV run -m "$M" -p "$P" -n 3 --kv dense,quest,freekv --budget 8 --oracle --trace "$C/trace/compare.skvt" >/dev/null 2>&1 || true

# csv: the same traces through the CSV export
cp "$C"/trace/*.skvt "$C/csv/" 2>/dev/null || true

# eval: case lines of fuzz_eval's fixed suite (eval_resume_check), a cut last line
cat > "$C/eval/cases.jsonl" <<'J'
{"case_key":"single|1024|10|0|256","task":"single","length":1024,"depth":10,"seed":0,"budget":"256","value":"1234567","wall_seconds":1.5,"dense":{"answer":" 1234567","hit":true,"t_decode":0.01,"decode_steps":11,"mass_recall":1,"output_error":0,"fetch_bytes":null,"resident_bytes":2119680},"shadowkv":{"answer":" 1234567","hit":true,"t_decode":0.008,"decode_steps":11,"mass_recall":0.92,"output_error":0.1,"fetch_bytes":861184,"resident_bytes":1017000},"quest":{"answer":" 7654321","hit":false,"distractor":null,"t_decode":0.02,"decode_steps":11,"mass_recall":0.5,"output_error":0.4,"fetch_bytes":0,"resident_bytes":2119680}}
{"case_key":"multikey|2048|50|1|64","task":"multikey","length":2048,"depth":50,"seed":1,"budget":"64","value":"7654321","facts":[{"key":"heron","value":"7654321","tok_begin":3,"tok_end":9}],"dense":{"answer":"x","hit":false},"shadowkv":{"answer":"7654321","hit":true}}
{"case_key":"single|2048|90|0|256","task":"single","length":2048,"depth":90,"seed":0,"budget":"256","dense":{"hit":tr
J

# cli: the README's lists and numbers
printf '\0001k,2k,4000' > "$C/cli/lengths"
printf '\0010:100:10' > "$C/cli/depths"
printf '\002dense,shadowkv,quest,freekv,specache,tailorkv' > "$C/cli/kvlist"
printf '\003rank=16' > "$C/cli/kvopt"
printf '\004--kv shadowkv --budget 3%% --rank 16 --outliers 4 --local 4 -n 8 --temp 0.7 --top-k 40 --top-p 0.9 -c 4096' > "$C/cli/argv"
