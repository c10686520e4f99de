"""GPU hardware: peak FLOP/s table and the NVML monitor."""
