"""Every private PyTorch, FSDP and Transformers access flopmeter makes, fenced in one place.

Each access sits behind one small named function whose docstring says what it reads, why no
public API does the job today, and what public API would replace it. ``tests/test_internals.py``
calls every function here on the installed versions, so an upgrade that removes or changes one
fails there, by name, and not somewhere inside a training run.

Nothing outside this module touches an underscore attribute of torch, FSDP or transformers.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["compiled_call_module", "compiled_module", "config_name_or_path",
           "current_dispatch_mode", "dispatch_stack_empty", "dynamo_graphs_compiled",
           "find_caller_local", "flop_counter_class", "fsdp2_mesh", "fsdp_flat_param_members",
           "fsdp_flat_param_of", "fsdp_flat_param_sizes", "function_mode_on_top",
           "in_backward_pass", "in_compiled_frame", "in_compiled_module_call", "is_convolution",
           "is_dtensor", "lora_delta_forward_products", "queue_end_of_backward",
           "restore_instance_attribute", "set_instance_attribute", "view_base"]  # fmt: skip


# ----------------------------------------------------------------------------- autograd
def graph_task_id() -> Callable[[], int]:
    """The function :func:`in_backward_pass` reads (``-1`` outside a backward pass), for a hot
    path that calls it directly; a function that always gives ``-1`` where torch has none."""
    return getattr(torch._C, "_current_graph_task_id", None) or _no_graph_task


def _no_graph_task() -> int:
    return -1


def in_backward_pass() -> bool:
    """True while autograd runs a backward pass on this thread.

    Reads ``torch._C._current_graph_task_id()`` (-1 outside a backward pass). Used to tell
    activation-checkpoint recomputation (a forward run inside backward) from a training forward.
    Public replacement: none yet (``torch.autograd.graph`` exposes no "current graph task").
    """
    return graph_task_id()() != -1


def in_custom_function_backward() -> bool:
    """True while autograd runs the ``backward`` of a custom ``torch.autograd.Function`` on
    this thread (TRL's fused LM head, chunked cross-entropy kernels), not a built-in node's.

    Reads ``torch._C._current_autograd_node()`` (the node autograd is executing, or ``None``)
    and tells a Python function's node (a ``BackwardCFunction``) from the C++ ones. Used to
    find the products such a backward recomputes. Public replacement: none
    (``torch.autograd.graph`` exposes no "current node").
    """
    current = getattr(torch._C, "_current_autograd_node", None)
    if current is None:
        return False
    node = current()
    return node is not None and isinstance(node, torch.autograd.function.BackwardCFunction)


def queue_end_of_backward(callback: Callable[[], None]) -> None:
    """Runs ``callback`` when the backward pass now running ends.

    Calls ``torch.autograd.Variable._execution_engine.queue_callback``; only valid inside a
    backward pass (raises otherwise). Public replacement: none (PyTorch uses the same call in
    FSDP and DDP for their end-of-backward work).
    """
    torch.autograd.Variable._execution_engine.queue_callback(callback)


# ----------------------------------------------------------------------------- dispatch modes
def dispatch_stack_empty() -> bool:
    """Whether no ``TorchDispatchMode`` is active on this thread.

    Reads ``torch._C._len_torch_dispatch_stack`` and
    ``torch.utils._python_dispatch.is_in_torch_dispatch_mode``. Public replacement: none.
    """
    length = getattr(torch._C, "_len_torch_dispatch_stack", None)
    if length is not None and length() != 0:
        return False
    from torch.utils import _python_dispatch

    in_mode = getattr(_python_dispatch, "is_in_torch_dispatch_mode", None)
    return not (in_mode is not None and in_mode())


def current_dispatch_mode() -> Any:
    """The innermost active ``TorchDispatchMode`` on this thread, or ``None``.

    Calls ``torch.utils._python_dispatch._get_current_dispatch_mode``. Public replacement: none.
    """
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    return _get_current_dispatch_mode()


def flop_counter_class(on_count: Callable[[Any, Any, Any, Any, Any], None]) -> type:
    """A :class:`torch.utils.flop_counter.FlopCounterMode` subclass that reports each operator.

    The subclass overrides the private ``FlopCounterMode._count_flops(func_packet, out, args,
    kwargs)``, which the mode calls for every dispatched operator, and hands each call to
    ``on_count(mode, func_packet, out, args, kwargs)`` instead of the base class's per-module
    bookkeeping. Public replacement: a per-operator callback on ``FlopCounterMode`` (none today;
    ``get_flop_counts()`` only gives totals after the fact).

    Args:
        on_count: Called for every operator the mode sees; its return value is ignored.
    """
    from torch.utils import flop_counter

    def _count_flops(self: Any, func_packet: Any, out: Any, args: Any, kwargs: Any) -> Any:
        on_count(self, func_packet, out, args, kwargs)
        return out

    body: dict[str, Any] = {"_count_flops": _count_flops}
    inner = _compile_tolerant_mode_class(flop_counter)
    if inner is not None:

        def __enter__(self: Any) -> Any:
            # the base's __enter__ with the inner mode swapped, and without its ModuleTracker
            # (per-module totals, unused here: on_count gets every operator), whose backward
            # hooks fail on the outputs of a compiled graph
            self.flop_counts.clear()
            self.mode = inner(self)
            self.mode.__enter__()
            return self

        def __exit__(self: Any, *args: Any) -> Any:
            mode, self.mode = self.mode, None
            return mode.__exit__(*args) if mode is not None else None

        body["__enter__"] = __enter__
        body["__exit__"] = __exit__
    return type("FlopmeterCounterMode", (flop_counter.FlopCounterMode,), body)


def _compile_tolerant_mode_class(flop_counter: Any) -> type | None:
    """The private dispatch mode ``FlopCounterMode`` pushes (``_FlopCounterMode``), subclassed to
    let ``torch.compile`` run while it is active; ``None`` when this torch lacks either part.

    By default torch.compile refuses to run under a non-infra dispatch mode, so a
    ``torch.compile(fullgraph=True)`` function called inside the model (cut-cross-entropy's
    ``impl="torch_compile"``) raises during a sample. With ``ignore_compile_internals()`` true,
    dynamo compiles as usual and the mode sees the compiled code's operators at run time (the
    matrix products inductor hands to extern kernels), not the tracing. Reads
    ``FlopCounterMode.mode`` and ``flop_counts`` and subclasses ``_FlopCounterMode``. Public
    replacement: a ``FlopCounterMode`` option for this (none today).
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    base = getattr(flop_counter, "_FlopCounterMode", None)
    init_names = flop_counter.FlopCounterMode.__init__.__code__.co_names
    layout = "mode" in init_names and "flop_counts" in init_names
    if base is None or not layout or not hasattr(TorchDispatchMode, "ignore_compile_internals"):
        return None

    def ignore_compile_internals(cls: type) -> bool:
        return True

    return type(
        "FlopmeterDispatchMode",
        (base,),
        {"ignore_compile_internals": classmethod(ignore_compile_internals)},
    )


