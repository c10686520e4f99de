"""A real Hugging Face Trainer run under FlopMeterCallback that trains until it is stopped.

Usage: python sigterm_trainer.py OUTPUT_DIR
A tiny Llama (two layers) on CPU, ``max_steps`` far beyond what the test waits for; the report
goes to OUTPUT_DIR/flops_meter.json and is refreshed every 0.05 s. Prints "step N" after each
optimizer step, so the test knows training is under way before it sends SIGTERM.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository, for tests.support
from flopmeter.integrations.hf import FlopMeterCallback
from tests.support.batches import PAD_ID
from tests.support.models import tiny_llama


class Rows(torch.utils.data.Dataset):
    """Rows of 6 real tokens, padded to 8 by the collator below."""

    def __len__(self) -> int:
        return 100_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.tensor([1 + (i + j) % 90 for j in range(6)] + [PAD_ID, PAD_ID])
        mask = torch.tensor([1] * 6 + [0, 0])
        return {
            "input_ids": ids,
            "attention_mask": mask,
            "labels": ids.masked_fill(mask == 0, -100),
        }


class Steps(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        print(f"step {state.global_step}", flush=True)


def main() -> None:
    out = Path(sys.argv[1])
    model = tiny_llama(vocab_size=96)  # the shared tiny Llama, seed 0
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=2,
        max_steps=1_000_000,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    meter = FlopMeterCallback(
        PAD_ID,
        output=str(out / "flops_meter.json"),
        refresh_seconds=0.05,
        nvml=False,
        model_name="tiny-llama",
    )
    Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[meter, Steps()]).train()


if __name__ == "__main__":
    main()
