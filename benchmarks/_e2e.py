"""The end-to-end added time per micro-batch: what a training loop pays for the meter.

The workload is issue 22's: a tiny model (``nn.Embedding(1000, 32)`` + ``nn.Linear(32, 1000)``),
right-padded ids of 4 x 48 with an attention mask, SGD, one micro-batch per training step. On a
shared virtual machine the per-step time of identical blocks drifts by tens of percent, so
"metered minus bare" over two long blocks cannot resolve a few microseconds on a ~1 ms step.
The estimator here can:

* many short blocks, each variant's block between two bare blocks (B V1 B V2 ... B), the
  variants in a new random order every round (so none always follows the same neighbour);
* every step timed alone (``perf_counter_ns``); a block's figure is the median of its steps
  (a step preempted by another process does not move it);
* a variant's difference in a round is its block's median minus the mean of its two bare
  neighbours' medians (linear drift cancels); the estimate is the median over rounds of those
  differences, with a bootstrap 95% confidence interval (resampling the rounds).

The instrument is validated in the same run: empty hooks that busy-wait a known 5 and 20 us
per micro-batch must measure 5 and 20 us above the empty hooks (see :func:`validation`).
"""

from __future__ import annotations

import contextlib
import random
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook

from flopmeter import FlopMeter
from flopmeter.flops.forwards import DISCOVERY_STEPS

PAD_ID = 0
VOCAB, HIDDEN = 1000, 32
ROWS, COLS = 4, 48
#: The known busy-waits the instrument must resolve, microseconds per micro-batch.
BUSY_US = (5, 20)
#: A busy-wait variant is "resolved" when the known wait lies in the 95% interval of its
#: measured excess over the empty hooks and that interval is at most twice this wide (us).
RESOLVE_TOLERANCE_US = 2.5


class TinyModel(nn.Module):
    """Issue 22's workload: an embedding and a linear head, cross-entropy on the labels."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
    ) -> torch.Tensor:
        logits = self.head(self.embed(input_ids))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


def make_batches(n: int = 8) -> list[dict[str, torch.Tensor]]:
    """Right-padded 4 x 48 batches (a quarter to all of each row real) with masks and labels."""
    g = torch.Generator().manual_seed(2)
    out = []
    for _ in range(n):
        lengths = torch.randint(COLS // 4, COLS + 1, (ROWS,), generator=g)
        mask = (torch.arange(COLS) < lengths[:, None]).long()
        ids = torch.randint(1, VOCAB, (ROWS, COLS), generator=g) * mask
        out.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    return out


class TinyLoop:
    """The model, SGD and a cycle of batches; :meth:`step` is one training step."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = TinyModel()
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3)
        self.batches = make_batches()
        self._real = [int(b["attention_mask"].sum()) for b in self.batches]
        self.i = 0
        #: The variant whose hooks are on (set by :func:`measure`), and the real tokens of the
        #: steps run under each (the meter's count is checked against it).
        self.active: str | None = None
        self.tokens: dict[str | None, int] = {}

    def step(self) -> None:
        k = self.i % len(self.batches)
        batch = self.batches[k]
        self.i += 1
        self.tokens[self.active] = self.tokens.get(self.active, 0) + self._real[k]
        loss = self.model(**batch)
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


# --------------------------------------------------------------------------- variants
#: A variant: a context manager around a block of the loop's steps.
Variant = Callable[[TinyLoop], contextlib.AbstractContextManager[Any]]


def _spin(n: int) -> None:
    for _ in range(n):
        pass


