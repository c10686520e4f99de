"""Each method's cost on meta, from one build of the model shared by a plan's methods, cached
per process.

Building a model on meta and running it are most of a plan's time, so a plan builds each
configuration once: ``full``, ``spectrum`` and ``freeze`` differ only in which parameters
train, so they share the build (each starts from the build's own ``requires_grad`` flags);
LoRA wraps the model in place, so it comes after them on the same build (a second LoRA
setting, or a method after LoRA, builds afresh). ``qlora`` is ``lora`` on the meta model (the
same peft adapters; 4-bit weights change no FLOP), so the two share one cost.

What a method's cost yields (its census, profile, trainable blocks and the check of the FLOP
model against the dispatch count) is kept per process, keyed by everything it depends on: the
configuration's content, the family, the method's settings and the blocks; the flopmeter,
torch and transformers versions are the process's own. Nothing is written to disk here (the
command line's plans are: :mod:`flopmeter.planner.plan_cache`).
"""

from __future__ import annotations

import functools
import json
import threading
import warnings
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar, cast

from flopmeter.counting.census import Census, take_census
from flopmeter.errors import ConfigurationError
from flopmeter.flops.model_profile import ModelProfile
from flopmeter.planner.build import (
    MetaCost,
    MethodSetup,
    _apply,
    _base_model,
    check_stack,
    cost_on_meta,
    hf_config,
    profile_on_meta,
    spectrum_layers,
)
from flopmeter.planner.dispatch import SequenceShape, dispatch_flops
from flopmeter.planner.families import Family

__all__ = [
    "CACHE_SIZE",
    "UNIFORM_TYPES",
    "DispatchCost",
    "MethodCost",
    "clear_cache",
    "cut_config",
    "dispatch_cost",
    "method_check",
    "method_cost",
]

#: Method costs kept per process (least recently used dropped first).
CACHE_SIZE = 256
_LORA = ("lora", "qlora")
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass
class MethodCost:
    """A method's cost on meta, without the model: what a plan reads of it.

    Attributes:
        census: The parameter census of the model as the method sets it up.
        profile: The meter's profile of it (one forward pass on meta).
        trainable_blocks: The blocks that train (spectrum, freeze); ``None`` otherwise.
        checks: The check of the FLOP model against the dispatch count, by sequence length
            (tokens): ``None`` where the two agree, else why not, in words.
    """

    census: Census
    profile: ModelProfile
    trainable_blocks: tuple[int, ...] | None
    checks: dict[int, str | None] = field(default_factory=dict)


@dataclass(frozen=True)
class DispatchCost:
    """A method's dispatch count on meta over a plan's sequence shapes.

    Attributes:
        census: The parameter census of the model as the method sets it up.
        trainable_blocks: The blocks that train (spectrum, freeze); ``None`` otherwise.
        flops: The dispatch count of one training step of each shape times its count, FLOP.
    """

    census: Census
    trainable_blocks: tuple[int, ...] | None
    flops: int


@dataclass
class _Build:
    """The one model on meta of a configuration, and the method it is set up for now."""

    key: tuple[Any, ...]
    model: Any
    flags: list[tuple[Any, bool]]  # each parameter's requires_grad as built
    lora: MethodSetup | None = None  # the LoRA setting it is wrapped with (None: not wrapped)


_costs: OrderedDict[tuple[Any, ...], MethodCost] = OrderedDict()
#: One plan at a time uses the shared build (plans from several threads wait their turn).
_lock = threading.RLock()
_dispatch: OrderedDict[tuple[Any, ...], DispatchCost] = OrderedDict()
_build: list[_Build] = []  # at most one: the last configuration built


def _locked(function: _F) -> _F:
    """``function`` holding :data:`_lock` while it runs."""

    @functools.wraps(function)
    def locked(*args: Any, **kwargs: Any) -> Any:
        with _lock:
            return function(*args, **kwargs)

    return cast(_F, locked)


@_locked
def clear_cache() -> None:
    """Forgets every kept cost and the kept build."""
    _costs.clear()
    _dispatch.clear()
    _build.clear()


def _config_key(config: dict[str, Any], family: Family | None) -> tuple[Any, ...]:
    return (json.dumps(config, sort_keys=True, default=repr), family)


def _setup_key(setup: MethodSetup) -> MethodSetup:
    """The setup as the model on meta sees it (``qlora`` is ``lora``)."""
    return replace(setup, method="lora") if setup.method in _LORA else setup


