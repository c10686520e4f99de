"""The HTML report in a real browser: headless Chromium loads the file, and the picture is there.

Chromium (Debian's ``chromium`` package) dumps the page's DOM, where the SVG must be with its
points and threshold line, and takes a screenshot, decoded here with a small PNG reader (zlib
and the five PNG filters): the page is not blank, and the threshold line's red and the primary
estimate's blue are drawn where the picture is. In CI (``CI`` set, and not to ``false``, ``0`` or
``no``) a missing Chromium is a failure, not a skip: .ci/run installs it.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from flopmeter.render.html import render_html
from flopmeter.types import ParentRun
from tests.support.reports import valid_report

THRESHOLD_RED = (0xC0, 0x39, 0x2B)  # svg.py's threshold line
PRIMARY_BLUE = (0x1F, 0x4E, 0x9C)  # svg.py's primary point
WIDTH, HEIGHT = 1000, 800


def in_ci(environ) -> bool:
    """Whether ``CI`` says this is CI: set to anything but empty, ``0``, ``false`` or ``no``."""
    return environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def test_ci_false_is_not_ci():
    assert not in_ci({}) and not in_ci({"CI": "false"}) and not in_ci({"CI": "0"})
    assert in_ci({"CI": "true"}) and in_ci({"CI": "1"})


@pytest.fixture(scope="module")
def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    if in_ci(os.environ):
        pytest.fail("chromium is not installed; .ci/run installs it (apt-get install chromium)")
    pytest.skip("chromium is not installed (apt-get install chromium) and CI is not set")


def _run(chromium: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         f"--user-data-dir={tmp / 'profile'}", "--no-first-run", *args],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp)},
    )  # fmt: skip


def _paeth(a: int, b: int, c: int) -> int:
    p = a + b - c
    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
    return a if pa <= pb and pa <= pc else (b if pb <= pc else c)


def _unfilter(kind: int, line: bytearray, prior: bytearray, bpp: int) -> None:
    """Undoes one scanline's PNG filter in place (PNG spec, section 9)."""
    if kind == 0:
        return
    for i in range(len(line)):
        a = line[i - bpp] if i >= bpp else 0
        b = prior[i]
        c = prior[i - bpp] if i >= bpp else 0
        pred = (0, a, b, (a + b) // 2, _paeth(a, b, c))[kind]
        line[i] = (line[i] + pred) & 0xFF


def read_png(path: Path) -> tuple[int, int, list[bytearray], int]:
    """Width, height, rows of raw bytes and bytes per pixel of an 8-bit RGB/RGBA PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    assert header is not None
    width, height, depth, colour, _, _, interlace = header
    assert depth == 8 and colour in (2, 6) and interlace == 0, header
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows, prior = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        line = bytearray(raw[start + 1 : start + 1 + stride])
        _unfilter(raw[start], line, prior, bpp)
        rows.append(line)
        prior = line
    return width, height, rows, bpp


def _pixels_near(rows, bpp, colour, tolerance=40):
    """(x, y) of pixels within ``tolerance`` of ``colour`` on each channel."""
    found = []
    for y, line in enumerate(rows):
        for x in range(0, len(line), bpp):
            if all(abs(line[x + k] - colour[k]) <= tolerance for k in range(3)):
                found.append((x // bpp, y))
    return found


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    # near the threshold: six_nd 3e22 (primary) against 1e23 / 3, and a parent run's total
    report = valid_report(
        model={"name": "<b>not bold</b> & co"},
        lineage={
            "parent_runs": [
                ParentRun(ref="first.json", run_id="p1", flops=1e21, status="completed")
            ],
            "cumulative_flops": 3.1e22,
        },
    )
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(render_html(report), encoding="utf-8")
    return path


@pytest.mark.slow
def test_the_svg_is_in_the_browsers_dom(chromium, page, tmp_path):
    result = _run(chromium, tmp_path, "--dump-dom", page.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert '<svg xmlns="http://www.w3.org/2000/svg" id="margin-plot"' in dom
    assert dom.count('<circle class="point"') == 3  # six_nd, seed and the cumulative figure
    assert 'id="threshold-line"' in dom
    # the linear share bar beside it: 3.1e22 of 3.33e22 is 93 %, near from 77 %
    assert 'id="share-bar"' in dom and 'id="near-line"' in dom and "93 %" in dom
    assert "&lt;b&gt;not bold&lt;/b&gt; &amp; co" in dom  # the hostile name stayed text
    assert "<b>not bold</b>" not in dom


@pytest.mark.slow
def test_the_screenshot_shows_the_picture(chromium, page, tmp_path):
    shot = tmp_path / "out.png"
    result = _run(chromium, tmp_path, f"--screenshot={shot}", f"--window-size={WIDTH},{HEIGHT}",
                  page.as_uri())  # fmt: skip
    assert result.returncode == 0 and shot.exists(), result.stderr[-2000:]
    width, height, rows, bpp = read_png(shot)
    assert (width, height) == (WIDTH, HEIGHT)
    # not blank: a real share of the page is not white, and it is not one flat colour
    dark = sum(1 for line in rows for x in range(0, len(line), bpp) if line[x] < 200)
    assert dark > 0.01 * width * height
    # the threshold line: a vertical run of red pixels in one column, at least 80 px tall
    red = _pixels_near(rows, bpp, THRESHOLD_RED)
    columns: dict[int, int] = {}
    for x, _ in red:
        columns[x] = columns.get(x, 0) + 1
    assert columns and max(columns.values()) >= 80, "no threshold line on the screenshot"
    line_x = max(columns, key=columns.get)
    # the primary points (six_nd 3e22 and the cumulative 3.1e22) are blue, just left of the line
    blue = _pixels_near(rows, bpp, PRIMARY_BLUE, tolerance=30)
    assert len(blue) > 50, "no primary point on the screenshot"
    assert any(line_x - 60 < x < line_x for x, _ in blue)
