"""jax_tma.build_info(): what was compiled and what the visible GPUs support."""

from __future__ import annotations

from typing import Any

import jax

from jax_tma import _devices, _ffi


def build_info() -> dict[str, Any]:
    """Reports the build and the devices, for bug reports.

    Takes no arguments and raises nothing: on a machine without a GPU, or
    with a build without CUDA, ``gpus`` is empty.

    Returns:
      A dict with ``cuda_compiled`` (bool: ``False`` for a build without
      ``nvcc``, whose ops run on CPU devices only), ``cuda_archs`` (e.g.
      ``"90a-real,100a-real,90-virtual"``), ``cuda_runtime_version`` (the
      statically linked cudart, or None), ``ffi_api_version`` ((major, minor)
      of the XLA FFI headers built against), ``ffi_targets`` (the names of
      jax_tma's FFI targets, which ``jax.export`` must be told are safe),
      ``jax_version`` and ``gpus``: per visible CUDA device its id, name,
      compute capability, whether TMA is usable (compute capability >= 9.0;
      on older GPUs ``method="auto"`` takes the SIMT kernels, with the same
      results) and ``plans_from``: the GPU whose tuned plans it runs (that
      GPU itself where the plans were tuned on it, else the nearest such GPU
      in peak memory bandwidth; None for another process's GPU).

    Examples:
      >>> import jax_tma
      >>> info = jax_tma.build_info()
      >>> sorted(info)
      ['cuda_archs', 'cuda_compiled', 'cuda_runtime_version', 'ffi_api_version', 'ffi_targets', 'gpus', 'jax_version']
      >>> all(isinstance(gpu["tma"], bool) for gpu in info["gpus"])
      True
    """
    ext = _ffi._ext
    gpus = []
    for d, (major, minor) in zip(_devices.cuda_devices(), _devices.gpu_compute_capabilities()):
        gpus.append(
            {
                "id": d.id,
                "name": d.device_kind,
                "compute_capability": f"{major}.{minor}",
                "tma": (major, minor) >= _ffi.rules()["tma_min_compute_capability"],
                "plans_from": _plans_from(ext, d),
            }
        )
    return {
        "cuda_archs": ext.cuda_archs,
        "cuda_compiled": bool(ext.cuda_compiled),
        "cuda_runtime_version": getattr(ext, "cuda_runtime_version", None),
        "ffi_api_version": tuple(ext.ffi_api_version),
        "ffi_targets": [t for family in ext.families().values() for t in family["targets"]],
        "gpus": gpus,
        "jax_version": jax.__version__,
    }


def _plans_from(ext, device) -> str | None:
    """The GPU whose tuned plans `device` runs: None where this process
    cannot query it (another process's, or a build without CUDA)."""
    if device.process_index != jax.process_index() or not hasattr(ext, "device_plan"):
        return None
    return ext.device_plan(device.local_hardware_id) or None