def dynamo_graphs_compiled() -> int:
    """How many graphs ``torch.compile`` has compiled in this process so far.

    Reads ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``, and only when dynamo is
    already imported (importing it takes seconds; a process that never called
    ``torch.compile`` has compiled nothing): 0 otherwise. Public replacement: none
    (``torch._dynamo.callback`` hooks compile starts, but is private too and needs the import).
    """
    utils = sys.modules.get("torch._dynamo.utils")
    counters = getattr(utils, "counters", None)
    try:
        return int(counters["stats"]["unique_graphs"]) if counters is not None else 0
    except (KeyError, TypeError, ValueError):
        return 0


def compiled_module(model: nn.Module) -> bool:
    """Whether ``model``'s forward runs compiled: ``model.compile()`` was called on it, or it is
    what ``torch.compile(model)`` returned (an ``OptimizedModule``).

    Reads ``nn.Module._compiled_call_impl``, and tells an ``OptimizedModule`` by its class name
    and its ``_orig_mod`` (without importing dynamo, which takes seconds). Public replacement:
    none (``isinstance(model, torch._dynamo.eval_frame.OptimizedModule)`` is private too and
    needs the import; ``model.compile()`` leaves no public trace).
    """
    if type(model).__name__ == "OptimizedModule" and hasattr(model, "_orig_mod"):
        return True
    return getattr(model, "_compiled_call_impl", None) is not None


