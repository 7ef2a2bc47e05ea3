"""The broadcast benchmark: every jax_tma.broadcast method and cluster size
against XLA's materialised broadcast_to, the simplest Pallas broadcast and
the copy ceiling, the dsmem
path's SM-to-SM push bandwidth, and (for ncu) every variant run once.

    python benchmarks/run.py broadcast [--out-dir DIR]
    python benchmarks/run.py broadcast-ncu [--out-dir DIR]  # DRAM bytes, via ncu
"""

from __future__ import annotations

import functools
import json
import math
import os
import sys
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma
import ncu
import pallas_kernels
from harness import Benchmark, Session, rotate, rotate_all

OP = "broadcast"
NCU_OP = "broadcast-ncu"
BYTES = "read + write: the input read once plus the n replicas written once"
PUSH_BYTES = ("dsmem push: the bytes pushed SM to SM (the input times cluster_size - 1, n = 1) "
              "over the kernel's busy time")
FULL = [
    # name, x shape, axis, n, dtype: bf16 (activations, K/V heads), and one
    # case in f32 too: jax_tma moves bytes, XLA's broadcast kernel is
    # compiled for the element type.
    ("8 replicas of 4096² bf16 (axis=0)", (4096, 4096), 0, 8, "bfloat16"),
    ("8 replicas of 4096² f32 (axis=0)", (4096, 4096), 0, 8, "float32"),
    ("8 replicas of each row of 4096² bf16 (axis=1)", (4096, 4096), 1, 8, "bfloat16"),
    ("GQA repeat K/V heads: (4, 4096, 8, 128) bf16 ×4 (axis=3)", (4, 4096, 8, 128), 3, 4,
     "bfloat16"),
    # Outputs of at most 8 MiB, where `auto` takes SIMT (broadcast_plan.h):
    # the K/V heads of 512 and of 64 tokens, as at decode.
    ("GQA repeat K/V heads: (1, 512, 8, 128) bf16 ×4 (axis=3)", (1, 512, 8, 128), 3, 4,
     "bfloat16"),
    ("GQA repeat K/V heads: (1, 64, 8, 128) bf16 ×4 (axis=3)", (1, 64, 8, 128), 3, 4,
     "bfloat16"),
]
SMOKE = [("4 replicas of 64² bf16 (axis=0)", (64, 64), 0, 4, "bfloat16"),
         ("4 replicas of 64² f32 (axis=0)", (64, 64), 0, 4, "float32"),
         ("2 replicas of (2, 16, 4, 8) bf16 (axis=3)", (2, 16, 4, 8), 3, 2, "bfloat16")]
_UINT = {"bfloat16": jnp.uint16, "float32": jnp.uint32}
CLUSTER_SIZES = (2, 4, 8, 16)


def methods() -> list[tuple[str, str, int | None]]:
    """(label, method, cluster_size) of every broadcast variant."""
    out = [("auto", "auto", None), ("store", "store", None), ("simt", "simt", None)]
    for method in ("multicast", "dsmem"):
        out += [(f"{method}/{c}", method, c) for c in CLUSTER_SIZES]
    return out


def _broadcast_fn(n: int, axis: int, method: str, cluster_size: int | None):
    return jax.jit(functools.partial(jax_tma.broadcast, n=n, axis=axis, method=method,
                                     cluster_size=cluster_size))


def _xla_broadcast(shape: tuple[int, ...], n: int, axis: int):
    out = tuple(shape[:axis]) + (n,) + tuple(shape[axis:])
    return jax.jit(lambda x: jnp.broadcast_to(jnp.expand_dims(x, axis), out))


def _random_bits(key: jax.Array, shape, dtype: str = "bfloat16") -> jax.Array:
    """Random bits of `dtype` (NaN payloads included)."""
    return jax.random.bits(key, shape, _UINT[dtype]).view(jnp.dtype(dtype))


