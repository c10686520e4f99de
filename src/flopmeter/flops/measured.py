"""The ``measured`` estimate: dispatch-level FLOP counts of sampled micro-batches, scaled up.

A few training micro-batches (by default the first two, then one in every 1024) run forward and
backward under :class:`torch.utils.flop_counter.FlopCounterMode`, which counts every matrix
multiplication PyTorch dispatches. Each sample is split into linear work (scales with tokens)
and attention-score work (``QK^T`` and ``AV``; scales with the sum of squared sequence lengths),
turned into FLOP per token and per token^2, and scaled by the whole run's token statistics.
Micro-batches that are not sampled cost nothing extra: no mode, no hook, no host sync.

PyTorch's counter leaves some operations at zero; this module adds formulas for them:

* CPU scaled-dot-product attention (``_scaled_dot_product_flash_attention_for_cpu`` and its
  backward), which ``attn_implementation="sdpa"`` dispatches on CPU;
* ``_grouped_mm`` (and ``_scaled_grouped_mm``), which transformers 5 uses by default for
  mixture-of-experts layers (``experts_implementation="grouped_mm"``).

Convention: the backward of fused attention is counted as four matmuls (``dP = dO V^T``,
``dV = P^T dO``, ``dQ = dS K``, ``dK = dS^T Q``), like eager attention; the recomputation of the
scores that fused kernels do to save memory is not counted (the Commission's guidelines,
Annex A.1, do not require recomputation; PyTorch's own formula counts it as a fifth matmul).
Activation-checkpoint recomputation (forward passes run again inside backward) is counted apart
and left out of the estimate, for the same reason.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from flopmeter.flops._exit_hook import register_exit_hook
from flopmeter.types import Estimate, TokenTotals

logger = logging.getLogger("flopmeter")

__all__ = [
    "ATTENTION_OPS",
    "DEFAULT_MEASURE_EVERY",
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

#: Sample one training micro-batch in this many (after the first two), by default.
DEFAULT_MEASURE_EVERY = 1024
#: ``measured / transformer`` beyond 1 +- this is a warning in the report.
RATIO_WARNING = 0.10

aten = torch.ops.aten


# ----------------------------------------------------------------------------- formulas
def _bmm_flops(b: int, m: int, k: int, n: int) -> int:
    return 2 * b * m * k * n


def _attention_flops(query_shape: Any, key_shape: Any, value_shape: Any, matmuls: int) -> int:
    """``matmuls`` products of size (query heads) x s_q x s_k x head_dim, 2 FLOP per MAC."""
    b, h_q, s_q, d_q = query_shape[-4:] if len(query_shape) == 4 else (1, *query_shape[-3:])
    s_k = key_shape[-2]
    d_v = value_shape[-1]
    # QK^T and dQ / dK use d_q; AV, dO V^T and dV use d_v. Half the matmuls each.
    return (matmuls // 2) * _bmm_flops(b * h_q, s_q, d_q, s_k) + (
        matmuls - matmuls // 2
    ) * _bmm_flops(b * h_q, s_q, d_v, s_k)


def cpu_sdpa_flop(
    query_shape: Any, key_shape: Any, value_shape: Any, *args: Any, **kwargs: Any
) -> int:
    """Forward of CPU scaled-dot-product attention: ``QK^T`` and ``AV`` over the full square.

    Grouped-query attention (fewer key/value heads) costs the query heads' count.

    Args:
        query_shape: ``[B, H_q, S_q, D]``.
        key_shape: ``[B, H_kv, S_k, D]``.
        value_shape: ``[B, H_kv, S_k, D_v]``.

    Returns:
        FLOP: ``2 * B * H_q * S_q * S_k * (D + D_v)``.
    """
    return _attention_flops(query_shape, key_shape, value_shape, 2)


def sdpa_backward_flop(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    """Backward of scaled-dot-product attention as four matmuls, without score recomputation.

    ``dP = dO V^T``, ``dV = P^T dO``, ``dQ = dS K`` and ``dK = dS^T Q``: twice the forward.

    Returns:
        FLOP: ``4 * B * H_q * S_q * S_k * (D + D_v)``.
    """
    return _attention_flops(query_shape, key_shape, value_shape, 4)


def cpu_sdpa_backward_flop(
    grad_out_shape: Any,
    query_shape: Any,
    key_shape: Any,
    value_shape: Any,
    *args: Any,
    **kwargs: Any,
) -> int:
    """Backward of CPU scaled-dot-product attention (see :func:`sdpa_backward_flop`)."""
    return sdpa_backward_flop(grad_out_shape, query_shape, key_shape, value_shape)


def grouped_mm_flop(
    a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **kwargs: Any
) -> int:
    """FLOP of ``torch._grouped_mm(a, b, offs)`` from the shapes alone (no host sync).

    The groups partition one dimension, so the total is that of one matmul over it:

    * 2-D x 3-D (``[M, K] x [G, K, N]``, rows grouped): ``2 * M * K * N``;
    * 2-D x 2-D (``[K, M] x [M, N] -> [G, K, N]``, the shared dimension grouped, as in the
      weight gradient): ``2 * K * M * N``;
    * 3-D x 2-D (``[G, M, K] x [K, N]``, columns grouped): ``2 * M * K * N``;
    * 3-D x 3-D (``[G, M, K] x [G, K, N]``, a batched matmul): ``2 * G * M * K * N``.

    Rows past the last offset are skipped by the kernel but counted here (the offsets live on
    the device; reading them would synchronise), so this is exact when every row is routed.
    """
    if len(a_shape) == 2 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * b_shape[2]
    if len(a_shape) == 2 and len(b_shape) == 2:
        return 2 * a_shape[0] * a_shape[1] * b_shape[1]
    if len(a_shape) == 3 and len(b_shape) == 2:
        return 2 * a_shape[1] * a_shape[2] * b_shape[1]
    if len(a_shape) == 3 and len(b_shape) == 3:
        return 2 * a_shape[0] * a_shape[1] * a_shape[2] * b_shape[2]
    raise ValueError(f"grouped_mm_flop: unexpected shapes {tuple(a_shape)} x {tuple(b_shape)}")


def _op(name: str) -> Any:
    return getattr(aten, name, None)


def measured_formulas() -> dict[Any, Any]:
    """The formulas flopmeter adds to (or changes in) PyTorch's counter, by operator.

    Returns:
        A ``custom_mapping`` for :class:`torch.utils.flop_counter.FlopCounterMode`; operators
        this PyTorch version lacks are left out.
    """
    mapping: dict[Any, Any] = {}
    for name, formula in (
        ("_scaled_dot_product_flash_attention_for_cpu", cpu_sdpa_flop),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", cpu_sdpa_backward_flop),
        ("_scaled_dot_product_efficient_attention_backward", sdpa_backward_flop),
        ("_scaled_dot_product_flash_attention_backward", sdpa_backward_flop),
        ("_scaled_dot_product_cudnn_attention_backward", sdpa_backward_flop),
        ("_grouped_mm", grouped_mm_flop),
        ("_scaled_grouped_mm", grouped_mm_flop),
    ):
        op = _op(name)
        if op is not None:
            mapping[op] = formula
    return mapping


#: Operators whose work grows with the square of the sequence length (attention scores).
ATTENTION_OPS = frozenset(
    {
        "bmm",
        "baddbmm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_cudnn_attention_backward",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
        "flex_attention",
        "flex_attention_backward",
    }
)

# Operator names that look like compute; seen without a formula, they are named in the notes.
_COMPUTE_HINTS = ("mm", "matmul", "gemm", "attention", "attn", "conv", "linear", "einsum")


def _op_name(packet: Any) -> str:
    name = getattr(packet, "__name__", None) or str(packet)
    return name.rsplit(".", 1)[-1]


# ----------------------------------------------------------------------------- samples
@dataclass(frozen=True)
class MeasuredSample:
    """The dispatch-level count of one sampled micro-batch (forward and backward).

    Attributes:
        linear_flops: FLOP of matmuls that scale with tokens (linear layers, experts, lm_head).
        attention_flops: FLOP of attention-score matmuls (``QK^T``, ``AV`` and their gradients).
        recompute_flops: FLOP of forward passes run again during backward (activation
            checkpointing), not part of the estimate.
        tokens: Tokens the micro-batch computed on, padding included (``B * T``).
        sum_sq_len: Sum over its sequences of the padded length squared (``B * T^2``).
        sequences: Its sequences (``B``).
    """

    linear_flops: int
    attention_flops: int
    recompute_flops: int
    tokens: int
    sum_sq_len: int
    sequences: int


def measured_estimate(
    samples: Iterable[MeasuredSample],
    totals: TokenTotals,
    *,
    transformer_flops: float | None = None,
    reason: str | None = None,
    unknown_ops: Iterable[str] = (),
) -> Estimate:
    """Scales sampled dispatch-level counts to the run (a pure function).

    ``flops = tokens_processed * sum(linear_flops) / sum(tokens)
    + sum_sq_seq_len * sum(attention_flops) / sum(sum_sq_len)``, the sums over samples.

    Args:
        samples: Complete forward+backward samples.
        totals: The run's token statistics.
        transformer_flops: The ``transformer`` estimate, for the consistency ratio.
        reason: Why there are no samples, when there are none.
        unknown_ops: Compute-like operators seen in samples that had no FLOP formula.

    Returns:
        The ``measured`` estimate; ``flops`` is null (with a reason) without samples.
    """
    samples = list(samples)
    formula = (
        "tokens_processed * linear_flops / sample_tokens "
        "+ sum_sq_seq_len * attention_flops / sample_sum_sq_len"
    )
    if not samples:
        return Estimate(
            flops=None,
            method="measured",
            formula=formula,
            inputs={"samples": 0},
            notes=[reason or "No training micro-batch was sampled."],
        )
    linear = sum(s.linear_flops for s in samples)
    attention = sum(s.attention_flops for s in samples)
    recompute = sum(s.recompute_flops for s in samples)
    tokens = sum(s.tokens for s in samples)
    sum_sq = sum(s.sum_sq_len for s in samples)
    notes = [
        f"Dispatch-level count (torch.utils.flop_counter.FlopCounterMode) of {len(samples)} "
        "sampled micro-batches, forward and backward, scaled by the run's tokens (linear work) "
        "and sum of squared sequence lengths (attention scores).",
        "Fused-attention backward counted as 4 matmuls (score recomputation not counted); "
        "CPU SDPA and grouped-mm mixture-of-experts matmuls counted with flopmeter's formulas.",
    ]
    flops: float | None = None
    if tokens > 0 and sum_sq > 0:
        flops = (
            totals.tokens_processed * linear / tokens + totals.sum_sq_seq_len * attention / sum_sq
        )
    else:
        notes.append("The samples had no tokens to scale by.")
    if recompute:
        notes.append(
            f"{recompute:.3g} FLOP of activation-checkpoint recomputation in the samples were "
            "not counted (Commission guidelines, Annex A.1)."
        )
    unknown = sorted(set(unknown_ops))
    if unknown:
        notes.append("Operators without a FLOP formula (counted as 0): " + ", ".join(unknown) + ".")
    inputs: dict[str, Any] = {
        "samples": len(samples),
        "linear_flops": linear,
        "attention_flops": attention,
        "recompute_flops_excluded": recompute,
        "sample_tokens": tokens,
        "sample_sum_sq_len": sum_sq,
        "sample_sequences": sum(s.sequences for s in samples),
        "tokens_processed": totals.tokens_processed,
        "sum_sq_seq_len": totals.sum_sq_seq_len,
    }
    if flops is not None and transformer_flops:
        ratio = flops / transformer_flops
        inputs["ratio_to_transformer"] = ratio
        if abs(ratio - 1.0) > RATIO_WARNING:
            notes.append(
                f"Warning: measured / transformer = {ratio:.3f}, beyond the {RATIO_WARNING:.0%} "
                "the two should agree within: the model runs work the architecture reading "
                "does not see (or the reverse); check the unknown operators and custom kernels."
            )
    return Estimate(flops=flops, method="measured", formula=formula, inputs=inputs, notes=notes)


# ----------------------------------------------------------------------------- sampling
_recompute = threading.local()


def _in_backward() -> bool:
    task_id = getattr(torch._C, "_current_graph_task_id", None)
    return task_id is not None and task_id() != -1


def _recompute_pre_hook(module: torch.nn.Module, args: Any) -> None:
    if _in_backward():
        _recompute.depth = getattr(_recompute, "depth", 0) + 1


def _recompute_post_hook(module: torch.nn.Module, args: Any, output: Any) -> None:
    if _in_backward() and getattr(_recompute, "depth", 0) > 0:
        _recompute.depth -= 1


@functools.cache
def _counter_class() -> type:
    """FlopCounterMode subclass, made on first use (importing the counter imports triton)."""
    from torch.utils.flop_counter import FlopCounterMode

    class _Counter(FlopCounterMode):
        """FlopCounterMode that splits its count into linear, attention and recompute work,
        stops counting once closed, and remembers compute-like operators without a formula."""

        def __init__(self) -> None:
            super().__init__(display=False, custom_mapping=measured_formulas())
            self.linear = 0
            self.attention = 0
            self.recompute = 0
            self.closed = False
            self.forward_flops: int | None = None
            self.unknown: set[str] = set()
            self.failed: list[str] = []

        @property
        def total(self) -> int:
            return self.linear + self.attention

        def _count_flops(self, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
            if self.closed:
                return out
            formula = self.flop_registry.get(func_packet)
            name = _op_name(func_packet)
            if formula is None:
                if any(hint in name.lower() for hint in _COMPUTE_HINTS):
                    self.unknown.add(name)
                return out
            try:
                flops = int(formula(*args, **kwargs, out_val=out))
            except Exception as exc:  # a formula must never fail the user's operator
                self.failed.append(f"{name}: {type(exc).__name__}: {exc}")
                return out
            if getattr(_recompute, "depth", 0) > 0:
                self.recompute += flops
            elif name in ATTENTION_OPS:
                self.attention += flops
            else:
                self.linear += flops
            return out

    return _Counter


def _dispatch_stack_empty() -> bool:
    length = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if length is not None and length() != 0:
        return False
    from torch.utils import _python_dispatch

    in_mode = getattr(_python_dispatch, "is_in_torch_dispatch_mode", None)
    return not (in_mode is not None and in_mode())


def _tensors(output: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Tensors in a model output (a tensor, tuple, list, dict or ModelOutput), two levels deep."""
    if isinstance(output, torch.Tensor):
        yield output
    elif depth < 2:
        if isinstance(output, dict):  # includes transformers' ModelOutput
            values: Iterable[Any] = output.values()
        elif isinstance(output, (tuple, list)):
            values = output
        else:
            return
        for value in values:
            yield from _tensors(value, depth + 1)


