"""A Hugging Face training script that does not mention flopmeter (unless asked to).

Usage: python hf_train.py OUT_DIR [--trainer lora|sft|subclass] [--edited] [--with-meter]
       [--max-steps N] [--save-steps N] [--resume] [--runs N] [--trainers N]

``lora``: a ``Trainer`` on a tiny Llama wrapped by PEFT (LoRA), padded batches of different
lengths, gradient accumulation 2; ``sft``: TRL's ``SFTTrainer`` with a ``peft_config``;
``subclass``: a ``Trainer`` subclass of this script's own whose ``__init__`` calls super.
``--edited`` is the same script edited to pass ``callbacks=[FlopMeterCallback()]``;
``--with-meter`` wraps ``trainer.train()`` in ``with FlopMeter(trainer.model, output=...)``.
``--runs N`` calls ``trainer.train()`` N times; ``--trainers N`` builds N trainers (the same
arguments, a fresh model each) and trains each once. Writes OUT_DIR/facts.json: the callbacks
the (last) trainer holds and its global step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import torch
from peft import LoraConfig, get_peft_model
from transformers import Trainer

from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama
from tests.support.text import texts, word_tokenizer
from tests.support.trainers import hf_arguments, sft_trainer

LORA = dict(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)


class MyTrainer(Trainer):
    """A subclass as axolotl's and LLaMA-Factory's are: its own ``__init__``, calling super."""

    def __init__(self, *args, note: str = "", **kwargs) -> None:
        self.note = note
        super().__init__(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--trainer", default="lora", choices=("lora", "sft", "subclass"))
    parser.add_argument("--edited", action="store_true")
    parser.add_argument("--with-meter", action="store_true")
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--save-steps", type=int, default=0)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--trainers", type=int, default=1)
    opts = parser.parse_args()
    for _ in range(opts.trainers):
        trainer = train(opts)
    facts = {
        "callbacks": [type(cb).__name__ for cb in trainer.callback_handler.callbacks],
        "global_step": trainer.state.global_step,
    }
    (Path(opts.out) / "facts.json").write_text(json.dumps(facts))


def train(opts: argparse.Namespace) -> Trainer:
    """Builds one trainer and trains it ``opts.runs`` times."""
    out = Path(opts.out)
    callbacks = []
    if opts.edited:
        from flopmeter.integrations.hf import FlopMeterCallback

        callbacks = [FlopMeterCallback()]
    settings = dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=opts.max_steps,
        logging_steps=1,
        save_strategy="steps" if opts.save_steps else "no",
        save_steps=opts.save_steps or 500,
        seed=0,
    )
    tokenizer = word_tokenizer()
    torch.manual_seed(0)
    model = tiny_llama(vocab_size=WORD_VOCAB, eos_token_id=tokenizer.eos_token_id)
    if opts.trainer == "sft":
        from datasets import Dataset

        trainer = sft_trainer(
            out,
            model=model,
            train_dataset=Dataset.from_dict({"text": texts(32, seed=3)}),
            processing_class=tokenizer,
            peft_config=LoraConfig(**LORA),
            callbacks=callbacks,
            max_length=32,
            **settings,
        )
    else:
        kind = MyTrainer if opts.trainer == "subclass" else Trainer
        trainer = kind(
            model=get_peft_model(model, LoraConfig(**LORA)),
            args=hf_arguments(out, remove_unused_columns=False, **settings),
            train_dataset=TokenDataset(sequences(32, seed=7)),
            data_collator=RecordingCollator(),
            processing_class=tokenizer,
            callbacks=callbacks,
        )
    resume = opts.resume or None
    for _ in range(opts.runs):
        if opts.with_meter:
            from flopmeter import FlopMeter

            with FlopMeter(trainer.model, output=out / "own_meter.json"):
                trainer.train(resume_from_checkpoint=resume)
        else:
            trainer.train(resume_from_checkpoint=resume)
    return trainer


if __name__ == "__main__":
    main()
