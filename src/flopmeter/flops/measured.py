"""The ``measured`` estimate's parts under one name (re-exports, for existing imports).

Dispatch-level FLOP counts of sampled training micro-batches, scaled up:

* :mod:`flopmeter.flops.aten_ops`: the operators, each with its kind and flopmeter's formula;
* :mod:`flopmeter.flops.counter`: the counting mode of one sample, split by kind;
* :mod:`flopmeter.flops.sampler`: which micro-batches are sampled, and each sample's lifecycle;
* :mod:`flopmeter.flops.scaling`: the pure scaling of the samples to the run.
"""

from __future__ import annotations

from flopmeter.flops.aten_ops import (
    ATTENTION_OPS,
    cpu_sdpa_backward_flop,
    cpu_sdpa_flop,
    grouped_mm_flop,
    measured_formulas,
    sdpa_backward_flop,
)
from flopmeter.flops.sampler import DEFAULT_MEASURE_EVERY, MAX_FORCED_SAMPLES, MeasuredSampler
from flopmeter.flops.scaling import AGREEMENT, RATIO_WARNING, MeasuredSample, measured_estimate

__all__ = [
    "AGREEMENT",
    "ATTENTION_OPS",
    "DEFAULT_MEASURE_EVERY",
    "MAX_FORCED_SAMPLES",
    "RATIO_WARNING",
    "MeasuredSample",
    "MeasuredSampler",
    "cpu_sdpa_backward_flop",
    "cpu_sdpa_flop",
    "grouped_mm_flop",
    "measured_estimate",
    "measured_formulas",
    "sdpa_backward_flop",
]
