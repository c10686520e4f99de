"""Puts ``flopmeter-auto.pth`` into site-packages, beside the package (pyproject.toml holds
everything else).

Python runs the ``import`` line of a ``.pth`` file in site-packages as each interpreter starts;
this one reads ``FLOPMETER_AUTO`` and does nothing else unless it is on (then it calls
``flopmeter.auto.boot.boot``: zero-code metering switched on by the environment alone, see
docs/integrations.md). Setuptools has no option for a file outside the packages, so the wheel
gets it from ``build_py`` and an editable install (``pip install -e``) from the editable
wheel's folder.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

PTH = "flopmeter-auto.pth"
SOURCE = Path(__file__).resolve().parent / "src" / PTH


class BuildPyWithPth(build_py):
    """``build_py`` that also puts the ``.pth`` file at the top of the wheel."""

    def run(self) -> None:
        super().run()
        self.copy_file(str(SOURCE), str(Path(self.build_lib) / PTH), preserve_mode=False)

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


class EditableWheelWithPth(editable_wheel):
    """``editable_wheel`` whose wheel also holds the ``.pth`` file."""

    def _install_namespaces(self, installation_dir, pth_prefix):  # type: ignore[no-untyped-def]
        super()._install_namespaces(installation_dir, pth_prefix)
        shutil.copyfile(SOURCE, Path(installation_dir) / PTH)


setup(cmdclass={"build_py": BuildPyWithPth, "editable_wheel": EditableWheelWithPth})
