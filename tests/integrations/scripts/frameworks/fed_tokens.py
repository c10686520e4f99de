"""What a Hugging Face Trainer fed its model, counted apart from flopmeter: each training
micro-batch's inputs as ``compute_loss`` receives them (after the collator and the move to the
device), written to a JSON file after each one. The counts are flopmeter's token fields, by
their definitions: non-padding tokens (``attention_mask`` ones), tokens with padding (the
mask's size), sequences (rows), the sum of squared per-row non-padding lengths, micro-batches.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any


def _add(counts: dict[str, int], inputs: Any) -> None:
    mask = inputs["attention_mask"]
    lengths = mask.sum(dim=-1)
    counts["tokens_processed"] += int(lengths.sum())
    counts["tokens_seen"] += int(mask.numel())
    counts["sequences"] += int(mask.shape[0])
    counts["sum_sq_seq_len"] += int((lengths * lengths).sum())
    counts["micro_batches"] += 1


def count_fed(owner: Any, path: str | Path) -> None:
    """Wraps ``owner.compute_loss`` (a trainer, or a trainer class) so that every call made in
    training mode adds its inputs to the counts in ``path``."""
    original = owner.compute_loss
    counts = dict.fromkeys(
        ("tokens_processed", "tokens_seen", "sequences", "sum_sq_seq_len", "micro_batches"), 0
    )
    bound = not isinstance(owner, type)

    @functools.wraps(original)
    def compute_loss(*args: Any, **kwargs: Any) -> Any:
        model, inputs = (args[0], args[1]) if bound else (args[1], args[2])
        if model.training:
            _add(counts, inputs)
            Path(path).write_text(json.dumps(counts))
        return original(*args, **kwargs)

    if bound:
        object.__setattr__(owner, "compute_loss", compute_loss)
    else:
        owner.compute_loss = compute_loss
