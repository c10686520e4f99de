"""The Hugging Face Trainer under torchrun (gloo, CPU) with the flopmeter callback.

Usage: torchrun --nproc_per_node 2 ddp_hf_trainer.py OUT_DIR
Each rank trains on its DistributedSampler share of rows of different lengths, with gradient
accumulation, evaluation and a checkpoint at step 2. Writes OUT_DIR/rank{r}.json with what the
rank's collator fed (per micro-batch), and rank 0 adds the Trainer's log history.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
from transformers import LlamaForCausalLM

from flopmeter import distributed
from flopmeter.integrations.hf import FlopMeterCallback
from tests.support.batches import WORD_VOCAB, RecordingCollator, TokenDataset, sequences
from tests.support.dist import dump_rank_facts, record_writes
from tests.support.models import tiny_llama_config
from tests.support.text import word_tokenizer
from tests.support.trainers import hf_trainer

TRAIN_ROWS = sequences(32, seed=7)
EVAL_ROWS = sequences(8, seed=8)


def main() -> None:
    out = Path(sys.argv[1])
    record_writes()
    torch.manual_seed(0)
    collator = RecordingCollator()
    callback = FlopMeterCallback()
    trainer = hf_trainer(
        out,
        model=LlamaForCausalLM(tiny_llama_config(vocab_size=WORD_VOCAB)),
        train_dataset=TokenDataset(TRAIN_ROWS),
        eval_dataset=TokenDataset(EVAL_ROWS, split="eval"),
        data_collator=collator,
        processing_class=word_tokenizer(),
        callbacks=[callback],
        per_device_train_batch_size=4,
        per_device_eval_batch_size=4,
        gradient_accumulation_steps=2,
        num_train_epochs=2,
        eval_strategy="steps",
        eval_steps=1,
        logging_steps=1,
        save_strategy="steps",
        save_steps=2,
        save_only_model=True,
        ddp_backend="gloo",
        include_num_input_tokens_seen="non_padding",
        remove_unused_columns=False,
        seed=0,
    )
    trainer.train()
    rank = distributed.rank()
    dump_rank_facts(
        out,
        rank,
        non_padding=collator.non_padding,
        with_padding=collator.with_padding,
        world_size=distributed.world_size(),
        num_input_tokens_seen=trainer.state.num_input_tokens_seen,
        global_step=trainer.state.global_step,
        dataset_tokens=TokenDataset(TRAIN_ROWS).total_tokens(),
        log_history=trainer.state.log_history if rank == 0 else None,
    )


if __name__ == "__main__":
    main()
