"""A Lightning training script that does not mention flopmeter (unless asked to).

Usage: python lightning_fit.py OUT_DIR [--edited] [--with-meter] [--subclass]
       [--epochs N] [--ckpt PATH] [--fits N]

A LightningModule around a tiny Llama fits padded batches of different lengths (eight an epoch)
with gradient accumulation 2, saving a checkpoint at the end (``OUT_DIR/last.ckpt``). ``--edited`` is the same
script edited to pass ``callbacks=[FlopMeterCallback()]``; ``--with-meter`` wraps
``trainer.fit`` in ``with FlopMeter(module.model, output=...)``; ``--subclass`` uses a ``Trainer``
subclass of this script's own; ``--ckpt`` resumes from a checkpoint; ``--fits N`` fits N
times, each with a trainer of its own (the same settings and folder) on the same module.
Writes OUT_DIR/facts.json: the (last) trainer's callbacks in order and its global step.
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
    parser.add_argument("--fits", type=int, default=1)
    opts = parser.parse_args()
    torch.manual_seed(0)
    module = lightning_module(tiny_llama(vocab_size=WORD_VOCAB))
    data = torch.utils.data.DataLoader(
        TokenDataset(sequences(32, seed=7)), batch_size=4, collate_fn=RecordingCollator()
    )
    for _ in range(opts.fits):
        trainer = fit(opts, module, data)
    facts = {
        "callbacks": [type(cb).__name__ for cb in trainer.callbacks],
        "global_step": trainer.global_step,
    }
    (Path(opts.out) / "facts.json").write_text(json.dumps(facts))


def fit(opts: argparse.Namespace, module: pl.LightningModule, data) -> pl.Trainer:
    """Builds a trainer and fits ``module`` on ``data`` with it."""
    out = Path(opts.out)
    callbacks = [ModelCheckpoint(dirpath=out, save_last=True, save_top_k=0)]
    if opts.edited:
        from flopmeter.integrations.lightning import FlopMeterCallback

        callbacks.append(FlopMeterCallback())
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
    return trainer


if __name__ == "__main__":
    main()
