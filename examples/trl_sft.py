"""Supervised fine-tuning with TRL's SFTTrainer and LoRA on a small Llama-style model (built from a
config; the tokenizer is a word-level one built in memory: no downloads), measured by flopmeter.

SFTTrainer is used unchanged: ``callbacks=[FlopMeterCallback()]`` is the only addition. TRL
applies the LoRA config itself; the meter counts the model as TRL trains it.

Run it with ``python examples/trl_sft.py --output out/trl_sft``.
"""

from __future__ import annotations

import argparse
import random

import torch
from datasets import Dataset
from peft import LoraConfig
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from flopmeter.integrations.hf import FlopMeterCallback

WORDS = [f"w{i}" for i in range(500)]


def word_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over WORDS with [PAD]=0, [UNK]=1, [EOS]=2."""
    vocab = {"[PAD]": 0, "[UNK]": 1, "[EOS]": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]"
    )


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=rng.randint(8, 60))) for _ in range(n)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/trl_sft", help="SFTConfig output_dir")
    parser.add_argument("--epochs", type=float, default=2)
    args = parser.parse_args()

    torch.manual_seed(0)
    tokenizer = word_tokenizer()
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=128,
            intermediate_size=344,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )
    callback = FlopMeterCallback(model_name="example/tiny-llama-sft")
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(
            output_dir=args.output,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            num_train_epochs=args.epochs,
            max_length=64,
            eval_strategy="steps",
            eval_steps=4,
            logging_steps=2,
            save_strategy="no",
            report_to=[],
            use_cpu=not torch.cuda.is_available(),
        ),
        train_dataset=Dataset.from_dict({"text": sentences(48, seed=1)}),
        eval_dataset=Dataset.from_dict({"text": sentences(8, seed=2)}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]),
        callbacks=[callback],
    )
    trainer.train()
    print(callback.meter.report().to_text())
    print(f"\nwrote {callback.meter.output}")


if __name__ == "__main__":
    main()