def in_compiled_module_call() -> bool:
    """Whether a module compiled by ``torch.compile`` is being called on this thread's stack.

    True in the forward hooks of an ``OptimizedModule`` (what ``torch.compile(model)`` returns)
    and of every module it wraps, which run eagerly or traced. Reads
    ``torch._dynamo.eval_frame._is_in_optimized_module()``, only when dynamo is already imported
    (nothing was compiled otherwise). Public replacement: none (``torch.compiler.is_compiling()``
    is False in the eagerly run parts of a compiled call, a hook that graph-broke for one).
    """
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    check = getattr(eval_frame, "_is_in_optimized_module", None)
    try:
        return bool(check()) if check is not None else False
    except Exception:  # a changed private helper: assume eager
        return False


def _compile_wrapper_frame() -> Any:
    """The innermost frame of dynamo's ``compile_wrapper`` on this thread's stack, or None."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    key = ("compile_wrapper", str(getattr(eval_frame, "__file__", "")))
    frame = sys._getframe(2) if eval_frame is not None else None
    while frame is not None and (frame.f_code.co_name, frame.f_code.co_filename) != key:
        frame = frame.f_back
    return frame


def in_compiled_frame() -> bool:
    """Whether the caller runs inside a call of what ``torch.compile`` returned (a disabled hook
    in it, the call going on compiled; or under the ``force_eager`` stance): a dispatch mode
    pushed there loses its dispatch key when the call returns (dynamo restores the key set it
    began with). Walks the frames. Public replacement: none (``is_compiling()`` is False)."""
    return _compile_wrapper_frame() is not None


def compiled_call_module() -> nn.Module | None:
    """The ``OptimizedModule`` (``torch.compile(module)``) whose compiled forward the caller runs
    inside: the ``self`` of the frame (``Module._call_impl``) that called the innermost
    ``compile_wrapper``; None when that is no such forward (``module.compile()``, a compiled
    function) or there is none. Reads frames' locals. Public replacement: none."""
    frame = _compile_wrapper_frame()
    caller = frame.f_back if frame is not None else None
    owner = caller.f_locals.get("self") if caller is not None else None
    return owner if type(owner).__name__ == "OptimizedModule" else None


# ----------------------------------------------------------------------------- FSDP2
def fsdp2_mesh(module: nn.Module) -> Any:
    """The device mesh ``fully_shard`` (FSDP2) shards ``module``'s own parameters over, else
    ``None``: ``module._get_fsdp_state()._fsdp_param_group.mesh_info.mesh`` (the dimensions of
    data parallelism). Public replacement: none (``FSDPModule`` names no mesh)."""
    state = getattr(module, "_get_fsdp_state", None)
    group = getattr(state(), "_fsdp_param_group", None) if callable(state) else None
    return getattr(getattr(group, "mesh_info", None), "mesh", None)


# ----------------------------------------------------------------------------- FSDP1
def fsdp_flat_param_of(module: nn.Module) -> nn.Parameter | None:
    """The FSDP1 flat parameter a ``FullyShardedDataParallel`` module manages, else ``None``.

    Reads ``FullyShardedDataParallel._handle.flat_param``: with ``use_orig_params=True`` the flat
    parameter is not among ``model.parameters()``. Public replacement: FSDP2 (``fully_shard``),
    whose parameters are DTensors and need none of this.
    """
    return getattr(getattr(module, "_handle", None), "flat_param", None)


