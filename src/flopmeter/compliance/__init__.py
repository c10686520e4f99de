"""Thresholds and verdicts of the EU AI Act downstream-modification rule."""

from flopmeter.compliance.thresholds import (
    GPAI_INDICATIVE_FLOPS,
    PRETRAIN_FLOPS_ENV,
    SYSTEMIC_RISK_FLOPS,
    Threshold,
    determine_threshold,
    pretrain_flops_from_env,
    resolve_pretrain_flops,
    validate_pretrain_flops,
)
from flopmeter.compliance.verdict import UNCERTAINTY_MARGIN, Verdict, verdict

__all__ = [
    "GPAI_INDICATIVE_FLOPS",
    "PRETRAIN_FLOPS_ENV",
    "SYSTEMIC_RISK_FLOPS",
    "UNCERTAINTY_MARGIN",
    "Threshold",
    "Verdict",
    "determine_threshold",
    "pretrain_flops_from_env",
    "resolve_pretrain_flops",
    "validate_pretrain_flops",
    "verdict",
]
