"""Dense peak throughput of accelerators, looked up by the exact device name.

The table holds **dense** figures (no 2:4 sparsity) per data type, from the vendors' datasheets
and architecture whitepapers (each row names its source). Lookup is by whole name, normalised
only for case, runs of spaces and an optional ``NVIDIA `` / ``Tesla `` prefix: never by
substring, so "NVIDIA H200" is not the H20, "NVIDIA L40S" is not the L40 or the L4, and
"NVIDIA A10G" is not the A10. A name that is not in the table (including MIG slices such as
"NVIDIA A100-SXM4-40GB MIG 1g.5gb", which have a fraction of the GPU) has no peak: ``None``.

Figures are FLOP/s (ops/s for ``int8``), per device as torch sees it (one MI250X GCD).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from flopmeter.errors import ConfigurationError

#: The data types the table has columns for (``int8`` is in integer ops/s, not FLOP/s).
DTYPES: tuple[str, ...] = ("bf16", "fp16", "tf32", "fp32", "fp8", "int8")

_DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "tf32": "tf32",
    "tensorfloat32": "tf32",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp8": "fp8",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "int8": "int8",
}

_PREFIXES = ("nvidia ", "tesla ")


def normalise_dtype(dtype: object) -> str:
    """The table's name for ``dtype``.

    Args:
        dtype: ``"bf16"``, ``"fp16"``, ``"tf32"``, ``"fp32"``, ``"fp8"`` or ``"int8"``, a common
            alias (``"bfloat16"``, ``"float16"``, ``"half"``, ``"float32"``, ...) or a
            ``torch.dtype`` (``torch.bfloat16``).

    Returns:
        One of :data:`DTYPES`.

    Raises:
        ConfigurationError: ``dtype`` is not a data type the table knows.
    """
    text = str(dtype).strip().lower()
    text = text.removeprefix("torch.")
    try:
        return _DTYPE_ALIASES[text]
    except KeyError:
        raise ConfigurationError(
            f"dtype {dtype!r} is not one the peak table knows; use one of {', '.join(DTYPES)}."
        ) from None


def normalise_gpu_name(name: str) -> str:
    """The lookup key of a device name: case-folded, single spaces, no NVIDIA/Tesla prefix.

    "NVIDIA A100-SXM4-40GB" and "A100-SXM4-40GB" (older drivers drop the prefix) give the same
    key; nothing else is removed, so different products keep different keys.
    """
    key = " ".join(name.split()).casefold()
    stripped = True
    while stripped:
        stripped = False
        for prefix in _PREFIXES:
            if key.startswith(prefix):
                key = key[len(prefix) :]
                stripped = True
    return key


@dataclass(frozen=True)
class PeakEntry:
    """One product in the peak table.

    Attributes:
        product: A short product label ("H100 SXM").
        names: The device names NVML / ``torch.cuda.get_device_name`` report for it.
        tflops: Dense peak per data type in TFLOP/s (TOPS for int8); a data type without a
            hardware path (or one the datasheet does not give) is absent.
        source: Where the figures come from.
        note: Caveats (derived figures, omitted columns).
    """

    product: str
    names: tuple[str, ...]
    tflops: Mapping[str, float]
    source: str
    note: str = ""
    _flops: Mapping[str, float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for dtype in self.tflops:
            if dtype not in DTYPES:
                raise ValueError(f"peak table row {self.product}: unknown dtype {dtype!r}")
        # float("989.4e12") is the nearest double to the decimal figure (989.4 * 1e12 is not).
        flops = {d: float(f"{v!r}e12") for d, v in self.tflops.items()}
        object.__setattr__(self, "_flops", MappingProxyType(flops))

    def flops_per_second(self, dtype: str = "bf16") -> float | None:
        """The dense peak in FLOP/s for ``dtype``; ``None`` when the row has no figure for it."""
        return self._flops.get(normalise_dtype(dtype))


def _row(
    product: str,
    names: tuple[str, ...],
    tflops: dict[str, float],
    source: str,
    note: str = "",
) -> PeakEntry:
    return PeakEntry(product, names, MappingProxyType(dict(tflops)), source, note)


#: The table. TFLOP/s, dense. Facts: docs/hardware.md (from the project's gpu-peaks notes).
PEAK_TABLE: tuple[PeakEntry, ...] = (
    _row(
        "V100 SXM2",
        ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
        {"fp16": 125, "fp32": 15.7},
        "NVIDIA Tesla V100 datasheet (SXM2 column)",
        "no bf16 tensor-core path (bf16 runs at about fp32 speed): bf16 has no figure",
    ),
    _row(
        "V100 PCIe",
        ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
        {"fp16": 112, "fp32": 14},
        "NVIDIA Tesla V100 datasheet (PCIe column)",
        "no bf16 tensor-core path: bf16 has no figure",
    ),
    _row(
        "V100S PCIe",
        ("Tesla V100S-PCIE-32GB",),
        {"fp16": 130, "fp32": 16.4},
        "NVIDIA Tesla V100S datasheet",
        "no bf16 tensor-core path: bf16 has no figure",
    ),
    _row(
        "T4",
        ("Tesla T4",),
        {"fp16": 65, "fp32": 8.1, "int8": 130},
        "NVIDIA T4 Tensor Core GPU datasheet",
        "no bf16 path: bf16 has no figure",
    ),
    _row(
        "A10",
        ("NVIDIA A10",),
        {"bf16": 125, "fp16": 125, "tf32": 62.5, "fp32": 31.2, "int8": 250},
        "NVIDIA A10 Tensor Core GPU datasheet",
    ),
    _row(
        "A10G (AWS g5)",
        ("NVIDIA A10G",),
        {"bf16": 70, "fp16": 70, "tf32": 35, "fp32": 35},
        "no NVIDIA datasheet: half-rate tensor cores with fp32 accumulation (GA102 whitepaper); "
        "large-GEMM measurements give bf16 69.5 TFLOP/s",
        "not the A10; int8 (about 280 TOPS, unconfirmed) is left out",
    ),
    _row(
        "A30",
        ("NVIDIA A30",),
        {"bf16": 165, "fp16": 165, "tf32": 82, "fp32": 10.3, "int8": 330},
        "NVIDIA A30 Tensor Core GPU datasheet",
    ),
    _row(
        "A40",
        ("NVIDIA A40",),
        {"bf16": 149.7, "fp16": 149.7, "tf32": 74.8, "fp32": 37.4, "int8": 299.3},
        "NVIDIA A40 datasheet",
    ),
    _row(
        "A100",
        (
            "NVIDIA A100-SXM4-40GB",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-PCIE-40GB",
            "NVIDIA A100 80GB PCIe",
        ),
        {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5, "int8": 624},
        "NVIDIA A100 Tensor Core GPU datasheet",
        "SXM and PCIe share the dense peaks; MIG slices are not this row",
    ),
    _row(
        "A800",
        ("NVIDIA A800-SXM4-80GB", "NVIDIA A800 80GB PCIe"),
        {"bf16": 312, "fp16": 312, "tf32": 156, "fp32": 19.5, "int8": 624},
        "NVIDIA A800 datasheet (same compute as the A100)",
    ),
    _row(
        "L4",
        ("NVIDIA L4",),
        {"bf16": 121, "fp16": 121, "tf32": 60, "fp32": 30.3, "fp8": 242.5, "int8": 242.5},
        "NVIDIA L4 Tensor Core GPU datasheet",
    ),
    _row(
        "L40",
        ("NVIDIA L40",),
        {"bf16": 181.05, "fp16": 181.05, "tf32": 90.5, "fp32": 90.5, "fp8": 362, "int8": 362},
        "NVIDIA L40 datasheet",
    ),
    _row(
        "L40S",
        ("NVIDIA L40S",),
        {"bf16": 362.05, "fp16": 362.05, "tf32": 183, "fp32": 91.6, "fp8": 733, "int8": 733},
        "NVIDIA L40S datasheet",
        "not the L40, not the L4",
    ),
    _row(
        "H100 SXM",
        ("NVIDIA H100 80GB HBM3",),
        {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67, "fp8": 1979, "int8": 1979},
        "NVIDIA H100 Tensor Core GPU datasheet (SXM column)",
        "the name carries no SXM marker",
    ),
    _row(
        "H100 PCIe",
        ("NVIDIA H100 PCIe",),
        {"bf16": 756, "fp16": 756, "tf32": 378, "fp32": 51, "fp8": 1513, "int8": 1513},
        "NVIDIA H100 Tensor Core GPU datasheet (PCIe column)",
    ),
    _row(
        "H100 NVL",
        ("NVIDIA H100 NVL",),
        {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60, "fp8": 1670.5, "int8": 1670.5},
        "NVIDIA H100 Tensor Core GPU datasheet (NVL column, per GPU)",
    ),
    _row(
        "H800 SXM",
        ("NVIDIA H800",),
        {"bf16": 989.4, "fp16": 989.4},
        "NVIDIA H800 datasheet (SXM)",
        '"NVIDIA H800" is the SXM part; only the 16-bit figures are in the table',
    ),
    _row(
        "H800 PCIe",
        ("NVIDIA H800 PCIe",),
        {"bf16": 756, "fp16": 756},
        "NVIDIA H800 datasheet (PCIe)",
        "only the 16-bit figures are in the table",
    ),
    _row(
        "H20",
        ("NVIDIA H20",),
        {"bf16": 148, "fp16": 148, "tf32": 74, "fp8": 296, "int8": 296},
        "NVIDIA H20 product specification (firmware-capped Hopper)",
        "fp32 (about 44 TFLOP/s) is unconfirmed and left out",
    ),
    _row(
        "H200 SXM",
        ("NVIDIA H200",),
        {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67, "fp8": 1979, "int8": 1979},
        "NVIDIA H200 Tensor Core GPU datasheet (SXM column)",
        '"H200" contains "H20": matched whole, never by substring',
    ),
    _row(
        "H200 NVL",
        ("NVIDIA H200 NVL",),
        {"bf16": 835.5, "fp16": 835.5, "tf32": 417.5, "fp32": 60, "fp8": 1670.5, "int8": 1670.5},
        "NVIDIA H200 Tensor Core GPU datasheet (NVL column)",
    ),
    _row(
        "GH200",
        ("NVIDIA GH200 480GB", "NVIDIA GH200 120GB", "NVIDIA GH200 144G HBM3e"),
        {"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp32": 67, "fp8": 1979, "int8": 1979},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (GPU part)",
    ),
    _row(
        "B200",
        ("NVIDIA B200",),
        {"bf16": 2250, "fp16": 2250, "tf32": 1100, "fp32": 75, "fp8": 4500, "int8": 4500},
        "NVIDIA DGX B200 / HGX B200 datasheet (per GPU, dense)",
    ),
    _row(
        "GB200",
        ("NVIDIA GB200",),
        {"bf16": 2500, "fp16": 2500, "tf32": 1250, "fp32": 80, "fp8": 5000, "int8": 5000},
        "NVIDIA GB200 NVL72 datasheet (per GPU, dense)",
        '"GB200" contains "B200": matched whole',
    ),
    _row(
        "RTX 3090",
        ("NVIDIA GeForce RTX 3090",),
        {"bf16": 71, "fp16": 71, "tf32": 35.6, "fp32": 35.6, "int8": 284},
        "NVIDIA Ampere GA102 GPU architecture whitepaper",
        "tensor figures with fp32 accumulation (what PyTorch uses); no fp8 path",
    ),
    _row(
        "RTX 4090",
        ("NVIDIA GeForce RTX 4090",),
        {"bf16": 165.2, "fp16": 165.2, "tf32": 82.6, "fp32": 82.6, "fp8": 330.3, "int8": 660.6},
        "NVIDIA Ada Lovelace GPU architecture whitepaper",
        "not the 4090 D or the 4090 Laptop GPU; consumer cards can boost above spec",
    ),
    _row(
        "RTX 6000 Ada",
        ("NVIDIA RTX 6000 Ada Generation",),
        {"bf16": 364.2, "fp16": 364.2, "tf32": 182.1, "fp32": 91.1, "fp8": 728.5, "int8": 728.5},
        "NVIDIA RTX 6000 Ada Generation datasheet",
    ),
    _row(
        "MI250X (one GCD)",
        ("AMD Instinct MI250X", "AMD Instinct MI250X / MI250"),
        {"bf16": 191.5, "fp16": 191.5, "fp32": 23.9, "int8": 191.5},
        "AMD Instinct MI250X datasheet, halved: one GCD is one torch device",
        "a package has 2 GCDs (383 TFLOP/s bf16)",
    ),
    _row(
        "MI300X",
        ("AMD Instinct MI300X",),
        {
            "bf16": 1307.4,
            "fp16": 1307.4,
            "tf32": 653.7,
            "fp32": 163.4,
            "fp8": 2614.9,
            "int8": 2614.9,
        },
        "AMD Instinct MI300X datasheet",
    ),
    _row(
        "MI325X",
        ("AMD Instinct MI325X",),
        {
            "bf16": 1307.4,
            "fp16": 1307.4,
            "tf32": 653.7,
            "fp32": 163.4,
            "fp8": 2614.9,
            "int8": 2614.9,
        },
        "AMD Instinct MI325X datasheet",
    ),
)


def _build_index(table: tuple[PeakEntry, ...]) -> Mapping[str, PeakEntry]:
    index: dict[str, PeakEntry] = {}
    for entry in table:
        for name in entry.names:
            key = normalise_gpu_name(name)
            if key in index:
                raise ValueError(f"peak table: {name!r} appears twice")
            index[key] = entry
    return MappingProxyType(index)


_INDEX = _build_index(PEAK_TABLE)


def peak_entry(gpu_name: str | None) -> PeakEntry | None:
    """The table row for a device name exactly as NVML reports it; ``None`` when unknown."""
    if not gpu_name or not isinstance(gpu_name, str):
        return None
    return _INDEX.get(normalise_gpu_name(gpu_name))


def peak_flops(gpu_name: str | None, dtype: Any = "bf16") -> float | None:
    """The dense peak of one device, in FLOP/s (ops/s for ``int8``).

    Args:
        gpu_name: The device name exactly as NVML or ``torch.cuda.get_device_name`` reports it
            ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", "Tesla T4").
        dtype: The data type of the training's matrix multiplications (see
            :func:`normalise_dtype`).

    Returns:
        The peak in FLOP/s; ``None`` for a device that is not in the table, or a data type the
        device has no figure for (e.g. bf16 on a V100).

    Raises:
        ConfigurationError: ``dtype`` is unknown.
    """
    key = normalise_dtype(dtype)
    entry = peak_entry(gpu_name)
    return None if entry is None else entry.flops_per_second(key)


def known_gpu_names() -> list[str]:
    """Every device name in the table, as NVML reports it."""
    return [name for entry in PEAK_TABLE for name in entry.names]
