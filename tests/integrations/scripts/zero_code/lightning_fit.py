"""A Lightning training script that does not mention flopmeter (unless asked to).

Usage: python lightning_fit.py OUT_DIR [--edited] [--with-meter] [--subclass]
       [--epochs N] [--ckpt PATH]

A LightningModule around a tiny Llama fits padded batches of different lengths (eight an epoch)
with gradient accumulation 2, saving a checkpoint at the end (``OUT_DIR/last.ckpt``). ``--edited`` is the same
script edited to pass ``callbacks=[FlopMeterCallback()]``; ``--with-meter`` wraps
``trainer.fit`` in ``with FlopMeter(module.model, output=...)``; ``--subclass`` uses a ``Trainer``
subclass of this script's own; ``--ckpt`` resumes from a checkpoint. Writes OUT_DIR/facts.json:
the trainer's callbacks in order and its global step.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.models import tiny_llama
from tests.support.trainers import lightning_module, lightning_trainer


class MyTrainer(pl.Trainer):
    """A subclass of the script's own: its ``__init__`` calls super."""

    def __init__(self, *args, note: str = "", **kwargs) -> None:
        self.note = note
        super().__init__(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--edited", action="store_true")
    parser.add_argument("--with-meter", action="store_true")
    parser.add_argument("--subclass", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--ckpt", default=None)
    opts = parser.parse_args()
    out = Path(opts.out)
    callbacks = [ModelCheckpoint(dirpath=out, save_last=True, save_top_k=0)]
    if opts.edited:
        from flopmeter.integrations.lightning import FlopMeterCallback

        callbacks.append(FlopMeterCallback())
    torch.manual_seed(0)
    module = lightning_module(tiny_llama(vocab_size=WORD_VOCAB))
    data = torch.utils.data.DataLoader(
        TokenDataset(sequences(32, seed=7)), batch_size=4, collate_fn=RecordingCollator()
    )
    settings = dict(max_epochs=opts.epochs, accumulate_grad_batches=2)
    if opts.subclass:
        trainer = MyTrainer(
            note="mine",
            default_root_dir=str(out),
            accelerator="cpu",
            devices=1,
            logger=False,
            callbacks=callbacks,
            enable_progress_bar=False,
            enable_model_summary=False,
            **settings,
        )
    else:
        trainer = lightning_trainer(out, callbacks, **settings)
    if opts.with_meter:
        from flopmeter import FlopMeter

        with FlopMeter(module.model, output=out / "own_meter.json"):
            trainer.fit(module, data, ckpt_path=opts.ckpt)
    else:
        trainer.fit(module, data, ckpt_path=opts.ckpt)
    facts = {
        "callbacks": [type(cb).__name__ for cb in trainer.callbacks],
        "global_step": trainer.global_step,
    }
    (out / "facts.json").write_text(json.dumps(facts))


if __name__ == "__main__":
    main()
