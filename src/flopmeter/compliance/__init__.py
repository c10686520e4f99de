"""Thresholds and verdicts of the EU AI Act downstream-modification rule.

``thresholds``: the rules; ``catalog``: the bundled pretraining-compute catalogue;
``original``: where the original compute comes from; ``verdict``: the verdict with the 30%
margin; ``lineage``: which runs a total counts, the total and its verdict (``parents`` wraps it
for a report's parent entries); ``obligations``: what follows on exceeds.
Pure functions and data: nothing here imports torch.
"""

from flopmeter.compliance.thresholds import (
    CATALOG,
    GPAI_INDICATIVE_FLOPS,
    PRETRAIN_FLOPS_ENV,
    SYSTEMIC_RISK_FLOPS,
    PretrainSetting,
    Threshold,
    determine_threshold,
    pretrain_flops_from_env,
    validate_pretrain_flops,
    validate_pretrain_setting,
)
from flopmeter.compliance.verdict import (
    UNCERTAINTY_MARGIN,
    Judgement,
    Verdict,
    judge,
    primary_verdict,
    verdict,
)

__all__ = [
    "CATALOG",
    "GPAI_INDICATIVE_FLOPS",
    "PRETRAIN_FLOPS_ENV",
    "SYSTEMIC_RISK_FLOPS",
    "UNCERTAINTY_MARGIN",
    "Judgement",
    "PretrainSetting",
    "Threshold",
    "Verdict",
    "determine_threshold",
    "judge",
    "pretrain_flops_from_env",
    "primary_verdict",
    "validate_pretrain_flops",
    "validate_pretrain_setting",
    "verdict",
]
