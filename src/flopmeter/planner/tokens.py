"""The token statistics of a planned run: from a token count, or from a JSONL dataset.

The ``transformer`` estimate needs the tokens and the sum of squared sequence lengths (the
attention term). ``--tokens N`` alone assumes full sequences of ``seq_len`` (the last one
shorter). ``--dataset`` reads each example's real length: with a tokenizer (loaded from a local
folder, never downloaded) the tokenizer's count, special tokens included; without one,
``ceil(characters / 4)``, and the plan says it is approximate. Each example is one sequence,
cut at ``seq_len`` (no packing: packed sequences without document masking attend over the
whole packed row, which a plan of the examples' lengths undercounts).

What an example's text is (fields of one JSON object per line):

* ``text``: the string;
* ``messages``: a list of ``{"role", "content"}``: the tokenizer's chat template when it has
  one, else the contents joined with newlines;
* ``prompt`` and ``completion``: the two strings joined (or, as TRL's conversational form,
  two lists of messages, joined as ``messages``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from flopmeter.errors import ConfigurationError
from flopmeter.types import TokenTotals

__all__ = [
    "CHARS_PER_TOKEN",
    "DatasetLengths",
    "dataset_lengths",
    "totals_for_lengths",
    "totals_for_sequences",
    "totals_for_tokens",
]

#: Characters per token of the approximation without a tokenizer (English text, BPE).
CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class DatasetLengths:
    """Per-example token lengths of a dataset, after cutting at ``seq_len``.

    Attributes:
        lengths: One entry per example, in tokens.
        truncated: Examples longer than ``seq_len`` before cutting.
        approximate: Lengths are ``ceil(characters / 4)``, not a tokenizer's count.
        how: How the lengths were counted, in words.
    """

    lengths: tuple[int, ...]
    truncated: int
    approximate: bool
    how: str


def totals_for_tokens(tokens: int, seq_len: int, batch_size: int = 1) -> TokenTotals:
    """Statistics of ``tokens`` tokens in full sequences of ``seq_len`` (the last shorter).

    ``batch_size`` sequences per micro-batch (default 1: the most micro-batches the tokens can
    take); only LoRA's per-micro-batch ``B @ A`` products on expert weights depend on it.
    """
    full, rest = divmod(tokens, seq_len)
    sequences = full + (1 if rest else 0)
    return TokenTotals(
        tokens_processed=tokens,
        tokens_seen=tokens,
        sequences=sequences,
        sum_sq_seq_len=full * seq_len * seq_len + rest * rest,
        micro_batches=-(-sequences // batch_size),
    )


def totals_for_sequences(sequences: Sequence[tuple[int, int]], batch_size: int = 1) -> TokenTotals:
    """Statistics of sequences given as ``(length, count)`` pairs (a recipe's training passes),
    ``batch_size`` per micro-batch (as :func:`totals_for_tokens`)."""
    n = sum(count for _, count in sequences)
    tokens = sum(length * count for length, count in sequences)
    return TokenTotals(
        tokens_processed=tokens,
        tokens_seen=tokens,
        sequences=n,
        sum_sq_seq_len=sum(length * length * count for length, count in sequences),
        micro_batches=-(-n // batch_size),
    )


def totals_for_lengths(
    lengths: tuple[int, ...], epochs: float = 1, batch_size: int = 1
) -> TokenTotals:
    """Statistics of ``epochs`` passes over sequences of the given lengths, ``batch_size``
    sequences per micro-batch (as :func:`totals_for_tokens`).

    A fractional ``epochs`` (``0.5``, ``1.5``) scales the dataset's tokens, sequences and sum of
    squared lengths by ``epochs``, each rounded to a whole number: the part epoch has the
    dataset's own mix of lengths (the expected totals of a random share of its examples), so
    the attention term scales with the tokens. Micro-batches: ``ceil(n / batch_size)`` per
    whole epoch, plus ``ceil(part_sequences / batch_size)`` for the part epoch.
    """
    tokens, squares, n = sum(lengths), sum(k * k for k in lengths), len(lengths)
    exact = Fraction(epochs)  # exact for whole epochs however large the dataset
    whole = math.floor(exact)
    part_sequences = round((exact - whole) * n)
    return TokenTotals(
        tokens_processed=round(exact * tokens),
        tokens_seen=round(exact * tokens),
        sequences=whole * n + part_sequences,
        sum_sq_seq_len=round(exact * squares),
        micro_batches=whole * -(-n // batch_size) + -(-part_sequences // batch_size),
    )


def _load_tokenizer(path: str | Path) -> Any:
    if not Path(path).expanduser().exists():
        raise ConfigurationError(f"tokenizer {path}: no such file or folder")
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(Path(path).expanduser()), local_files_only=True)
    except Exception as exc:  # transformers raises many types for a folder it cannot load
        raise ConfigurationError(
            f"tokenizer {path} cannot be loaded: the tokenizer files there could not be read "
            f"by transformers ({_why(exc)})"
        ) from None


def _why(exc: Exception) -> str:
    """The reason of a tokenizer loading failure in words (a bare KeyError names a field)."""
    if isinstance(exc, KeyError):
        return (
            f"a field it expects, {exc.args[0]!r}, is missing from them" if exc.args else "KeyError"
        )
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def _messages_text(messages: Any, where: str) -> str:
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
    ):
        raise ConfigurationError(f"{where}: messages must be a list of {{role, content}} objects")
    return "\n".join(m["content"] for m in messages)


def _example(record: Any, where: str) -> str | list[dict[str, Any]]:
    """The text (or messages) of one JSONL record."""
    if not isinstance(record, dict):
        raise ConfigurationError(f"{where}: a JSON object is expected")
    if isinstance(record.get("text"), str):
        return record["text"]
    if "messages" in record:
        _messages_text(record["messages"], where)
        return record["messages"]
    prompt, completion = record.get("prompt"), record.get("completion")
    if isinstance(prompt, str) and isinstance(completion, str):
        return prompt + completion
    if isinstance(prompt, list) and isinstance(completion, list):
        _messages_text(prompt + completion, where)
        return prompt + completion
    raise ConfigurationError(
        f"{where}: no text field (expected text, messages, or prompt and completion)"
    )


def _records(path: Path) -> Iterator[tuple[str, Any]]:
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise ConfigurationError(f"dataset {path}: {exc.strerror or exc}") from None
    with handle:
        try:
            for number, line in enumerate(handle, start=1):
                where = f"{path} line {number}"
                if not line.strip():
                    continue
                try:
                    yield where, _example(json.loads(line), where)
                except json.JSONDecodeError as exc:
                    raise ConfigurationError(f"{where}: not valid JSON ({exc.msg})") from None
        except UnicodeDecodeError as exc:
            raise ConfigurationError(f"dataset {path} is not UTF-8 text: {exc.reason}") from None


def _count(tokenizer: Any, example: str | list[dict[str, Any]], where: str) -> int:
    if tokenizer is None:
        text = example if isinstance(example, str) else _messages_text(example, where)
        return math.ceil(len(text) / CHARS_PER_TOKEN)
    if isinstance(example, list):
        if getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template(example, tokenize=True)
            return len(ids["input_ids"] if hasattr(ids, "keys") else ids)
        example = _messages_text(example, where)
    return len(tokenizer(example)["input_ids"])


def dataset_lengths(
    path: str | Path, seq_len: int, tokenizer: str | Path | None = None
) -> DatasetLengths:
    """Each example's length in tokens, cut at ``seq_len`` (see the module docstring).

    Raises:
        ConfigurationError: the file cannot be read, a line is not a JSON object with a text
            (the message names the line), the tokenizer cannot be loaded, or there are no
            examples.
    """
    path = Path(path).expanduser()
    loaded = None if tokenizer is None else _load_tokenizer(tokenizer)
    lengths, truncated = [], 0
    for where, example in _records(path):
        n = _count(loaded, example, where)
        truncated += n > seq_len
        lengths.append(min(n, seq_len))
    if not lengths:
        raise ConfigurationError(f"dataset {path} holds no examples")
    how = (
        f"the tokenizer at {tokenizer}"
        if loaded is not None
        else f"ceil(characters / {CHARS_PER_TOKEN}) per example (approximate: no tokenizer given)"
    )
    return DatasetLengths(tuple(lengths), truncated, loaded is None, how)
