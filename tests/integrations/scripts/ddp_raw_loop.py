"""A raw DDP training loop under torchrun (gloo, CPU): each rank feeds different sequences.

Usage: torchrun --nproc_per_node 2 ddp_raw_loop.py OUT_DIR
Writes OUT_DIR/flops_meter.json (the meter, rank 0) and OUT_DIR/rank{r}.json (what each rank
fed, counted here from the batches themselves).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.distributed as dist
from transformers import LlamaForCausalLM

from flopmeter import FlopMeter
from tests.support.batches import WORD_VOCAB, RecordingCollator, sequences
from tests.support.dist import dump_rank_facts, record_writes
from tests.support.models import tiny_llama_config


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record_writes()
    torch.manual_seed(0)
    model = LlamaForCausalLM(tiny_llama_config(vocab_size=WORD_VOCAB))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    # different rows (and so different token counts) on each rank, the same number of batches
    rows = sequences(16, seed=100 + rank, max_len=8 + 8 * rank)
    collator, eval_collator = RecordingCollator(), RecordingCollator()
    batches = [collator([{"input_ids": r} for r in rows[i : i + 4]]) for i in range(0, 16, 4)]
    evaluation = [eval_collator([{"input_ids": r} for r in rows[:4]])]

    with FlopMeter(ddp, output=out) as meter:
        for i, batch in enumerate(batches):
            (ddp(**batch).loss / 2).backward()
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
            if i == 1:  # evaluation midway: not counted
                ddp.eval()
                with torch.no_grad():
                    for eval_batch in evaluation:
                        ddp(**eval_batch)
                ddp.train()
    report = meter.report()
    dump_rank_facts(
        out,
        rank,
        non_padding=sum(collator.non_padding),
        with_padding=sum(collator.with_padding),
        micro_batches=len(batches),
        report_tokens=report.tokens.tokens_processed,
    )
    dist.barrier()  # no rank tears gloo down while a peer still talks to it (hangs otherwise)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
