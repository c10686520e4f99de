"""Workloads shared by the overhead benchmarks: a small transformer training step, the ways of
counting it (bare, FlopMeter, the field's reference points) and the alternating protocol.

Settings (environment variables, read when the benchmarks run):

* ``FLOPMETER_BENCH_THREADS``: torch intra-op threads (default 1: on a shared two-core machine
  one thread is far less noisy, and the goal is stated for a ~10 ms step);
* ``FLOPMETER_BENCH_ROUNDS``, ``FLOPMETER_BENCH_STEPS``: rounds of the alternating protocol and
  steps per block (defaults 150 and 10).
"""

from __future__ import annotations

import contextlib
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from flopmeter import FlopMeter
from flopmeter.options import DEFAULT_MEASURE_EVERY

PAD_ID = 0
VOCAB = 512
#: The step model: a 2-layer Llama, hidden size 96, batches of 4 x 48 with padding (about
#: 10 ms per training step with one thread on the 2-core CPU machine this was written on).
MODEL = {"hidden_size": 96, "intermediate_size": 264, "num_hidden_layers": 2}
BATCH_ROWS, BATCH_COLS = 4, 48


def env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def configure_threads() -> int:
    threads = env_int("FLOPMETER_BENCH_THREADS", 1)
    torch.set_num_threads(threads)
    return threads


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": _cpu_name(),
        "logical_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    with contextlib.suppress(OSError):
        info["load_average_1min"] = round(os.getloadavg()[0], 2)
    return info


def _cpu_name() -> str:
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def make_model(**config: Any) -> torch.nn.Module:
    """The step model (a seeded ``LlamaForCausalLM``), ``config`` overriding its config."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    settings = {
        "vocab_size": VOCAB,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "pad_token_id": PAD_ID,
        **MODEL,
        **config,
    }
    return LlamaForCausalLM(LlamaConfig(**settings))


def make_batches(
    n: int, rows: int = BATCH_ROWS, cols: int = BATCH_COLS, vocab: int = VOCAB
) -> list[dict[str, Any]]:
    """Right-padded batches (a quarter to all of each row is real) with masks and labels."""
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        lengths = torch.randint(cols // 4, cols + 1, (rows,), generator=g)
        mask = (torch.arange(cols) < lengths[:, None]).long()
        ids = torch.randint(1, vocab, (rows, cols), generator=g) * mask
        out.append(
            {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
        )
    return out


def real_tokens(batches: list[dict[str, Any]]) -> int:
    return sum(int(b["attention_mask"].sum()) for b in batches)


class Trainer:
    """A model, an optimizer and a cycle of batches: ``step()`` is one training step.

    By default the small CPU workload (:func:`make_model`, :func:`make_batches`, AdamW).
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        batches: list[dict[str, Any]] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.model = model if model is not None else make_model()
        self.model.train()
        self.optimizer = optimizer or torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        self.batches = batches if batches is not None else make_batches(8)
        self._i = 0

    def next_batch(self) -> dict[str, Any]:
        batch = self.batches[self._i % len(self.batches)]
        self._i += 1
        return batch

    def step(self) -> None:
        loss = self.model(**self.next_batch()).loss
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()


# --------------------------------------------------------------------------- ways of counting
# Each is a context manager around a block of training steps, and a per-step wrapper.
Variant = tuple[
    Callable[[Trainer], contextlib.AbstractContextManager[Any]], Callable[[Trainer], None]
]


@contextlib.contextmanager
def _nothing(trainer: Trainer) -> Iterator[None]:
    yield


def _plain_step(trainer: Trainer) -> None:
    trainer.step()


@contextlib.contextmanager
def _flopmeter(trainer: Trainer, **kwargs: Any) -> Iterator[FlopMeter]:
    meter = FlopMeter(trainer.model, pad_id=PAD_ID, **kwargs)
    first = trainer._i
    meter.start()
    yield meter
    meter.stop()
    seen = [trainer.batches[i % len(trainer.batches)] for i in range(first, trainer._i)]
    report = meter.report()
    if report.tokens.tokens_processed != real_tokens(seen) or meter.problems:
        raise AssertionError(
            f"the meter miscounted during the benchmark: {report.tokens.tokens_processed} tokens "
            f"instead of {real_tokens(seen)}; hook errors {meter.problems}"
        )


