"""A plan as text: an aligned table, a markdown table, or JSON (the whole plan)."""

from __future__ import annotations

import json

from flopmeter.planner.plan import MethodPlan, Plan

__all__ = ["FORMATS", "render"]

FORMATS = ("table", "json", "md")
_HEADER = ("method", "trainable", "compute", "share", "verdict", "tokens to threshold")


def _flops(value: float) -> str:
    return f"{value:.2e} FLOP"


def _share(value: float) -> str:
    return f"{100 * value:.3g}%"


def _to_threshold(m: MethodPlan) -> str:
    if m.tokens_to_threshold is None:
        return "never (no compute)"
    text = f"{m.tokens_to_threshold:.2e} tokens"
    if m.epochs_to_threshold is not None:
        epochs = m.epochs_to_threshold
        text += f" ({epochs:,.1f} epochs)" if epochs < 1e6 else f" ({epochs:.2e} epochs)"
    return text


def _cells(m: MethodPlan) -> tuple[str, ...]:
    share = m.n_trainable / m.n_total if m.n_total else 0.0
    return (
        m.method,
        f"{m.n_trainable:,} ({_share(share)})",
        _flops(m.flops),
        _share(m.share_of_threshold),
        m.verdict,
        _to_threshold(m),
    )


def _head(plan: Plan) -> list[str]:
    first = plan.methods[0]
    name = plan.model or "bare numbers"
    approx = " (approximate)" if plan.approximate_tokens else ""
    count = first.n_total if plan.base_parameters is None else plan.base_parameters
    return [
        f"flopmeter estimate: {name}, {count:,} parameters",
        f"  model:     {plan.source}",
        f"  tokens:    {first.tokens:,}{approx}: {plan.tokens_from}",
        f"  threshold: {_flops(first.threshold_value)} ({first.threshold_kind}"
        f"{plan.threshold_note})",
    ]


def _notes(plan: Plan, indent: str = "  ") -> list[str]:
    lines = [f"{indent}{m.method}: {note}" for m in plan.methods for note in m.notes]
    return lines + [f"{indent}{note}" for note in plan.notes]


_PHASE_HEADER = ("method", "phase", "compute", "judged", "what")


def _phase_rows(plan: Plan) -> list[tuple[str, ...]]:
    """One row per phase of each method planned with a recipe (none without one)."""
    return [
        (m.method, p.name, _flops(p.flops), "yes" if p.counted else "no", p.how)
        for m in plan.methods
        for p in m.phases
    ]


def _policy(plan: Plan) -> str:
    policy = next((m.phase_policy for m in plan.methods if m.phase_policy), None)
    return (
        f"phases (policy {policy}: compute is the sum of the judged phases; "
        "docs/compliance.md, 'Which phases count'):"
    )


def _aligned(rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def render_table(plan: Plan) -> str:
    """Aligned plain text: the head, one row per method, a recipe's phases, then the notes."""
    body = _aligned([_HEADER, *(_cells(m) for m in plan.methods)])
    phases = _phase_rows(plan)
    if phases:
        body += ["", _policy(plan), *_aligned([_PHASE_HEADER, *phases])]
    return "\n".join([*_head(plan), "", *body, "", "notes:", *_notes(plan)])


def render_md(plan: Plan) -> str:
    """A markdown table with the head above and the notes below."""
    rows = [_HEADER, ("---",) * 2 + ("---:",) * 2 + ("---",) * 2, *map(_cells, plan.methods)]
    table = ["| " + " | ".join(r) + " |" for r in rows]
    phases = _phase_rows(plan)
    if phases:
        align = ("---", "---", "---:", "---", "---")
        table += ["", _policy(plan), ""]
        table += ["| " + " | ".join(r) + " |" for r in [_PHASE_HEADER, align, *phases]]
    head = [line.strip() for line in _head(plan)]
    return "\n".join(
        [
            f"**{head[0]}**",
            "",
            *(f"- {h}" for h in head[1:]),
            "",
            *table,
            "",
            "**Notes**",
            "",
            *_notes(plan, "- "),
        ]
    )


def render(plan: Plan, fmt: str = "table") -> str:
    """``plan`` in ``fmt``: ``table``, ``md`` or ``json`` (the whole :class:`Plan`: its
    plan-wide fields, such as ``approximate_tokens`` and ``notes``, and ``methods``, one object
    per method; equal to ``plan.model_dump(mode="json")``)."""
    if fmt == "json":
        return json.dumps(plan.model_dump(mode="json"), indent=2)
    if fmt == "md":
        return render_md(plan)
    return render_table(plan)
