"""The framework tests' pieces (axolotl, LLaMA-Factory): each framework's own virtual
environment (scripts/framework_venv), the tiny model and dataset made with its python, the
configs, the runs, and what a report and the trainer's own inputs say."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tests.support.zero_code import clean_env

ROOT = Path(__file__).resolve().parents[2]
#: The scripts the framework processes run or import (on their PYTHONPATH).
SCRIPTS = ROOT / "tests" / "integrations" / "scripts" / "frameworks"
#: The plugin line the axolotl tests put in the YAML.
PLUGIN = "flopmeter.integrations.axolotl.FlopMeterPlugin"
#: The tests' own axolotl plugin counting what the trainer fed (scripts/ax_fed_tokens.py).
FED_PLUGIN = "ax_fed_tokens.FedTokensPlugin"


def framework_python(name: str) -> Path:
    """The python of ``.venv-NAME``, made by ``scripts/framework_venv NAME`` when missing or
    stale (minutes the first time); fails the test when it cannot be made."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "framework_venv"), name],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    assert done.returncode == 0, f"scripts/framework_venv {name} failed:\n{done.stderr[-4000:]}"
    return Path(done.stdout.strip().splitlines()[-1])


def framework_env(python: Path, home: Path, extra: Mapping[str, str] | None = None) -> dict:
    """The variables a framework run needs beside the cleaned environment: its venv's bin first
    on PATH (axolotl execs ``accelerate launch``), the scripts on PYTHONPATH, nothing fetched or
    reported over the network, the Hugging Face caches under ``home``."""
    env = {
        "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(SCRIPTS), os.environ.get("PYTHONPATH")])),
        "HF_HOME": str(home),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "AXOLOTL_DO_NOT_TRACK": "1",  # else axolotl waits on its telemetry
        "DO_NOT_TRACK": "1",
        "WANDB_DISABLED": "true",
        "CUDA_VISIBLE_DEVICES": "",
    }
    env.update(extra or {})
    return env


def run_plain(
    command: Sequence[str], *, cwd: Path, env: Mapping[str, str], timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` without zero-code metering (the cleaned environment plus ``env``)."""
    return subprocess.run(
        list(command),
        cwd=cwd,
        env=clean_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def make_tiny(python: Path, out: Path) -> Path:
    """The tiny Llama, its tokenizer and the alpaca dataset, written by ``python`` into
    ``out`` (``out/model``, ``out/data``)."""
    done = run_plain([str(python), str(SCRIPTS / "make_tiny.py"), str(out)], cwd=out.parent,
                     env={}, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def framework_and_tiny(name: str, folder: Path) -> tuple[Path, Path]:
    """The python of framework ``name``'s venv (made on first use) and a tiny model made
    with it under ``folder/tiny``: what each framework module's fixture holds."""
    python = framework_python(name)
    return python, make_tiny(python, folder / "tiny")


def axolotl_config(tiny: Path, run: Path, plugins: Sequence[str], **extra: Any) -> Path:
    """``run/cfg.yml``: a LoRA run of 4 steps of 2 sequences on the tiny model (JSON, which
    is YAML), with ``plugins``; ``extra`` keys added as they are."""
    cfg = {
        "base_model": str(tiny / "model"),
        "tokenizer_config": str(tiny / "model"),
        "plugins": list(plugins),
        "datasets": [
            {"path": str(tiny / "data" / "tiny_alpaca.jsonl"), "ds_type": "json", "type": "alpaca"}
        ],
        "dataset_prepared_path": str(run / "prepared"),
        "val_set_size": 0,
        "seed": 42,  # axolotl shuffles the dataset with a fresh seed when none is given
        "output_dir": str(run / "out"),
        "sequence_len": 128,
        "sample_packing": False,
        "adapter": "lora",
        "lora_r": 4,
        "lora_alpha": 8,
        "lora_dropout": 0.0,
        "lora_target_linear": True,
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "num_epochs": 1,
        "max_steps": 4,
        "optimizer": "adamw_torch",
        "lr_scheduler": "cosine",
        "learning_rate": 0.001,
        "logging_steps": 1,
        "save_strategy": "no",
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "flash_attention": False,
        "sdp_attention": False,
        "gradient_checkpointing": False,
        "dataloader_num_workers": 0,
        # axolotl's fused LoRA kernels need a GPU
        "lora_mlp_kernel": False,
        "lora_qkv_kernel": False,
        "lora_o_kernel": False,
        "lora_embedding_kernel": False,
        **extra,
    }
    run.mkdir(parents=True, exist_ok=True)
    path = run / "cfg.yml"
    path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return path


def llamafactory_config(tiny: Path, run: Path) -> Path:
    """``run/cfg.yaml``: an SFT LoRA run of 4 steps of 2 sequences on the tiny model (JSON,
    which is YAML)."""
    cfg = {
        "model_name_or_path": str(tiny / "model"),
        "trust_remote_code": False,
        "stage": "sft",
        "do_train": True,
        "finetuning_type": "lora",
        "lora_rank": 4,
        "lora_target": "all",
        "dataset": "tiny_alpaca",
        "dataset_dir": str(tiny / "data"),
        "template": "default",
        "cutoff_len": 128,
        "overwrite_cache": True,
        "preprocessing_num_workers": 1,
        "dataloader_num_workers": 0,
        "output_dir": str(run / "out"),
        "logging_steps": 1,
        "save_strategy": "no",
        "plot_loss": False,
        "overwrite_output_dir": True,
        "report_to": "none",
        "per_device_train_batch_size": 2,
        "gradient_accumulation_steps": 1,
        "learning_rate": 1.0e-3,
        "max_steps": 4,
        "lr_scheduler_type": "cosine",
        "bf16": False,
        "fp16": False,
    }
    run.mkdir(parents=True, exist_ok=True)
    path = run / "cfg.yaml"
    path.write_text(json.dumps(cfg, indent=1), encoding="utf-8")
    return path


def read_json(path: Path) -> dict[str, Any]:
    """A JSON file (a report: a folder means its ``flops_meter.json``)."""
    path = path / "flops_meter.json" if path.is_dir() else path
    return json.loads(path.read_text(encoding="utf-8"))


def counts(report: Mapping[str, Any]) -> dict[str, Any]:
    """What two runs of one training must agree on: every token count, the primary compute
    and each estimate's FLOP."""
    tokens = {k: v for k, v in report["tokens"].items() if k != "tokens_meaning"}
    compute = report["compute"]
    estimates = {name: e.get("flops") for name, e in (compute.get("estimates") or {}).items()}
    return {"tokens": tokens, "primary_flops": compute["primary_flops"], "estimates": estimates}


def report_files(folder: Path) -> list[str]:
    """The flopmeter report files in ``folder`` (``flops_meter*.json``)."""
    return sorted(p.name for p in folder.glob("flops_meter*.json"))


def report_lines(done: subprocess.CompletedProcess[str]) -> list[str]:
    """The job's end's lines naming its reports (``flopmeter: report: PATH (...)``)."""
    return [line for line in done.stderr.splitlines() if line.startswith("flopmeter: report: ")]
