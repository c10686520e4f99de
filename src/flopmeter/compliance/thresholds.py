"""The EU AI Act compute thresholds for downstream modifiers, as pure functions.

Source: Commission Guidelines on the scope of the obligations for providers of general-purpose
AI models, C(2025) 5045 (adopted as C(2025) 7719), section 3.2 (downstream modification), and
Regulation (EU) 2024/1689, Art. 51(2). The rule is *one third*; the AWS reference meter's 30% is
not used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

from flopmeter.checks import real_number
from flopmeter.errors import ConfigurationError
from flopmeter.types import ThresholdKind
from flopmeter.units import human_flops

#: Art. 51(2): a GPAI model trained with more than this is presumed to have systemic risk.
SYSTEMIC_RISK_FLOPS = 1e25
#: Guidelines, section 2.1: indicative criterion for a general-purpose AI model.
GPAI_INDICATIVE_FLOPS = 1e23
#: The fraction of the original model's compute a modification must exceed (section 3.2).
MODIFICATION_FRACTION = 1.0 / 3.0
#: The environment variable the AWS meter reads, honoured for drop-in compatibility.
PRETRAIN_FLOPS_ENV = "PRETRAIN_FLOPS"
#: The value of ``pretrain_flops`` (or ``PRETRAIN_FLOPS``) that opts in to the bundled catalogue.
CATALOG = "catalog"

#: What ``pretrain_flops`` may be once checked: FLOP, the catalogue opt-in, or unknown.
PretrainSetting = float | Literal["catalog"] | None


_SOURCES: dict[str, str] = {
    "one_third_of_original": (
        "Commission Guidelines C(2025) 5045, section 3.2: a modification is significant when "
        "its training compute exceeds one third of the original model's training compute."
    ),
    "default_gpai": (
        "Commission Guidelines C(2025) 5045, section 3.2: when the original model's compute "
        "is not known, one third of 10^23 FLOP (the GPAI indicative criterion of section 2.1)."
    ),
    "default_systemic_risk": (
        "Commission Guidelines C(2025) 5045, section 3.2: when the original model has systemic "
        "risk and its compute is unknown, one third of 10^25 FLOP (AI Act Art. 51(2))."
    ),
}


@dataclass(frozen=True)
class Threshold:
    """The compute above which a modification makes the modifier a provider.

    Attributes:
        value: The threshold in FLOP. A run *exceeds* it when its compute is strictly greater.
        kind: Which rule produced the value.
        source: The rule, in words, with the document it comes from.
    """

    value: float
    kind: ThresholdKind
    source: str

    def exceeded_by(self, flops: float) -> bool:
        """Whether ``flops`` (FLOP) is strictly greater than the threshold."""
        return flops > self.value


def validate_pretrain_flops(value: object, *, name: str = "pretrain_flops") -> float | None:
    """Checks a user-supplied pretraining compute and returns it as a float (FLOP).

    Args:
        value: ``None`` (unknown) or a finite, non-negative number of FLOP.
        name: What to call the value in the error message.

    Raises:
        ConfigurationError: the value is not a number, or is negative, NaN or infinite.
    """
    if value is None:
        return None
    if isinstance(value, str):  # text (PRETRAIN_FLOPS, or a number given as text)
        try:
            value = float(value)
        except ValueError:
            raise ConfigurationError(
                f"{name} must be a number of FLOP (for example 1.2e24), got {value!r}."
            ) from None
    flops = real_number(value, name, what="a non-negative number of FLOP (for example 1.2e24)")
    return flops


def validate_pretrain_setting(value: object, *, name: str = "pretrain_flops") -> PretrainSetting:
    """Checks ``pretrain_flops`` as a user may give it: FLOP, ``"catalog"`` or ``None``.

    Args:
        value: ``None`` (unknown), the string ``"catalog"`` (any case; opts in to the bundled
            catalogue), or a finite, non-negative number of FLOP (a number or its text).
        name: What to call the value in the error message.

    Raises:
        ConfigurationError: anything else; the message names ``name``.
    """
    if isinstance(value, str) and value.strip().lower() == CATALOG:
        return CATALOG
    try:
        return validate_pretrain_flops(value, name=name)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"{str(exc).rstrip('.')}; or 'catalog' to use the bundled catalogue's figure."
        ) from None


def pretrain_flops_from_env(environ: dict[str, str] | None = None) -> PretrainSetting:
    """Reads ``PRETRAIN_FLOPS``: FLOP, ``"catalog"``, or ``None`` when unset or empty.

    Raises:
        ConfigurationError: the variable is set to something that is neither a valid FLOP count
            nor ``catalog``; the message names the variable.
    """
    env = os.environ if environ is None else environ
    raw = env.get(PRETRAIN_FLOPS_ENV, "").strip()
    if not raw:
        return None
    return validate_pretrain_setting(raw, name=f"The environment variable {PRETRAIN_FLOPS_ENV}")


def determine_threshold(
    pretrain_flops: float | None = None, *, original_systemic_risk: bool = False
) -> Threshold:
    """Chooses the threshold for a modification of a model, per the Commission guidelines.

    Args:
        pretrain_flops: The original model's training compute in FLOP, or ``None`` if unknown.
        original_systemic_risk: Whether the original model is a GPAI model with systemic risk.
            Only matters when ``pretrain_flops`` is unknown.

    Returns:
        One third of ``pretrain_flops`` when it is known and at least 10^23 FLOP; one third of
        10^25 when unknown and the original has systemic risk; one third of 10^23 otherwise
        (also when the known compute is below 10^23: flopmeter's reading, with both values in
        ``source``; see :func:`below_gpai_reading`).
    """
    flops = validate_pretrain_flops(pretrain_flops)
    if flops is not None and flops >= GPAI_INDICATIVE_FLOPS:
        kind: ThresholdKind = "one_third_of_original"
        value = flops * MODIFICATION_FRACTION
    elif flops is None and original_systemic_risk:
        kind = "default_systemic_risk"
        value = SYSTEMIC_RISK_FLOPS * MODIFICATION_FRACTION
    else:
        kind = "default_gpai"
        value = GPAI_INDICATIVE_FLOPS * MODIFICATION_FRACTION
    source = _SOURCES[kind]
    if flops is not None and kind == "default_gpai":
        source = below_gpai_reading(flops)
    return Threshold(value=value, kind=kind, source=source)


def below_gpai_reading(pretrain_flops: float) -> str:
    """The rule applied when the original's known compute is below 10^23 FLOP, in words: the
    guidelines' rule and flopmeter's reading kept apart, with both values.

    The one-third rule of section 3.2 is about modifying a general-purpose AI model, and an
    original trained with at most 10^23 FLOP does not meet the guidelines' indicative criterion
    for one (section 2.1); the guidelines say nothing more for that case. flopmeter then applies
    the fallback of 1/3 x 10^23 FLOP, as the AWS reference meter does. That value is *higher*
    than one third of the known compute, so it is the less strict of the two; the text says so.
    """
    third = pretrain_flops * MODIFICATION_FRACTION
    fallback = GPAI_INDICATIVE_FLOPS * MODIFICATION_FRACTION
    return (
        "Commission Guidelines C(2025) 5045, section 3.2: a modification is significant when "
        "its training compute exceeds one third of the original model's; one third of the "
        f"original's known compute ({human_flops(pretrain_flops)}) would be "
        f"{human_flops(third)}. That compute is below 10^23 FLOP, the guidelines' indicative "
        "criterion for a general-purpose AI model (section 2.1), so the original is arguably "
        "not one and the one-third rule arguably does not apply as written; the guidelines "
        "do not say which threshold applies then. flopmeter's reading, not the guidelines': it "
        f"applies the fallback the guidelines give for an unknown compute, {human_flops(fallback)}"
        " (one third of 10^23 FLOP), as the AWS reference meter does, so that every original "
        "treated as not a GPAI model gets the same test. This is the less strict of the two "
        f"values: a run between {human_flops(third)} and {human_flops(fallback)} is below this "
        "threshold but above one third of the original's compute."
    )
