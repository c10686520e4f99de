"""The peak table: every device of the project's gpu-peaks notes by its real NVML name, in
FLOP/s, and the substring traps the AWS meter falls into."""

from __future__ import annotations

import math

import pytest
import torch

from flopmeter.errors import ConfigurationError
from flopmeter.hardware.peaks import (
    DTYPES,
    PEAK_TABLE,
    known_gpu_names,
    normalise_dtype,
    normalise_gpu_name,
    peak_entry,
    peak_flops,
)

T = 1e12
# Transcribed by hand from shared/docs/gpu-peaks.md: name as NVML reports it -> TFLOP/s by
# dtype. None: "n/a" (no hardware path), a blank cell, or a figure the notes call unconfirmed.
EXPECTED: dict[str, dict[str, float | None]] = {}


def _add(names: list[str], bf16, fp16, tf32, fp32, fp8, int8) -> None:
    for name in names:
        EXPECTED[name] = dict(bf16=bf16, fp16=fp16, tf32=tf32, fp32=fp32, fp8=fp8, int8=int8)


_add(["Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"], None, 125, None, 15.7, None, None)
_add(["Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"], None, 112, None, 14, None, None)
_add(["Tesla V100S-PCIE-32GB"], None, 130, None, 16.4, None, None)
_add(["Tesla T4"], None, 65, None, 8.1, None, 130)
_add(["NVIDIA A10"], 125, 125, 62.5, 31.2, None, 250)
_add(["NVIDIA A10G"], 70, 70, 35, 35, None, None)  # int8 "~280": left out
_add(["NVIDIA A30"], 165, 165, 82, 10.3, None, 330)
_add(["NVIDIA A40"], 149.7, 149.7, 74.8, 37.4, None, 299.3)
_add(
    [
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
    ],
    312, 312, 156, 19.5, None, 624,
)  # fmt: skip
_add(["NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe"], 312, 312, 156, 19.5, None, 624)
_add(["NVIDIA L4"], 121, 121, 60, 30.3, 242.5, 242.5)
_add(["NVIDIA L40"], 181.05, 181.05, 90.5, 90.5, 362, 362)
_add(["NVIDIA L40S"], 362.05, 362.05, 183, 91.6, 733, 733)
_add(["NVIDIA H100 80GB HBM3"], 989.4, 989.4, 494.7, 67, 1979, 1979)
_add(["NVIDIA H100 PCIe"], 756, 756, 378, 51, 1513, 1513)
_add(["NVIDIA H100 NVL"], 835.5, 835.5, 417.5, 60, 1670.5, 1670.5)
_add(["NVIDIA H800"], 989.4, 989.4, None, None, None, None)
_add(["NVIDIA H800 PCIe"], 756, 756, None, None, None, None)
_add(["NVIDIA H20"], 148, 148, 74, None, 296, 296)  # fp32 "~44 (unconfirmed)": left out
_add(["NVIDIA H200"], 989.4, 989.4, 494.7, 67, 1979, 1979)
_add(["NVIDIA H200 NVL"], 835.5, 835.5, 417.5, 60, 1670.5, 1670.5)
_add(
    ["NVIDIA GH200 480GB", "NVIDIA GH200 120GB", "NVIDIA GH200 144G HBM3e"],
    989.4, 989.4, 494.7, 67, 1979, 1979,
)  # fmt: skip
_add(["NVIDIA B200"], 2250, 2250, 1100, 75, 4500, 4500)
_add(["NVIDIA GB200"], 2500, 2500, 1250, 80, 5000, 5000)
_add(["NVIDIA GeForce RTX 3090"], 71, 71, 35.6, 35.6, None, 284)
_add(["NVIDIA GeForce RTX 4090"], 165.2, 165.2, 82.6, 82.6, 330.3, 660.6)
_add(["NVIDIA RTX 6000 Ada Generation"], 364.2, 364.2, 182.1, 91.1, 728.5, 728.5)
_add(["AMD Instinct MI250X", "AMD Instinct MI250X / MI250"], 191.5, 191.5, None, 23.9, None, 191.5)
_add(["AMD Instinct MI300X"], 1307.4, 1307.4, 653.7, 163.4, 2614.9, 2614.9)
_add(["AMD Instinct MI325X"], 1307.4, 1307.4, 653.7, 163.4, 2614.9, 2614.9)

CASES = [(name, dtype, tf) for name, row in EXPECTED.items() for dtype, tf in row.items()]