def bench_broadcast(s: Session) -> dict[str, Any]:
    """Every method and cluster size, XLA's materialised jnp.broadcast_to,
    the Pallas kernel and the copy ceiling (the reference memcpy of the same bytes),
    interleaved, each checked bit for bit first. Then the
    dsmem path's SM-to-SM push bandwidth: n=1 (one store per tile,
    cluster_size - 1 pushes of it)."""
    rows = []
    for name, shape, axis, n, dtype in SMOKE if s.smoke else FULL:
        # Four inputs (4 x 32 MiB at bf16) rotate, so that no call finds its
        # input in L2 (50 MiB on H100).
        inputs = [(_random_bits(k, shape, dtype),)
                  for k in jax.random.split(jax.random.key(11), 4)]
        x = inputs[0][0]
        nbytes = x.size * x.dtype.itemsize * (n + 1)
        fns = {label: _broadcast_fn(n, axis, m, c) for label, m, c in methods()}
        fns["xla"] = _xla_broadcast(shape, n, axis)
        fns["pallas"] = jax.jit(functools.partial(pallas_kernels.broadcast, n=n, axis=axis))
        # The reference moves the bits as unsigned integers: XLA's float
        # broadcast may flush subnormals (bf16 on the CPU does), so it is
        # checked as a comparator, as is the Pallas kernel (Pallas's
        # interpreter on an older jax quiets NaNs).
        want = fns["xla"](x.view(_UINT[dtype])).view(jnp.dtype(dtype))
        for label, fn in fns.items():
            s.check(f"{name} {label}", fn(x), want, comparator=label in ("xla", "pallas"))
        del want
        ceiling_in = jax.random.bits(jax.random.key(12), (nbytes // 8,), jnp.uint32)
        s.check(f"{name} memcpy ceiling", s.refs.memcpy(ceiling_in), ceiling_in)
        cases = rotate_all(fns, inputs)
        cases["memcpy"] = rotate(s.refs.memcpy, [(ceiling_in,)])
        timed = s.time(cases, 4 if s.smoke else 10, rep=2)
        t = timed["cases"]
        ours = [label for label, _, _ in methods() if label != "auto"]
        best = min(ours, key=lambda k: t[k]["busy_us"])
        row = {"case": name, "shape": list(shape), "axis": axis, "n": n, "dtype": dtype,
               "bytes": nbytes,
               "protocol": timed["protocol"], "times": t,
               "busy_tbps": {k: nbytes / v["busy_us"] / 1e6 for k, v in t.items()},
               "best": best, "best_vs_xla": t["xla"]["busy_us"] / t[best]["busy_us"],
               "auto_vs_best": t[best]["busy_us"] / t["auto"]["busy_us"],
               "auto_vs_xla": t["xla"]["busy_us"] / t["auto"]["busy_us"],
               "auto_vs_pallas": t["pallas"]["busy_us"] / t["auto"]["busy_us"],
               "auto_vs_pallas_span": t["pallas"]["span_us"] / t["auto"]["span_us"]}
        rows.append(row)
        del inputs, x, ceiling_in
        s.log(f"broadcast {name}: best {best} {row['best_vs_xla']:.2f}x XLA, auto at "
              f"{row['auto_vs_best']:.3f} of best")

    name, shape, _, _, _ = (SMOKE if s.smoke else FULL)[0]
    inputs = [(_random_bits(k, shape),) for k in jax.random.split(jax.random.key(13), 4)]
    x = inputs[0][0]
    fns = {}
    for cluster in CLUSTER_SIZES:
        fn = fns[str(cluster)] = _broadcast_fn(1, 0, "dsmem", cluster)
        s.check(f"dsmem push, cluster {cluster}", fn(x), x[None])
    timed = s.time(rotate_all(fns, inputs), 4 if s.smoke else 10, rep=2)
    push = [{"cluster_size": int(c), **t, "pushed_bytes": x.size * 2 * (int(c) - 1),
             "push_tbps": x.size * 2 * (int(c) - 1) / t["busy_us"] / 1e6}
            for c, t in timed["cases"].items()]
    return {"op": OP, "bytes_convention": BYTES, "rows": rows,
            "pallas_kernel": pallas_kernels.describe("broadcast"),
            "dsmem_push": {"input": name, "bytes_convention": PUSH_BYTES,
                           "protocol": timed["protocol"], "rows": push}}


def split_at_markers(kernels: list[dict[str, Any]], labels: list[str],
                     x_bytes: int) -> list[dict[str, Any]]:
    """Per variant (`labels`, in order), the ncu metrics of its kernels, those
    between two launches of the marker kernel (see run_once), summed."""
    marks = [i for i, k in enumerate(kernels) if "ReadStreamKernel" in k["name"]]
    if len(marks) != len(labels) + 1 or any(b - a < 2 for a, b in zip(marks, marks[1:])):
        raise RuntimeError(f"ncu: {len(marks)} marker kernels around {len(labels)} variants "
                           f"(each needs a kernel between two markers): "
                           f"{[k['name'][:60] for k in kernels]}")
    rows = []
    for label, lo, hi in zip(labels, marks, marks[1:]):
        group = kernels[lo + 1:hi]
        total = {m: sum(k["metrics"][m] for k in group) for m in ncu.METRICS}
        rows.append({"method": label, "kernels": [k["name"] for k in group],
                     "dram_read_bytes": total["dram__bytes_read.sum"],
                     "dram_write_bytes": total["dram__bytes_write.sum"],
                     "read_over_x": total["dram__bytes_read.sum"] / x_bytes,
                     "kernel_us": total["gpu__time_duration.sum"] / 1e3})
    return rows


def bench_broadcast_ncu() -> dict[str, Any]:
    """DRAM bytes read and written by every variant on the first case, from
    ncu (`run.py broadcast-once` profiled as a subprocess)."""
    run_py = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run.py")
    prof = ncu.profile([sys.executable, "-P", run_py, "broadcast-once"],
                       shown=["python", "-P", "benchmarks/run.py", "broadcast-once"])
    prefix = "broadcast-once variants: "
    labels = json.loads(next(line[len(prefix):] for line in prof["stdout"].splitlines()
                             if line.startswith(prefix)))
    name, shape, _, n, _ = FULL[0]
    x_bytes = math.prod(shape) * 2
    return {"op": NCU_OP, "case": name, "x_bytes": x_bytes, "out_bytes": x_bytes * n,
            "metrics": list(ncu.METRICS), "command": prof["command"],
            "ncu_version": prof["ncu_version"],
            "rows": split_at_markers(prof["kernels"], labels, x_bytes),
            "bytes_convention": "DRAM bytes as ncu counts them (dram__bytes_read.sum, "
                                "dram__bytes_write.sum), each variant's kernels summed"}


def run_once() -> list[str]:
    """Runs every broadcast variant and XLA's broadcast_to once on the first
    case, each between two launches of the reference read kernel (markers
    that split an ncu report into the variants' kernels); everything is
    compiled first, so that no compile-time kernel falls between markers.
    Returns the variant labels in order."""
    from references import load

    refs = load(smoke=False)
    name, shape, axis, n, _ = FULL[0]
    rng = np.random.default_rng(3)  # host data: no device kernel makes x
    x = jax.device_put(rng.integers(0, 1 << 16, shape, dtype=np.uint16).view(jnp.bfloat16))
    marker_in = jax.device_put(np.arange(4, dtype=np.uint32))
    variants = [(label, _broadcast_fn(n, axis, m, c)) for label, m, c in methods()]
    variants.append(("xla", _xla_broadcast(shape, n, axis)))
    compiled = [(label, fn.lower(x).compile()) for label, fn in variants]
    marker = refs.read_stream.lower(marker_in).compile()
    jax.block_until_ready(marker(marker_in))
    for label, fn in compiled:
        jax.block_until_ready(fn(x))
        jax.block_until_ready(marker(marker_in))
    return [label for label, _ in compiled]


BENCHMARKS = {
    "broadcast": Benchmark(lambda s, args: bench_broadcast(s), budget_s=30, once=run_once),
    # DRAM bytes from ncu
    "broadcast-ncu": Benchmark(lambda s, args: bench_broadcast_ncu(), budget_s=30,
                               not_in_smoke="needs ncu and a GPU", timing_method="ncu",
                               group="ncu"),
}
