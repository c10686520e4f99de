"""What each fine-tuning method's model assumes, in words: the notes of a method's plan,
whichever way it is costed (the transformer estimate or the dispatch count)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from flopmeter.flops.architecture import Architecture
    from flopmeter.planner.build import MethodSetup

__all__ = ["QLORA_NOTE", "method_notes", "method_notes_for"]

QLORA_NOTE = (
    "4-bit base weights (QLoRA) change no FLOP here: the meter counts a quantized layer by its "
    "logical shape like any linear layer (the census counts 4-bit weights unpacked) and does "
    "not count dequantisation, so QLoRA's compute is LoRA's."
)


def method_notes(
    setup: MethodSetup, arch: Architecture, blocks: tuple[int, ...] | None
) -> list[str]:
    """What each method's model assumes, in words."""
    return method_notes_for(setup, arch.num_layers, blocks, arch.tie_word_embeddings)


def method_notes_for(
    setup: MethodSetup, layers: int | None, blocks: tuple[int, ...] | None, tied: bool
) -> list[str]:
    """What each method's model assumes, in words (``layers``: the blocks, for spectrum and
    freeze; ``tied``: the output layer shares the embedding table)."""
    method = setup.method
    lora = (
        f"peft LoRA r={setup.lora_r} (alpha {2 * setup.lora_r}) on "
        f"{setup.lora_targets if isinstance(setup.lora_targets, str) else ','.join(setup.lora_targets)}"
        "; the base model frozen."
    )
    if method == "full":
        return ["Every parameter trains."]
    if method == "lora":
        return [lora]
    if method == "qlora":
        return [lora, QLORA_NOTE]
    chosen = list(blocks or ())
    if method == "spectrum":
        return [
            f"Spectrum: the linear weights of {len(chosen)} of {layers} blocks train "
            f"({chosen}, spread evenly from block 0); embeddings, norms and the output layer "
            "frozen. Real Spectrum picks modules by signal-to-noise ratio, which needs the "
            "weights; with as many modules training, this choice takes the most compute any "
            "choice can (gradients flow through every block)."
        ]
    frozen = layers - len(chosen)
    trains = (
        "the blocks above and the final norm train; the output layer shares the embedding "
        "table, so it stays frozen"
        if tied
        else "the blocks above, the final norm and the output layer train"
    )
    return [
        f"Freeze: the input embeddings and blocks 0-{frozen - 1} ({frozen} of {layers}) "
        f"frozen; {trains}."
    ]
