"""LLaMA-Factory trained through its Python API with the callback passed, the edited form of
``llamafactory-cli train CFG``: ``python lf_api.py CFG FED_TOKENS`` (or under ``torchrun``).
What the trainer fed is counted apart (fed_tokens) into FED_TOKENS (``FED_TOKENS.RANK`` under
torchrun)."""

from __future__ import annotations

import os
import sys

import yaml
from fed_tokens import count_fed
from llamafactory.train.sft.trainer import CustomSeq2SeqTrainer
from llamafactory.train.tuner import run_exp

from flopmeter.integrations.hf import FlopMeterCallback

if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        args = yaml.safe_load(f)
    rank = os.environ.get("RANK")
    count_fed(CustomSeq2SeqTrainer, sys.argv[2] if rank is None else f"{sys.argv[2]}.{rank}")
    run_exp(args=args, callbacks=[FlopMeterCallback()])
