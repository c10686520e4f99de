"""A raw loop on a tiny Llama that does not mention flopmeter, for jobs run side by side.

Usage: python side_by_side.py SYNC_DIR N [--steps S] [--hang]

After its first optimizer step (a zero-code meter has claimed its report file by then) it
writes ``SYNC_DIR/<pid>.ready`` and waits, up to 120 s, until N such files are there: N of these
started at once hold their report files at the same time. Then it trains the other steps and
writes ``SYNC_DIR/<pid>.tokens``: the non-padding tokens it trained on, counted here from the
attention masks. ``--hang`` prints ``HANGING`` after the first step and sleeps (the signal
tests kill it there).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository: tests.support

from tests.support.models import PAD_ID, tiny_llama


def batches(steps: int) -> list[dict[str, torch.Tensor]]:
    """Right-padded batches of seeded random lengths (the same in every process)."""
    g = torch.Generator().manual_seed(5)
    out = []
    for _ in range(steps):
        lengths = torch.randint(4, 17, (4,), generator=g)
        ids = torch.full((4, 16), PAD_ID, dtype=torch.long)
        mask = torch.zeros((4, 16), dtype=torch.long)
        for row, n in enumerate(lengths.tolist()):
            ids[row, :n] = torch.randint(1, 97, (n,), generator=g)
            mask[row, :n] = 1
        out.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    return out


def wait_for(sync: Path, n: int) -> None:
    (sync / f"{os.getpid()}.ready").write_text("")
    deadline = time.monotonic() + 120
    while len(list(sync.glob("*.ready"))) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(list(sync.glob('*.ready')))} of {n} jobs got ready")
        time.sleep(0.05)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("sync", type=Path)
    parser.add_argument("n", type=int)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--hang", action="store_true")
    args = parser.parse_args()
    model = tiny_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    tokens = 0
    for step, batch in enumerate(batches(args.steps)):
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        tokens += int(batch["attention_mask"].sum())
        if step == 0:
            if args.hang:
                print("HANGING", flush=True)
                time.sleep(120)
            wait_for(args.sync, args.n)
    (args.sync / f"{os.getpid()}.tokens").write_text(str(tokens))
    print("trained", flush=True)


if __name__ == "__main__":
    main()
