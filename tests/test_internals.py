"""Every private torch / FSDP / transformers access in flopmeter.internals, pinned.

An upgrade that removes or changes one of them fails here, by name, instead of somewhere
inside a training run. Each test checks the behaviour flopmeter relies on, not only that an
attribute exists.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import flopmeter
from flopmeter import internals


def test_in_backward_pass_is_true_only_inside_backward():
    seen: list[bool] = []
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()
    x.register_hook(lambda g: seen.append(internals.in_backward_pass()))
    assert internals.in_backward_pass() is False
    y.backward()
    assert seen == [True]
    assert internals.in_backward_pass() is False


def test_queue_end_of_backward_runs_after_the_backward_pass():
    order: list[str] = []
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()

    def hook(grad: torch.Tensor) -> None:
        order.append("hook")
        internals.queue_end_of_backward(lambda: order.append("end"))

    x.register_hook(hook)
    y.backward()
    assert order == ["hook", "end"]


class _Nop(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def test_dispatch_stack_and_current_mode():
    assert internals.dispatch_stack_empty()
    assert internals.current_dispatch_mode() is None
    with _Nop() as mode:
        assert not internals.dispatch_stack_empty()
        assert internals.current_dispatch_mode() is mode
    assert internals.dispatch_stack_empty()


def test_flop_counter_class_reports_every_operator_with_its_output():
    calls: list[tuple[str, tuple[int, ...]]] = []

    def on_count(mode, packet, out, args, kwargs):
        calls.append((packet.__name__, tuple(out.shape)))

    counter = internals.flop_counter_class(on_count)(display=False)
    a, b = torch.ones(4, 6), torch.ones(6, 5)
    with counter:
        torch.mm(a, b)
    # 4 x 6 x 5 multiply-adds; the override sees the op and its [4, 5] output
    assert ("mm", (4, 5)) in calls


@pytest.mark.slow
def test_compiled_module_tells_model_compile_apart():
    model = nn.Linear(2, 2)
    assert internals.compiled_module(model) is False
    model.compile()
    assert internals.compiled_module(model) is True
    # torch.compile(model) leaves the module as it is and returns an OptimizedModule around it
    other = nn.Linear(2, 2)
    assert internals.compiled_module(torch.compile(other)) is True
    assert internals.compiled_module(other) is False


def test_fsdp_accessors_on_a_one_rank_fsdp1_model(tmp_path):
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        inner = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
        for use_orig in (False, True):
            model = FSDP(inner, use_orig_params=use_orig, device_id=torch.device("cpu"))
            flat = internals.fsdp_flat_param_of(model)
            assert flat is not None
            unsharded, numels = internals.fsdp_flat_param_sizes(flat)
            assert unsharded == (55,)  # one rank: the whole flat parameter
            assert numels == [40, 12, 3]  # embedding 10x4, weight 3x4, bias 3
            members = internals.fsdp_flat_param_members(flat)
            assert (members["originals"] is not None) is use_orig
            assert [info.param_name for info in members["param_infos"]] == [
                "weight",
                "weight",
                "bias",
            ]
            assert isinstance(members["param_infos"][0].module, nn.Embedding)
            found = list(internals.iter_fsdp_flat_params(model, list(model.parameters())))
            assert found == [flat]
            inner = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 3))
    finally:
        dist.destroy_process_group()
    assert internals.fsdp_flat_param_sizes(nn.Parameter(torch.ones(2))) is None


def test_find_caller_local_walks_up_the_frames():
    marker = object()

    def inner():
        return internals.find_caller_local("self", lambda v: v is marker, skip=1)

    def middle():
        return inner()

    def outer(self=marker):  # the local is named "self", as in CallbackHandler.call_event
        return middle()

    assert outer() is marker
    assert internals.find_caller_local("self", lambda v: False) is None


def test_instance_attribute_shadows_and_restores_the_class_method():
    class Module:
        def step(self) -> str:
            return "class"

    module = Module()
    previous = internals.set_instance_attribute(module, "step", lambda: "instance")
    assert module.step() == "instance" and previous is None
    internals.restore_instance_attribute(module, "step", previous)
    assert module.step() == "class"
    module.step = lambda: "user's"  # type: ignore[method-assign]
    previous = internals.set_instance_attribute(module, "step", lambda: "ours")
    internals.restore_instance_attribute(module, "step", previous)
    assert module.step() == "user's"


def test_lora_delta_forward_products_matches_peft():
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    sizes = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32}
    heads = {"num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1}
    config = transformers.MixtralConfig(
        **sizes, **heads, num_local_experts=4, num_experts_per_tok=2
    )
    model = peft.get_peft_model(
        transformers.AutoModelForCausalLM.from_config(config),
        peft.LoraConfig(r=2, target_modules=[], target_parameters=["experts.down_proj"]),
    )
    wrapper = next(m for m in model.modules() if type(m).__name__ == "ParamWrapper")
    assert internals.lora_delta_forward_products(wrapper, 1) == 2  # folded: check, then use
    assert internals.lora_delta_forward_products(wrapper, 2) == 1
    param = wrapper.get_param()  # [experts, hidden, intermediate]; one product: numel * r MACs
    ids = torch.randint(0, 64, (1, 4))
    with FlopCounterMode(display=False) as counter:
        model(input_ids=ids)
    baddbmm = counter.get_flop_counts()["Global"][torch.ops.aten.baddbmm]
    assert baddbmm == 2 * 2 * param.numel() * 2


def test_is_convolution_covers_torch_convolutions_and_subclasses():
    class MyConv(nn.modules.conv._ConvNd):  # a subclass outside torch, of the private base
        pass

    assert internals.is_convolution(nn.Conv1d(2, 2, 3))
    assert internals.is_convolution(nn.ConvTranspose2d(2, 2, 3))
    assert issubclass(MyConv, nn.modules.conv._ConvNd)
    assert not internals.is_convolution(nn.Linear(2, 2))


def test_view_base_finds_the_weight_behind_a_slice_or_transpose():
    weight = torch.ones(6, 4)
    assert internals.view_base(weight) is None
    assert internals.view_base(weight[2:4].t()) is weight
    meta = torch.empty(6, 4, device="meta")
    assert internals.view_base(meta.t()) is meta  # where data pointers cannot tell them apart


def test_function_mode_on_top_is_the_innermost_mode():
    from torch.overrides import TorchFunctionMode

    outer, inner = TorchFunctionMode(), TorchFunctionMode()
    assert not internals.function_mode_on_top(outer)
    with outer:
        assert internals.function_mode_on_top(outer)
        with inner:
            assert internals.function_mode_on_top(inner)
            assert not internals.function_mode_on_top(outer)
        assert internals.function_mode_on_top(outer)


@pytest.mark.slow
def test_flop_counter_class_lets_a_compiled_function_run_and_counts_it():
    """torch.compile refuses to run under a plain dispatch mode; the counter's mode lets it, and
    sees the compiled code's matrix products at run time (4 x 6 x 5 multiply-adds, forward)."""
    calls: list[str] = []
    counter = internals.flop_counter_class(lambda m, p, o, a, k: calls.append(p.__name__))
    product = torch.compile(lambda a, b: (a @ b).relu(), fullgraph=True)
    with counter(display=False):
        out = product(torch.ones(4, 6), torch.ones(6, 5))
    assert out.shape == (4, 5)
    assert "mm" in calls