@contextlib.contextmanager
def _aws_style(trainer: Trainer) -> Iterator[None]:
    """The AWS callback's per-micro-batch count: a host copy of the ids and ``.item()``."""
    counted = [0]

    def hook(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        ids = kwargs["input_ids"]
        counted[0] += (ids.cpu() != PAD_ID).sum().item()

    handle = trainer.model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def _flop_counter_step(trainer: Trainer) -> None:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        trainer.step()


def measured_meter_kwargs() -> tuple[dict[str, Any], str]:
    """FlopMeter arguments that sample every micro-batch for the ``measured`` estimate.

    The default rate (micro-batches 1, 2, then one in ``DEFAULT_MEASURE_EVERY``) samples too
    rarely to time in short blocks, so this variant samples every micro-batch; the amortised
    overhead at the default rate is derived from it (see :func:`amortised_sampling_ratio`).
    """
    return {"measure_every": 1}, (
        "FlopMeter(model, pad_id=0, measure_every=1): every micro-batch counted at the dispatch "
        "level (the default samples one in "
        f"{DEFAULT_MEASURE_EVERY}; the amortised figure is derived below)"
    )


def amortised_sampling_ratio(hot_path_ratio: float, sampled_ratio: float) -> float:
    """Step-time ratio of a long run at the default sampling rate.

    Args:
        hot_path_ratio: Counted/bare step ratio of the meter with sampling off.
        sampled_ratio: Counted/bare step ratio with every micro-batch sampled.

    Returns:
        ``hot_path_ratio + (sampled_ratio - hot_path_ratio) / DEFAULT_MEASURE_EVERY``.
    """
    return hot_path_ratio + (sampled_ratio - hot_path_ratio) / DEFAULT_MEASURE_EVERY


def variants() -> dict[str, tuple[Variant, str]]:
    """The ways of counting a training step, with a description (or why one is missing)."""
    measured_kwargs, measured_note = measured_meter_kwargs()

    def _hot_path(trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
        return _flopmeter(trainer, measure_every=0)

    def _measured(trainer: Trainer) -> contextlib.AbstractContextManager[Any]:
        return _flopmeter(trainer, **measured_kwargs)

    return {
        "flopmeter": (
            (_hot_path, _plain_step),
            "FlopMeter(model, pad_id=0, measure_every=0): the per-micro-batch path (token "
            "statistics, optimizer-step hook); the measured estimate's sampling is the last row",
        ),
        "aws_style": (
            (_aws_style, _plain_step),
            "forward pre-hook: (ids.cpu() != pad).sum().item() per micro-batch",
        ),
        "flop_counter_mode": (
            (_nothing, _flop_counter_step),
            "torch.utils.flop_counter.FlopCounterMode around every step",
        ),
        "measured_sampling": ((_measured, _plain_step), measured_note),
    }


# --------------------------------------------------------------------------- the protocol
def alternate(
    trainer: Trainer,
    variant: Variant,
    *,
    rounds: int,
    steps: int,
    synchronize: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """Bare and counted blocks of ``steps`` steps, alternating (ABBA) for ``rounds`` rounds.

    Each block starts with one untimed step inside its context (for the meter, the first
    micro-batch takes the parameter census, once per run); the ratio of a round is the counted
    block's time over the adjacent bare block's. Both wall-clock time and this process's CPU
    time are measured: on a machine shared with other work the CPU time is the steadier
    measure of the work added (it does not count time spent descheduled).

    Args:
        trainer: The training step.
        variant: How the counted blocks count (see :func:`variants`).
        rounds: Rounds (one bare and one counted block each).
        steps: Timed steps per block.
        synchronize: Called before each clock reading (``torch.cuda.synchronize`` on a GPU,
            where steps are queued asynchronously).

    Returns:
        Median ratios and quartiles, the ratio of the fastest blocks, median step times in
        milliseconds, and the raw ratios.
    """
    sync = synchronize or (lambda: None)
    enter, step = variant

    def block(counted: bool) -> tuple[float, float]:
        run = step if counted else _plain_step
        with enter(trainer) if counted else _nothing(trainer):
            run(trainer)  # untimed, in both: for the meter, the census of its first batch
            sync()
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(steps):
                run(trainer)
            sync()
            return time.perf_counter() - wall, time.process_time() - cpu

    for counted in (False, True):  # warm-up, not recorded
        block(counted)
    ratios, cpu_ratios, bare_s, counted_s = [], [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        times = {c: block(c) for c in order}
        bare_s.append(times[False][0])
        counted_s.append(times[True][0])
        ratios.append(times[True][0] / times[False][0])
        cpu_ratios.append(times[True][1] / times[False][1])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    cq1, _, cq3 = statistics.quantiles(cpu_ratios, n=4)
    return {
        "median_ratio": statistics.median(ratios),
        "ratio_q1": q1,
        "ratio_q3": q3,
        "median_cpu_ratio": statistics.median(cpu_ratios),
        "cpu_ratio_q1": cq1,
        "cpu_ratio_q3": cq3,
        "fastest_ratio": min(counted_s) / min(bare_s),
        "bare_step_ms": statistics.median(bare_s) / steps * 1e3,
        "counted_step_ms": statistics.median(counted_s) / steps * 1e3,
        "rounds": rounds,
        "steps_per_block": steps,
        "ratios": ratios,
        "cpu_ratios": cpu_ratios,
    }