def fsdp_flat_param_sizes(param: Any) -> tuple[tuple[int, ...], list[int] | None] | None:
    """``(unsharded size, per-original numels)`` of an FSDP1 ``FlatParameter``, else ``None``.

    Reads ``FlatParameter._unpadded_unsharded_size`` and ``._numels`` (duck typed: FSDP is
    never imported); the numels are ``None`` when FSDP did not record them. Public
    replacement: none for FSDP1.
    """
    unsharded = getattr(param, "_unpadded_unsharded_size", None)
    if unsharded is None:
        return None
    numels = getattr(param, "_numels", None)
    return tuple(unsharded), None if numels is None else list(numels)


def fsdp_flat_param_members(flat: Any) -> dict[str, Any]:
    """What an FSDP1 ``FlatParameter`` records about the parameters flattened into it.

    Reads ``_params`` (the original parameters, ``use_orig_params=True`` only, else ``None``),
    ``_sharded_size`` (this rank's shard), ``_param_infos`` and ``_shared_param_infos`` (each
    member's module and name; ``module``, ``param_name``, ``prim_module``,
    ``prim_param_name``). Public replacement: none for FSDP1.

    Returns:
        A dict with keys ``originals``, ``sharded_size``, ``param_infos``, ``shared_infos``.
    """
    return {
        "originals": getattr(flat, "_params", None),
        "sharded_size": getattr(flat, "_sharded_size", None),
        "param_infos": tuple(getattr(flat, "_param_infos", None) or ()),
        "shared_infos": tuple(getattr(flat, "_shared_param_infos", None) or ()),
    }


# ----------------------------------------------------------------------------- frameworks
def find_caller_local(
    name: str, predicate: Callable[[Any], bool], *, skip: int = 1, depth: int | None = 6
) -> Any:
    """A local variable ``name`` of one of the calling frames that satisfies ``predicate``.

    Walks ``sys._getframe`` up to ``depth`` frames above the caller (``skip`` frames skipped;
    ``depth=None``: every frame). Zero-code metering asks it which Trainer builds an optimizer.
    Used by the Hugging Face adapter to find the Trainer's ``CallbackHandler`` (the ``self`` of
    ``CallbackHandler.call_event``) and reorder its list. Public replacement: a way for a
    callback to ask to run before the reporting callbacks (none in transformers today).

    Returns:
        The value, or ``None`` when no frame holds one.
    """
    frame = sys._getframe(skip + 1)
    for _ in range(depth) if depth is not None else iter(int, 1):
        if frame is None:
            return None
        value = frame.f_locals.get(name)
        if predicate(value):
            return value
        frame = frame.f_back
    return None


def set_instance_attribute(obj: Any, name: str, value: Any) -> Any:
    """Sets ``obj.<name>`` in the instance's ``__dict__``, shadowing the class attribute.

    Used by the Lightning adapter to route ``training_step`` through the metered module.
    Lightning's strategies look ``training_step`` up on the instance. Public replacement: a
    Lightning hook around ``training_step`` (none today).

    Returns:
        What the instance's ``__dict__`` held under ``name`` before (``None``: nothing), for
        :func:`restore_instance_attribute`.
    """
    previous = obj.__dict__.get(name)
    obj.__dict__[name] = value
    return previous


def restore_instance_attribute(obj: Any, name: str, previous: Any) -> None:
    """Undoes :func:`set_instance_attribute` (``previous`` as it returned)."""
    if previous is not None:
        obj.__dict__[name] = previous
    else:
        obj.__dict__.pop(name, None)


def iter_fsdp_flat_params(model: nn.Module, params: list[nn.Parameter]) -> Iterator[Any]:
    """FSDP1 flat parameters in ``model``, each once: through FSDP handles, then among ``params``.

    Duck typed on :func:`fsdp_flat_param_sizes`, with the per-original numels recorded (no FSDP
    import).
    """
    seen: set[int] = set()
    candidates = [fsdp_flat_param_of(m) for m in model.modules()]
    for flat in [*candidates, *params]:
        if flat is None or id(flat) in seen:
            continue
        sizes = fsdp_flat_param_sizes(flat)
        if sizes is None or sizes[1] is None:
            continue
        seen.add(id(flat))
        yield flat


