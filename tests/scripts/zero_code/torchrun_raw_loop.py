"""examples/torchrun_raw_loop.py without its ``with FlopMeter`` line: the same DDP loop on
several processes (gloo on CPU), the same shards, and nothing of flopmeter (zero-code metering
attaches on every rank; rank 0 writes the one report)."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

PAD_ID = 0


def make_batches(n_batches: int, batch_size: int, max_len: int, vocab: int, seed: int):
    """Right-padded batches of random token ids with an attention mask."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_batches):
        lengths = torch.randint(max_len // 4, max_len + 1, (batch_size,), generator=g)
        ids = torch.full((batch_size, max_len), PAD_ID, dtype=torch.long)
        mask = torch.zeros((batch_size, max_len), dtype=torch.long)
        for row, n in enumerate(lengths.tolist()):
            ids[row, :n] = torch.randint(1, vocab, (n,), generator=g)
            mask[row, :n] = 1
        yield {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per step")
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if use_cuda else "cpu"

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
    model = LlamaForCausalLM(config).to(device)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    # each rank reads its own shard (here: its own seed)
    shard = [
        {k: v.to(device) for k, v in b.items()}
        for b in make_batches(args.steps * args.accumulation, 4, 128, config.vocab_size, 1 + rank)
    ]

    for i, batch in enumerate(shard):
        (ddp(**batch).loss / args.accumulation).backward()
        if (i + 1) % args.accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()

    if rank == 0:
        print("trained")
    dist.barrier()  # no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