def spin_iterations_per_us(repeats: int = 5, iterations: int = 200_000) -> float:
    """Iterations of :func:`_spin` per microsecond of this thread's CPU time (the fastest of
    ``repeats`` timings: the least disturbed)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.thread_time_ns()
        _spin(iterations)
        best = min(best, time.thread_time_ns() - t0)
    return iterations / (best / 1e3)


def spin_cost_us(iterations: int, repeats: int = 2000) -> float:
    """The median CPU time of one ``_spin(iterations)`` call, microseconds (each call timed
    alone, as the hook makes it)."""
    times = []
    clock = time.thread_time_ns
    for _ in range(repeats):
        t0 = clock()
        _spin(iterations)
        times.append(clock() - t0)
    # the clock's own cost, subtracted: two readings around nothing
    empty = []
    for _ in range(repeats):
        t0 = clock()
        empty.append(clock() - t0)
    return (statistics.median(times) - statistics.median(empty)) / 1e3


@contextlib.contextmanager
def _hooked(
    loop: TinyLoop, forward_pre: Callable[..., None], step_post: Callable[..., None]
) -> Iterator[None]:
    """``forward_pre`` on the loop's model (``with_kwargs``) and ``step_post`` as a global
    optimizer step post-hook, for the block; both removed after."""
    handles = [
        loop.model.register_forward_pre_hook(forward_pre, with_kwargs=True),
        register_optimizer_step_post_hook(step_post),
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def empty_hooks(loop: TinyLoop, spin: int = 0) -> Iterator[None]:
    """A forward pre-hook (``with_kwargs``) and a global optimizer step post-hook that do
    nothing (torch's hook dispatch: the floor any hook-based meter pays), the forward pre-hook
    spinning a pure-Python loop of ``spin`` iterations when given (a known busy-wait: no clock
    is read in it, since on this VM a clock reading costs 0.4-2.6 us and its system call
    slows the rest of the step)."""

    def forward_pre(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if spin:
            _spin(spin)

    def step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
        return None

    with _hooked(loop, forward_pre, step_post):
        yield


@contextlib.contextmanager
def one_read(loop: TinyLoop) -> Iterator[None]:
    """The least a meter that counts what the model is fed does: the empty hooks, the forward
    pre-hook copying the call's attention mask into a buffer kept for it (one torch
    operation, no statistics) and the step hook adding 1 to a counter. Any such meter on CPU
    tensors pays at least this; FlopMeter's staging copy is this copy."""
    slot = torch.empty_like(loop.batches[0]["attention_mask"])
    steps = [0]

    def forward_pre(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        slot.copy_(kwargs["attention_mask"])

    def step_post(optimizer: Any, args: Any, kwargs: Any) -> None:
        steps[0] += 1

    with _hooked(loop, forward_pre, step_post):
        yield


@contextlib.contextmanager
def aws_style(loop: TinyLoop) -> Iterator[None]:
    """The AWS callback's per-micro-batch count: a host copy of the ids and ``.item()``."""
    counted = [0]

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        counted[0] += (kwargs["input_ids"].cpu() != PAD_ID).sum().item()

    handle = loop.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def flopmeter(loop: TinyLoop) -> Iterator[FlopMeter]:
    """``FlopMeter(model, pad_id=0, measure_every=0, output=None)`` around the block; checks
    afterwards that it counted every real token of the steps run with its hooks on (a fast
    wrong meter is no win)."""
    first = loop.tokens.get("flopmeter", 0)
    meter = FlopMeter(loop.model, pad_id=PAD_ID, measure_every=0, output=None)
    meter.start()
    try:
        yield meter
    finally:
        meter.stop()
    counted = meter.report().tokens.tokens_processed
    real = loop.tokens.get("flopmeter", 0) - first
    if counted != real or meter.problems:
        raise AssertionError(
            f"the meter miscounted during the benchmark: {counted} tokens instead of {real}; "
            f"hook errors {dict(meter.problems)}"
        )


def busy_spins(per_us: float) -> dict[int, int]:
    """Spin iterations for each known wait of ``BUSY_US`` (``per_us`` iterations per us)."""
    return {us: round(us * per_us) for us in BUSY_US}


def variants(spins: dict[int, int] | None = None) -> dict[str, tuple[Variant, str]]:
    """The variants timed against the bare loop, with what each is.

    Args:
        spins: Spin iterations per known wait (:func:`busy_spins`; calibrated here when not
            given).
    """
    spins = busy_spins(spin_iterations_per_us()) if spins is None else spins
    out: dict[str, tuple[Variant, str]] = {
        "flopmeter": (flopmeter, "FlopMeter(model, pad_id=0, measure_every=0, output=None)"),
        "empty_hooks": (
            empty_hooks,
            "a forward pre-hook (with_kwargs) and an optimizer step post-hook that do nothing",
        ),
        "one_read": (
            one_read,
            "the empty hooks, the forward pre-hook copying the attention mask into a buffer "
            "kept for it and the step hook counting the step (the least a meter that counts "
            "what the model is fed does per micro-batch)",
        ),
        "aws_style": (aws_style, "forward pre-hook: (ids.cpu() != pad).sum().item()"),
    }
    for us, n in spins.items():
        out[f"busy_{us}us"] = (
            lambda loop, n=n: empty_hooks(loop, spin=n),
            f"the empty hooks, the forward pre-hook spinning a Python loop of {n} iterations "
            f"(about {us} us: validation)",
        )
    return out


# --------------------------------------------------------------------------- the estimator
class HookSwitch:
    """Switches the hooks torch calls in a training step between sets, in about a microsecond
    and outside the timed step: every hook dictionary of the model's modules, of the
    optimizer and torch's global forward and optimizer-step hooks.

    Each variant is entered once (its hooks registered the way it registers them); what it
    added is kept as a set and removed, so steps can alternate one by one between the bare
    loop and a variant, and slow drift of the machine's speed cancels in adjacent pairs.
    """

    def __init__(self, loop: TinyLoop) -> None:
        import torch.nn.modules.module as module_globals
        import torch.optim.optimizer as optimizer_globals

        owners: list[Any] = [*loop.model.modules(), loop.optimizer]
        self.dicts: list[dict[Any, Any]] = [
            value
            for owner in owners
            for name, value in vars(owner).items()
            if "hook" in name and isinstance(value, dict)
        ]
        for globals_ in (module_globals, optimizer_globals):
            self.dicts += [
                v for k, v in vars(globals_).items() if "_global_" in k and isinstance(v, dict)
            ]
        self.bare = self.snapshot()

    def snapshot(self) -> list[dict[Any, Any]]:
        return [dict(d) for d in self.dicts]

    def set(self, state: list[dict[Any, Any]]) -> None:
        for d, s in zip(self.dicts, state, strict=True):
            if d != s:
                d.clear()
                d.update(s)

    def union(self, states: list[list[dict[Any, Any]]]) -> None:
        """Every set registered at once (so each context's own exit removes its hooks)."""
        for i, d in enumerate(self.dicts):
            for state in states:
                d.update(state[i])


def bootstrap_ci(
    values: list[float], *, resamples: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """A percentile bootstrap confidence interval of the median of ``values``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.tensor(values, dtype=torch.float64)
    picks = torch.randint(len(values), (resamples, len(values)), generator=g)
    medians = x[picks].median(dim=1).values.sort().values
    lo = medians[int((1 - level) / 2 * resamples)]
    hi = medians[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return float(lo), float(hi)


CLOCKS = ("cpu", "wall")


def measure(
    loop: TinyLoop,
    named: dict[str, Variant],
    *,
    rounds: int,
    pairs: int,
    seed: int = 0,
) -> dict[str, Any]:
    """Times bare and variant training steps alternating one by one in adjacent pairs.

    Every variant is entered once (and its first steps, for the meter the census and the steps over which it looks for other models, run
    untimed); then for ``rounds`` rounds, each variant in a new random order runs ``pairs``
    pairs of steps (bare then variant, or variant then bare, alternately: ABBA), the hooks
    switched by :class:`HookSwitch` between steps. A pair's difference is the variant's step
    time minus the bare step's; the estimate is the median of a variant's differences, with a
    bootstrap 95% interval. Both clocks are read around every step: ``cpu`` (this thread's CPU
    time: the host time the training thread spends, not the time it waits while another
    process holds the CPU, so the steadier figure on a shared machine) and ``wall``.

    Args:
        loop: The training loop.
        named: The variants by name.
        rounds: Rounds (each times every variant in ``pairs`` pairs).
        pairs: Pairs of steps per variant per round.
        seed: Seed of the variants' order and of the bootstrap.

    Returns:
        For each clock (``"cpu"``, ``"wall"``): ``bare_step_us`` (median bare step) and, per
        variant under ``variants``, ``added_us`` (the estimate: microseconds per micro-batch),
        ``ci_low_us``/``ci_high_us``, ``step_us`` (median step) and the raw
        ``differences_us``; and ``rounds``, ``pairs_per_round``, ``pairs``, ``seconds``.
    """
    rng = random.Random(seed)
    names = list(named)
    started = time.perf_counter()
    switch = HookSwitch(loop)
    sets: dict[str, list[dict[Any, Any]]] = {}
    wclock, cclock = time.perf_counter_ns, time.thread_time_ns
    with contextlib.ExitStack() as stack:
        for name in names:
            loop.active = name
            stack.enter_context(named[name](loop))
            # untimed: the census of the meter's first micro-batch, and the steps over which
            # it looks for other models (a global module hook, off from then on): the set of
            # hooks kept is the steady state's
            for _ in range(DISCOVERY_STEPS + 1):
                loop.step()
            sets[name] = switch.snapshot()
            switch.set(switch.bare)
            loop.active = None
        for _ in range(20):  # warm-up
            loop.step()
        bare: list[tuple[int, int]] = []
        steps: dict[str, list[tuple[int, int]]] = {n: [] for n in names}
        diffs: dict[str, list[tuple[float, float]]] = {n: [] for n in names}
        for _ in range(rounds):
            order = names[:]
            rng.shuffle(order)
            for name in order:
                for j in range(pairs):
                    times = {}
                    for counted in (False, True) if j % 2 == 0 else (True, False):
                        switch.set(sets[name] if counted else switch.bare)
                        loop.active = name if counted else None
                        w0, c0 = wclock(), cclock()
                        loop.step()
                        c1, w1 = cclock(), wclock()
                        times[counted] = (w1 - w0, c1 - c0)
                    bare.append(times[False])
                    steps[name].append(times[True])
                    diffs[name].append(
                        (
                            (times[True][0] - times[False][0]) / 1e3,
                            (times[True][1] - times[False][1]) / 1e3,
                        )
                    )
        switch.union(list(sets.values()))
        loop.active = None
    switch.set(switch.bare)
    out: dict[str, Any] = {
        "rounds": rounds,
        "pairs_per_round": pairs,
        "pairs": rounds * pairs,
        "seconds": time.perf_counter() - started,
    }
    for k, clock in ((1, "cpu"), (0, "wall")):
        per: dict[str, Any] = {}
        for name in names:
            d = [x[k] for x in diffs[name]]
            lo, hi = bootstrap_ci(d, seed=seed)
            per[name] = {
                "added_us": statistics.median(d),
                "ci_low_us": lo,
                "ci_high_us": hi,
                "step_us": statistics.median(x[k] for x in steps[name]) / 1e3,
                "differences_us": d,
            }
        out[clock] = {"bare_step_us": statistics.median(x[k] for x in bare) / 1e3, "variants": per}
    return out


def median_difference_ci(
    a: list[float], b: list[float], *, resamples: int = 1000, seed: int = 0
) -> tuple[float, float]:
    """Bootstrap 95% interval of ``median(a) - median(b)`` (``a`` and ``b`` resampled apart)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for x in (a, b):
        t = torch.tensor(x, dtype=torch.float64)
        picks = torch.randint(len(x), (resamples, len(x)), generator=g)
        out.append(t[picks].median(dim=1).values)
    d = (out[0] - out[1]).sort().values
    return float(d[int(0.025 * resamples)]), float(d[min(resamples - 1, int(0.975 * resamples))])


def validation(result: dict[str, Any], known_us: dict[int, float]) -> list[dict[str, Any]]:
    """The busy-wait variants' excess over the empty hooks against the known wait.

    Args:
        result: One clock's part of :func:`measure`'s result (``result["cpu"]``).
        known_us: What each busy-wait variant's spin costs, microseconds (by its nominal
            wait in ``BUSY_US``; :func:`spin_cost_us` timed in the same run).

    Returns:
        One entry per known wait: ``busy_us`` (nominal), ``known_us``, ``measured_us`` (the
        busy-wait variant's added time minus the empty hooks'), its bootstrap 95% interval
        ``ci_low_us``/``ci_high_us``, ``inside`` (the known cost lies in the interval) and
        ``resolved`` (inside, and the interval no wider than ``2 * RESOLVE_TOLERANCE_US``:
        then a 10 us cost is told from 0 and from 20).
    """
    v = result["variants"]
    empty = v["empty_hooks"]
    out = []
    for us in BUSY_US:
        busy = v[f"busy_{us}us"]
        lo, hi = median_difference_ci(busy["differences_us"], empty["differences_us"], seed=us)
        known = known_us[us]
        inside = lo <= known <= hi
        out.append(
            {
                "busy_us": us,
                "known_us": known,
                "measured_us": busy["added_us"] - empty["added_us"],
                "ci_low_us": lo,
                "ci_high_us": hi,
                "inside": inside,
                "resolved": inside and hi - lo <= 2 * RESOLVE_TOLERANCE_US,
            }
        )
    return out
