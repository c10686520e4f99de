"""An axolotl plugin of the tests' own: counts what the trainer axolotl built fed its model
(fed_tokens.count_fed) into the file ``FED_TOKENS_OUT`` names. Listed as
``ax_fed_tokens.FedTokensPlugin`` with this folder on PYTHONPATH."""

from __future__ import annotations

import os
from typing import Any

from axolotl.integrations.base import BasePlugin
from fed_tokens import count_fed


class FedTokensPlugin(BasePlugin):
    def post_trainer_create(self, cfg: Any, trainer: Any) -> None:
        count_fed(trainer, os.environ["FED_TOKENS_OUT"])
