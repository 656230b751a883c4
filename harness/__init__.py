"""verify-parity: correctness and regression harness for fused target-verify kernels."""
__version__ = "0.1.0"
