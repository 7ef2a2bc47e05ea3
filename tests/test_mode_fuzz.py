"""Fuzz: every op against its NumPy result (bit for bit) and its jnp/lax
equivalent on random dtypes, shapes, methods and modes (eager, jit, vmap,
disable_jit, vjp, shard_map), fresh each run: the `rng` fixture's seed is
in every failure report (JAX_TMA_SEED=<seed> replays it). One case a test;
under --fuzz-budget (tests/conftest.py), as many as its share of the budget
allows, at least one."""

import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import pytest

import families
import ops_table as T
from families import BY_NAME, OP_NAMES
from reference import assert_bits_equal, cpu_device

TRIALS = 3
MODES = ("eager", "jit", "vmap", "disable_jit", "vjp", "shard_map")


def _draw_case(rng, name):
    op = BY_NAME[name]
    dtype = op.dtypes[int(rng.integers(len(op.dtypes)))]
    modes = [m for m in MODES if m != "vjp" or jnp.issubdtype(dtype, jnp.inexact)]
    if op.collective:  # it runs inside shard_map, so under none of these two
        modes = [m for m in modes if m not in ("vmap", "shard_map")]
    mode = str(rng.choice(modes))
    kw = dict(even=False, method=str(rng.choice(op.methods)), **op.fuzz_kw)
    if op.collective:
        kw["batch"] = 8 * int(rng.integers(1, 3))
    elif mode == "shard_map":
        kw["batch"] = 8
    else:
        kw["batch"] = int(rng.integers(op.min_batch, 5))
    return families.build(name, rng, dtype, **kw), mode


def _on_cpu(fn, *args):
    """fn(*args), jitted on the CPU. The jnp equivalents run there whatever
    the default backend: XLA's GPU compiler ends the process on some of them
    for narrow types (jnp's im2col of int4 under vmap, the grads of window's
    float4_e2m1fn and im2col's float8_e4m3b11fnuz: H100, jax 0.11.2,
    2026-11-27), taking a pytest-xdist worker's later tests with it."""
    with jax.default_device(cpu_device()):
        return jax.jit(fn)(*args)


def _run(case, mode, rng):
    """(ours in `mode`, the jnp equivalent's result, the NumPy result)."""
    if mode in ("eager", "jit", "disable_jit"):
        ours = jax.jit(case.ours) if mode == "jit" else case.ours
        if mode == "disable_jit":
            with jax.disable_jit():
                y = ours(*case.args)
        else:
            y = ours(*case.args)
        return y, _on_cpu(case.ref, *case.args), case.want()
    if mode == "vmap":
        k = int(rng.integers(1, len(case.args) + 1))
        batched = tuple(sorted(rng.permutation(len(case.args))[:k]))
        args, in_axes, want = T.stacked(case, rng, batched=batched)
        return (jax.jit(jax.vmap(case.ours, in_axes=in_axes))(*args),
                _on_cpu(jax.vmap(case.ref, in_axes=in_axes), *args), want)
    if mode == "vjp":
        ct = T.cotangent(rng, T.out_struct(case).shape, case.dtype)
        y, got = jax.jit(lambda c, *a: T.vjp(case, case.ours, a, c))(ct, *case.args)
        want, exact = _on_cpu(lambda c, *a: T.ref_grads(case, a, c), ct, *case.args)
        for g, w, e in zip(got, want, exact):
            T.assert_grads_like_jnp(g, w, e)
        return y, None, case.want()
    mesh = T.cpu_mesh()
    specs = case.batch_specs()
    ours, ref = (jax.jit(T.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=T.BATCH))
                 for fn in T.local_fns(case))
    return ours(*case.args), ref(*case.args), case.want()


@pytest.mark.quick
@pytest.mark.parametrize("trial", range(TRIALS))
@pytest.mark.parametrize("name", OP_NAMES)
def test_fuzz(rng, name, trial, fuzz_deadline):
    while True:
        case, mode = _draw_case(rng, name)
        note = f"{name} of {case.dtype} {[a.shape for a in case.args]} in mode {mode}"
        try:
            y, ref, want = _run(case, mode, rng)
            assert_bits_equal(y, want)
            if ref is not None:
                T.assert_like_jnp(y, ref, case.exact, flushed_ok=True)
        except Exception as e:
            raise AssertionError(f"{note}: {type(e).__name__}: {e}") from e
        if fuzz_deadline is None or time.monotonic() > fuzz_deadline:
            break


@pytest.mark.parametrize("budget", ["0", "inf", "soon"])
def test_fuzz_budget_must_be_positive_seconds(budget):
    done = subprocess.run([sys.executable, "-P", "-m", "pytest", f"--fuzz-budget={budget}",
                           "--collect-only", "-q", __file__], capture_output=True, text=True,
                          cwd=os.path.dirname(__file__))
    assert done.returncode == 4, done.stdout + done.stderr
    assert f"--fuzz-budget: {budget!r} is not a positive number of seconds" in done.stderr, \
        done.stderr
