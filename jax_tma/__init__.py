"""jax_tma: the Tensor Memory Accelerator of Hopper/Blackwell GPUs as JAX ops.

``import jax_tma`` registers every FFI target once; every op runs under
``jit``, ``vmap``, ``grad`` and ``shard_map`` and has a CPU implementation
with the GPU's results bit for bit, but for float sums of
``scatter(mode="add")`` without ``deterministic=True`` (``gather``'s
gradient among them): the GPU adds those in hardware order and may flush
float32 subnormals, so they agree with the CPU's to rounding only.
"""

from __future__ import annotations

from jax_tma import _ffi
from jax_tma._all_to_all import all_to_all
from jax_tma._broadcast import broadcast
from jax_tma._build_info import build_info
from jax_tma._copy import copy
from jax_tma._gather import gather
from jax_tma._im2col import col2im, im2col
from jax_tma._moe import MoePlan, moe_combine, moe_dispatch
from jax_tma._ppermute import ppermute
from jax_tma._ragged_all_to_all import ragged_all_to_all
from jax_tma._scatter import scatter
from jax_tma._window import window

__version__ = "0.1.0"
__all__ = ["all_to_all", "broadcast", "build_info", "col2im", "copy", "gather", "im2col",
           "moe_combine", "moe_dispatch", "ppermute", "ragged_all_to_all", "scatter", "window"]

_ffi.register()
