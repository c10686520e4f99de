"""A Ray Train ``TorchTrainer`` with 2 CPU workers on a tiny Llama, for tests/integrations/
test_ray.py (run with the python of ``.venv-ray``).

``python ray_loop.py meter OUT``: each worker meters its loop with ``FlopMeter(model, 0,
output=OUT)``; ``python ray_loop.py bare -``: the loop never mentions flopmeter (zero-code);
``python ray_loop.py budget OUT FLOPS``: the meter with ``budget=FLOPS``, each worker stopping
when ``meter.should_stop`` says so and writing the step it stopped at to OUT.rank{r}.json.
Each worker takes every second of 8 micro-batches of 2 x 16 tokens and steps at each.
"""

from __future__ import annotations

import json
import os
import sys

import ray
import torch
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model

MODE, OUT = sys.argv[1], os.path.abspath(sys.argv[2])
BUDGET = float(sys.argv[3]) if MODE == "budget" else None


def loop(config: dict) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    context = ray.train.get_context()
    rank, world = context.get_world_rank(), context.get_world_size()
    torch.manual_seed(0)
    net = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, pad_token_id=0,
        )
    )  # fmt: skip
    model = prepare_model(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    job = [torch.randint(1, 128, (2, 16), generator=g) for _ in range(8)]

    def steps(meter=None) -> int | None:
        for step, ids in enumerate(job[rank::world], start=1):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
            if meter is not None and meter.should_stop:
                return step
        return None

    if config["mode"] == "bare":
        steps()
        return
    from flopmeter import FlopMeter

    with FlopMeter(model, 0, output=config["out"], budget=config["budget"]) as meter:
        stopped_at = steps(meter)
    if config["budget"] is not None:
        with open(f"{config['out']}.rank{rank}.json", "w", encoding="utf-8") as f:
            json.dump({"stopped_at": stopped_at}, f)


ray.init(num_cpus=2, include_dashboard=False)
trainer = TorchTrainer(
    loop,
    train_loop_config={"mode": MODE, "out": OUT, "budget": BUDGET},
    scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
    run_config=RunConfig(storage_path=os.path.abspath("ray_results"), name="exp"),
)
trainer.fit()
