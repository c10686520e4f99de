"""Token-statistics kernels (Triton on CUDA; torch elsewhere)."""
