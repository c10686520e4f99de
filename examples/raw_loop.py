"""Fine-tune a small Llama-style model (built from a config, no downloads) under FlopMeter.

A plain PyTorch loop with padding, gradient accumulation and an evaluation pass: the meter
counts training micro-batches only, without padding, and writes ``flops_meter.json``.

Run it with ``scripts/example`` (which makes the virtual environment) or
``python examples/raw_loop.py --output out/``.
"""

from __future__ import annotations

import argparse

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from flopmeter import FlopMeter

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
    parser.add_argument("--output", default="flops_meter.json", help="report file or folder")
    parser.add_argument("--steps", type=int, default=8, help="optimizer steps")
    parser.add_argument("--accumulation", type=int, default=2, help="micro-batches per step")
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
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train = list(make_batches(args.steps * args.accumulation, 4, 128, config.vocab_size, 1))
    evaluation = list(make_batches(2, 4, 128, config.vocab_size, 2))

    with FlopMeter(model, PAD_ID, model_name="example/tiny-llama", output=args.output) as meter:
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

    report = meter.report()
    print(report.to_text())
    print(f"\nwrote {meter.output}")


if __name__ == "__main__":
    main()
