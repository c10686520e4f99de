"""examples/raw_loop.py without its ``with FlopMeter`` line: the same model, padding, gradient
accumulation and evaluation pass, and nothing of flopmeter. Run it metered with no change:

    flopmeter run -- python examples/zero_code_raw_loop.py     # or FLOPMETER_AUTO=1 python ...

The meter attaches when the optimizer is built (the module whose parameters it steps) and the
report, ``./flops_meter.json``, says so in its ``attach`` section; its counts are those of
examples/raw_loop.py (tests/test_auto_raw.py compares them).

Flags for the tests' failure cases (each off by default): ``--early-backward`` runs one
training micro-batch's backward before the optimizer is built; ``--crash-after N`` raises after
N micro-batches; ``--hang-after N`` prints ``HANGING`` and sleeps after N micro-batches.
"""

from __future__ import annotations

import argparse
import time

import torch
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
        labels = ids.masked_fill(mask == 0, -100)
        yield {"input_ids": ids, "attention_mask": mask, "labels": labels}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per step")
    parser.add_argument("--early-backward", action="store_true")
    parser.add_argument("--crash-after", type=int, default=0)
    parser.add_argument("--hang-after", type=int, default=0)
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
    model = LlamaForCausalLM(config)
    train = list(make_batches(args.steps * args.accumulation, 4, 128, config.vocab_size, 1))
    evaluation = list(make_batches(2, 4, 128, config.vocab_size, 2))
    if args.early_backward:  # a warm-up micro-batch before the optimizer exists
        model(**train[0]).loss.backward()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    model.train()
    for i, batch in enumerate(train):
        loss = model(**batch).loss / args.accumulation
        loss.backward()
        if (i + 1) % args.accumulation == 0:
            optimizer.step()
            optimizer.zero_grad()
        if (i + 1) == len(train) // 2:  # an evaluation pass midway: not counted
            model.eval()
            with torch.no_grad():
                for eval_batch in evaluation:
                    model(**eval_batch)
            model.train()
        if args.crash_after and i + 1 == args.crash_after:
            raise RuntimeError("the loss went to NaN (on purpose)")
        if args.hang_after and i + 1 == args.hang_after:
            print("HANGING", flush=True)
            time.sleep(120)
    print("trained")


if __name__ == "__main__":
    main()
