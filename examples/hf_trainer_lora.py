"""LoRA fine-tuning of a small Llama-style model (built from a config, no downloads) with the
Hugging Face Trainer, measured by flopmeter's callback: one line, ``callbacks=[FlopMeterCallback()]``.

The meter is created when training begins, on the model the Trainer trains (the PEFT model),
so the report's trainable parameters are the LoRA adapters', not the whole model. Gradient
accumulation, padding and evaluation during training are in the run; evaluation is not counted.

Run it with ``python examples/hf_trainer_lora.py --output out/hf_lora`` (the report goes to
``OUTPUT/flops_meter.json``). Add ``--resume`` to continue from the last checkpoint there.
"""

from __future__ import annotations

import argparse

import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from flopmeter.integrations.hf import FlopMeterCallback

PAD_ID = 0


class RandomTokens(torch.utils.data.Dataset):
    """Seeded rows of random token ids of different lengths (stand-in for a tokenized corpus)."""

    def __init__(self, n: int, vocab: int, max_len: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        lengths = torch.randint(max_len // 4, max_len + 1, (n,), generator=g).tolist()
        self.rows = [torch.randint(1, vocab, (k,), generator=g) for k in lengths]

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.rows[i]}


def pad_batch(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pads to the longest row, with an attention mask and labels that skip padding."""
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = r["input_ids"]
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default="out/hf_lora", help="Trainer output_dir")
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    args = parser.parse_args()

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=PAD_ID,
    )
    model = get_peft_model(
        LlamaForCausalLM(config),
        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    model.print_trainable_parameters()

    trainer = Trainer(
        model=model,
        args=TrainingArguments(
            output_dir=args.output,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            num_train_epochs=args.epochs,
            learning_rate=1e-3,
            eval_strategy="steps",
            eval_steps=4,
            logging_steps=2,
            save_strategy="steps",
            save_steps=4,
            report_to=[],  # "tensorboard", "wandb", ...: flopmeter_* values go there too
            use_cpu=not torch.cuda.is_available(),
        ),
        train_dataset=RandomTokens(64, config.vocab_size, 128, seed=1),
        eval_dataset=RandomTokens(8, config.vocab_size, 128, seed=2),
        data_collator=pad_batch,
        callbacks=[FlopMeterCallback(model_name="example/tiny-llama-lora")],
    )
    trainer.train(resume_from_checkpoint=True if args.resume else None)

    callback = next(
        c for c in trainer.callback_handler.callbacks if isinstance(c, FlopMeterCallback)
    )
    print(callback.meter.report().to_text())
    print(f"\nwrote {callback.meter.output}")


if __name__ == "__main__":
    main()
