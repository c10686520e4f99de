"""Parameter census under FSDP on two gloo processes: every rank counts the full logical model.

FSDP1 with ``use_orig_params=True`` (the default of HF Accelerate and the Trainer) leaves the
original parameters in ``model.parameters()`` as views into this rank's shard, so ``numel()``
there is a piece of the parameter, or 0. With ``use_orig_params=False`` the model holds one flat
parameter per FSDP unit instead. FSDP2 (``fully_shard``) holds DTensors. In every case the
census must equal the unwrapped model's own count, tied weights once, nothing counted twice.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from flopmeter import FlopMeter
from flopmeter.counting.census import take_census
from tests.support.batches import PAD_ID, padded_batch
from tests.support.dist import gloo_group
from tests.support.models import tiny_llama

# spawns gloo processes: one rerun for gloo's teardown abort alone (tests/conftest.py)
pytestmark = pytest.mark.gloo

fsdp = pytest.importorskip("torch.distributed.fsdp")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

VOCAB, WIDTH, HIDDEN = 11, 6, 5
# Counted by hand: an embedding tied to the output projection (once), two trainable linears
# with odd sizes (so a shard boundary falls inside a parameter), one frozen linear.
TIED = VOCAB * WIDTH  # 66
UP = WIDTH * HIDDEN + HIDDEN  # 35
DOWN = HIDDEN * WIDTH + WIDTH  # 36
FROZEN = WIDTH * WIDTH + WIDTH  # 42
TOTAL, TRAINABLE = TIED + UP + DOWN + FROZEN, TIED + UP + DOWN  # 179, 137
LLAMA_TOTAL = 24800  # tiny_llama, untied: see tests/test_census.py


class TiedNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        # The head is registered first, so FSDP files the tied table under the head (a
        # Linear) and records the embedding as the sharing module.
        self.head = nn.Linear(WIDTH, VOCAB, bias=False)
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.embed.weight = self.head.weight
        self.up = nn.Linear(WIDTH, HIDDEN)
        self.down = nn.Linear(HIDDEN, WIDTH)
        self.frozen = nn.Linear(WIDTH, WIDTH)
        self.frozen.requires_grad_(False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.frozen(self.down(torch.relu(self.up(self.embed(ids))))))


def _own_count(model: nn.Module) -> dict[str, int]:
    """The unwrapped model's count, from its own parameters (tied weights are one object)."""
    params = {id(p): p for p in model.parameters()}.values()
    return {
        "n_total": sum(p.numel() for p in params),
        "n_trainable": sum(p.numel() for p in params if p.requires_grad),
        "n_embedding": model.embed.weight.numel(),
    }


def _census(model: nn.Module) -> dict[str, int]:
    c = take_census(model)
    return {
        "n_total": c.n_total,
        "n_trainable": c.n_trainable,
        "n_embedding": c.n_embedding,
        "n_partitioned": c.n_partitioned,
    }


def _step(model: nn.Module) -> None:
    ids = torch.arange(8).reshape(2, 4) % VOCAB
    model(ids).sum().backward()


def _fsdp1(use_orig_params: bool) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    net = TiedNet()
    own = _own_count(net)
    cpu = torch.device("cpu")
    net.up = FSDP(net.up, device_id=cpu, use_orig_params=use_orig_params)
    net.frozen = FSDP(net.frozen, device_id=cpu, use_orig_params=use_orig_params)
    model = FSDP(net, device_id=cpu, use_orig_params=use_orig_params)
    local = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    before = _census(model)
    _step(model)
    return {"own": own, "local": local, "before": before, "after": _census(model)}


def _fsdp2() -> dict:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (2,))
    net = TiedNet()
    own = _own_count(net)
    fully_shard(net.up, mesh=mesh)
    fully_shard(net.frozen, mesh=mesh)
    fully_shard(net, mesh=mesh)
    local = sum(p.to_local().numel() for p in {id(p): p for p in net.parameters()}.values())
    before = _census(net)
    _step(net)
    return {"own": own, "local": local, "before": before, "after": _census(net)}


def _meter_run(out_dir: str, rank: int) -> dict:
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer

    llama = tiny_llama()
    own = sum(p.numel() for p in llama.parameters())
    model = FSDP(
        llama,
        device_id=torch.device("cpu"),
        use_orig_params=True,
        auto_wrap_policy=ModuleWrapPolicy({LlamaDecoderLayer}),
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    output = Path(out_dir) / "report.json"
    with FlopMeter(model, PAD_ID, output=output):
        for i, rows in enumerate([[16, 3], [7, 7]]):
            model(**padded_batch(rows, 16, seed=10 * rank + i)).loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    return {"own": own}


def _worker(rank: int, store: str, out_dir: str) -> None:
    with gloo_group(rank, 2, store):
        result = {
            "fsdp1_orig_params": _fsdp1(use_orig_params=True),
            "fsdp1_flat_params": _fsdp1(use_orig_params=False),
            "fsdp2": _fsdp2(),
            "meter": _meter_run(out_dir, rank),
        }
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("fsdp")
    mp.spawn(_worker, args=(str(out / "store"), str(out)), nprocs=2, join=True)
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    ranks[0]["report"] = json.loads((out / "report.json").read_text())
    return ranks


@pytest.mark.slow
@pytest.mark.parametrize("case", ["fsdp1_orig_params", "fsdp1_flat_params", "fsdp2"])
def test_every_rank_counts_the_whole_unsharded_model(ranks, case):
    for rank in ranks:
        r = rank[case]
        assert r["own"] == {"n_total": TOTAL, "n_trainable": TRAINABLE, "n_embedding": TIED}
        # The shard really is a piece: what this rank stores is less than the model.
        assert r["local"] < TOTAL
        for when in ("before", "after"):  # before training, and after a forward and backward
            census = r[when]
            assert {k: v for k, v in census.items() if k != "n_partitioned"} == r["own"], when
        # Outside a forward every parameter is sharded over the two ranks.
        assert r["before"]["n_partitioned"] == TOTAL
        assert r["after"]["n_partitioned"] == TOTAL


@pytest.mark.slow
def test_meter_under_fsdp_reports_the_whole_model(ranks):
    report = ranks[0]["report"]  # rank 0 writes it
    assert ranks[0]["meter"]["own"] == ranks[1]["meter"]["own"] == LLAMA_TOTAL
    assert report["run"]["world_size"] == 2
    assert report["model"]["n_total"] == LLAMA_TOTAL
    assert report["model"]["n_trainable"] == LLAMA_TOTAL
