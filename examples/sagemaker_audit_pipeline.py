"""The SageMaker audit step end to end, runnable on a laptop against a local moto server.

What a SageMaker job does with flopmeter, in two steps:

1. **The training job** (``train`` below): the Trainer runs with ``FlopMeterCallback`` and
   ``aws_keys=True``, so ``/opt/ml/output/data/flops_meter.json`` has the AWS meter's keys
   (``Flops_architecture``, ``exceeds_30pct``, ``pct_of_pretrain``) for the pipeline that parses
   them, the full report lies beside it, and at the end of training the report is appended to the
   ledger and copied to S3 (one object per run) and DynamoDB (one item per run).
2. **The pipeline step after the job** (``upload`` below): ``flopmeter upload`` copies the
   report again, idempotently: the same run's same report changes nothing.

Run it locally with::

    python examples/sagemaker_audit_pipeline.py --local --workdir out/sagemaker_audit

``--local`` starts a moto S3/DynamoDB server on this machine (``pip install 'moto[server]'``,
in the dev extra), points boto3 at it with fake credentials, creates the bucket and the table,
and sets the environment a SageMaker training job has (``TRAINING_JOB_NAME``,
``SM_OUTPUT_DATA_DIR`` under ``--workdir``). Without ``--local`` it uses your AWS account and
the real SageMaker environment: give ``--bucket`` and ``--table`` that exist.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

from flopmeter.integrations.hf import FlopMeterCallback

PAD_ID = 0


def start_local_aws(workdir: Path, bucket: str, table: str) -> str:
    """A moto server with the bucket and table, and the environment of a SageMaker job."""
    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's access log, one per request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
        AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=url,
        TRAINING_JOB_NAME="flopmeter-audit-demo",
        SM_OUTPUT_DATA_DIR=str(workdir / "opt_ml_output_data"),
    )  # fmt: skip
    boto3.client("s3").create_bucket(Bucket=bucket)
    boto3.client("dynamodb").create_table(
        TableName=table,
        KeySchema=[{"AttributeName": "run_id", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "run_id", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return url


def pad_batch(rows: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    width = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), width), PAD_ID)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r["input_ids"])] = r["input_ids"]
        mask[i, : len(r["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def train(workdir: Path, bucket: str, table: str, ledger: Path) -> FlopMeterCallback:
    """The training job: a small Llama-style model (built from a config, no download)."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, pad_token_id=PAD_ID,
    )  # fmt: skip
    g = torch.Generator().manual_seed(1)
    data = [{"input_ids": torch.randint(1, 512, (int(n),), generator=g)}
            for n in torch.randint(8, 33, (32,), generator=g)]  # fmt: skip
    callback = FlopMeterCallback(
        aws_keys=True,  # the AWS meter's keys in the uploaded flops_meter.json
        ledger=ledger,  # the run's record in the tamper-evident ledger
        sinks=[f"s3://{bucket}/flopmeter/runs", f"dynamodb://{table}"],
        model_name="demo/llama-tiny",
    )
    args = TrainingArguments(
        output_dir=str(workdir / "model"), per_device_train_batch_size=8, num_train_epochs=1,
        save_strategy="no", report_to=[], use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    Trainer(
        model=LlamaForCausalLM(config), args=args, train_dataset=data,
        data_collator=pad_batch, callbacks=[callback],
    ).train()  # fmt: skip
    return callback


def flopmeter(*args: str) -> None:
    """``flopmeter ARGS`` as a pipeline step runs it: a subprocess of this Python (so it works
    without the virtual environment's ``bin`` on ``PATH``)."""
    print("$ flopmeter", " ".join(args))
    sys.stdout.flush()
    subprocess.run([sys.executable, "-m", "flopmeter.cli", *args], check=True)


def upload(report: Path, bucket: str, table: str) -> None:
    """The pipeline step after the job (here a subprocess, as a pipeline runs it)."""
    flopmeter("upload", str(report), "--s3", f"s3://{bucket}/flopmeter/runs",
              "--dynamodb-table", table)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("out/sagemaker_audit"))
    parser.add_argument("--bucket", default="flopmeter-audit-demo")
    parser.add_argument("--table", default="flopmeter-runs")
    parser.add_argument("--local", action="store_true", help="a local moto server, fake creds")
    args = parser.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    if args.local:
        start_local_aws(args.workdir, args.bucket, args.table)
    ledger = args.workdir / "ledger.sqlite"
    callback = train(args.workdir, args.bucket, args.table, ledger)
    meter = callback.meter
    assert meter is not None
    uploaded = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "/opt/ml/output/data"))
    aws = json.loads((uploaded / "flops_meter.json").read_text())
    print(f"run {meter.run_id}; sinks problems: {dict(meter.problems) or 'none'}")
    keys = ("Flops_architecture", "exceeds_30pct", "pct_of_pretrain", "training_job_name")
    print("AWS-keyed file:", json.dumps({k: aws[k] for k in keys}))
    upload(uploaded / "flopmeter_report.json", args.bucket, args.table)
    flopmeter("ledger", "verify", "--ledger", str(ledger))


if __name__ == "__main__":
    main()
