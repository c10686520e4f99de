"""The command starts fast: threshold, report, show and schema import no torch.

Each runs in a fresh interpreter, which then checks ``sys.modules``: torch must not be there.
The package's public names are imported on first use (PEP 562) and still all resolve.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support.planner import CONFIG
from tests.support.reports import valid_data, write_data

CHECK = (
    "import sys, contextlib, io, flopmeter.cli as c\n"
    "with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):\n"
    "    status = c.main(sys.argv[1:])\n"
    "assert status == 0, status\n"
    "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
    "assert not loaded, loaded[:5]\n"
)


@pytest.mark.parametrize(
    "argv",
    [
        ["threshold"],
        ["threshold", "--pretrain-flops", "3.8e25", "--systemic-risk"],
        ["report", "{report}"],
        ["report", "{report}", "--format", "md"],
        ["report", "{report}", "--format", "html"],
        ["report", "{report}", "--format", "json"],
        ["show", "{report}", "--format", "sagemaker"],
        ["schema"],
        ["--help"],
    ],
    ids=lambda a: " ".join(a),
)
def test_command_imports_no_torch(tmp_path, argv):
    path = write_data(tmp_path, valid_data())
    args = [a.format(report=path) for a in argv]
    if args == ["--help"]:  # exits through SystemExit(0): check after it
        code = CHECK.replace(
            "status = c.main(sys.argv[1:])",
            "status = 0\n    try: c.main(['--help'])\n    except SystemExit: pass",
        )
    else:
        code = CHECK
    result = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_the_checker_sees_torch_when_it_is_imported():
    # the same check, after importing the meter (which needs torch), fails: so it can fail
    code = "import flopmeter.meter\n" + CHECK
    result = subprocess.run([sys.executable, "-c", code, "schema"], capture_output=True, text=True)
    assert result.returncode != 0 and "torch" in result.stderr


@pytest.mark.slow
def test_public_names_resolve_lazily():
    code = (
        "import sys, flopmeter\n"
        "assert 'torch' not in sys.modules\n"
        "assert flopmeter.__version__\n"
        "from flopmeter import FlopReport, ConfigurationError, determine_threshold\n"
        "assert 'torch' not in sys.modules\n"
        "from flopmeter import FlopMeter\n"
        "assert FlopMeter.__module__ == 'flopmeter.meter'\n"
        "for name in flopmeter.__all__: getattr(flopmeter, name)\n"
        "assert set(flopmeter.__all__) <= set(dir(flopmeter))\n"
        "try:\n    flopmeter.nope\nexcept AttributeError: pass\nelse: raise SystemExit('no error')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


#: ``flopmeter estimate`` of bare numbers: pure arithmetic, so none of the model stack.
PLANNER_CHECK = CHECK.replace(
    "sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))",
    "sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'peft', 'numpy'})",
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "argv",
    [
        ["estimate", "--params", "7e9", "--tokens", "1e9"],
        ["estimate", "--params", "3.2B", "--trainable", "24M", "--tokens", "2e12"],
        ["estimate", "--params", "7e9", "--tokens", "1e9", "--format", "json"],
        ["estimate", "--params", "7e9", "--tokens", "1e9", "--format", "md"],
        ["estimate", "--params", "7e9", "--tokens", "1e9", "--pretrain-flops", "3.8e25",
         "--systemic-risk"],
        ["estimate", "--params", "1e9", "--tokens", "1e9", "--fail-on", "near"],
    ],
    ids=lambda a: " ".join(a[1:]),
)  # fmt: skip
def test_estimate_of_bare_numbers_imports_no_model_stack(argv):
    result = subprocess.run(
        [sys.executable, "-c", PLANNER_CHECK, *argv], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
def test_the_planner_checker_sees_transformers_when_a_model_is_planned(tmp_path):
    # the same check on a plan of a model (which builds it on meta) fails: so it can fail
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIG))
    argv = ["estimate", str(config), "--tokens", "1000", "--method", "full"]
    result = subprocess.run(
        [sys.executable, "-c", PLANNER_CHECK, *argv], capture_output=True, text=True
    )
    assert result.returncode != 0 and "transformers" in result.stderr
