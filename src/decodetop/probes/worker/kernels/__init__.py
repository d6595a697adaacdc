"""Provides decodetop's own fused kernels and the engines' kernels where importable (torch side): one module per
kernel (`mla`, `dsa`, `gqa`, `norms`, `rope`), the MoE tile store (`tiles`), engine detection (`engines`) and what
they share (`common`: the Triton check, the kernel classes, the best-kernel choice)."""