@pytest.mark.parametrize(("name", "dtype", "tflops"), CASES)
def test_every_device_of_the_notes_by_its_nvml_name(name: str, dtype: str, tflops: float | None):
    got = peak_flops(name, dtype)
    if tflops is None:
        assert got is None
    else:
        assert got == pytest.approx(tflops * T, rel=1e-12)  # FLOP/s, not TFLOP/s


def test_the_table_holds_exactly_the_devices_of_the_notes():
    assert sorted(known_gpu_names()) == sorted(EXPECTED)


@pytest.mark.parametrize(
    ("name", "expected_tflops", "trap"),
    [
        ("NVIDIA H200", 989.4, "H20"),
        ("NVIDIA H200 NVL", 835.5, "H20 / H200"),
        ("NVIDIA GH200 480GB", 989.4, "H20 / H200"),
        ("NVIDIA H20", 148, "H200"),
        ("NVIDIA L40S", 362.05, "L40 / L4"),
        ("NVIDIA L40", 181.05, "L4"),
        ("NVIDIA L4", 121, "L40"),
        ("NVIDIA A10G", 70, "A10"),
        ("NVIDIA A10", 125, "A100"),
        ("NVIDIA A100-SXM4-80GB", 312, "A10"),
        ("NVIDIA GB200", 2500, "B200"),
        ("NVIDIA B200", 2250, "GB200"),
        ("NVIDIA H100 PCIe", 756, "H100 SXM"),
        ("NVIDIA H100 80GB HBM3", 989.4, "H100 PCIe"),
        ("NVIDIA H800 PCIe", 756, "H800 SXM"),
    ],
)
def test_substring_traps(name: str, expected_tflops: float, trap: str):
    assert peak_flops(name) == pytest.approx(expected_tflops * T, rel=1e-12), trap


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA RTX A4000",  # contains A40
        "NVIDIA T400",  # contains T4
        "NVIDIA T400 4GB",
        "NVIDIA GeForce RTX 4090 D",  # a different (capped) product
        "NVIDIA GeForce RTX 4090 Laptop GPU",
        "NVIDIA A100-SXM4-40GB MIG 1g.5gb",  # a MIG slice: a fraction of the GPU
        "NVIDIA H100 80GB HBM3 MIG 3g.40gb",
        "NVIDIA B100",  # name unconfirmed in the notes: not guessed
        "NVIDIA GeForce GTX 1080",
        "AMD Radeon Graphics",
        "",
        "H2",
    ],
)
def test_unknown_or_partial_names_have_no_peak(name: str):
    assert peak_flops(name) is None
    assert peak_entry(name) is None


def test_no_name_has_no_peak():
    assert peak_flops(None) is None


@pytest.mark.parametrize(
    ("variant", "canonical"),
    [
        ("A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),  # older drivers drop "NVIDIA "
        ("nvidia h200", "NVIDIA H200"),
        ("  NVIDIA   H200  ", "NVIDIA H200"),
        ("V100-SXM2-16GB", "Tesla V100-SXM2-16GB"),
        ("NVIDIA Tesla T4", "Tesla T4"),
        ("T4", "Tesla T4"),
    ],
)
def test_case_spaces_and_vendor_prefix_do_not_matter(variant: str, canonical: str):
    assert normalise_gpu_name(variant) == normalise_gpu_name(canonical)
    assert peak_flops(variant, "fp16") == peak_flops(canonical, "fp16") is not None


def test_rows_have_sources_and_figures_are_dense_flops():
    for entry in PEAK_TABLE:
        assert entry.source.strip(), entry.product
        for dtype in DTYPES:
            value = entry.flops_per_second(dtype)
            assert value is None or (math.isfinite(value) and value > 1e12), entry.product
    # Dense, not the datasheets' 2:4-sparse figure (which is twice): H100 SXM bf16 989.4.
    assert peak_flops("NVIDIA H100 80GB HBM3") == 989.4e12


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        (torch.bfloat16, "bf16"),
        (torch.float16, "fp16"),
        ("half", "fp16"),
        (torch.float32, "fp32"),
        ("tf32", "tf32"),
        (torch.float8_e4m3fn, "fp8"),
        ("int8", "int8"),
    ],
)
def test_dtype_aliases(given: object, expected: str):
    assert normalise_dtype(given) == expected


@pytest.mark.parametrize("bad", ["bf32", "fp64", torch.float64, "", "int4"])
def test_unknown_dtype_is_a_configuration_error(bad: object):
    with pytest.raises(ConfigurationError, match="dtype"):
        peak_flops("NVIDIA H200", bad)
