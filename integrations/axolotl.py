"""axolotl plugin: one line in the YAML adds the Hugging Face callback to the trainer axolotl
builds::

    plugins:
      - flopmeter.integrations.axolotl.FlopMeterPlugin

axolotl imports the plugin by that name in each process it trains in and calls
:meth:`FlopMeterPlugin.add_callbacks_post_trainer` once its trainer is built (an
``AxolotlTrainer``, a ``transformers.Trainer`` subclass); the plugin returns a
:class:`~flopmeter.integrations.hf.FlopMeterCallback`, which then meters the run as it meters
any Trainer (the model as trained, after PEFT wrapping; the report in ``output_dir``).

The meter's options come from the environment (``FLOPMETER_<OPTION>``, ``PRETRAIN_FLOPS``: the
variables zero-code metering reads, :func:`flopmeter.auto.env_options.options_from_env`) and
from an optional ``flopmeter:`` mapping in the YAML, which wins over them::

    flopmeter:
      pretrain_flops: 3.8e25
      model_name: meta-llama/Llama-3.1-8B

The mapping is the :class:`~flopmeter.integrations.hf.FlopMeterCallback`'s keywords (every
meter option, and ``pad_id``, ``sagemaker_output``, ``aws_keys``, ``log_compute``); they are
checked when axolotl registers the plugin, before the model loads (a
:class:`~flopmeter.errors.ConfigurationError` then stops the job before any training).

Never two meters on one run: when the trainer already holds a ``FlopMeterCallback`` (one the
user's code passed, or the one zero-code metering adds when ``FLOPMETER_AUTO`` is on), the
plugin adds none. A failure of the plugin's own beyond the options is logged and training goes
on unmetered.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field

from flopmeter.errors import ConfigurationError, MissingExtraError

try:
    from axolotl.integrations.base import BasePlugin
except ImportError:  # pragma: no cover - exercised in a test that hides axolotl
    raise MissingExtraError(
        "axolotl", "axolotl", "flopmeter.integrations.axolotl (the axolotl plugin)"
    ) from None

from flopmeter.auto.env_options import options_from_env
from flopmeter.integrations.hf import FlopMeterCallback

__all__ = ["CONFIG_KEY", "FlopMeterArgs", "FlopMeterPlugin", "plugin_options"]

logger = logging.getLogger("flopmeter")

#: The plugin's key in axolotl's YAML: a mapping of the callback's keywords.
CONFIG_KEY = "flopmeter"


class FlopMeterArgs(BaseModel):
    """The plugin's part of axolotl's config schema (axolotl refuses keys no schema names)."""

    flopmeter: dict[str, Any] | None = Field(
        None,
        description="flopmeter's options (FlopMeterCallback keywords: pretrain_flops, "
        "model_name, output, ...); they win over the FLOPMETER_* environment variables.",
    )


def plugin_options(
    cfg: Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The callback's keywords for a run: the environment's meter options, then the YAML's
    ``flopmeter:`` mapping over them.

    Args:
        cfg: axolotl's config (its parsed ``DictDefault`` or the raw mapping), or ``None``.
        environ: The environment to read; ``os.environ`` by default.

    Raises:
        ConfigurationError: ``flopmeter:`` is there and not a mapping.
    """
    given = None if cfg is None else cfg.get(CONFIG_KEY)
    if given is not None and not isinstance(given, Mapping):
        raise ConfigurationError(
            f"axolotl's '{CONFIG_KEY}:' must be a mapping of flopmeter options, "
            f"not {type(given).__name__}"
        )
    return {**options_from_env(environ), **dict(given or {})}


class FlopMeterPlugin(BasePlugin):
    """Meters an axolotl training run: ``plugins: [flopmeter.integrations.axolotl.FlopMeterPlugin]``.

    axolotl makes it with no arguments (``FlopMeterPlugin()``); everything it needs comes from
    the config and the environment (see the module docstring).
    """

    def get_input_args(self) -> str:
        """The pydantic model of the plugin's config key, by its import path."""
        return f"{__name__}.{FlopMeterArgs.__name__}"

    def register(self, cfg: dict) -> None:
        """Checks the options now, before the model loads (axolotl calls this with the raw
        config when it loads the plugin).

        Raises:
            ConfigurationError: an option (or ``PRETRAIN_FLOPS``) is invalid.
        """
        FlopMeterCallback(**plugin_options(cfg))

    def add_callbacks_post_trainer(self, cfg: Any, trainer: Any) -> list[Any]:
        """The callback for the trainer axolotl has built, or none when it has one already.

        The callback joins after the Trainer's ``__init__``, so its ``on_init_end`` never runs:
        what that does (the Trainer's ``train`` wrapped, so that a run that raises has its
        ``failed`` report on disk) is done here.

        Raises:
            ConfigurationError: an option (or ``PRETRAIN_FLOPS``) is invalid.
        """
        try:
            if any(isinstance(cb, FlopMeterCallback) for cb in trainer.callback_handler.callbacks):
                logger.warning(
                    "flopmeter: the %s already has a FlopMeterCallback; the axolotl plugin "
                    "adds none",
                    type(trainer).__qualname__,
                )
                return []
            callback = FlopMeterCallback(**plugin_options(cfg))
        except ConfigurationError:
            raise
        except Exception as exc:  # never the job's problem
            logger.error(
                "flopmeter: the axolotl plugin could not attach to the %s (%s: %s); training "
                "goes on unmetered",
                type(trainer).__qualname__,
                type(exc).__name__,
                exc,
            )
            return []
        try:
            callback._wrap_train(trainer)
        except Exception as exc:  # the meter still runs; a raising run's report comes at exit
            logger.warning(
                "flopmeter: could not wrap %s.train (%s: %s); a run that raises gets its "
                "failed report when the process exits",
                type(trainer).__qualname__,
                type(exc).__name__,
                exc,
            )
        return [callback]
