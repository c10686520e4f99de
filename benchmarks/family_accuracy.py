"""How close is each report to the truth, per model family? Prints the table of issue 20.

For every family of ``tests/support/families.py`` (tiny configs of the real transformers,
diffusers and peft classes, CPU), full fine-tuning and LoRA: the truth (PyTorch's
``FlopCounterMode`` count of the same micro-batches, forward and backward, the non-padding work,
eager attention, hand-counted convolution backward), and the report's estimates as ratios to
it: ``transformer``, ``measured``, ``seed`` and ``6ND``; then the primary estimate, the
positions it counts (its ``padding_convention``), its ratio to the truth of those positions (a
``padded`` figure to PyTorch's count of the batches whole, as they ran: ``families.run_truth``)
and the verdict state (the outcome, or ``withheld`` with the start of the reason).

Run: ``.venv/bin/python benchmarks/family_accuracy.py`` (about twenty minutes on 2 busy CPU
cores); ``--family t5 --family bart`` for some, ``--mode lora`` for one mode. Not part of the
test run (``tests/test_families.py`` asserts on the same runs).
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.support import families as fam

HEADER = [
    "family",
    "mode",
    "truth (FLOP)",
    "transformer",
    "measured",
    "seed",
    "6ND",
    "primary",
    "positions",
    "primary / its truth",
    "verdict",
]


def ratio(flops: float | None, truth: int) -> str:
    """``flops / truth`` to 3 decimals, or ``null`` when there is no figure."""
    return "null" if flops is None else f"{flops / truth:.3f}"


def verdict_state(report: Any) -> str:
    """The outcome, or ``withheld: <reason, shortened>``."""
    if report.verdict.outcome is not None:
        return report.verdict.outcome
    reason = report.compute.withheld_reason or "no reason given"
    return f"withheld: {reason[:60]}".replace("|", "/")


def case_row(name: str, mode: fam.Mode) -> list[str]:
    """One table row: the family trained under the meter and held to its truth."""
    family = fam.FAMILIES[name]
    try:
        truth = fam.truth(family, mode)
        truths = {"non_padding": truth, "padded": fam.run_truth(family, mode)}
        report = fam.train_metered(family, mode)
    except Exception as exc:  # a family that cannot be built or trained here: say why
        return [name, mode, f"cannot run: {type(exc).__name__}: {str(exc)[:80]}"] + [""] * 8
    estimates = report.compute.estimates

    def of(key: str) -> str:
        return ratio(estimates[key].flops if key in estimates else None, truth)

    primary = report.compute.primary_estimate or "null"
    chosen = estimates.get(primary)
    positions = chosen.inputs.get("padding_convention", "") if chosen is not None else ""
    return [
        name,
        mode,
        f"{truth:.3e}",
        of("transformer"),
        of("measured"),
        of("seed"),
        of("six_nd"),
        primary,
        positions,
        ratio(report.compute.primary_flops, fam.truth_of(report, truths)),
        verdict_state(report),
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", action="append", choices=sorted(fam.FAMILIES))
    parser.add_argument("--mode", action="append", choices=fam.MODES)
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    print("| " + " | ".join(HEADER) + " |")
    print("| " + " | ".join(["---"] * 2 + ["---:"] * 5 + ["---", "---", "---:", "---"]) + " |")
    for name in args.family or list(fam.FAMILIES):
        for mode in args.mode or fam.MODES:
            print("| " + " | ".join(case_row(name, mode)) + " |", flush=True)


if __name__ == "__main__":
    main()
