"""Triton kernels too long for their op module (see STYLE: split past ~300 lines)."""
