"""Build a tiny Llama-style checkpoint that real vLLM (CPU build) can serve.

Everything is made here from installed packages: weights from a seeded generator, written as BF16
safetensors shards (with modelfleet's own header writer) plus model.safetensors.index.json, a byte-level
BPE tokenizer trained with `tokenizers` on generated text, a chat template, config.json and
generation_config.json. Deterministic: the same arguments give the same bytes on every run.

Shape: hidden 128, 2 attention heads of head_dim 64 (the CPU attention kernel rejects head_dim 16),
1 KV head (GQA), 2 layers, vocabulary 512.

reasoning=True builds a model shaped like a reasoning model's checkpoint: `<think>` and `</think>` are special
tokens and the chat template opens the assistant's turn with `<think>` (as DeepSeek-R1's and Kimi-K2's do; the
`thinking` template argument, false, closes it at once). Served with a reasoning parser (deepseek_r1) and the
reasoning config that names those strings, its streams carry reasoning deltas, and a request's
`thinking_token_budget` ends the reasoning after that many tokens (the weights are random: the model never ends
it by itself).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import sys
from pathlib import Path

import numpy as np
from ansible_collections.modelfleet.fleet.plugins.module_utils.modelfleet.safetensors_header import encode_header  # noqa: E402

HIDDEN = 128
HEADS = 2
KV_HEADS = 1
HEAD_DIM = 64
LAYERS = 2
INTERMEDIATE = 256
VOCAB = 512

_MESSAGES = "{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n{% endfor %}"
CHAT_TEMPLATE = _MESSAGES + "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
SPECIAL = ["<s>", "</s>", "<unk>", "<|user|>", "<|assistant|>", "<|system|>", "<|end|>"]
THINK = ["<think>", "</think>"]
# the assistant's turn opens the reasoning; the template argument `thinking`, false, closes it at once
REASONING_CHAT_TEMPLATE = _MESSAGES + (
    "{% if add_generation_prompt %}<|assistant|>\n"
    "{% if thinking is defined and not thinking %}<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}"
)


def _corpus(seed: int) -> list[str]:
    rng = np.random.default_rng(seed)
    words = ["model", "fleet", "gpu", "token", "serve", "vllm", "deploy", "bench", "disk", "fetch",
             "shard", "host", "unit", "ready", "the", "a", "of", "to", "and", "is", "in", "it", "with",
             "expert", "cache", "kimi", "int4", "layer", "tensor", "weight", "stream", "fast", "slow"]
    return [" ".join(words[i] for i in rng.integers(0, len(words), size=24)) for _ in range(400)]


def build_tokenizer(seed: int, reasoning: bool = False):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL + (THINK if reasoning else []),
                                  show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return tok


def _bf16(a: np.ndarray) -> bytes:
    """float32 -> bfloat16 bytes (round to nearest even)."""
    u = a.astype(np.float32).view(np.uint32)
    rounded = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.tobytes()


def tensor_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    t = {
        "model.embed_tokens.weight": (vocab, HIDDEN),
        "model.norm.weight": (HIDDEN,),
        "lm_head.weight": (vocab, HIDDEN),
    }
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        t.update({
            p + "input_layernorm.weight": (HIDDEN,),
            p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "self_attn.q_proj.weight": (HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.k_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.v_proj.weight": (KV_HEADS * HEAD_DIM, HIDDEN),
            p + "self_attn.o_proj.weight": (HIDDEN, HEADS * HEAD_DIM),
            p + "mlp.gate_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.up_proj.weight": (INTERMEDIATE, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTERMEDIATE),
        })
    return t


def _write_shard(path: Path, tensors: dict[str, np.ndarray]) -> None:
    prefix, _ = encode_header({n: ("BF16", a.shape) for n, a in tensors.items()},
                              metadata={"format": "pt"})
    with open(path, "wb") as f:
        f.write(prefix)
        for n in sorted(tensors):
            f.write(_bf16(tensors[n]))


def build(out: str | Path, seed: int = 0, shards: int = 3, name: str = "tiny-llama", reasoning: bool = False,
          max_positions: int = 2048) -> dict:
    """The model in `out`; `max_positions`: the longest sequence it declares (config and tokenizer)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(seed, reasoning)
    vocab = tok.get_vocab_size()
    rng = np.random.default_rng(seed)
    shapes = tensor_shapes(vocab)
    arrays = {}
    for n in sorted(shapes):
        if n.endswith("norm.weight"):
            arrays[n] = np.ones(shapes[n], dtype=np.float32)
        else:
            arrays[n] = (rng.standard_normal(shapes[n]) * 0.05).astype(np.float32)
    names = sorted(arrays)
    per = -(-len(names) // shards)
    weight_map = {}
    total = 0
    for i in range(shards):
        part = names[i * per:(i + 1) * per]
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        _write_shard(out / fname, {n: arrays[n] for n in part})
        for n in part:
            weight_map[n] = fname
            total += arrays[n].size * 2
    (out / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2, sort_keys=True) + "\n")
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM, "num_hidden_layers": LAYERS, "vocab_size": vocab,
        "max_position_embeddings": max_positions,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "bos_token_id": tok.token_to_id("<s>"), "eos_token_id": tok.token_to_id("</s>"),
        "_modelfleet_name": name, "_modelfleet_seed": seed,
    }
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2) + "\n")
    tok_json = json.loads(tok.to_str())
    (out / "tokenizer.json").write_text(json.dumps(tok_json, sort_keys=True, ensure_ascii=False) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "</s>", "model_max_length": max_positions,
        "chat_template": REASONING_CHAT_TEMPLATE if reasoning else CHAT_TEMPLATE,
        "add_bos_token": False, "add_eos_token": False, "clean_up_tokenization_spaces": False,
    }, indent=2, sort_keys=True) + "\n")
    return {"path": str(out), "files": sorted(p.name for p in out.iterdir() if p.is_file()),
            "digest": tree_digest(out)}


def tree_digest(path: str | Path) -> str:
    h = hashlib.sha256()
    for p in sorted(Path(path).iterdir()):
        if p.is_file():
            h.update(p.name.encode() + b"\0" + struct.pack("<Q", p.stat().st_size))
            h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", help="directory to write the model into")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--name", default="tiny-llama")
    ap.add_argument("--reasoning", action="store_true", help="<think> tokens and a template that opens them")
    ap.add_argument("--max-positions", type=int, default=2048, help="the longest sequence the model declares")
    a = ap.parse_args(argv)
    if a.shards < 1:
        ap.error("--shards must be >= 1")
    r = build(a.out, a.seed, a.shards, a.name, a.reasoning, a.max_positions)
    print(json.dumps(r, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
