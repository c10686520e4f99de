"""Lightning ``strategy="ddp"`` on two CPU processes under torchrun, with the flopmeter callback.

Usage: torchrun --nproc_per_node 2 ddp_lightning.py OUT_DIR
Each rank trains on its DistributedSampler share of rows of different lengths, with gradient
accumulation, validation and a checkpoint at the end of each epoch. Writes OUT_DIR/rank{r}.json
with what the rank's collator fed, per micro-batch (rank 0 also PyTorch's FLOP count of the
training rows).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger

from flopmeter.integrations.lightning import FlopMeterCallback
from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.dist import dump_rank_facts, record_writes
from tests.support.models import tiny_llama
from tests.support.trainers import lightning_module, lightning_trainer
from tests.support.truth import sequence_truth

TRAIN_ROWS = sequences(32, seed=9)
VAL_ROWS = sequences(8, seed=10)


def main() -> None:
    out = Path(sys.argv[1])
    record_writes()
    collator = RecordingCollator()
    trainer = lightning_trainer(
        out,
        [
            FlopMeterCallback(),
            ModelCheckpoint(dirpath=str(out / "ckpt"), every_n_epochs=1, save_top_k=-1),
        ],
        max_epochs=2,
        accumulate_grad_batches=2,
        val_check_interval=2,
        devices=2,
        strategy="ddp",
        logger=CSVLogger(str(out)),
        log_every_n_steps=1,
    )
    module = lightning_module(tiny_llama(vocab_size=WORD_VOCAB, attn_implementation="eager"))
    trainer.fit(
        module,
        torch.utils.data.DataLoader(TokenDataset(TRAIN_ROWS), batch_size=4, collate_fn=collator),
        torch.utils.data.DataLoader(
            TokenDataset(VAL_ROWS), batch_size=4, collate_fn=RecordingCollator()
        ),
    )
    dump_rank_facts(
        out,
        trainer.global_rank,
        non_padding=collator.non_padding,
        with_padding=collator.with_padding,
        world_size=trainer.world_size,
        global_step=trainer.global_step,
        dataset_tokens=TokenDataset(TRAIN_ROWS).total_tokens(),
        log_dir=trainer.logger.log_dir if trainer.global_rank == 0 else None,
        # both epochs of every row (the ranks' shares together), forward and backward
        flops_truth=2 * sequence_truth(module.model, TRAIN_ROWS)
        if trainer.global_rank == 0
        else None,
    )


if __name__ == "__main__":
    main()
