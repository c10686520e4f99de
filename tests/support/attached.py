"""The zero-code trainer tests' runs: a script of tests/integrations/scripts/zero_code run
plainly or under zero-code metering, its report's counts, and the job folder's records."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support.exits import assert_exit_ok
from tests.support.shared_runs import SharedRuns
from tests.support.zero_code import clean_env, launch

SCRIPTS = Path(__file__).resolve().parents[1] / "integrations" / "scripts" / "zero_code"


def run_script(
    script: str,
    out: Path,
    *args: str,
    launcher: str | None,
    job: Path | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Runs ``SCRIPTS/script OUT args`` plainly (``launcher=None``) or under zero-code metering
    with the job folder ``job``; fails the test when it exits non-zero."""
    out.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(SCRIPTS / script), str(out), *args]
    extra = dict(env or {})
    if job is not None:
        job.mkdir(parents=True, exist_ok=True)
        extra["FLOPMETER_JOB_DIR"] = str(job)
    if launcher is None:
        done = subprocess.run(
            command,
            cwd=out,
            env=clean_env(extra),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    else:
        done = launch(command, launcher=launcher, cwd=out, env=extra)
    assert_exit_ok(done)
    return done


def plain_run(runs: SharedRuns, script: str, out: Path, *args: str) -> Path:
    """``out`` holding the files ``run_script(script, out, *args, launcher=None)`` leaves: a
    plain run (no zero-code; ``--edited`` or ``--with-meter`` for the script's own meter) is
    deterministic, so the session makes each argument set once and copies it
    (tests/support/shared_runs.py). For the baselines a test compares its metered run with."""
    key = json.dumps({"script": script, "args": list(args)})
    return runs.copy(key, out, lambda folder: run_script(script, folder, *args, launcher=None))


def report(path: Path) -> dict[str, Any]:
    """The report file at ``path`` (a folder: its ``flops_meter.json``)."""
    path = path / "flops_meter.json" if path.is_dir() else path
    return json.loads(path.read_text(encoding="utf-8"))


def counts(data: dict[str, Any]) -> dict[str, Any]:
    """What two runs of one training must agree on: every token count, the primary compute and
    each estimate's FLOP."""
    tokens = {k: v for k, v in data["tokens"].items() if k != "tokens_meaning"}
    compute = data["compute"]
    estimates = {name: e.get("flops") for name, e in (compute.get("estimates") or {}).items()}
    return {"tokens": tokens, "primary_flops": compute["primary_flops"], "estimates": estimates}


def facts(out: Path) -> dict[str, Any]:
    """What the script wrote of its trainer (``facts.json``: callbacks, global step)."""
    return json.loads((out / "facts.json").read_text(encoding="utf-8"))


def report_files(out: Path) -> list[str]:
    """The report files in ``out`` (every ``*.json`` but the script's ``facts.json``)."""
    return sorted(p.name for p in out.glob("*.json") if p.name != "facts.json")


def meter_records(job: Path) -> list[dict[str, Any]]:
    """The job folder's records of meters (all but each process's ``boot`` and ``torch``
    import), oldest first."""
    from flopmeter.auto.job import read_records

    return [r for r in read_records(job) if r["event"] not in ("boot", "torch")]


def events(job: Path) -> list[str]:
    """The events of :func:`meter_records`, oldest first."""
    return [r["event"] for r in meter_records(job)]


def assert_each_run_named(
    done: subprocess.CompletedProcess[str], out: Path, runs: int, tokens: int, alone: Path
) -> None:
    """The end of a job of ``runs`` runs that each trained the same way, writing into ``out``:
    every run's report is kept in a file of its own (the last at ``flops_meter.json``, the
    earlier ones beside it under their run ids), each holds the counts of the same training run
    alone (``alone``'s report) and ``tokens`` non-padding tokens (counted by the test), and the
    job's end names each file once, then the total: the sum of the runs' tokens and compute."""
    files = sorted(
        out.glob("flops_meter*.json"),
        key=lambda p: (p.name == "flops_meter.json", report(p)["run"]["started_at"]),
    )
    assert len(files) == runs, report_files(out)
    data = [report(p) for p in files]
    assert files[-1].name == "flops_meter.json"
    for path, each in zip(files[:-1], data[:-1], strict=True):
        assert path.name == f"flops_meter.{each['run']['run_id']}.json"  # kept aside, its own
    assert len({each["run"]["run_id"] for each in data}) == runs
    for each in data:
        assert counts(each) == counts(report(alone))
        assert each["tokens"]["tokens_processed"] == tokens
        assert each["run"]["status"] == "completed"
    lines = [x for x in done.stderr.splitlines() if x.startswith("flopmeter: ")]
    named = [x.split()[2] for x in lines if x.startswith("flopmeter: report: ")]
    assert sorted(named) == sorted(str(p) for p in files)  # each run's file, once
    (total,) = [x for x in lines if x.startswith("flopmeter: job total: ")]
    flops = sum(each["compute"]["primary_flops"] for each in data)
    assert total.startswith(
        f"flopmeter: job total: {runs} runs: {runs * tokens:,} non-padding tokens, "
        f"{flops:.3e} FLOP ("
    )
    for each in data:
        assert f"run {each['run']['run_id']}: {tokens:,} tokens" in total
