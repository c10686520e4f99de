"""A raw distillation loop with no line of flopmeter: a frozen teacher's forward before (or,
with the argument ``after``, after) the student's, for the zero-code phase tests. With the
argument ``meter`` it meters itself with the context manager instead."""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from tests.support.models import tiny_llama


def main() -> None:
    order = "after" if "after" in sys.argv else "before"
    student = tiny_llama(attn_implementation="eager")
    teacher = tiny_llama(attn_implementation="eager", hidden_size=64, intermediate_size=128).eval()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    batches = [torch.randint(1, 97, (2, 16), generator=g) for _ in range(4)]

    def loop() -> None:
        for ids in batches:
            if order == "before":
                with torch.no_grad():
                    target = teacher(input_ids=ids).logits
            logits = student(input_ids=ids).logits
            if order == "after":
                with torch.no_grad():
                    target = teacher(input_ids=ids).logits
            F.mse_loss(logits, target).backward()
            opt.step()
            opt.zero_grad()

    if "meter" in sys.argv:
        from flopmeter import FlopMeter

        with FlopMeter(student, pad_id=0, output="cm.json", ledger=False):
            loop()
    else:
        loop()


if __name__ == "__main__":
    main()
