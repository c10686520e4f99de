"""An attention module's query, key and value projections, found by their names under it."""

from __future__ import annotations

from torch import nn

__all__ = ["score_projections"]

#: Projection names (by the child's own name, anywhere under an attention module).
_SCORE_NAMES = {
    "q": ("q_proj", "query", "q", "to_q", "q_lin", "wq"),
    "k": ("k_proj", "key", "k", "to_k", "k_lin", "wk"),
    "v": ("v_proj", "value", "v", "to_v", "v_lin", "wv"),
}


def score_projections(name: str, module: nn.Module) -> tuple[dict[str, nn.Module], dict[str, str]]:
    """The query, key and value projections of the attention module ``module`` (named
    ``name`` in the model), found by their own names anywhere under it, the first of each role
    in module order.

    Returns:
        ``(found, names)``: by role (``"q"``, ``"k"``, ``"v"``; a role whose projection is not
        found is absent), the projection module and its full name in the model.
    """
    found: dict[str, nn.Module] = {}
    names: dict[str, str] = {}
    for child_name, child in module.named_modules():
        leaf = child_name.rsplit(".", 1)[-1]
        for role, options in _SCORE_NAMES.items():
            if child_name and leaf in options and role not in found:
                found[role] = child
                names[role] = f"{name}.{child_name}" if name else child_name
    return found, names
