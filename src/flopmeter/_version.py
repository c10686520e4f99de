"""The package's version, in a leaf that imports nothing, so that every module can read it
without importing the package root (whose public face imports the meter)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