@pytest.mark.slow
def test_in_compiled_frame_is_true_in_a_compiled_call_and_its_eager_parts():
    """The meter's hook, eager inside a compiled call (a disabled function), is told it runs
    inside one; under the force_eager stance too (the wrapper runs the code eagerly)."""
    seen: list[bool] = []
    probe = torch.compiler.disable(lambda: seen.append(internals.in_compiled_frame()))

    def step(x: torch.Tensor) -> torch.Tensor:
        probe()
        return x + 1

    compiled = torch.compile(step, backend="eager")
    step(torch.ones(2))
    compiled(torch.ones(2))
    with torch.compiler.set_stance("force_eager"):
        compiled(torch.ones(2))
    assert seen == [False, True, True]
    assert internals.in_compiled_frame() is False


@pytest.mark.slow
def test_dynamo_graphs_compiled_counts_a_new_compilation():
    before = internals.dynamo_graphs_compiled()
    torch.compile(lambda x: x.sin() + 1, fullgraph=True)(torch.ones(3))
    assert internals.dynamo_graphs_compiled() == before + 1


def test_in_custom_function_backward_is_true_only_inside_a_custom_backward():
    seen: list[tuple[str, bool]] = []

    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            seen.append(("forward", internals.in_custom_function_backward()))
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            seen.append(("backward", internals.in_custom_function_backward()))
            return grad * 2

    x = torch.ones(3, requires_grad=True)
    y = Double.apply(x).sum()
    x.register_hook(lambda g: seen.append(("hook", internals.in_custom_function_backward())))
    y.backward()
    assert seen == [("forward", False), ("backward", True), ("hook", False)]
    assert internals.in_custom_function_backward() is False


#: Private names of PyTorch, Transformers and the meter that only flopmeter/internals.py may
#: touch (the meter's own private attributes by ``meter._``, from the zero-code paths).
_PRIVATE = re.compile(
    r"\b_getframe\b|\._parameters\b|\._modules\b|\b_local_tensor\b|\b_name_or_path\b"
    r"|\bmeter\._[a-z]|torch\._C\b|\._orig_mod\b|_fsdp_flat_param\b"
)


def test_no_private_name_is_touched_outside_the_fence():
    root = Path(flopmeter.__file__).parent
    paths = [*root.rglob("*.py"), *(root.parents[1] / "integrations").rglob("*.py")]
    found = []
    for path in paths:
        if path.name == "internals.py":
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            code = line.split("#", 1)[0]
            if _PRIVATE.search(code) and not code.lstrip().startswith(('"', "'")):
                found.append(f"{path.relative_to(root.parents[1])}:{number}: {line.strip()}")
    assert found == []


def test_fsdp2_mesh_is_the_mesh_fully_shard_shards_a_module_over(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    store = f"file://{tmp_path / 'store'}"
    dist.init_process_group("gloo", init_method=store, rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp",))
        net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))
        fully_shard(net[0], mesh=mesh)
        assert internals.fsdp2_mesh(net[0]) == mesh
        assert internals.fsdp2_mesh(net[1]) is None  # not sharded
        assert internals.fsdp2_mesh(net) is None
    finally:
        dist.destroy_process_group()
