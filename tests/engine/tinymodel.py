"""Build a tiny Llama for real-engine tests, with no download: a byte-level BPE tokenizer
trained here on generated text (with a chat template) and random weights.

    python tinymodel.py OUT_DIR [--gguf]

Runs in an engine's venv (needs numpy and tokenizers; safetensors for the Hugging Face
directory vLLM loads, gguf for the llama.cpp file). Writes OUT_DIR/hf/ (config.json,
model.safetensors, tokenizer.json, tokenizer_config.json) and, with --gguf,
OUT_DIR/tiny-f32.gguf. The GGUF is written directly with gguf-py (the tokenizer declared
"gpt2" style, which a locally trained byte-level BPE is), not with llama.cpp's converter.
"""

from __future__ import annotations

import json
import pathlib
import random
import sys

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL = ["<|bos|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
DIM, LAYERS, HEADS, KV_HEADS, FFN, CTX = 128, 2, 2, 1, 256, 2048  # head_dim 64 (vLLM CPU)


def corpus(n: int = 3000) -> list[str]:
    rng = random.Random(7)
    text = ("the fabric routes requests to engines on nodes across sites and every node "
            "serves a model with tokens prompts answers hello world quick brown fox jumps "
            "over lazy dog one two three four five six seven eight nine ten")
    words = text.split(" ")
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 20))) for _ in range(n)]


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus(), trainer)
    return tok


def weights(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    head = DIM // HEADS

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(np.float32)

    t = {"model.embed_tokens.weight": w(vocab, DIM), "model.norm.weight": np.ones(DIM, np.float32),
         "lm_head.weight": w(vocab, DIM)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({
            p + "self_attn.q_proj.weight": w(DIM, DIM),
            p + "self_attn.k_proj.weight": w(KV_HEADS * head, DIM),
            p + "self_attn.v_proj.weight": w(KV_HEADS * head, DIM),
            p + "self_attn.o_proj.weight": w(DIM, DIM),
            p + "mlp.gate_proj.weight": w(FFN, DIM),
            p + "mlp.up_proj.weight": w(FFN, DIM),
            p + "mlp.down_proj.weight": w(DIM, FFN),
            p + "input_layernorm.weight": np.ones(DIM, np.float32),
            p + "post_attention_layernorm.weight": np.ones(DIM, np.float32),
        })
    return t


def write_hf(out: pathlib.Path, tok: Tokenizer, tensors: dict[str, np.ndarray]) -> None:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab_size()
    bos, eos = tok.token_to_id("<|bos|>"), tok.token_to_id("<|end|>")
    (out / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": DIM,
        "intermediate_size": FFN, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS, "head_dim": DIM // HEADS,
        "max_position_embeddings": CTX, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "vocab_size": vocab, "bos_token_id": bos, "eos_token_id": eos,
        "tie_word_embeddings": False, "torch_dtype": "float32", "hidden_act": "silu",
    }))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": bos, "eos_token_id": eos}))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|bos|>",
        "eos_token": "<|end|>", "pad_token": "<|end|>", "chat_template": CHAT_TEMPLATE,
        "model_max_length": CTX, "clean_up_tokenization_spaces": False,
    }))
    save_file(tensors, str(out / "model.safetensors"))


def write_gguf(path: pathlib.Path, tok: Tokenizer, tensors: dict[str, np.ndarray]) -> None:
    import gguf

    doc = json.loads(tok.to_str())
    vocab = doc["model"]["vocab"]
    tokens = [t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])]
    special = set(SPECIAL)
    types = [3 if t in special else 1 for t in tokens]  # 3: control
    merges = [m if isinstance(m, str) else " ".join(m) for m in doc["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(DIM // HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)  # ALL_F32
    w.add_vocab_size(len(tokens))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.token_to_id("<|bos|>"))
    w.add_eos_token_id(tok.token_to_id("<|end|>"))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)
    names = {"model.embed_tokens.weight": "token_embd.weight",
             "model.norm.weight": "output_norm.weight", "lm_head.weight": "output.weight"}
    sub = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
           "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
           "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
           "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for name, arr in tensors.items():
        if name in names:
            gname = names[name]
        else:
            _, _, i, rest = name.split(".", 3)
            gname = f"blk.{i}.{sub[rest.removesuffix('.weight')]}.weight"
        w.add_tensor(gname, arr)  # random weights: the Q/K row permutation does not matter
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main(argv: list[str]) -> int:
    out = pathlib.Path(argv[1])
    tok = train_tokenizer()
    tensors = weights(tok.get_vocab_size())
    if "--gguf" in argv:
        out.mkdir(parents=True, exist_ok=True)
        write_gguf(out / "tiny-f32.gguf", tok, tensors)
    else:
        write_hf(out / "hf", tok, tensors)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
