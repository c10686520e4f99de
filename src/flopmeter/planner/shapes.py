"""A plan's sequences as distinct shapes with their counts, for the dispatch-counted families.

The budgets are spread evenly, as a data loader fills sequences: ``--tokens`` in full
sequences of ``--seq-len`` (the last shorter); an encoder-decoder's ``--decoder-tokens`` over
those sequences (``D // S`` each, one more for the first ``D % S``); a vision-language model's
``--images`` the same way; a speech model's ``--tokens`` (the transcripts) over its
``--clips``. A sequence's work depends only on its shape, so a plan costs each distinct shape
once and multiplies by its count: at most four shapes per plan.
"""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

from flopmeter.errors import ConfigurationError
from flopmeter.planner.dispatch import SequenceShape

__all__ = [
    "epochs_factor",
    "length_shapes",
    "speech_shapes",
    "spread",
    "text_shapes",
    "with_decoder",
    "with_images",
]


def spread(total: int, parts: int) -> list[tuple[int, int]]:
    """``total`` spread over ``parts`` as evenly as whole numbers allow: ``(value, count)``
    pairs, the larger value first (``D % S`` parts of ``D // S + 1``)."""
    q, r = divmod(total, parts)
    return [(v, n) for v, n in ((q + 1, r), (q, parts - r)) if n]


def text_shapes(tokens: int, seq_len: int) -> list[tuple[int, int]]:
    """``tokens`` in full sequences of ``seq_len`` (the last shorter): ``(length, count)``."""
    full, rest = divmod(tokens, seq_len)
    return [(v, n) for v, n in ((seq_len, full), (rest, 1 if rest else 0)) if n]


def _pair(lengths: list[tuple[int, int]], other: list[tuple[int, int]]) -> Counter[tuple[int, int]]:
    """Sequence ``i`` of the first list with sequence ``i`` of the second, counted."""
    out: Counter[tuple[int, int]] = Counter()
    a, b = [list(x) for x in lengths], [list(x) for x in other]
    while a and b:
        n = min(a[0][1], b[0][1])
        out[(a[0][0], b[0][0])] += n
        for side in (a, b):
            side[0][1] -= n
            if not side[0][1]:
                side.pop(0)
    return out


def with_decoder(tokens: int, seq_len: int, decoder_tokens: int) -> Counter[SequenceShape]:
    """Encoder sequences of ``tokens`` with ``decoder_tokens`` spread over them.

    Raises:
        ConfigurationError: fewer decoder tokens than sequences (a target of 0 tokens).
    """
    enc = text_shapes(tokens, seq_len)
    sequences = sum(n for _, n in enc)
    if decoder_tokens < sequences:
        raise ConfigurationError(
            f"--decoder-tokens {decoder_tokens:,} is fewer than the {sequences:,} sequences of "
            "--tokens: every sequence needs a target of at least one decoder token"
        )
    pairs = _pair(enc, spread(decoder_tokens, sequences))
    return Counter({SequenceShape(e, decoder_tokens=d): n for (e, d), n in pairs.items()})


def with_images(tokens: int, seq_len: int, images: int) -> Counter[SequenceShape]:
    """Text sequences of ``tokens`` with ``images`` spread over them (the first get more)."""
    text = text_shapes(tokens, seq_len)
    pairs = _pair(text, spread(images, sum(n for _, n in text)))
    return Counter({SequenceShape(t, images=i): n for (t, i), n in pairs.items()})


def speech_shapes(tokens: int, clips: int, max_target: int | None) -> Counter[SequenceShape]:
    """``clips`` audio clips with ``tokens`` transcript tokens spread over them.

    Raises:
        ConfigurationError: fewer tokens than clips, or a transcript longer than the decoder's
            ``max_target`` positions.
    """
    if tokens < clips:
        raise ConfigurationError(
            f"--tokens {tokens:,} (the transcripts) is fewer than --clips {clips:,}: every "
            "clip needs a transcript of at least one token"
        )
    parts = spread(tokens, clips)
    if max_target is not None and parts[0][0] > max_target:
        raise ConfigurationError(
            f"--tokens {tokens:,} over {clips:,} clips is {parts[0][0]:,} transcript tokens "
            f"per clip, more than the decoder's {max_target:,} positions (max_target_positions)"
        )
    return Counter({SequenceShape(0, decoder_tokens=d, clips=1): n for d, n in parts})


def length_shapes(lengths: tuple[int, ...]) -> Counter[SequenceShape]:
    """A dataset's lengths as shapes, counted per epoch (the caller multiplies by the epochs;
    a fractional epoch has the dataset's own mix, see :mod:`flopmeter.planner.tokens`)."""
    return Counter(SequenceShape(n) for n in lengths)


def epochs_factor(epochs: float | None) -> Fraction:
    """``epochs`` as an exact fraction (1 when the plan has no dataset)."""
    return Fraction(1) if epochs is None else Fraction(epochs)
