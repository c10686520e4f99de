"""GPU hardware: the dense peak FLOP/s table and the NVML monitor.

``pynvml`` is imported only when a monitor starts.
"""
