"""Device queries: the visible CUDA devices and their compute capabilities
(what build_info reports and what methods that need TMA check)."""

from __future__ import annotations

import jax


def cuda_devices() -> list:
    """Every visible CUDA device; empty without one."""
    try:
        return jax.devices("cuda")
    except RuntimeError:
        return []


def gpu_compute_capabilities() -> list[tuple[int, int]]:
    """(major, minor) of every visible CUDA device; empty without one."""
    caps = []
    for d in cuda_devices():
        major, _, minor = str(getattr(d, "compute_capability", "0.0")).partition(".")
        caps.append((int(major), int(minor or 0)))
    return caps
