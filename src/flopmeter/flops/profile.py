"""The model profile: which weights a token passes through and what backward computes for them.

Re-exports, under one name, the profile's parts:

* :mod:`flopmeter.flops.model_profile`: the data (:class:`ModelProfile` and its parts);
* :mod:`flopmeter.flops.classify`: which modules do matmul work, of what kind;
* :mod:`flopmeter.flops.capture`: the temporary hooks (:class:`Profiler`, :func:`profile_model`);
* :mod:`flopmeter.flops.build`: the records of one forward pass turned into a profile.

The attention geometry and the routing come from the configuration
(:mod:`flopmeter.flops.architecture`).
"""

from __future__ import annotations

from flopmeter.flops.capture import Profiler, profile_model
from flopmeter.flops.model_profile import AttentionLayerWork, LinearGroup, ModelProfile

__all__ = [
    "AttentionLayerWork",
    "LinearGroup",
    "ModelProfile",
    "Profiler",
    "profile_model",
]
