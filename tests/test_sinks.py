"""The S3 and DynamoDB sinks and ``flopmeter upload`` against a local moto server over real HTTP
(boto3 is not patched): objects and items present, idempotent re-uploads, conflicting reports
refused, unreachable endpoints handled without holding up the end of a run."""

from __future__ import annotations

import json
import socket

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.cli import main
from flopmeter.errors import ConfigurationError
from flopmeter.ledger.sinks import DynamoDBSink, S3Sink, SinkPayload, deliver, parse_sinks
from flopmeter.ledger.store import Ledger
from flopmeter.report import FlopReport
from tests.support.aws import CREDENTIALS
from tests.support.batches import PAD_ID, padded_batch
from tests.support.models import tiny_llama


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed when the with ends: connections are refused


def _report(run_id: str = "run-1", **fields) -> dict:
    report = FlopReport(
        run={"run_id": run_id, "status": "completed"}, model={"name": "org/base"}, **fields
    )
    return json.loads(report.to_json())


@pytest.mark.slow
def test_s3_holds_one_object_per_run_and_a_second_upload_changes_nothing(aws):
    sink = S3Sink(aws["name"], "audit/runs", endpoint_url=aws["url"])
    payload = SinkPayload.of(_report(compute={"primary_flops": 1.5e15}))
    first = deliver(payload, [sink], 20)
    assert first[0].ok and first[0].detail == f"s3://{aws['name']}/audit/runs/run-1.json"
    obj = aws["s3"].get_object(Bucket=aws["name"], Key="audit/runs/run-1.json")
    body = obj["Body"].read().decode()
    assert json.loads(body) == _report(compute={"primary_flops": 1.5e15})
    assert obj["Metadata"]["report-sha256"] == payload.report_sha256
    again = deliver(SinkPayload.of(_report(compute={"primary_flops": 1.5e15})), [sink], 20)
    assert again[0].ok and again[0].detail.endswith("(already there)")
    keys = aws["s3"].list_objects_v2(Bucket=aws["name"])["Contents"]
    assert [k["Key"] for k in keys] == ["audit/runs/run-1.json"]
    assert keys[0]["ETag"] == obj["ETag"]


def test_s3_refuses_another_report_under_the_same_run_id(aws):
    sink = S3Sink(aws["name"], "", endpoint_url=aws["url"])
    assert deliver(SinkPayload.of(_report(tokens={"tokens_processed": 1})), [sink], 20)[0].ok
    clash = deliver(SinkPayload.of(_report(tokens={"tokens_processed": 2})), [sink], 20)[0]
    assert not clash.ok and "already holds another report" in clash.detail
    body = aws["s3"].get_object(Bucket=aws["name"], Key="run-1.json")["Body"].read()
    assert json.loads(body)["tokens"]["tokens_processed"] == 1  # not overwritten


@pytest.mark.slow
def test_dynamodb_holds_one_item_per_run_idempotently(aws):
    sink = DynamoDBSink(aws["name"], endpoint_url=aws["url"])
    report = _report(compute={"primary_flops": 2.5e16}, tokens={"tokens_processed": 4096})
    payload = SinkPayload.of(report)
    assert deliver(payload, [sink], 20)[0].ok
    assert deliver(SinkPayload.of(report), [sink], 20)[0].ok  # same report: no error
    items = aws["dynamodb"].scan(TableName=aws["name"])["Items"]
    assert len(items) == 1
    item = items[0]
    assert item["run_id"] == {"S": "run-1"}
    assert json.loads(item["report"]["S"]) == report
    assert item["report_sha256"] == {"S": payload.report_sha256}
    assert float(item["primary_flops"]["N"]) == 2.5e16
    assert int(item["tokens_processed"]["N"]) == 4096
    clash = deliver(SinkPayload.of(_report(tokens={"tokens_processed": 1})), [sink], 20)[0]
    assert not clash.ok and "already holds another report" in clash.detail