class _Sample:
    """One open sample: its counter, the micro-batches it spans, and its hooks."""

    def __init__(self, counter: Any, thread: int) -> None:
        self.counter = counter
        self.thread = thread
        self.forwards = 0
        self.tokens = 0
        self.sum_sq = 0
        self.sequences = 0
        self.backward_seen = False
        self.blind = False  # its outputs held no tensor: its backward is not seen ending
        self.global_hooks: list[Any] = []

    def add_batch(self, ref: torch.Tensor) -> None:
        rows = 1 if ref.dim() == 1 else math.prod(ref.shape[:-1])
        cols = ref.shape[-1]
        self.forwards += 1
        self.tokens += rows * cols
        self.sum_sq += rows * cols * cols
        self.sequences += rows


@dataclass
class MeasuredSampler:
    """Runs :class:`FlopCounterMode` over chosen training micro-batches, forward and backward.

    The meter calls :meth:`due` on every training micro-batch (an integer test) and the other
    methods only around sampled ones. A sample opens in the model's forward pre-hook (only when
    no other dispatch mode is active) and closes when the backward pass that starts from the
    model's outputs ends (an autograd callback), or at the optimizer step. Further training
    forward passes before that backward (gradient accumulation over several forwards) join the
    sample; when the forward returned no tensor (``None``: the loss kept elsewhere), the next
    training forward pass (or the meter's stop) closes it instead, kept when work ran after the
    forward. Closing stops the count; the mode leaves the dispatch stack later, on the thread
    that entered it and only from the top, at the next training forward pass, the optimizer
    step or the meter's stop, so it never leaks onto the caller's stack. A sample is dropped when its forward pass
    raised (told apart from one that returned ``None``), when its outputs hold tensors but none
    needs a gradient, or when its backward pass did more than twice its forward pass's work
    (the backward covered forward passes outside the sample).

    Args:
        every: Sample micro-batch 1, 2, and every ``every``-th after; ``0`` turns sampling off.
        max_samples: Stop sampling after this many complete samples.
    """

    every: int = DEFAULT_MEASURE_EVERY
    max_samples: int = 64
    samples: list[MeasuredSample] = field(default_factory=list)
    unknown_ops: set[str] = field(default_factory=set)
    skipped: dict[str, int] = field(default_factory=dict)
    _open: _Sample | None = None
    _stale: list[Any] = field(default_factory=list)

    #: Most forward passes one sample may span before it is dropped.
    MAX_FORWARDS = 16

    @property
    def active(self) -> bool:
        """Whether a sample is open (counting, or closed but not yet off the stack)."""
        return self._open is not None

    @property
    def collecting(self) -> bool:
        """Whether a sample is open, counting, and waiting for its backward pass."""
        sample = self._open
        return sample is not None and not sample.counter.closed and not sample.backward_seen

    def due(self, micro_batch: int) -> bool:
        """Whether training micro-batch number ``micro_batch`` (1-based) should be sampled."""
        if self.every <= 0 or len(self.samples) >= self.max_samples:
            return False
        return micro_batch <= 2 or micro_batch % self.every == 0

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def on_training_forward(
        self, model: torch.nn.Module, ref: torch.Tensor, micro_batch: int
    ) -> None:
        """The meter's forward pre-hook, for a training micro-batch (after its tokens counted).

        Args:
            model: The model (its outputs show where the backward pass ends).
            ref: The micro-batch's ``input_ids`` or ``attention_mask`` (its shape is read).
            micro_batch: The micro-batch's number, 1-based.
        """
        self._remove_stale()
        if self._open is not None:
            if self._open.blind and self.collecting:
                self._close_unseen("no backward pass seen before the next forward pass")
            elif self.collecting and self._open.forwards < self.MAX_FORWARDS:
                self._open.add_batch(ref)  # several forwards before one backward: one sample
                self._watch_output(model, self._open)
                return
            elif self.collecting:
                self._close(keep=False, why="spanned too many forward passes")
            self.settle()
        if self._open is None and self.due(micro_batch):
            self._begin(model, ref)

    def _begin(self, model: torch.nn.Module, ref: torch.Tensor) -> None:
        if getattr(torch.compiler, "is_compiling", lambda: False)():
            self._skip("compiling")
            return
        if getattr(model, "_compiled_call_impl", None) is not None:
            self._skip("the model is compiled (torch.compile)")
            return
        if not _dispatch_stack_empty():
            self._skip("another dispatch mode was active")
            return
        counter = _counter_class()()
        hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(_recompute_pre_hook),
            torch.nn.modules.module.register_module_forward_hook(
                _recompute_post_hook, always_call=True
            ),
        ]
        try:
            counter.__enter__()
        except Exception:
            for handle in hooks:
                handle.remove()
            raise
        sample = _Sample(counter, threading.get_ident())
        sample.global_hooks = hooks
        sample.add_batch(ref)
        self._open = sample
        self._watch_output(model, sample)

    def _watch_output(self, model: torch.nn.Module, sample: _Sample) -> None:
        handles: list[Any] = []

        def on_exit(
            module: torch.nn.Module, args: Any, kwargs: Any, output: Any, returned: bool
        ) -> None:
            # Removing a module's own forward hook while torch runs its always-call hooks after
            # an exception would break that loop; after a normal return it is safe.
            if returned:
                for handle in handles:
                    handle.remove()
            else:
                self._stale.extend(handles)
            try:
                self._on_output(sample, output, returned)
            except Exception as exc:  # the meter never breaks training
                logger.warning("flopmeter (measured): %s; sample dropped", exc)
                self._close(keep=False, why="error in the sampler")

        handles.extend(register_exit_hook(model, on_exit))

    def _on_output(self, sample: _Sample, output: Any, returned: bool) -> None:
        if sample is not self._open or sample.counter.closed:
            return
        if not returned:
            self._close(keep=False, why="the forward pass raised")
            self.settle()
            return
        sample.counter.forward_flops = sample.counter.total
        hooked = seen = False
        for tensor in _tensors(output):
            seen = True
            if tensor.requires_grad:
                tensor.register_hook(functools.partial(self._on_grad, sample))
                hooked = True
        if not seen:
            # Nothing to follow into the backward pass (the forward returned None, or an object
            # without tensors flopmeter reads; the loss may live elsewhere): the optimizer step
            # or the next training forward pass closes the sample.
            sample.blind = True
        elif not hooked:
            self._close(keep=False, why="no model output needs a gradient")

    def _on_grad(self, sample: _Sample, grad: torch.Tensor) -> None:
        # Runs inside the backward pass: close the count when that backward pass ends.
        if sample is not self._open or sample.counter.closed or sample.backward_seen:
            return
        sample.backward_seen = True
        sample.counter.forward_flops = sample.counter.total
        with contextlib.suppress(Exception):  # only fails outside a backward pass
            torch.autograd.Variable._execution_engine.queue_callback(
                functools.partial(self._end_backward, sample)
            )

    def _end_backward(self, sample: _Sample) -> None:
        if sample is self._open:
            self._close(keep=True)

    def _close(self, *, keep: bool, why: str = "") -> None:
        sample = self._open
        if sample is None or sample.counter.closed:
            return
        counter = sample.counter
        counter.closed = True
        if not keep:
            self._skip(why or "incomplete")
            return
        if counter.failed:
            # A formula raised on an operator: the sample's count is incomplete.
            self._skip(f"a FLOP formula failed ({counter.failed[0]})")
            return
        forward = counter.forward_flops
        if forward is None or forward <= 0:
            self._skip("no forward work was counted")
            return
        backward = counter.total - forward
        if backward > 2 * forward * (1 + 1e-6):
            # Backward did more than twice the forward's work: its graph held forward passes
            # the sample did not see (e.g. it opened between two accumulated forwards).
            self._skip("its backward pass covered forward passes outside the sample")
            return
        self.samples.append(
            MeasuredSample(
                linear_flops=counter.linear,
                attention_flops=counter.attention,
                recompute_flops=counter.recompute,
                tokens=sample.tokens,
                sum_sq_len=sample.sum_sq,
                sequences=sample.sequences,
            )
        )
        self.unknown_ops |= counter.unknown

    def on_optimizer_step(self) -> None:
        """The meter's optimizer-step hook: a backward pass has ended; close and settle."""
        self._close_unseen("no backward pass seen before the step")
        self.settle()

    def _close_unseen(self, why: str) -> None:
        """Closes a sample whose backward pass was not seen through the outputs: kept when work
        ran after its forward pass (a step, or the next training forward, follows a backward)."""
        sample = self._open
        if sample is not None and not sample.counter.closed:
            forward = sample.counter.forward_flops
            ran_backward = forward is not None and sample.counter.total > forward
            self._close(keep=ran_backward, why=why)

    def settle(self) -> None:
        """Closes an open sample (dropping it if incomplete) and takes its mode off the stack.

        The mode is popped only on the thread that pushed it and only from the top of the
        stack; otherwise it stays closed (counting nothing) and leaves at the next call.
        """
        sample = self._open
        if sample is None:
            return
        if not sample.counter.closed:
            self._close(keep=False, why="no backward pass seen")
        if threading.get_ident() != sample.thread:
            return
        from torch.utils._python_dispatch import _get_current_dispatch_mode

        if _get_current_dispatch_mode() is not sample.counter.mode:
            return  # another mode is above ours: it stays closed; pop at the next call
        try:
            sample.counter.__exit__(None, None, None)
        finally:
            self._open = None
            for handle in sample.global_hooks:
                handle.remove()
            _recompute.depth = 0

    def _remove_stale(self) -> None:
        while self._stale:
            self._stale.pop().remove()

    def stop(self) -> None:
        """Closes everything (the meter's stop)."""
        sample = self._open
        if sample is not None and sample.blind:
            self._close_unseen("no backward pass seen before the stop")
        self.settle()
        self._remove_stale()

    def sampling_note(self) -> str | None:
        """Why micro-batches were not sampled, when some were not."""
        if self.every <= 0:
            return "Sampling was turned off (measure_every=0)."
        if not self.skipped:
            return None
        return (
            "Samples dropped or skipped: "
            + ", ".join(f"{k} ({v})" for k, v in self.skipped.items())
            + "."
        )
