"""``flopmeter threshold [MODEL_ID]``: the threshold for a modification, its rule, and why.

Reads ``--pretrain-flops`` (a number or ``catalog``), else ``PRETRAIN_FLOPS``, as the library
does (:mod:`flopmeter.compliance.original`). Imports nothing that needs torch.
"""

from __future__ import annotations

import argparse
import textwrap

from flopmeter.cli._args import add_threshold_args
from flopmeter.compliance.catalog import lookup
from flopmeter.compliance.original import (
    OriginalCompute,
    describe_entry,
    resolve_original_compute,
)
from flopmeter.compliance.thresholds import (
    GPAI_INDICATIVE_FLOPS,
    Threshold,
    determine_threshold,
    pretrain_flops_from_env,
)
from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN, near_threshold_flops
from flopmeter.units import human_flops, percent


def original_for_args(args: argparse.Namespace) -> OriginalCompute:
    """The original compute for the arguments: ``--pretrain-flops`` beats ``PRETRAIN_FLOPS``
    (which is then not read), either may be ``catalog`` (looked up for ``MODEL_ID``).

    Raises:
        ConfigurationError: ``PRETRAIN_FLOPS`` is needed and is neither a number nor ``catalog``.
    """
    argument = args.pretrain_flops
    environment = pretrain_flops_from_env() if argument is None else None
    return resolve_original_compute(
        argument,
        environment,
        getattr(args, "model_id", None),
        original_systemic_risk=args.systemic_risk,
    )


def _where(original: OriginalCompute) -> str:
    """Where the original compute came from, in a few words."""
    if original.source == "catalog" and original.catalog is not None:
        return f"the catalogue: {original.catalog.base_model}, {original.catalog.basis}"
    return "--pretrain-flops" if original.source == "argument" else str(original.source)


def explain(original: OriginalCompute, t: Threshold) -> str:
    """Why this rule applies, in a sentence or two."""
    flops = original.flops
    if t.kind == "one_third_of_original":
        return (
            f"The original model's training compute is {human_flops(flops)} (from "
            f"{_where(original)}); a modification is significant when its own training compute "
            "is strictly greater than one third of that."
        )
    if t.kind == "default_systemic_risk":
        return (
            "The original model's training compute is not known and the original is a "
            "general-purpose AI model with systemic risk (--systemic-risk), so the fallback of "
            "the guidelines is one third of 10^25 FLOP."
        )
    if flops is not None and flops < GPAI_INDICATIVE_FLOPS:
        return (
            f"The original model's training compute, {human_flops(flops)} (from "
            f"{_where(original)}), is below 10^23 FLOP, the guidelines' indicative criterion for "
            f"a general-purpose AI model. One third of it would be {human_flops(flops / 3)}; "
            f"flopmeter applies the fallback of {human_flops(t.value)} instead (its reading, not "
            "the guidelines'; see Rule), which is the less strict of the two."
        )
    why = (
        "the catalogue has no figure for the model"
        if original.catalog_asked
        else "no --pretrain-flops, no PRETRAIN_FLOPS, no catalogue figure chosen"
    )
    return (
        f"The original model's training compute is not known ({why}), so the fallback of the "
        "guidelines applies: one third of 10^23 FLOP."
    )


def catalogue_line(model_id: str | None, original: OriginalCompute) -> str | None:
    """What the catalogue says about ``model_id``, and whether it was used; ``None`` when there
    is nothing to say (no model id and no opt-in)."""
    entry = lookup(model_id)
    if entry is None:
        if not original.catalog_asked:
            return None
        if not model_id:
            return "Catalogue: asked for, but no MODEL_ID was given, so the fallback applies."
        return (
            f"Catalogue: no entry for {model_id!r} (it never guesses across sizes or "
            "families), so the fallback applies."
        )
    head = f"Catalogue: {describe_entry(entry)}"
    if original.source == "catalog":
        return f"{head}. Used, as asked; estimates for one model can differ by up to 10x."
    if entry.flops is None:
        return f"{head}." + (
            " No figure to use, so the fallback applies." if original.catalog_asked else ""
        )
    would = original.catalog.threshold_flops if original.catalog else None
    return f"{head}. Not used; --pretrain-flops catalog would give {human_flops(would)}."


def run(args: argparse.Namespace) -> int:
    """Prints the rule that applies, the threshold, and why."""
    original = original_for_args(args)
    t = determine_threshold(original.flops, original_systemic_risk=args.systemic_risk)
    near = near_threshold_flops(t.value, UNCERTAINTY_MARGIN)
    lines = [
        f"Threshold: {human_flops(t.value)} ({t.kind}): a modification whose training compute "
        f"is strictly above it makes the modifier the provider of the modified model; "
        f"near_threshold above {human_flops(near)}, {percent(near / t.value)} of it (compute "
        f"that would pass the threshold with the {UNCERTAINTY_MARGIN:.0%} error margin of "
        "Annex A.2 added).",
        "Why: " + explain(original, t),
        f"Rule: {t.source}",
    ]
    catalogue = catalogue_line(getattr(args, "model_id", None), original)
    if catalogue:
        lines.append(catalogue)
    for line in lines:
        # a figure is never split across lines: its spaces are non-breaking while wrapping
        kept = line.replace(" × ", "\u00a0×\u00a0").replace(" FLOP", "\u00a0FLOP")
        wrapped = textwrap.fill(kept, width=100, subsequent_indent="  ")
        print(wrapped.replace("\u00a0", " "))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Adds the ``threshold`` subcommand."""
    p = sub.add_parser(
        "threshold", help="the threshold for a modification: the rule, the value, and why"
    )
    p.add_argument(
        "model_id",
        nargs="?",
        metavar="MODEL_ID",
        help="the Hugging Face id of the model being modified (the catalogue looks it up)",
    )
    add_threshold_args(p)
    p.set_defaults(func=run)