def test_a_missing_bucket_or_table_is_a_clear_failure(aws):
    outcomes = deliver(
        SinkPayload.of(_report()),
        [S3Sink("no-such-bucket", "x", endpoint_url=aws["url"]),
         DynamoDBSink("no-such-table", endpoint_url=aws["url"])],
        20,
    )  # fmt: skip
    assert [o.ok for o in outcomes] == [False, False]
    assert "NoSuchBucket" in outcomes[0].detail
    assert "ResourceNotFound" in outcomes[1].detail


@pytest.mark.slow
def test_an_endpoint_that_never_answers_is_given_up_at_the_deadline(aws):
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        outcomes = deliver(SinkPayload.of(_report()), [S3Sink("b-x", "p", endpoint_url=url)], 1.0)
    assert not outcomes[0].ok and outcomes[0].detail == "s3://b-x/p: not done within 1 s"


@pytest.mark.slow
def test_the_meter_copies_its_report_with_its_ledger_record(aws, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", aws["url"])
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    sinks = [f"s3://{aws['name']}/runs", f"dynamodb://{aws['name']}"]
    ledger = tmp_path / "ledger.sqlite"
    with FlopMeter(model, PAD_ID, output=tmp_path / "r.json", ledger=ledger, sinks=sinks) as meter:
        model(**padded_batch([5, 7], 8)).loss.backward()
        optimizer.step()
    assert not meter.problems
    record = Ledger(ledger, create=False).records()[0]
    obj = aws["s3"].get_object(Bucket=aws["name"], Key=f"runs/{meter.run_id}.json")
    assert json.loads(obj["Body"].read()) == json.loads((tmp_path / "r.json").read_text())
    assert obj["Metadata"]["ledger-chain-hash"] == record.chain_hash
    assert obj["Metadata"]["ledger-seq"] == "1"
    item = aws["dynamodb"].get_item(TableName=aws["name"], Key={"run_id": {"S": meter.run_id}})
    assert item["Item"]["ledger_chain_hash"] == {"S": record.chain_hash}
    assert item["Item"]["report_sha256"] == {"S": record.report_sha256}


@pytest.mark.slow
def test_an_unreachable_sink_inside_training_is_a_warning_not_a_crash(
    tmp_path, monkeypatch, caplog
):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    model = tiny_llama()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    with FlopMeter(
        model, PAD_ID, output=tmp_path / "r.json", sinks="s3://b-x/p", sink_timeout_seconds=2
    ) as meter:
        model(**padded_batch([5, 7], 8)).loss.backward()
        optimizer.step()
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["run"]["status"] == "completed" and report["tokens"]["tokens_processed"] == 12
    problem = meter.problems["sink s3://b-x/p"]  # refused, or still retrying at the deadline
    assert "Could not connect" in problem or "not done within 2 s" in problem
    assert "not copied to s3://b-x/p" in caplog.text


def test_sink_specs_are_checked_when_the_meter_is_made(monkeypatch):
    assert [s.name for s in parse_sinks("s3://b/p/q, dynamodb://t")] == [
        "s3://b/p/q",
        "dynamodb://t",
    ]
    for bad in ("http://x", "s3://", "dynamodb://t/extra", 3):
        with pytest.raises(ConfigurationError, match="not a sink"):
            parse_sinks(bad)
    monkeypatch.setenv("FLOPMETER_SINKS", "ftp://nowhere")
    with pytest.raises(ConfigurationError, match="not a sink"):
        FlopMeter(tiny_llama())


# ---------------------------------------------------------------------------- flopmeter upload
def _report_file(tmp_path):
    """A final report as the meter writes it (a real, tiny run)."""
    model = torch.nn.Sequential(torch.nn.Embedding(11, 4), torch.nn.Linear(4, 11))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with FlopMeter(model, output=tmp_path / "flops_meter.json"):
        model(torch.randint(1, 11, (2, 5))).sum().backward()
        optimizer.step()
    return tmp_path / "flops_meter.json"


@pytest.mark.slow
def test_upload_stores_the_report_once_and_again_is_a_no_op(aws, tmp_path, capsys):
    path = _report_file(tmp_path)
    run_id = json.loads(path.read_text())["run"]["run_id"]
    args = ["upload", str(path), "--s3", f"s3://{aws['name']}/pipe",
            "--dynamodb-table", aws["name"], "--endpoint-url", aws["url"]]  # fmt: skip
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"stored: s3://{aws['name']}/pipe/{run_id}.json" in out
    assert f"stored: dynamodb://{aws['name']} run_id={run_id}" in out
    assert main(args) == 0
    assert "(already there)" in capsys.readouterr().out
    body = aws["s3"].get_object(Bucket=aws["name"], Key=f"pipe/{run_id}.json")["Body"].read()
    assert json.loads(body) == json.loads(path.read_text())


@pytest.mark.slow
def test_upload_to_an_unreachable_endpoint_is_one_line_and_exit_1(tmp_path, capsys, monkeypatch):
    for key, value in CREDENTIALS.items():
        monkeypatch.setenv(key, value)
    path = _report_file(tmp_path)
    url = f"http://127.0.0.1:{_closed_port()}"
    status = main(["upload", str(path), "--s3", "s3://b-x/p", "--endpoint-url", url,
                   "--timeout", "2"])  # fmt: skip
    err = capsys.readouterr().err
    assert status == 1
    assert err.count("\n") == 1 and err.startswith("flopmeter: error: s3://b-x/p: ")
    assert "Could not connect" in err or "not done within 2 s" in err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"Flops_architecture": 1.0, "exceeds_30pct": false}', "AWS FlopsMeterCallback"),
        (None, "not final"),
    ],
)
def test_upload_refuses_a_file_that_is_not_a_final_report(tmp_path, capsys, content, message):
    path = tmp_path / "flops_meter.json"
    if content is None:
        path.write_text(FlopReport(run={"run_id": "r", "status": "running"}).to_json())
    else:
        path.write_text(content)
    assert main(["upload", str(path), "--s3", "s3://b-x/p"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_upload_needs_a_destination(tmp_path, capsys):
    assert main(["upload", str(_report_file(tmp_path))]) == 2
    assert "--s3" in capsys.readouterr().err


def test_upload_of_the_aws_keyed_copy_names_the_full_report_beside_it(tmp_path, capsys):
    from flopmeter.report.output_path import FULL_REPORT_FILENAME
    from flopmeter.report.output_path import FULL_REPORT_FILENAME as WRITTEN_BY_THE_CALLBACK
    from flopmeter.report.reading import read_report
    from flopmeter.report.sagemaker import aws_keyed_report

    assert FULL_REPORT_FILENAME == WRITTEN_BY_THE_CALLBACK
    # what FlopMeterCallback(aws_keys=True) leaves in SageMaker's output folder: the AWS-keyed
    # flops_meter.json (with run_id and schema_version) and the full report beside it
    report = read_report(_report_file(tmp_path / "run"))
    folder = tmp_path / "opt_ml_output_data"
    folder.mkdir()
    aws_copy = folder / "flops_meter.json"
    aws_copy.write_text(json.dumps(aws_keyed_report(report, {"TRAINING_JOB_NAME": "job"})))
    (folder / FULL_REPORT_FILENAME).write_text(report.to_json())
    assert main(["upload", str(aws_copy), "--s3", "s3://b-x/p"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "AWS-keyed copy" in err
    assert f"upload {folder / FULL_REPORT_FILENAME} beside it" in err
    assert "not there" not in err
    (folder / FULL_REPORT_FILENAME).unlink()
    assert main(["upload", str(aws_copy), "--s3", "s3://b-x/p"]) == 2
    assert "not there now" in capsys.readouterr().err
