"""The run's phases besides the trained model's training passes, as pure arithmetic.

A post-training run spends compute that is not the trained model's own training forward and
backward: the trained model's forward passes without gradients (generation of rollouts, old
log-probabilities, a reference made by disabling its adapter) and other models' forward passes
that feed its loss or its data (a reference model, a teacher, a reward model).
:mod:`flopmeter.flops.forwards` watches those calls; this module turns what it saw into FLOP.

Each watched call is reduced, from its shapes alone, to a vector of *units* within its *form*
(what kind of call it is: a text call with or without a key-value cache, or a non-text call of
one shape). For a text call the units are ``(rows, tokens, key-value pairs, head tokens)``: a
transformer's forward FLOP is exactly a linear combination of these (linear layers per token,
attention scores per query-key pair, the language-model head per token it is applied to).
A few calls of each form are counted at dispatch level (samples). The form's FLOP is then
exact without any fitted rate: when the form's unit totals are a linear combination
``sum_i w_i * u_i`` of the sampled calls' units, its FLOP is ``sum_i w_i * f_i``
(:func:`form_flops`), and more samples than the units' rank check that the FLOP are linear in
the units at all. When the totals are outside the samples' span, or the samples disagree with
any linear rule, the figure is ``None`` with the reason: never a plausible number.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flopmeter.checks import real_number
from flopmeter.errors import ConfigurationError

__all__ = [
    "DEFAULT_PHASE_POLICY",
    "LINEAR_TOLERANCE",
    "PHASE_POLICIES",
    "SPAN_TOLERANCE",
    "TRAINING",
    "WATCHED_METHOD",
    "DeclaredPhase",
    "FormTally",
    "PhaseFigure",
    "PhaseTally",
    "counted_phases_flops",
    "declared_phase",
    "form_flops",
    "merge_tallies",
    "phase_figures",
    "phase_flops",
    "tallies_from_state",
    "tallies_state",
]

#: Largest relative residual of the samples' FLOP against the best linear rule in their units
#: for the rule to count as exact (FlopCounterMode's counts are integers; float64 rounding is
#: far below this).
LINEAR_TOLERANCE = 1e-6
#: Largest relative residual of a form's unit totals against the span of its samples' units.
SPAN_TOLERANCE = 1e-9


@dataclass
class FormTally:
    """The calls of one form of one phase: their unit totals and their dispatch samples.

    Attributes:
        calls: Calls of this form.
        totals: The calls' units, summed (one entry per unit).
        samples: ``(units, flops)`` of each call counted at dispatch level.
        lost: Calls chosen for a sample whose count could not be taken (another dispatch mode
            was active, a compiled model, a formula that raised).
    """

    calls: int = 0
    totals: list[float] = field(default_factory=list)
    samples: list[tuple[tuple[float, ...], int]] = field(default_factory=list)
    lost: int = 0

    def add(self, units: Sequence[float]) -> None:
        """Adds one call's units."""
        self.calls += 1
        if not self.totals:
            self.totals = [0.0] * len(units)
        for i, u in enumerate(units):
            self.totals[i] += u

    def covers(self, units: Sequence[float]) -> bool:
        """Whether ``units`` lie in the span of the samples' units (then sampling this call
        adds no knowledge the figure needs)."""
        if not self.samples:
            return False
        return _in_span([s for s, _ in self.samples], units)


@dataclass
class PhaseTally:
    """What the watch saw of one phase: its forms, the modules it covers, and its notes."""

    forms: dict[str, FormTally] = field(default_factory=dict)
    modules: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def calls(self) -> int:
        """Forward calls in the phase."""
        return sum(f.calls for f in self.forms.values())

    @property
    def samples(self) -> int:
        """Calls counted at dispatch level."""
        return sum(len(f.samples) for f in self.forms.values())


def merge_tallies(parts: Sequence[dict[str, PhaseTally]]) -> dict[str, PhaseTally]:
    """The tallies of several ranks (or a run and its checkpoint) as one run's, in new objects
    (a pure function): calls and unit totals summed, every part's samples kept (each is an
    exact count of one call), modules and notes once each."""
    out: dict[str, PhaseTally] = {}
    for part in parts:
        for name, tally in part.items():
            into = out.setdefault(name, PhaseTally())
            into.modules.extend(m for m in tally.modules if m not in into.modules)
            into.notes.extend(n for n in tally.notes if n not in into.notes)
            for key, form in tally.forms.items():
                merged = into.forms.setdefault(key, FormTally())
                merged.calls += form.calls
                if not merged.totals:
                    merged.totals = [0.0] * len(form.totals)
                merged.totals = [a + b for a, b in zip(merged.totals, form.totals, strict=False)]
                merged.samples.extend(form.samples)
                merged.lost += form.lost
    return out


