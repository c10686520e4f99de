"""Writes a tiny Llama (2 layers, hidden 64) with its own byte-level BPE tokenizer, and a
40-example alpaca dataset (JSON for LLaMA-Factory, JSONL for axolotl), into OUT/model and
OUT/data; nothing downloaded. Run with the framework's own python (its transformers saves the
files it will read): ``python make_tiny.py OUT``."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

WORDS = [
    "the",
    "cat",
    "dog",
    "sat",
    "on",
    "mat",
    "red",
    "blue",
    "green",
    "big",
    "small",
    "runs",
    "jumps",
    "eats",
    "food",
    "water",
    "sky",
    "sun",
    "moon",
    "star",
    "tree",
    "house",
    "car",
    "road",
    "fast",
    "slow",
    "happy",
    "sad",
]
NAMES = ["alice", "bob", "carol", "dave"]
PROMPT_WORDS = [
    "Below is an instruction that describes a task. Write a response that appropriately "
    "completes the request.",
    "### Instruction:",
    "### Input:",
    "### Response:",
    "user assistant system Human Assistant",
]


def examples(n: int = 40) -> list[dict[str, str]]:
    """``n`` alpaca examples (instruction, input: empty for every other one, output)."""
    rng = random.Random(0)
    out = []
    for i in range(n):
        name, words = rng.choice(NAMES), rng.sample(WORDS, 4)
        out.append(
            {
                "instruction": f"Describe {name} and the {words[0]}.",
                "input": "" if i % 2 else f"{words[1]} {words[2]}",
                "output": f"{name} sees the {words[0]} and the {words[3]} near the {words[1]}.",
            }
        )
    return out


def tokenizer(texts: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts`` (``<s>`` prepended, ``<pad>`` apart)."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1000,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(texts, trainer)
    bos = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
        pad_token="<pad>",
    )  # fmt: skip


def main(out: Path) -> None:
    data = examples()
    texts = [e[k] for e in data for k in ("instruction", "input", "output")] + PROMPT_WORDS
    fast = tokenizer(texts)
    model_dir = out / "model"
    fast.save_pretrained(model_dir)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=256,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(model_dir)
    data_dir = out / "data"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "tiny_alpaca.json").write_text(json.dumps(data, indent=1))
    (data_dir / "tiny_alpaca.jsonl").write_text("".join(json.dumps(e) + "\n" for e in data))
    info = {"tiny_alpaca": {"file_name": "tiny_alpaca.json"}}
    (data_dir / "dataset_info.json").write_text(json.dumps(info, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