def _fresh(key: tuple[Any, ...], config: dict[str, Any], family: Family | None) -> _Build:
    with warnings.catch_warnings():  # transformers' deprecation notices are not the user's
        warnings.simplefilter("ignore", FutureWarning)
        model = _base_model(config, family)
    build = _Build(key, model, [(p, p.requires_grad) for p in model.parameters()])
    _build[:] = [build]
    return build


def _set_up(
    config: dict[str, Any], setup: MethodSetup, layers: int, family: Family | None
) -> tuple[Any, tuple[int, ...] | None]:
    """The shared model of ``config`` set up for ``setup`` (in training mode), and the blocks
    that train; as :func:`flopmeter.planner.build.cost_on_meta` builds it afresh."""
    key = _config_key(config, family)
    build = _build[0] if _build and _build[0].key == key else None
    lora = _setup_key(setup) if setup.method in _LORA else None
    if build is None or (build.lora is not None and build.lora != lora):
        build = _fresh(key, config, family)
    if lora is not None and build.lora == lora:
        return build.model.train(), None
    for param, flag in build.flags:  # the build's own flags, as a fresh build has them
        param.requires_grad_(flag)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            model, blocks = _apply(build.model, setup, layers, family)
    except BaseException:
        _build.clear()  # half set up: never reused
        raise
    if lora is not None:
        build.model, build.lora = model, lora
    return model.train(), blocks


@_locked
def method_cost(
    config: dict[str, Any], setup: MethodSetup, layers: int, family: Family | None = None
) -> MethodCost:
    """The cost of ``setup`` on the model of ``config`` (see the module docstring): what
    :func:`flopmeter.planner.build.cost_on_meta` gives, without the model.

    Args:
        config: A ``config.json`` dictionary.
        setup: The method and its settings.
        layers: The number of transformer blocks (from the architecture).
        family: The text-only family to build (default a causal LM).

    Raises:
        ConfigurationError: transformers or peft cannot build it, or the profile fails.
    """
    key = _key(config, setup, layers, family)
    cost = _costs.get(key)
    if cost is None:
        model, blocks = _set_up(config, setup, layers, family)
        cost = MethodCost(take_census(model), profile_on_meta(model, setup, family), blocks)
        _costs[key] = cost
        while len(_costs) > CACHE_SIZE:
            _costs.popitem(last=False)
    _costs.move_to_end(key)
    return cost


#: Model types whose blocks are all of one kind, the same at every depth (unless their
#: configuration's ``layer_types`` names more than one kind: then they are checked in full).
UNIFORM_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "phi3", "mixtral", "bert"})


def cut_config(config: dict[str, Any], blocks: int) -> dict[str, Any] | None:
    """``config`` with ``blocks`` transformer blocks, where its blocks are all alike (one kind,
    :data:`UNIFORM_TYPES`); ``None`` for any other configuration."""
    if config.get("model_type") not in UNIFORM_TYPES or "num_hidden_layers" not in config:
        return None
    kinds = getattr(hf_config(config), "layer_types", None)
    if kinds is not None and len(set(kinds)) != 1:
        return None
    cut = {**config, "num_hidden_layers": blocks}
    if isinstance(config.get("layer_types"), list):
        cut["layer_types"] = config["layer_types"][:blocks]
    return cut


def _cuts(setup: MethodSetup, layers: int) -> list[tuple[int, MethodSetup]] | None:
    """The cut models (blocks, setup) whose figures decide the check of ``setup`` on
    ``layers`` alike blocks (see :func:`_alike_check`); ``None``: check the whole model.

    A method sets each block up as one of a few kinds, and the difference of the two figures
    is a sum over the blocks of their kind's part plus what is outside them:

    - full, lora, qlora: one kind; cut to one block and to two;
    - freeze: frozen blocks (no backward) below, then the lowest trainable block (no input
      gradient), then trainable ones: one of the first two kinds varies, so three cuts,
      frozen/trainable (1, 1), (2, 1) and (1, 2); not when no block trains;
    - spectrum: block 0 trains (no input gradient, the embeddings are frozen); above it,
      trained and frozen blocks both pass the input gradient down: cuts (0, 1), (1, 1) and
      (0, 2) trained/frozen blocks above block 0.
    """
    if layers <= 2:
        return None
    if setup.method in ("full", *_LORA):
        return [(1, setup), (2, setup)]
    if setup.method == "freeze":
        frozen = layers // 2 if setup.freeze_layers is None else setup.freeze_layers
        if not 0 <= frozen < layers:
            return None
        return [(2, replace(setup, freeze_layers=1)), (3, replace(setup, freeze_layers=2)),
                (3, replace(setup, freeze_layers=1))]  # fmt: skip
    if setup.method == "spectrum":
        cuts = [(2, 0.5, (0,)), (3, 2 / 3, (0, 1)), (3, 1 / 3, (0,))]
        if any(spectrum_layers(n, f) != chosen for n, f, chosen in cuts):
            return None
        return [(n, replace(setup, spectrum_fraction=f)) for n, f, _ in cuts]
    return None


