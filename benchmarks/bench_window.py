"""The window benchmark: jax_tma.window (auto, the tensor-map path and SIMT)
against the XLA formulation of each case and the copy ceiling.

    python benchmarks/run.py window [--out-dir DIR]
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

import jax_tma
from harness import Benchmark, Session, rotate

OP = "window"
BYTES = ("read + write: every output element written once plus the input element it reads "
         "(padding: the whole input read plus the whole output written)")
# Every case at float32 and bfloat16 (crops and pads of images and
# activations): jax_tma moves bytes, but XLA's slice and pad kernels change
# with the element type. The aligned start is a multiple of 16 bytes at both.
FULL = {"n": 8192, "box": 4096, "start": (1234, 2345), "aligned": (1234, 2344), "pad": 64,
        "dtypes": ("float32", "bfloat16")}
SMOKE = {"n": 256, "box": 128, "start": (12, 35), "aligned": (12, 40), "pad": 8,
         "dtypes": ("float32", "bfloat16")}
_SHORT = {"float32": "f32", "bfloat16": "bf16"}


def _window(start, shape, strides=None, traced=False):
    """{method: jitted window} for auto, tma and simt (`traced`: the start
    is two int32 arguments)."""
    def make(method):
        if traced:
            return jax.jit(lambda x, i, j: jax_tma.window(x, (i, j), shape, strides=strides,
                                                          method=method))
        return jax.jit(lambda x: jax_tma.window(x, start, shape, strides=strides, method=method))
    return {m: make(m) for m in ("auto", "tma", "simt")}


def _cases(p: dict[str, Any], dtype: str) -> list[dict[str, Any]]:
    n, box, (i, j), (ai, aj), pad = p["n"], p["box"], p["start"], p["aligned"], p["pad"]
    size = jnp.dtype(dtype).itemsize
    short = _SHORT[dtype]
    moved = 2 * box * box * size
    dyn = jax.jit(lambda x, i, j: jax.lax.dynamic_slice(x, (i, j), (box, box)))
    return [
        {"case": f"{box}² of {n}² {short} at a traced start ({i}, {j}), innermost start not "
                 f"16-B aligned, vs lax.dynamic_slice",
         "ours": _window(None, (box, box), traced=True), "xla": dyn,
         "args": (jnp.int32(i), jnp.int32(j)), "bytes": moved},
        {"case": f"the same at a traced start ({ai}, {aj}), innermost start 16-B aligned",
         "ours": _window(None, (box, box), traced=True), "xla": dyn,
         "args": (jnp.int32(ai), jnp.int32(aj)), "bytes": moved},
        {"case": f"the same at a static start ({ai}, {aj}) vs the static slice "
                 f"x[{ai}:{ai + box}, {aj}:{aj + box}]",
         "ours": _window((ai, aj), (box, box)),
         "xla": jax.jit(lambda x: x[ai:ai + box, aj:aj + box]), "args": (), "bytes": moved},
        {"case": f"x[::2, ::2] of {n}² {short} vs XLA's strided slice (no tensor-map form: "
                 f"innermost stride 2)",
         "ours": {m: f for m, f in _window((0, 0), (n // 2, n // 2), (2, 2)).items()
                  if m != "tma"},
         "xla": jax.jit(lambda x: x[::2, ::2]), "args": (), "bytes": 2 * (n // 2) ** 2 * size},
        {"case": f"pad {n}² -> {n + 2 * pad}² {short} (static start ({-pad}, {-pad})) vs "
                 f"jnp.pad",
         "ours": _window((-pad, -pad), (n + 2 * pad,) * 2),
         "xla": jax.jit(lambda x: jnp.pad(x, pad)), "args": (),
         "bytes": (n * n + (n + 2 * pad) ** 2) * size},
        {"case": f"whole-array copy of {n}² {short}: jax_tma.copy (auto, 'tiled' in the tma "
                 f"column, simt) vs jnp.copy",
         "ours": {"auto": jax.jit(jax_tma.copy),
                  "tma": jax.jit(functools.partial(jax_tma.copy, method="tiled")),
                  "simt": jax.jit(functools.partial(jax_tma.copy, method="simt"))},
         "xla": jax.jit(jnp.copy), "args": (), "bytes": 2 * n * n * size},
    ]


def _paths_run(fn, *args) -> str:
    """The handler paths (ffi/path_counts.h) that one call of `fn` runs, e.g.
    "window.tiled" where auto's planner took the tensor-map kernel. Call it
    first: a CUDA graph that XLA replays counts once, when it is recorded."""
    before = jax_tma._ffi.path_counts()
    jax.block_until_ready(fn(*args))
    after = jax_tma._ffi.path_counts()
    return ",".join(sorted(p for p, n in after.items() if n > before.get(p, 0))) or "?"


def bench_window(s: Session) -> dict[str, Any]:
    """Each case's jax_tma methods, its XLA formulation and the copy ceiling
    (the reference memcpy of the same bytes), interleaved; each checked bit
    for bit against the XLA formulation first."""
    p = SMOKE if s.smoke else FULL
    n = p["n"]
    rows = []
    for dtype, c in [(d, c) for d in p["dtypes"] for c in _cases(p, d)]:
        x = jax.random.normal(jax.random.key(7), (n, n), dtype)
        args = (x, *c["args"])
        want = c["xla"](*args)
        auto_path = _paths_run(c["ours"]["auto"], *args)
        for method, fn in c["ours"].items():
            s.check(f"{c['case']}: {method}", fn(*args), want)
        ceiling_in = jax.random.bits(jax.random.key(8), (c["bytes"] // 8,), jnp.uint32)
        s.check(f"{c['case']}: memcpy ceiling", s.refs.memcpy(ceiling_in), ceiling_in)
        cases = {m: rotate(fn, [args]) for m, fn in c["ours"].items()}
        cases["xla"] = rotate(c["xla"], [args])
        cases["memcpy"] = rotate(s.refs.memcpy, [(ceiling_in,)])
        timed = s.time(cases, 4 if s.smoke else 10, rep=2)
        t = timed["cases"]
        row = {"case": c["case"], "dtype": dtype, "bytes": c["bytes"],
               "protocol": timed["protocol"],
               "auto_path": auto_path,
               "times": t,
               "busy_tbps": {k: c["bytes"] / v["busy_us"] / 1e6 for k, v in t.items()},
               "span_tbps": {k: c["bytes"] / v["span_us"] / 1e6 for k, v in t.items()},
               "vs_xla": {m: t["xla"]["busy_us"] / t[m]["busy_us"] for m in c["ours"]},
               "vs_ceiling": {m: t["memcpy"]["busy_us"] / t[m]["busy_us"] for m in c["ours"]}}
        rows.append(row)
        del ceiling_in, want, x
        s.log(f"window: {c['case']}: " + ", ".join(
            f"{k} {v:.3f} TB/s" for k, v in row["busy_tbps"].items()))
    return {"op": OP, "bytes_convention": BYTES, "rows": rows}


BENCHMARKS = {"window": Benchmark(lambda s, args: bench_window(s), budget_s=20)}