def tallies_state(tallies: dict[str, PhaseTally]) -> dict[str, Any]:
    """The tallies as plain data for a checkpoint (``FlopMeter.state_dict``'s ``phases``)."""
    return {
        name: {
            "modules": list(t.modules),
            "notes": list(t.notes),
            "forms": {
                key: {
                    "calls": f.calls,
                    "totals": list(f.totals),
                    "samples": [[list(u), flops] for u, flops in f.samples],
                    "lost": f.lost,
                }
                for key, f in t.forms.items()
            },
        }
        for name, t in tallies.items()
    }


def tallies_from_state(data: object) -> dict[str, PhaseTally]:
    """The tallies a checkpoint saved (:func:`tallies_state`), checked; ``None``: none (a state
    saved before phases were counted).

    Raises:
        ConfigurationError: ``phases`` is not what :func:`tallies_state` writes, naming the part.
    """
    if data is None:
        return {}

    def bad(where: str) -> ConfigurationError:
        return ConfigurationError(f"The saved meter state's phases are not valid: {where}.")

    if not isinstance(data, dict):
        raise bad("not a mapping")
    out: dict[str, PhaseTally] = {}
    for name, t in data.items():
        if not isinstance(name, str) or not isinstance(t, dict):
            raise bad(f"phase {name!r}")
        forms = t.get("forms")
        if not isinstance(forms, dict):
            raise bad(f"phase {name!r}: forms")
        tally = PhaseTally(
            modules=[str(m) for m in t.get("modules") or []],
            notes=[str(n) for n in t.get("notes") or []],
        )
        for key, f in forms.items():
            try:
                calls, lost = int(f["calls"]), int(f["lost"])
                totals = [float(v) for v in f["totals"]]
                samples = [(tuple(float(v) for v in u), int(flops)) for u, flops in f["samples"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise bad(f"phase {name!r}, form {key!r}: {exc}") from None
            if calls < 0 or lost < 0 or any(not math.isfinite(v) or v < 0 for v in totals):
                raise bad(f"phase {name!r}, form {key!r}: negative or non-finite counts")
            tally.forms[str(key)] = FormTally(calls, totals, samples, lost)
        out[name] = tally
    return out


def _scaled(rows: Sequence[Sequence[float]]) -> tuple[np.ndarray, np.ndarray]:
    """The rows as a matrix with each column scaled to at most 1 (for conditioning), and the
    scales."""
    a = np.asarray(rows, dtype=np.float64)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0
    return a / scale, scale


def _in_span(rows: Sequence[Sequence[float]], vector: Sequence[float]) -> bool:
    a, scale = _scaled(rows)
    v = np.asarray(vector, dtype=np.float64) / scale
    norm = float(np.linalg.norm(v))
    if norm == 0.0:
        return True
    w, *_ = np.linalg.lstsq(a.T, v, rcond=None)
    return float(np.linalg.norm(a.T @ w - v)) <= SPAN_TOLERANCE * norm * max(1, len(rows))


def form_flops(form: FormTally) -> tuple[float | None, str | None]:
    """A form's FLOP from its unit totals and its samples (a pure function).

    Returns:
        ``(flops, None)``, or ``(None, why)`` when the samples cannot give the figure exactly.
    """
    if form.calls == 0:
        return 0.0, None
    if not form.samples:
        return None, f"none of its {form.calls} call(s) was counted at dispatch level"
    units = [s for s, _ in form.samples]
    flops = np.asarray([f for _, f in form.samples], dtype=np.float64)
    a, scale = _scaled(units)
    rule, *_ = np.linalg.lstsq(a, flops, rcond=None)
    misfit = float(np.linalg.norm(a @ rule - flops))
    if misfit > LINEAR_TOLERANCE * max(float(np.linalg.norm(flops)), 1.0):
        return None, (
            f"its {len(units)} dispatch samples fit no linear rule in their shapes (relative "
            f"misfit {misfit / max(float(np.linalg.norm(flops)), 1.0):.1e}): the work does not "
            "scale with rows, tokens and key-value pairs"
        )
    totals = np.asarray(form.totals, dtype=np.float64) / scale
    if not _in_span(units, form.totals):
        return None, (
            f"its {form.calls} call(s) have shapes outside what its {len(units)} dispatch "
            "sample(s) cover"
        )
    value = float(totals @ rule)
    return (max(value, 0.0) if math.isfinite(value) else None), None


def phase_flops(tally: PhaseTally) -> tuple[float | None, str | None]:
    """A phase's FLOP: the sum of its forms' (a pure function); ``None`` with the first form's
    reason when any form's figure is unknown."""
    total = 0.0
    for key, form in tally.forms.items():
        flops, why = form_flops(form)
        if flops is None:
            return None, f"{key}: {why}"
        total += flops
    return total, None


#: Which phases enter the judged figure (``MeterOptions.phases``). ``modification``: every
#: phase that fed this run's updates (the trained model's training passes, its forward passes
#: without gradients while it trains, other models' forward passes while it trains, and
#: declared phases); ``updates``: the trained model's training passes only. Evaluation enters
#: under neither.
PHASE_POLICIES = ("modification", "updates")
DEFAULT_PHASE_POLICY = "modification"
#: The trained model's own training forward and backward passes.
TRAINING = "training"


@dataclass(frozen=True)
class DeclaredPhase:
    """Compute of this run that the meter could not see, declared by the user with its source
    (generation in a vLLM server, teacher logits computed beforehand), FLOP."""

    name: str
    flops: float | None
    source: str


#: Phase names the meter gives itself (a declared phase may not take one).
OWN_PHASES = ("training", "generation", "scoring", "evaluation")


def declared_phase(name: object, flops: object, source: object) -> DeclaredPhase:
    """A declared phase, checked (``FlopMeter.declare_phase``).

    Raises:
        ConfigurationError: an empty name or source, a name the meter uses itself (or one
            starting with ``model ``), or a figure that is not a finite non-negative number.
    """
    if not isinstance(name, str) or not name.strip():
        raise ConfigurationError(f"A declared phase needs a name, got {name!r}.")
    if name.strip() in OWN_PHASES or name.strip().startswith("model "):
        raise ConfigurationError(
            f"A declared phase may not be named {name!r}: the meter names its own phases so."
        )
    if not isinstance(source, str) or not source.strip():
        raise ConfigurationError(
            f"A declared phase needs its source (where the figure comes from), got {source!r}."
        )
    value = None
    if flops is not None:
        value = real_number(flops, "declared phase flops")
        if value < 0:
            raise ConfigurationError(f"declared phase flops must not be negative, got {flops!r}.")
    return DeclaredPhase(name.strip(), value, source.strip())


@dataclass(frozen=True)
class PhaseFigure:
    """One phase of the run, as the report gives it.

    Attributes:
        name: ``training``, ``generation``, ``scoring``, ``model <name>``, ``evaluation``, or a
            declared phase's name.
        flops: Its compute, FLOP; ``None`` when not known (``reason`` says why).
        counted: Whether it enters the judged figure (the phase policy).
        method: How it was counted.
        calls: Forward calls in it (``None`` for the training passes and declared phases).
        samples: Calls counted at dispatch level.
        modules: The modules it covers.
        notes: What else the report says of it.
        reason: Why ``flops`` is ``None``.
    """

    name: str
    flops: float | None
    counted: bool
    method: str
    calls: int | None = None
    samples: int | None = None
    modules: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    reason: str | None = None


#: How a watched phase is counted, in the report's words.
WATCHED_METHOD = (
    "dispatch counts of sampled calls, scaled exactly by each call's rows, tokens, key-value "
    "pairs and head tokens (flopmeter.flops.phases)"
)


def _counted(name: str, policy: str) -> bool:
    if name == "evaluation":
        return False
    return policy == "modification" or name == TRAINING


def phase_figures(
    tallies: dict[str, PhaseTally],
    declared: Sequence[DeclaredPhase] = (),
    policy: str = DEFAULT_PHASE_POLICY,
) -> list[PhaseFigure]:
    """The run's phases besides its training passes, with their figures (a pure function):
    watched phases first (generation, scoring, other models), then declared ones, evaluation
    last."""

    def order(name: str) -> tuple[int, str]:
        rank = {"generation": 0, "scoring": 1, "evaluation": 9}.get(name, 2)
        return rank, name

    out: list[PhaseFigure] = []
    for name in sorted(tallies, key=order):
        tally = tallies[name]
        flops, why = phase_flops(tally)
        notes = list(tally.notes)
        lost = sum(f.lost for f in tally.forms.values())
        if lost:
            notes.append(
                f"{lost} call(s) chosen for a dispatch count could not be counted (another "
                "dispatch mode was active, or the call raised)"
            )
        if tally.notes and flops is not None:
            why, flops = f"its calls were not all watched ({tally.notes[0]})", None
        out.append(
            PhaseFigure(
                name=name,
                flops=flops,
                counted=_counted(name, policy),
                method=WATCHED_METHOD,
                calls=tally.calls,
                samples=tally.samples,
                modules=tuple(tally.modules),
                notes=tuple(notes),
                reason=why,
            )
        )
    tail = [f for f in out if f.name == "evaluation"]
    out = [f for f in out if f.name != "evaluation"]
    for d in declared:
        out.append(
            PhaseFigure(
                name=d.name,
                flops=d.flops,
                counted=_counted(d.name, policy),
                method=f"declared: {d.source}",
                reason=None if d.flops is not None else f"not seen by the meter ({d.source})",
            )
        )
    return out + tail


def counted_phases_flops(figures: Sequence[PhaseFigure]) -> tuple[float, str | None]:
    """The FLOP of the phases that enter the judged figure (besides the training passes), and
    why that sum is not known when a counted phase's figure is not (``(0.0, why)``)."""
    total = 0.0
    for f in figures:
        if not f.counted or f.name == TRAINING:
            continue
        if f.flops is None:
            return (
                0.0,
                f"the {f.name} phase, which the phase policy counts, has no figure: {f.reason}",
            )
        total += f.flops
    return total, None
