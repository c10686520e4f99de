"""flopmeter imports without the frameworks; an adapter without its framework names the extra."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = r"""
import json, sys
for name in ("transformers", "lightning", "lightning.pytorch"):
    sys.modules[name] = None  # importing it now raises ImportError, as if not installed
import flopmeter, flopmeter.integrations
from flopmeter.errors import MissingExtraError
result = {"frameworks_loaded": [m for m in ("transformers", "lightning") if sys.modules.get(m)]}
for adapter in ("hf", "lightning"):
    try:
        __import__(f"flopmeter.integrations.{adapter}")
    except MissingExtraError as exc:
        result[adapter] = {"package": exc.package, "extra": exc.extra, "message": str(exc),
                           "is_import_error": isinstance(exc, ImportError)}
print(json.dumps(result))
"""


@pytest.mark.slow
def test_adapters_without_their_framework():
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["frameworks_loaded"] == []
    assert result["hf"]["extra"] == "hf" and result["hf"]["package"] == "transformers"
    # the package itself: flopmeter is on no index, so 'flopmeter[hf]' may not resolve
    assert "pip install 'transformers'" in result["hf"]["message"]
    assert "'hf' extra" in result["hf"]["message"]
    assert result["lightning"]["extra"] == "lightning"
    assert "pip install 'lightning'" in result["lightning"]["message"]
    assert result["hf"]["is_import_error"] and result["lightning"]["is_import_error"]


def test_import_flopmeter_does_not_load_frameworks():
    code = (
        "import sys, flopmeter, flopmeter.integrations; "
        "print([m for m in ('transformers', 'lightning', 'peft', 'trl') if m in sys.modules])"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "[]"
