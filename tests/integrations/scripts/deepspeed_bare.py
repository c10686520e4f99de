"""A raw DeepSpeed loop that never mentions flopmeter (``python deepspeed_bare.py STAGE``): the
model, data and config of deepspeed_runs.py, for zero-code metering (tests/integrations/
test_deepspeed.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed

sys.path.insert(0, str(Path(__file__).parent))
import deepspeed_runs as runs

deepspeed.init_distributed(dist_backend="gloo")
net = runs.model()
engine, *_ = deepspeed.initialize(
    model=net, model_parameters=net.parameters(), config=runs.ds_config(int(sys.argv[1]))
)
for ids in runs.batches():
    engine.backward(engine(input_ids=ids, labels=ids).loss)
    engine.step()
