"""The folder ``flopmeter run`` puts first on ``PYTHONPATH``: its ``sitecustomize`` module
starts zero-code metering in each Python process of the command (see :mod:`flopmeter.auto`).
This ``__init__`` makes it a package only so that the wheel carries it; Python imports the
``sitecustomize`` inside by its folder, not as ``flopmeter.auto.site.sitecustomize``."""
