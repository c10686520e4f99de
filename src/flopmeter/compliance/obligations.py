"""What follows under the AI Act when a modification exceeds its threshold, in plain words.

A downstream modifier whose modification exceeds the threshold is presumed to become the
provider of the modified model (guidelines C(2025) 5045, section 3.2), and its obligations as a
provider are limited to the modification (Recital 109). This is a list of what the Act asks,
with the article, for the report; it is not legal advice.
"""

from __future__ import annotations

from flopmeter.types import Obligation

__all__ = ["NOTIFICATION_ONLY_WITH_SYSTEMIC_RISK", "obligations"]

_LIMITED = " It covers the modification only (Recital 109), not the original model."

#: Art. 53(1): every provider of a general-purpose AI model.
_PROVIDER = (
    Obligation(
        title="Technical documentation",
        article="AI Act Art. 53(1)(a), Annex XI",
        text="Draw up and keep up to date technical documentation of the modified model, its "
        "training and testing, including the training compute (for example in FLOP), training "
        "time and energy, to give the AI Office and national authorities on request."
        + _LIMITED
        + " Not required for a model released under a free and open-source licence without "
        "systemic risk (Art. 53(2)).",
    ),
    Obligation(
        title="Information for downstream providers",
        article="AI Act Art. 53(1)(b), Annex XII",
        text="Give the providers of AI systems that build on the modified model the information "
        "they need to understand its capabilities and limits and to meet their own obligations."
        + _LIMITED
        + " The same open-source exception applies (Art. 53(2)).",
    ),
    Obligation(
        title="Copyright policy",
        article="AI Act Art. 53(1)(c)",
        text="Put in place a policy to comply with Union copyright law, in particular to "
        "identify and respect reservations of rights (text and data mining opt-outs) in the "
        "data used for the modification.",
    ),
    Obligation(
        title="Summary of the training content",
        article="AI Act Art. 53(1)(d)",
        text="Make publicly available a sufficiently detailed summary of the content used for "
        "training, using the AI Office's template (24 July 2025)." + _LIMITED,
    ),
)

#: Art. 52(1) and Art. 55: a provider of a general-purpose AI model with systemic risk.
_SYSTEMIC = (
    Obligation(
        title="Notification to the Commission",
        article="AI Act Art. 52(1)",
        text="Notify the Commission without delay and in any event within two weeks after the "
        "requirement is met or it becomes known that it will be met.",
    ),
    Obligation(
        title="Obligations for models with systemic risk",
        article="AI Act Art. 55(1)",
        text="Evaluate the model with standardised protocols, including adversarial testing; "
        "assess and mitigate possible systemic risks; keep track of, document and report "
        "serious incidents to the AI Office; and ensure adequate cybersecurity protection.",
    ),
)


#: What a report without systemic risk says about Art. 52(1), so the reader sees it was
#: considered and why it is not listed.
NOTIFICATION_ONLY_WITH_SYSTEMIC_RISK = (
    "Not listed: the notification to the Commission (AI Act Art. 52(1), within two weeks) and "
    "the obligations of Art. 55. They apply only to a general-purpose AI model with systemic "
    "risk (presumed when its cumulative training compute is greater than 10^25 FLOP, Art. "
    "51(2)). The original model was not marked as having "
    "systemic risk (original_systemic_risk, or a known compute above 10^25 FLOP); if the "
    "modified model has systemic risk, they apply too."
)


def obligations(*, systemic_risk: bool) -> list[Obligation]:
    """What follows for a modifier whose modification exceeds its threshold.

    Args:
        systemic_risk: Whether the original model is a general-purpose AI model with systemic
            risk (then so is the modified one, and Art. 52(1) and 55 apply too).

    Returns:
        The obligations, each with its article, in plain words (not legal advice).
    """
    return [*_PROVIDER, *(_SYSTEMIC if systemic_risk else ())]
