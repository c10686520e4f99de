"""The plan cache of ``flopmeter estimate`` (docs/planner.md, "Speed"): a plan read back is the
plan made, byte for byte, in every format; a changed input, version or source file is a new
key; a damaged, foreign or unreadable cache file is ignored with a note and overwritten; a
cache that cannot be written is a note. Every test runs with its own empty cache folder
(tests/conftest.py sets ``FLOPMETER_CACHE_DIR``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import flopmeter
from flopmeter.cli import main
from flopmeter.planner import plan_cache
from flopmeter.planner.plan import PlanRequest
from flopmeter.planner.render import render
from tests.support.planner import CONFIG

ARGS = ["--tokens", "5000", "--seq-len", "16", "--method", "full", "--method", "lora"]


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(CONFIG))
    return path


@pytest.fixture
def builds(monkeypatch):
    """How many plans were made (not read from the cache): calls of ``model_plan``."""
    import flopmeter.planner.model_plan as module

    made = []
    real = module.model_plan

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "model_plan", counted)
    return made


def _estimate(capsys, argv):
    status = main(["estimate", *argv])
    out, err = capsys.readouterr()
    assert status == 0, err
    return out, err


def _files():
    return sorted(plan_cache.cache_folder().glob("*.json"))


@pytest.mark.parametrize("fmt", ["table", "json", "md"])
def test_a_cached_plan_is_the_plan_made_byte_for_byte(capsys, config, builds, fmt):
    argv = [str(config), *ARGS, "--format", fmt]
    first, err = _estimate(capsys, argv)
    assert err == "" and len(builds) == 1 and len(_files()) == 1
    second, err = _estimate(capsys, argv)
    assert len(builds) == 1, "the second plan was made again, not read"
    assert "plan cache: read from" in err and str(_files()[0]) in err
    assert second == first
    written = _files()[0].stat().st_mtime_ns
    fresh, err = _estimate(capsys, [*argv, "--no-cache"])
    assert fresh == first and err == "" and len(builds) == 2
    assert _files()[0].stat().st_mtime_ns == written, "--no-cache wrote the cache"
    if fmt == "json":  # a real plan: two methods, each with a figure
        assert [m["method"] for m in json.loads(first)["methods"]] == ["full", "lora"]


def test_other_inputs_are_other_keys(capsys, config, builds):
    _estimate(capsys, [str(config), *ARGS])
    _estimate(capsys, [str(config), *ARGS, "--lora-r", "8"])
    _estimate(capsys, [str(config), *ARGS, "--pretrain-flops", "1e24"])
    config.write_text(json.dumps({**CONFIG, "num_hidden_layers": 4}))
    _estimate(capsys, [str(config), *ARGS])
    assert len(builds) == 4 and len(_files()) == 4


def test_another_transformers_version_is_refused(capsys, config, builds, monkeypatch):
    first, _ = _estimate(capsys, [str(config), *ARGS])
    real = plan_cache._version
    monkeypatch.setattr(
        plan_cache, "_version", lambda name: "0.0.1" if name == "transformers" else real(name)
    )
    again, err = _estimate(capsys, [str(config), *ARGS])
    assert len(builds) == 2 and "read from" not in err and again == first
    stored = [json.loads(p.read_text())["key"]["installed"]["transformers"] for p in _files()]
    assert sorted(stored) == sorted(["0.0.1", real("transformers")])


def _entry(path):
    return json.loads(path.read_text())


def _reseal(entry):
    entry["plan_sha256"] = plan_cache._sha256(plan_cache._canonical(entry["plan"]))
    return entry


def _damage(path, how):
    text = path.read_text()
    entry = json.loads(text)
    if how == "truncated":
        path.write_text(text[: len(text) // 2])
    elif how == "not JSON":
        path.write_bytes(b"\x80\x04\x95 a pickle, say")
    elif how == "another schema":
        path.write_text(json.dumps({**entry, "schema": "flopmeter-plan-cache/0"}))
    elif how == "a list":
        path.write_text("[]")
    elif how == "a field more":
        path.write_text(json.dumps({**entry, "code": "os.system('x')"}))
    elif how == "another key":
        entry["key"]["installed"]["torch"] = "1.0.0"
        path.write_text(json.dumps(entry))
    elif how == "a plan without its digest":
        entry["plan"]["methods"][0]["flops"] /= 2
        path.write_text(json.dumps(entry))
    elif how == "a method without flops":
        del entry["plan"]["methods"][0]["flops"]
        path.write_text(json.dumps(_reseal(entry)))
    elif how == "a plan field more":
        entry["plan"]["methods"][0]["bonus"] = 1
        path.write_text(json.dumps(_reseal(entry)))
    elif how == "a count as text":
        entry["plan"]["methods"][0]["n_total"] = str(entry["plan"]["methods"][0]["n_total"])
        path.write_text(json.dumps(_reseal(entry)))


WHY = {
    "truncated": "not valid JSON",
    "not JSON": "not UTF-8",
    "another schema": "schema 'flopmeter-plan-cache/0'",
    "a list": "not a plan cache file",
    "a field more": "not a plan cache file",
    "another key": "its stored key is not this plan's key",
    "a plan without its digest": "its plan does not match its digest",
    "a method without flops": "its plan is not a valid plan",
    "a plan field more": "its plan holds fields or values a plan does not",
    "a count as text": "its plan holds fields or values a plan does not",
}


@pytest.mark.parametrize("how", list(WHY))
def test_a_damaged_or_foreign_file_is_ignored_and_overwritten(capsys, config, builds, how):
    first, _ = _estimate(capsys, [str(config), *ARGS])
    (path,) = _files()
    material = _entry(path)["key"]
    _damage(path, how)
    again, err = _estimate(capsys, [str(config), *ARGS])
    assert again == first and len(builds) == 2
    assert err.count("\n") == 1 and f"plan cache: ignored {path}: {WHY[how]}" in err, err
    repaired = plan_cache.read_entry(path, material)  # raises unless rewritten
    assert render(repaired, "table") + "\n" == first
    third, err = _estimate(capsys, [str(config), *ARGS])
    assert third == first and "read from" in err and len(builds) == 2


def test_a_folder_in_the_files_place_is_a_note_and_the_plan_stands(capsys, config, builds):
    first, _ = _estimate(capsys, [str(config), *ARGS])
    (path,) = _files()
    path.unlink()
    path.mkdir()
    again, err = _estimate(capsys, [str(config), *ARGS])
    assert again == first and len(builds) == 2
    assert "ignored" in err and "not a regular file" in err and "not stored" in err


def test_a_cache_that_cannot_be_written_is_a_note(capsys, config, builds, monkeypatch, tmp_path):
    fresh, _ = _estimate(capsys, [str(config), *ARGS, "--no-cache"])
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    monkeypatch.setenv(plan_cache.CACHE_DIR_ENV, str(blocker))  # plans/ cannot be made in it
    out, err = _estimate(capsys, [str(config), *ARGS])
    assert out == fresh and err.count("\n") == 1 and "not stored in" in err, err


def test_a_read_only_cache_folder_is_a_note(capsys, config, builds, monkeypatch):
    """The folder exists and refuses new files (as a read-only folder does for a user; the
    suite may run as root, whom file modes do not stop, so the refusal is the OS error's)."""
    fresh, _ = _estimate(capsys, [str(config), *ARGS, "--no-cache"])
    plan_cache.cache_folder().mkdir(parents=True)

    def refused(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(plan_cache.tempfile, "mkstemp", refused)
    out, err = _estimate(capsys, [str(config), *ARGS])
    assert out == fresh and "not stored in" in err and "Permission denied" in err
    assert list(plan_cache.cache_folder().iterdir()) == []


def test_the_python_function_caches_only_when_asked(config, tmp_path):
    from flopmeter.planner import estimate

    kwargs = {"model": config, "tokens": 5000, "seq_len": 16, "methods": ["full"]}
    made = estimate(**kwargs)
    assert not plan_cache.cache_folder().exists()
    assert estimate(**kwargs, cache=tmp_path / "mine") == made
    assert len(list((tmp_path / "mine").glob("*.json"))) == 1
    assert estimate(**kwargs, cache=tmp_path / "mine") == made


def _key(**inputs):
    req = PlanRequest(**inputs)
    req.check()
    threshold, note = req.resolve_threshold()
    return plan_cache.key_material(req, threshold, note)


def test_the_key_names_the_dataset_bytes_and_no_tokenizer_plan(tmp_path, config):
    data = tmp_path / "data.jsonl"
    data.write_text('{"text": "w1 w2 w3"}\n')
    before = _key(model=config, dataset=data)
    data.write_text('{"text": "w1 w2 w4"}\n')
    assert _key(model=config, dataset=data)["inputs"] != before["inputs"]
    assert _key(model=config, dataset=data, tokenizer=tmp_path) is None


def test_the_source_digest_follows_a_real_edit_of_a_copy(tmp_path):
    copy = tmp_path / "flopmeter"
    shutil.copytree(Path(flopmeter.__file__).parent, copy, ignore=shutil.ignore_patterns("*.pyc"))
    before = plan_cache.source_digest(copy)
    (copy / "planner" / "__pycache__").mkdir(exist_ok=True)
    (copy / "planner" / "__pycache__" / "stale.pyc").write_bytes(b"compiled")
    assert plan_cache.source_digest.__wrapped__(copy) == before  # bytecode is not source
    with (copy / "planner" / "plan.py").open("a") as handle:
        handle.write("# an edit\n")
    assert plan_cache.source_digest.__wrapped__(copy) != before


CHECK = (
    "import sys, flopmeter.cli as c\n"
    "status = c.main(sys.argv[1:])\n"
    "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'peft'})\n"
    "heavy += sorted({'flopmeter.report', 'flopmeter.ledger.store'} & set(sys.modules))\n"
    "print('imported:', heavy, 'from', c.__file__, file=sys.stderr)\n"
    "sys.exit(status)\n"
)


@pytest.mark.slow
def test_an_edited_source_file_is_a_new_key_end_to_end(tmp_path, config):
    """A copy of the package on PYTHONPATH (an editable install's case): the second run reads
    the plan without importing torch, transformers or peft; after an edit of one of the copy's
    source files the plan is made again, under a new key, and is the same plan."""
    copy = tmp_path / "site" / "flopmeter"
    shutil.copytree(Path(flopmeter.__file__).parent, copy, ignore=shutil.ignore_patterns("*.pyc"))
    env = {**os.environ, "PYTHONPATH": str(copy.parent)}
    argv = ["estimate", str(config), *ARGS, "--format", "json"]

    def run():
        done = subprocess.run(
            [sys.executable, "-c", CHECK, *argv], capture_output=True, text=True, env=env
        )
        assert done.returncode == 0, done.stderr
        assert f"from {copy}" in done.stderr, done.stderr
        return done.stdout, done.stderr

    first, err = run()
    assert "'torch'" in err and len(_files()) == 1
    second, err = run()
    assert second == first and "read from" in err and "imported: []" in err, err
    with (copy / "planner" / "render.py").open("a") as handle:
        handle.write("# an edit that changes no figure\n")
    third, err = run()
    assert third == first and "read from" not in err and len(_files()) == 2


def test_a_cache_path_the_system_cannot_look_up_is_a_note(capsys, config, builds, monkeypatch):
    """A cache folder whose name is too long for the system (ENAMETOOLONG, which
    ``Path.exists`` lets through on Python 3.11): a note and the plan, not 'unexpected
    OSError' with exit 1 and no plan."""
    fresh, _ = _estimate(capsys, [str(config), *ARGS, "--no-cache"])
    monkeypatch.setenv(plan_cache.CACHE_DIR_ENV, "/tmp/" + "a" * 5000)
    out, err = _estimate(capsys, [str(config), *ARGS])
    assert out == fresh and err.count("\n") == 1 and "cannot be looked up" in err, err


def test_a_folder_others_may_write_is_not_used(capsys, config, builds, tmp_path, monkeypatch):
    """Anyone who can write the folder could plant a well-formed plan with its digest: a
    group- or world-writable folder (a FLOPMETER_CACHE_DIR under /tmp) is neither read nor
    written, with a note."""
    first, _ = _estimate(capsys, [str(config), *ARGS])
    folder = plan_cache.cache_folder()
    folder.chmod(0o777)
    again, err = _estimate(capsys, [str(config), *ARGS])
    assert again == first and len(builds) == 2  # planned afresh, not read
    assert "writable by others" in err and "read from" not in err, err
    folder.chmod(0o700)
    third, err = _estimate(capsys, [str(config), *ARGS])
    assert third == first and "read from" in err and len(builds) == 2


def test_a_fifo_in_the_files_place_never_makes_the_read_wait(capsys, config, builds):
    first, _ = _estimate(capsys, [str(config), *ARGS])
    (path,) = _files()
    path.unlink()
    os.mkfifo(path)
    again, err = _estimate(capsys, [str(config), *ARGS])
    assert again == first and "not a regular file" in err, err
