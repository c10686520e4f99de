"""Integers no meter can write (past a 64-bit count, or past Python's 4,300 digits for text) are
refused by the strict reader by field, in one line; a neighbour file holding one is skipped with
a note when a parent is looked up by run id, never an "unexpected" error. A secret in a failed
run's error is redacted in every form an exception message takes."""

from __future__ import annotations

import json

import pytest
import torch

from flopmeter import FlopMeter
from flopmeter.cli import main
from tests.support.reports import valid_data


def _hostile(tmp_path, digits: int):
    data = valid_data()
    text = json.dumps(data)
    count = f'"tokens_processed": {data["tokens"]["tokens_processed"]}'
    path = tmp_path / "hostile.json"
    path.write_text(text.replace(count, '"tokens_processed": 1' + "0" * digits))
    return path


def test_a_count_past_64_bits_is_refused_by_field(tmp_path, capsys):
    for digits in (20, 400):
        status = main(["report", str(_hostile(tmp_path, digits))])
        err = capsys.readouterr().err.strip()
        assert status == 2 and "unexpected" not in err, err
        assert "tokens.tokens_processed" in err and "2^63 - 1" in err


def test_an_integer_past_the_text_limit_is_refused(tmp_path, capsys):
    status = main(["report", str(_hostile(tmp_path, 5000))])
    err = capsys.readouterr().err.strip()
    assert status == 2 and "unexpected" not in err and "not valid JSON" in err


def test_a_parent_looked_up_by_run_id_skips_a_hostile_neighbour(tmp_path, caplog):
    _hostile(tmp_path, 400)
    parent = valid_data()
    (tmp_path / "parent.json").write_text(json.dumps(parent))
    model = torch.nn.Linear(2, 2)
    meter = FlopMeter(model, parent_runs=[parent["run"]["run_id"]], output=tmp_path / "new.json")
    assert [p.run_id for p in meter.parents] == [parent["run"]["run_id"]]
    assert any(
        "hostile.json" in r.getMessage() and "2^63" in r.getMessage() for r in caplog.records
    )


SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"


@pytest.mark.parametrize(
    "message",
    [
        f"bad credentials: aws_secret_access_key = {SECRET}",
        f"{{'aws_secret_access_key': '{SECRET}', 'region': 'eu-west-1'}}",  # a dict's repr
        f'{{"aws_session_token": "{SECRET}"}}',
        f"aws_secret_access_key = 'wJalr {SECRET}' in the profile",  # a quoted value with a space
        f"export AWS_SECRET_ACCESS_KEY {SECRET}",
        f"password => '{SECRET}'",
    ],
)
def test_a_secret_in_a_failed_runs_error_is_redacted_in_every_form(tmp_path, message):
    model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError), FlopMeter(model, output=tmp_path / "r.json"):
        raise RuntimeError(message)
    text = (tmp_path / "r.json").read_text()
    error = json.loads(text)["run"]["error"]
    assert "wJalr" not in text and "[REDACTED]" in error, error


def _read_back(tmp_path, data):
    from flopmeter import ReportFileError, read_report

    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ReportFileError) as caught:
        read_report(path)
    return caught.value


@pytest.mark.parametrize(
    ("attach", "says"),
    [
        ({"method": None, "reason": "another meter held the file"}, "was not measured"),
        ({"method": "optimizer", "unseen_micro_batches": True}, "measured in part only"),
    ],
)
def test_the_strict_reader_refuses_a_verdict_on_a_run_not_measured(tmp_path, attach, says):
    data = valid_data()
    assert data["verdict"]["outcome"] is not None
    blank = dict.fromkeys(
        ("method", "launcher", "job_id", "trainer_class", "model_class", "found",
         "unseen_micro_batches", "reason"),
    )  # fmt: skip
    data["attach"] = {**blank, **attach}
    error = _read_back(tmp_path, data)
    assert error.field == "verdict.outcome" and says in str(error)


def test_a_2_1_report_without_its_attach_section_is_refused(tmp_path):
    data = valid_data()
    del data["attach"]
    for version in ("2.1", "2.2"):
        data["schema_version"] = version
        error = _read_back(tmp_path, data)
        assert error.field == "attach" and "missing" in str(error)