def _alike_check(
    config: dict[str, Any],
    setup: MethodSetup,
    layers: int,
    family: Family | None,
    length: int,
    counts: Callable[[MetaCost, int], tuple[float | None, int]],
) -> bool:
    """Whether the FLOP model equals the dispatch count exactly on a few models cut to one,
    two or three blocks (:func:`_cuts`), which proves it equal on the model of ``layers``
    alike blocks.

    Both figures are sums over the blocks, by the kind the method makes of each, plus what is
    outside them, so their difference is ``a + b x n1 (+ c x n2)`` in the blocks of each
    kind: zero on the cuts makes every coefficient zero. That holds where every block of the
    configuration is alike (:func:`cut_config`); for any other model or method, or where a
    difference is not exactly zero, the answer is ``False`` and the model is checked in full.
    """
    cuts = _cuts(setup, layers)
    if cuts is None:
        return False
    for blocks, cut_setup in cuts:
        cut = cut_config(config, blocks)
        if cut is None:
            return False
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                cost = cost_on_meta(cut, cut_setup, blocks, family)
            modelled, counted = counts(cost, length)
        except ConfigurationError:
            return False
        if modelled is None or modelled != counted:
            return False
    return True


@_locked
def method_check(
    config: dict[str, Any],
    setup: MethodSetup,
    layers: int,
    family: Family | None,
    length: int,
    check: Callable[[MetaCost, int], str | None],
    counts: Callable[[MetaCost, int], tuple[float | None, int]] | None = None,
) -> str | None:
    """``check(cost, length)`` of :func:`method_cost`'s cost (with the model on meta set up
    for ``setup``), run once per length and kept with the cost.

    ``check`` answers ``None`` when the FLOP model agrees with the dispatch count of one
    sequence of ``length`` tokens, else why not, in words. ``counts(cost, length)``, when
    given, answers the two figures (the FLOP model's, the dispatch count's): where they are
    exactly equal on the model cut to one block and to two (:func:`_alike_check`), the answer
    is ``None`` without counting the whole model.
    """
    cost = method_cost(config, setup, layers, family)
    if length not in cost.checks:
        if counts is not None and _alike_check(config, setup, layers, family, length, counts):
            cost.checks[length] = None
        else:
            model, blocks = _set_up(config, setup, layers, family)
            meta = MetaCost(cost.census, cost.profile, blocks, model)
            cost.checks[length] = check(meta, length)
    return cost.checks[length]


@_locked
def dispatch_cost(
    config: dict[str, Any],
    setup: MethodSetup,
    layers: int | None,
    family: Family,
    shapes: Counter[SequenceShape],
) -> DispatchCost:
    """The dispatch count of ``setup``'s model of ``config`` over ``shapes`` (each shape's
    training step counted once on meta, times its count), on the shared build, kept.

    Raises:
        ConfigurationError: the model cannot be built or run on meta (one line).
    """
    check_stack(setup, layers, family)
    key = (*_key(config, setup, layers or 0, family), frozenset(shapes.items()))
    cost = _dispatch.get(key)
    if cost is None:
        model, blocks = _set_up(config, setup, layers or 0, family)
        census = take_census(model)
        flops = sum(dispatch_flops(model, family, s) * n for s, n in shapes.items())
        cost = _dispatch[key] = DispatchCost(census, blocks, flops)
        while len(_dispatch) > CACHE_SIZE:
            _dispatch.popitem(last=False)
    _dispatch.move_to_end(key)
    return cost


def _key(
    config: dict[str, Any], setup: MethodSetup, layers: int, family: Family | None
) -> tuple[Any, ...]:
    return (*_config_key(config, family), _setup_key(setup), layers)