# ----------------------------------------------------------------------------- modules
def is_convolution(module: nn.Module) -> bool:
    """Whether ``module`` is a torch convolution layer (any ``ConvNd`` or ``ConvTransposeNd``).

    Checks ``isinstance`` against ``torch.nn.modules.conv._ConvNd``, their private common base
    class, so that subclasses of it outside torch count too. Public replacement:
    ``isinstance(module, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d,
    nn.ConvTranspose2d, nn.ConvTranspose3d))``, which misses direct subclasses of ``_ConvNd``.
    """
    return isinstance(module, nn.modules.conv._ConvNd)


# ----------------------------------------------------------------------------- views and modes
def view_base(tensor: torch.Tensor) -> torch.Tensor | None:
    """The tensor ``tensor`` is a view of (``Tensor._base``), or ``None`` when it is no view.

    Used to recognise a weight used through a slice or a transpose (``weight[a:b].t()``) outside
    its module. Public replacement: comparing ``untyped_storage().data_ptr()``, which cannot
    tell tensors apart on the ``meta`` device (every pointer is 0).
    """
    return tensor._base


def function_mode_on_top(mode: Any) -> bool:
    """Whether ``mode`` is the innermost active ``TorchFunctionMode`` on this thread.

    Reads ``torch._C._len_torch_function_stack`` and ``torch._C._get_function_stack_at``, so
    that flopmeter only ever leaves the stack from the top. Public replacement: none
    (``torch.overrides`` exposes no query of the mode stack).
    """
    length = torch._C._len_torch_function_stack()
    return length > 0 and torch._C._get_function_stack_at(length - 1) is mode


# ----------------------------------------------------------------------------- peft
def lora_delta_forward_products(wrapper: nn.Module, adapters: int) -> int:
    """How many times one forward call of peft's ``ParamWrapper`` builds each ``B @ A`` product.

    peft 0.21 folds a single adapter on a multi-expert parameter (not in a low-precision dtype
    of ``peft.tuners.lora.layer.UPCAST_DTYPES``) into its parametrization ``_LoraFactorsProxy``
    (``baddbmm(W, lhs, rhs)``), which ``torch.nn.utils.parametrize.register_parametrization``
    evaluates once to check its shape and the forward pass once more: two products, of which
    only the second is differentiated. Otherwise ``get_delta_weight`` builds each adapter's
    product once (``_LoraParameterProxy`` only adds it). Public replacement: none (peft
    documents neither path; ``register_parametrization(..., unsafe=True)`` would drop the check).

    Args:
        wrapper: The ``ParamWrapper``.
        adapters: Its active adapters that hold LoRA weights.

    Returns:
        Products per adapter per forward call: 2 on the folded path, else 1.
    """
    from peft.tuners.lora import layer

    dtype = wrapper.get_param().dtype
    low = any(getattr(torch, n, None) == dtype for n in getattr(layer, "UPCAST_DTYPES", ()))
    folded = hasattr(layer, "_LoraFactorsProxy") and adapters == 1
    return 2 if folded and getattr(wrapper, "num_experts", 1) > 1 and not low else 1


def config_name_or_path(config: Any) -> str | None:
    """A Hugging Face config's model id: ``name_or_path``, else the private ``_name_or_path``
    it is stored under (older configs). Public replacement: ``name_or_path`` everywhere."""
    return getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)


def is_dtensor(param: Any) -> bool:
    """Whether ``param`` is a DTensor (FSDP2, tensor parallel), by its class name or the private
    ``_local_tensor`` it holds (a subclass under another name). Public replacement:
    ``isinstance(param, torch.distributed.tensor.DTensor)``, which needs the import."""
    return type(param).__name__ == "DTensor" or hasattr(param, "_local_tensor")
