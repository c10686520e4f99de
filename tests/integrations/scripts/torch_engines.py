"""torch's own engines on CPU gloo ranks under torchrun, each metered with ``FlopMeter``, for
tests/integrations/test_torch_engines.py: DDP, FSDP2 (``fully_shard``), a (dp, tp) device mesh
(the Llama's linears under ``parallelize_module``, FSDP2 over the dp dimension), and
Accelerate's FSDP2 plugin on the CPU (``accelerate-fsdp2``: what ``prepare`` gives back).

``torchrun ... torch_engines.py OUT ENGINE [BUDGET]``: data-parallel replica ``d`` (the rank
under DDP and FSDP2, the dp coordinate on the mesh, shared by its tp ranks) trains up to
``STEPS`` optimizer steps, one micro-batch ``micro_batch(d, step)`` each, and stops when the
meter says so (``meter.should_stop``, with a budget of BUDGET FLOP). Rank 0 writes
OUT/flops_meter.json; every rank writes OUT/rank{r}.json: the step it stopped at and its own
copy of the final report's figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import torch
import torch.distributed as dist

from tests.support.models import tiny_llama

STEPS, ROWS = 4, 2


def micro_batch(replica: int, step: int) -> torch.Tensor:
    """The token ids replica ``replica`` trains on at ``step`` (1-based): ``ROWS`` rows of
    ``8 * (replica + 1)`` tokens, no padding (pad id 0 is never drawn), so every replica feeds a
    different count and every step costs the same."""
    g = torch.Generator().manual_seed(100 * replica + step)
    return torch.randint(1, 97, (ROWS, 8 * (replica + 1)), generator=g)


def _tensor_parallel(model: torch.nn.Module, mesh) -> None:
    """The Megatron split of each layer's linears over ``mesh``: q, k, v, gate and up by
    columns, o and down by rows."""
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    for layer in model.model.layers:
        plan = {f"self_attn.{n}": ColwiseParallel() for n in ("q_proj", "k_proj", "v_proj")}
        plan.update({"self_attn.o_proj": RowwiseParallel(), "mlp.down_proj": RowwiseParallel()})
        plan.update({"mlp.gate_proj": ColwiseParallel(), "mlp.up_proj": ColwiseParallel()})
        parallelize_module(layer, mesh, plan)


def wrapped(engine: str) -> tuple[torch.nn.Module, int]:
    """The tiny Llama under ``engine`` and this rank's data-parallel replica."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model, rank = tiny_llama(), dist.get_rank()
    if engine == "ddp":
        return torch.nn.parallel.DistributedDataParallel(model), rank
    if engine == "fsdp2":
        for layer in model.model.layers:
            fully_shard(layer)
        return fully_shard(model), rank
    mesh = init_device_mesh("cpu", (dist.get_world_size() // 2, 2), mesh_dim_names=("dp", "tp"))
    _tensor_parallel(model, mesh["tp"])
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    return fully_shard(model, mesh=mesh["dp"]), mesh["dp"].get_local_rank()


def accelerate_fsdp2() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The tiny Llama and its optimizer as ``Accelerator(cpu=True, fsdp_plugin=...)`` (FSDP
    version 2) prepares them; the Accelerator joins the gloo group."""
    from accelerate import Accelerator
    from accelerate.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))
    model = tiny_llama()
    return accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=1e-3))


def main() -> None:
    from flopmeter import FlopMeter

    out, engine = Path(sys.argv[1]), sys.argv[2]
    budget = float(sys.argv[3]) if len(sys.argv) > 3 else None
    torch.set_num_threads(1)
    if engine == "accelerate-fsdp2":
        model, optimizer = accelerate_fsdp2()
        replica = dist.get_rank()
    else:
        dist.init_process_group("gloo")
        model, replica = wrapped(engine)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    stopped_at = None
    with FlopMeter(model, 0, output=out / "flops_meter.json", budget=budget) as meter:
        for step in range(1, STEPS + 1):
            ids = micro_batch(replica, step)
            model(input_ids=ids, labels=ids).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if meter.should_stop:
                stopped_at = step
                break
    r = meter.report()
    facts = {"replica": replica, "stopped_at": stopped_at, "tokens": r.tokens.tokens_processed,
             "steps": r.tokens.optimizer_steps, "flops": r.compute.primary_flops,
             "model_class": type(model).__name__}  # fmt: skip
    (out / f"rank{dist.get_rank()}.json").write_text(json.dumps(facts), encoding="utf-8")
    dist.barrier()  # no rank tears gloo down while a peer still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
