"""jax_tma.moe_dispatch and jax_tma.moe_combine on 8 host devices: issue
43's contract row for row against the NumPy reference (recv's order, group
sizes, capacity drops and plan.dropped, masked and out-of-range ids, skewed
routing and empty experts), combine's sums bit for bit in the documented
order, every real float dtype; a whole MoE layer (router, top-k, ragged_dot
experts) against the dense formulation, forward, grads and linearize,
with and without drops; each op's jvp and vjp alone; the plan through jit,
out_specs, scan carries and a custom_vjp; vmap and eager shard_map; two mesh
axes; every validation rule's message."""

import dataclasses
import functools
import logging
import re

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from jax import lax
from jax.sharding import PartitionSpec as P

import jax_tma
import ops_table
from paths import paths_ran
from jax_tma import _ffi
from jax_tma._moe import (_plan_counts_p, _plan_in_jnp, _plan_p, _plan_sends, _pull_composed,
                          _pull_p)
from reference import (assert_bits_equal, cpu_device, cpu_mesh, moe_combine_reference,
                       moe_dispatch_reference, random_array)

N = 8
MESH = cpu_mesh((N,), ("x",))
GRID = cpu_mesh((2, 4), ("a", "b"))


def _on_mesh(fn, mesh=MESH, specs=P("x"), out=P("x"), jit=True):
    f = jax.shard_map(fn, mesh=mesh, in_specs=specs, out_specs=out)
    return jax.jit(f) if jit else f


def _body(num_experts: int, capacity: int | None, axes=("x",)):
    """dispatch, then combine of the received rows times 2 (the rows are
    recv's as dispatched, so that combine's reference sees them)."""
    def body(x, ids, weights):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=num_experts, axis_name=axes,
                                          capacity=capacity)
        return recv, plan.group_sizes, plan.dropped, jax_tma.moe_combine(recv * 2, plan, weights)
    return body


@functools.cache
def _layer(num_experts: int, capacity: int | None, axes=("x",), mesh=MESH, spec=P("x")):
    return _on_mesh(_body(num_experts, capacity, axes), mesh, spec, spec)


def _routing(rng, kind: str, tokens: int, k: int, num_experts: int) -> np.ndarray:
    """(N·tokens, k) int32 ids: "random" (with -1 masks and traced ids out of
    range, which mask too), "skewed" (every token's first choice expert 3,
    the rest random: most experts of the other devices stay empty) or
    "masked" (every choice -1)."""
    if kind == "masked":
        return np.full((N * tokens, k), -1, np.int32)
    ids = rng.integers(-1, num_experts, (N * tokens, k)).astype(np.int32)
    if kind == "skewed":
        ids[:, 0] = 3
        ids[:, 1:] = rng.choice([-1, 3, num_experts - 1], ids[:, 1:].shape)
    else:
        ids[rng.random(ids.shape) < 0.05] = num_experts + 7
        ids[rng.random(ids.shape) < 0.05] = -5
    return ids


def _normal(rng, shape, dtype=np.float32) -> np.ndarray:
    """Values to compute with: normal, so that no sum or product is
    subnormal (XLA flushes those to zero on the CPU), positive where the
    dtype has no sign."""
    values = rng.standard_normal(shape)
    if not ml_dtypes.finfo(dtype).min < 0:
        values = np.abs(values)
    return values.astype(dtype)


def _check(got, x, ids, weights, num_experts, capacity, n=N):
    recv, sizes, dropped, out = (np.asarray(a) for a in got)
    want_recv, want_sizes, want_dropped, placed = moe_dispatch_reference(
        x, ids, n, num_experts, capacity)
    rows = recv.reshape((n, -1) + recv.shape[1:])
    assert rows.shape[1] == (ids.shape[0] * ids.shape[1] if capacity is None
                             else num_experts // n * capacity)
    for d in range(n):
        assert_bits_equal(rows[d, :len(want_recv[d])], want_recv[d])
    assert_bits_equal(sizes, want_sizes.reshape(-1))
    assert_bits_equal(dropped, want_dropped)
    y = np.concatenate([np.concatenate([2 * want_recv[d], np.zeros(
        (rows.shape[1] - len(want_recv[d]),) + recv.shape[1:], recv.dtype)]) for d in range(n)])
    assert_bits_equal(out, moe_combine_reference(y, weights, placed, n))


# ---- the contract ---------------------------------------------------------------

@pytest.mark.parametrize("capacity", [None, 3, 0])
def test_dispatch_and_combine_match_the_numpy_contract(rng, capacity):
    """Random routing (masked and out-of-range ids), every token's first
    choice to one expert (the others of its devices empty, drops with a
    capacity), every choice masked; one compiled program for the three."""
    num_experts, tokens, k = 16, 6, 3
    f = _layer(num_experts, capacity)
    for kind in ("random", "skewed", "masked"):
        x = _normal(rng, (N * tokens, 5))
        ids = _routing(rng, kind, tokens, k, num_experts)
        weights = _normal(rng, (N * tokens, k))
        _check(f(x, ids, weights), x, ids, weights, num_experts, capacity)


def test_the_plan_says_what_it_dropped_where_a_device_holds_several_choices(rng):
    """Top-k over distinct experts of one device (experts 0 and 1 of device
    0, 4 a device): the token crosses once, both choices land, the
    capacity drops the later sources' rows first."""
    ids = np.tile(np.array([[0, 1]], np.int32), (N * 4, 1))
    x = _normal(rng, (N * 4, 2))
    weights = _normal(rng, (N * 4, 2))
    got = _layer(32, 5)(x, ids, weights)
    _check(got, x, ids, weights, 32, 5)
    dropped = np.asarray(got[2]).reshape(N, 4, 2)
    assert not dropped[:1].any() and dropped[2:].all() and dropped[1, 1:].all()


# ---- the plan's kernels -------------------------------------------------------

def _plans(ids, num_experts: int, capacity, mesh=MESH, axes=("x",)):
    """The plan of each device's ids (ids: (n·T, k) on `mesh`) by the plan's
    kernels (_plan_sends) and by its jnp formulation (_plan_in_jnp), every
    field of each stacked over the devices; one program each (two exchanges
    side by side in one program can starve each other on the CPU:
    docs/limits.md)."""
    n = mesh.size
    spec = P(axes)
    return tuple(_on_mesh(lambda ids, f=f: f(ids, num_experts, capacity, axes, n), mesh, spec,
                          spec)(ids) for f in (_plan_sends, _plan_in_jnp))


@pytest.mark.parametrize("capacity", [None, 0, 2])
@pytest.mark.parametrize("dtype", [np.int32, np.int8, np.uint8, np.int16, np.uint32, np.int64])
def test_the_plans_kernels_give_the_jnp_formulations_bits(rng, capacity, dtype):
    """Every field of the plan, for random, skewed and masked routing in the
    ids' own integer dtype (wide ids past int32's range, which mask)."""
    num_experts = 16
    for kind in ("random", "skewed", "masked"):
        ids = _routing(rng, kind, 5, 3, num_experts).astype(np.int64)
        if np.dtype(dtype).kind == "u":
            ids = np.where(ids < 0, np.iinfo(dtype).max, ids)
        if dtype is np.int64:
            ids = np.where(rng.random(ids.shape) < 0.1, 2**32 + 3, ids)
        kernels, composed = _plans(ids.astype(dtype), num_experts, capacity)
        for field, a, b in zip(kernels._fields, kernels, composed):
            assert_bits_equal(np.asarray(a), np.asarray(b))


def test_the_plans_kernels_over_two_mesh_axes_and_under_vmap(rng):
    ids = np.stack([_routing(rng, "random", 4, 2, 8) for _ in range(3)])
    plans = jax.vmap(lambda i: _plans(i, 8, 1, GRID, ("a", "b")))(ids)
    for a, b in zip(*plans):
        assert_bits_equal(np.asarray(a), np.asarray(b))


@pytest.mark.parametrize("tokens,k,num_experts", [(683, 6, 16), (4, 2, 264)])
def test_past_the_plans_kernels_limits_the_plan_is_the_jnp_formulations(rng, tokens, k,
                                                                        num_experts):
    """Over 4,096 choices a device, or 256 experts: no call of the kernels."""
    ids = _routing(rng, "random", tokens, k, num_experts)
    with paths_ran() as ran:
        jax.block_until_ready(_on_mesh(lambda i: _plan_sends(i, num_experts, None, ("x",), N))(
            ids))
    assert not {p for p in ran if p.startswith("moe_dispatch_")}, ran


def test_past_the_plans_kernels_limits_the_jnp_formulation_keeps_the_contract(rng):
    """More experts than the kernels hold (ffi/ppermute/moe_dispatch_plan.h):
    the jnp plan, the same contract."""
    num_experts = N * 40
    assert num_experts > _ffi.rules()["ppermute.moe_plan_max_experts"]
    x = _normal(rng, (N * 6, 5))
    ids = _routing(rng, "random", 6, 3, num_experts)
    weights = _normal(rng, (N * 6, 3))
    _check(_layer(num_experts, 2)(x, ids, weights), x, ids, weights, num_experts, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens,k,num_experts,n,capacity", [
    (128, 8, 32, 2, -1), (512, 8, 32, 2, -1), (512, 8, 256, 8, 100), (682, 6, 60, 4, 90),
    (64, 8, 256, 64, -1), (4096, 1, 8, 1, 5), (0, 4, 8, 2, -1)])
def test_the_plans_kernels_on_a_gpu_give_the_cpu_handlers_bits(rng, gpu, tokens, k, num_experts,
                                                               n, capacity):
    """Both calls on the GPU and on the CPU: decode shapes up to the kernels'
    4,096 choices, 256 experts, 64 positions, skewed ids (a third of the choices to one expert),
    a table of every position's counts naming a random position, a batch of
    two."""
    ids = rng.integers(-1, num_experts, (2, tokens, k)).astype(np.int32)
    ids[rng.random(ids.shape) < 0.3] = 3 % num_experts
    table = np.tile(rng.integers(0, tokens * k + 1, (2, n, 1)),
                    (1, 1, num_experts + n + 1)).astype(np.int32)
    table[..., :num_experts] = rng.integers(0, 2 * tokens + 1, (2, n, num_experts))
    table[..., -1] = rng.integers(0, n, (2, 1))
    attrs = dict(experts=num_experts, parts=n)

    def calls(ids, table):
        return _plan_counts_p.bind(ids, **attrs), _plan_p.bind(ids, table, capacity=capacity,
                                                               **attrs)
    f = jax.jit(calls)
    want = f(jax.device_put(ids, cpu_device()), jax.device_put(table, cpu_device()))
    got = f(jax.device_put(ids, gpu), jax.device_put(table, gpu))
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        assert_bits_equal(np.asarray(a), np.asarray(b))


# The float8 types each cost a compile: a run takes the common two, e8m0
# (no zero, no sign) and one of the others, drawn with the run's seed.
_FLOATS = [d.name for d in ops_table.FLOAT_DTYPES if d.kind != "c"]
_FIXED = [d for d in _FLOATS if not d.startswith("float8")] + [
    "float8_e4m3fn", "float8_e5m2", "float8_e8m0fnu"]


@pytest.mark.parametrize("dtype", _FIXED + ["another-float8"])
def test_every_real_float_dtype(rng, dtype):
    """dispatch moves any bits (NaNs, infinities, subnormals); combine rounds
    as the reference does. One dispatch carries both: each token's random
    bits, then the same values tamed (1 where not finite or far from 1, so
    that no sum is subnormal), which combine sums."""
    if dtype == "another-float8":
        dtype = str(rng.choice([d for d in _FLOATS if d.startswith("float8") and d not in _FIXED]))
    dtype = np.dtype(getattr(jnp, dtype))
    ids = _routing(rng, "random", 4, 2, 8)
    weights = _normal(rng, (N * 4, 2))
    x = random_array(rng, (N * 4, 3), dtype)
    with np.errstate(invalid="ignore", over="ignore"):
        v = np.abs(x.astype(np.float64))
        tame = np.where((v == 0) | ((v >= 2.0 ** -20) & (v <= 2.0 ** 20)), x, np.ones_like(x))

    def body(x, ids, weights):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x")
        return recv, jax_tma.moe_combine(recv[:, 3:], plan, weights)

    recv, out = _on_mesh(body)(np.concatenate([x, tame], axis=1), ids, weights)
    want, _, _, placed = moe_dispatch_reference(x, ids, N, 8)
    rows = np.asarray(recv).reshape(N, -1, 6)
    for d in range(N):
        assert_bits_equal(rows[d, :len(want[d]), :3], want[d])
    # A sum past the dtype's range is NaN in the float8 types without an
    # infinity, of either sign: XLA's conversions to them keep it in some
    # programs and not in others (IEEE leaves a NaN's sign open).
    want = moe_combine_reference(np.asarray(recv)[:, 3:], weights, placed, N)
    nan = np.isnan(want.astype(np.float64))
    assert_bits_equal(np.isnan(np.asarray(out).astype(np.float64)), nan)
    assert_bits_equal(np.asarray(out)[~nan], want[~nan])


def test_over_two_mesh_axes_and_over_one(rng):
    """Over ("a", "b") the 8 devices are one group; over "b" each row of 4
    dispatches on its own."""
    tokens, k = 4, 2
    x = _normal(rng, (N * tokens, 3))
    ids = _routing(rng, "random", tokens, k, 8)
    weights = _normal(rng, (N * tokens, k))
    both = P(("a", "b"))
    _check(_layer(8, None, ("a", "b"), GRID, both)(x, ids, weights), x, ids, weights, 8, None)
    got = _layer(8, 2, ("b",), GRID, both)(x, ids, weights)
    for row in range(2):
        part = [np.split(np.asarray(a), 2)[row] for a in got]
        _check(part, *(np.split(a, 2)[row] for a in (x, ids, weights)), 8, 2, n=4)


def test_a_shard_map_manual_over_some_axes_takes_the_lax_formulations(rng, caplog):
    """Manual over "b" alone ("a" automatic: the same dispatch in both rows
    of the mesh): every exchange is lax's, and each device still learns its
    position from the counts' all_to_all."""
    tokens, k = 4, 2
    x = _normal(rng, (4 * tokens, 3))
    ids = _routing(rng, "random", tokens, k, 8)[:4 * tokens]
    weights = _normal(rng, (4 * tokens, k))
    f = jax.jit(jax.shard_map(_body(8, 2, ("b",)), mesh=GRID, in_specs=P("b"), out_specs=P("b"),
                              axis_names={"b"}))
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        got = f(x, ids, weights)
    _check(got, x, ids, weights, 8, 2, n=4)
    assert "lax.all_to_all of the pairs and their rows, because the shard_map is manual over" \
        in caplog.text, caplog.text


# ---- a whole layer against the dense formulation --------------------------------

TOKENS, DIM, HIDDEN, EXPERTS, TOP_K = 6, 8, 4, 16, 2


def _router(x, w_router):
    gates, experts = lax.top_k(jax.nn.softmax(x @ w_router, axis=-1), TOP_K)
    return gates, experts


def _moe(capacity):
    def body(x, w_router, w1, w2):
        gates, experts = _router(x, w_router)
        recv, plan = jax_tma.moe_dispatch(x, experts, num_experts=EXPERTS, axis_name="x",
                                          capacity=capacity)
        h = jnp.tanh(lax.ragged_dot(recv, w1, plan.group_sizes))
        return jax_tma.moe_combine(lax.ragged_dot(h, w2, plan.group_sizes), plan, gates)
    return jax.shard_map(body, mesh=MESH, in_specs=(P("x"), P(), P("x"), P("x")),
                         out_specs=P("x"))


def _dense(keep):
    def layer(x, w_router, w1, w2):
        gates, experts = _router(x, w_router)
        mask = (jax.nn.one_hot(experts, EXPERTS) * (gates * keep)[..., None]).sum(1)
        h = jnp.tanh(jnp.einsum("td,edh->teh", x, w1))
        return jnp.einsum("te,teh,ehd->td", mask, h, w2)
    return layer


def _assert_close(got, want):
    for g, w in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        scale = float(np.abs(w).max())
        assert float(np.abs(np.asarray(g) - w).max()) <= 1e-4 * scale, (g, w)


@pytest.mark.parametrize("capacity", [None, 2])
def test_a_layer_matches_the_dense_one_forward_grads_and_linearize(rng, capacity):
    keys = jax.random.split(jax.random.key(int(rng.integers(1 << 31))), 8)
    args = (jax.random.normal(keys[0], (N * TOKENS, DIM)),
            jax.random.normal(keys[1], (DIM, EXPERTS)),
            jax.random.normal(keys[2], (EXPERTS, DIM, HIDDEN)) / np.sqrt(DIM),
            jax.random.normal(keys[3], (EXPERTS, HIDDEN, DIM)) / np.sqrt(HIDDEN))
    _, experts = _router(*args[:2])
    dropped = moe_dispatch_reference(args[0], experts, N, EXPERTS, capacity)[2]
    if capacity is not None:
        assert dropped.any() and not dropped.all()
    moe, dense = _moe(capacity), jax.jit(_dense(jnp.asarray(~dropped, jnp.float32)))
    ct = jax.random.normal(keys[4], (N * TOKENS, DIM))
    tangents = tuple(jax.random.normal(kk, a.shape) for kk, a in zip(keys[4:], args))
    # Forward mode through linearize, whose programs each hold one chain of
    # exchanges (a jvp's holds the primal's and the tangent's: docs/ops/moe.md).
    out, linear = jax.linearize(jax.jit(moe), *args)
    _assert_close((out, linear(*tangents)), jax.jvp(dense, args, tangents))

    def loss(f):
        return lambda *a: (f(*a) * ct).sum()

    _assert_close(jax.jit(jax.grad(loss(moe), argnums=(0, 1, 2, 3)))(*args),
                  jax.jit(jax.grad(loss(dense), argnums=(0, 1, 2, 3)))(*args))


def test_each_op_alone_forward_and_reverse(rng):
    """dispatch's tangent is the dispatch of dx, bit for bit; weights'
    cotangent is ⟨ct_out, y[row]⟩ (0 where masked), y's the dispatched
    cotangent times the weight; the derivative in y of the derivative in
    weights is combine itself, bit for bit. Each program holds one chain of
    exchanges."""
    ids = _routing(rng, "random", 4, 2, 8)
    x, dx = _normal(rng, (N * 4, 3)), _normal(rng, (N * 4, 3))
    weights, ct = _normal(rng, (N * 4, 2)), _normal(rng, (N * 4, 3))

    def forward(x, dx, ids):
        (recv, plan), (d_recv, _) = jax.jvp(
            lambda v: jax_tma.moe_dispatch(v, ids, num_experts=8, axis_name="x"), (x,), (dx,))
        return recv, d_recv, plan

    recv, d_recv, plan = _on_mesh(forward)(x, dx, ids)
    want = moe_dispatch_reference(dx, ids, N, 8)[0]
    rows = np.asarray(d_recv).reshape(N, -1, 3)
    for d in range(N):
        assert_bits_equal(rows[d, :len(want[d])], want[d])

    def reverse(y, plan, weights, ct):
        out, vjp = jax.vjp(lambda y, w: jax_tma.moe_combine(y, plan, w), y, weights)
        ct_y, ct_w = vjp(ct)
        # recv's rows past those received are unspecified
        received = jnp.arange(y.shape[0]) < jnp.sum(plan.group_sizes)
        return out, ct_w, jnp.sum(jnp.where(received[:, None], ct_y * y, 0))[None]

    out, ct_w, dot = _on_mesh(reverse)(recv, plan, weights, ct)
    valid = (ids >= 0) & (ids < 8)
    want = np.where(valid, np.einsum("th,th->t", ct, x)[:, None], 0)
    np.testing.assert_allclose(ct_w, want, rtol=1e-5, atol=1e-5)
    # Σ over the slots of ⟨weight · ct, y⟩ = Σ_t Σ_j weights[t, j] ⟨ct[t], x[t]⟩: a float32
    # sum whose terms may cancel, so held to 1e-5 of the terms' magnitude, not of the sum.
    terms = weights * want
    np.testing.assert_allclose(np.asarray(dot).sum(), terms.sum(), rtol=0,
                               atol=1e-5 * np.abs(terms).sum())

    def second(y, plan, weights):
        return jax.jvp(lambda v: jax.jvp(lambda w: jax_tma.moe_combine(v, plan, w),
                                         (weights,), (weights,))[1], (y,), (y,))[1]

    assert_bits_equal(_on_mesh(second)(recv, plan, weights), out)


# ---- the plan as a value -------------------------------------------------------------

def test_the_plan_passes_out_specs_jit_scan_and_custom_vjp(rng):
    ids = _routing(rng, "random", 4, 2, 8)
    x = _normal(rng, (N * 4, 3))
    weights = _normal(rng, (N * 4, 2))
    want = _layer(8, None)(x, ids, weights)[3]
    dispatch = _on_mesh(lambda x, ids: jax_tma.moe_dispatch(x, ids, num_experts=8,
                                                            axis_name="x"))
    recv, plan = dispatch(x, ids)
    assert isinstance(plan, jax_tma.MoePlan) and plan.group_sizes.shape == (8,)
    plan = jax.jit(lambda p: p)(plan)
    combine = _on_mesh(lambda y, p, w: jax_tma.moe_combine(y * 2, p, w))
    assert_bits_equal(combine(recv, plan, weights), want)

    def scanned(x, ids, weights):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x")

        def step(carry, _):
            rows, plan = carry
            return (rows, plan), jax_tma.moe_combine(rows * 2, plan, weights)
        return lax.scan(step, (recv, plan), None, length=2)[1]

    out = _on_mesh(scanned, out=P(None, "x"))(x, ids, weights)
    assert_bits_equal(out[1], want)

    @jax.custom_vjp
    def moved(x, ids):
        return jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x")[0]

    def moved_fwd(x, ids):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x")
        return recv, plan

    def moved_bwd(plan, ct):
        unit = jnp.ones(plan.dropped.shape, jnp.float32)
        return jax_tma.moe_combine(ct, plan, unit), None

    moved.defvjp(moved_fwd, moved_bwd)
    ct = _normal(rng, recv.shape)

    def grads(dispatch):
        return _on_mesh(lambda x, ids, ct: jax.vjp(lambda v: dispatch(v, ids), x)[1](ct)[0])

    plain = grads(lambda v, ids: jax_tma.moe_dispatch(v, ids, num_experts=8,
                                                      axis_name="x")[0])
    # the dispatch's transpose is combine with unit weights, bit for bit
    assert_bits_equal(grads(moved)(x, ids, ct), plain(x, ids, ct))


def test_the_dispatch_transpose_sums_on_the_way_home_past_the_inbox_limit(rng):
    """At rows past the inbox's limit of pair rows, the dispatch's transpose
    (its cotangent's rows summed home with unit weights) is one
    jax_tma_moe_combine too, and equal bit for bit to combine with unit
    weights."""
    hidden = 32784
    x, ids = _normal(rng, (N * 4, hidden)), _routing(rng, "random", 4, 2, 8)
    recv, plan = _on_mesh(lambda x, ids: jax_tma.moe_dispatch(x, ids, num_experts=8,
                                                              axis_name="x"))(x, ids)
    ct = _normal(rng, recv.shape)
    vjp = _on_mesh(lambda x, ids, ct: jax.vjp(
        lambda v: jax_tma.moe_dispatch(v, ids, num_experts=8, axis_name="x")[0], x)[1](ct)[0])
    text = vjp.lower(x, ids, ct).compile().as_text()
    assert len(re.findall(r'custom_call_target="jax_tma_moe_combine"', text)) == 1, text
    unit = _on_mesh(lambda ct, p: jax_tma.moe_combine(
        ct, p, jnp.ones(p.dropped.shape, jnp.float32)))
    assert_bits_equal(vjp(x, ids, ct), unit(ct, plan))


# ---- modes ---------------------------------------------------------------------------

def test_vmap_gives_each_member_its_own_dispatch(rng):
    ids = np.stack([_routing(rng, "random", 4, 2, 8) for _ in range(2)])
    x = _normal(rng, (2, N * 4, 3))
    weights = _normal(rng, (2, N * 4, 2))
    got = jax.jit(jax.vmap(_on_mesh(_body(8, 1), jit=False)))(x, ids, weights)
    for b in range(2):
        _check([a[b] for a in got], x[b], ids[b], weights[b], 8, 1)


def test_eager(rng):
    """Without jit, shard_map runs each primitive on its own."""
    ids = _routing(rng, "random", 2, 2, 8)
    x = _normal(rng, (N * 2, 3))
    weights = _normal(rng, (N * 2, 2))
    _check(_on_mesh(_body(8, None), jit=False)(x, ids, weights), x, ids, weights, 8, None)


@pytest.mark.parametrize("hidden", [6, 32784])
def test_no_buffer_is_filled_for_the_token_exchanges_to_overwrite(rng, hidden):
    """The exchanges of token rows write into results of rows of their own:
    the dispatch's pull has no output operand, and neither has combine's
    exchange home: at small rows a ragged_all_to_all of the pairs' sums with
    an output of no rows, not a buffer of fill (on an H200 at DeepEP's shape
    each fill took about 70 µs of the op's GPU time); past the inbox's limit
    of pair rows (32 rows a device of 32,784 float32: 4.1 MiB) one
    jax_tma_moe_combine of y, the weights, the slots and the four index
    arrays, which sums the pairs as it sends them (no buffer of sums
    either). The results are the reference's, bit for bit."""
    x, ids, weights = (_normal(rng, (N * 4, hidden)), _routing(rng, "random", 4, 2, 16),
                       _normal(rng, (N * 4, 2)))
    layer = _layer(16, None)
    text = layer.lower(x, ids, weights).compile().as_text()
    shapes = dict(re.findall(r"^\s*(%[\w.-]+) = (\S+)", text, re.M))
    calls = {t: [[shapes[re.sub(r"/\*.*?\*/", "", o).strip()] for o in args.split(",")]
                 for args in re.findall(rf"= \(?f32\[\d+,{hidden}\]\S*(?: s32\[\S*)? "
                                        rf"custom-call\(([^)]*)\).*"
                                        rf'custom_call_target="{t}"', text)]
             for t in ("jax_tma_ragged_all_to_all", "jax_tma_moe_combine",
                       "jax_tma_moe_dispatch")}
    assert len(calls["jax_tma_moe_dispatch"]) == 1, text
    large = N * 4 * hidden * 4 > jax_tma._ffi._ext.exchange_inbox_max_bytes  # n·T f32 rows
    if large:
        assert not calls["jax_tma_ragged_all_to_all"], text
        [operands] = calls["jax_tma_moe_combine"]
        assert [o.split("[")[0] for o in operands] == ["f32", "f32"] + ["s32"] * 5, operands
    else:
        assert not calls["jax_tma_moe_combine"], text
        [operands] = calls["jax_tma_ragged_all_to_all"]
        assert operands[1].startswith(f"f32[0,{hidden}]"), operands
    _check(layer(x, ids, weights), x, ids, weights, 16, None)


def test_no_partition_id_in_a_layer_or_its_gradient(rng):
    """Every device learns its position from the counts' all_to_all, not
    from lax.axis_index: XLA issues the partition id as a memset ahead of a
    program's command buffer, and on a GPU that memset then waits for the
    host to launch the buffer (on an H200, 64 µs of idle GPU before a chain
    of twelve small kernels, against none without it)."""
    x, ids, weights = (_normal(rng, (N * 4, 8)), _routing(rng, "random", 4, 2, 16),
                       _normal(rng, (N * 4, 2)))
    layer = _layer(16, None)
    grad = jax.jit(jax.grad(lambda x, ids, w: jnp.sum(layer(x, ids, w)[3] ** 2), argnums=(0, 2)))
    for text in (layer.lower(x, ids, weights).compile().as_text(),
                 grad.lower(x, ids, weights).compile().as_text()):
        assert "partition-id" not in text and "replica-id" not in text, text
    _check(layer(x, ids, weights), x, ids, weights, 16, None)


def test_num_sms_is_the_cta_budget_of_every_exchange_that_copies_rows(rng):
    """num_sms reaches every call that copies rows, as its ctas (the GPU
    handlers' budget; the CPU's check it): the dispatch's pull and ragged
    exchange, the combine's, and those of the gradients, which take it from
    the plan; without it they get 0 (the device's choice). The results are
    the same bits either way."""
    x, ids, weights = (_normal(rng, (N * 4, 6)), _routing(rng, "random", 4, 2, 16),
                       _normal(rng, (N * 4, 2)))

    def layer(num_sms):
        def body(x, ids, weights):
            recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=16, axis_name="x",
                                              num_sms=num_sms)
            assert plan.num_sms == num_sms
            return jax_tma.moe_combine(recv * 2, plan, weights)
        f = _on_mesh(body, jit=False)
        return jax.jit(jax.value_and_grad(lambda x, w: jnp.sum(f(x, ids, w) ** 2), (0, 1)))

    for num_sms, ctas in ((None, 0), (N, N), (132, 132)):
        text = layer(num_sms).lower(x, weights).compile().as_text()
        calls = [line for line in text.splitlines() if re.search(
            r'custom_call_target="jax_tma_(ragged_all_to_all|moe_dispatch)"', line)]
        assert len(calls) >= 4, text
        for line in calls:
            assert re.search(rf"\bctas = {ctas} : i64", line), line
    for got, want in zip(*(jax.tree.leaves(layer(s)(x, weights)) for s in (N, None))):
        assert_bits_equal(got, want)


def test_num_sms_under_vmap_gives_each_member_the_same_bits(rng):
    """vmap folds the members' exchanges into one (every member's slices:
    more than num_sms = n of them, which the GPU launchers floor at a CTA a
    slice): the budget rides along, and the results are those without it."""
    ids = np.stack([_routing(rng, "random", 4, 2, 16) for _ in range(2)])
    x, weights = _normal(rng, (2, N * 4, 3)), _normal(rng, (2, N * 4, 2))

    def layer(num_sms):
        def body(x, ids, weights):
            recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=16, axis_name="x",
                                              num_sms=num_sms)
            return jax_tma.moe_combine(recv * 2, plan, weights)
        return jax.jit(jax.vmap(_on_mesh(body, jit=False)))

    text = layer(N).lower(x, ids, weights).compile().as_text()
    assert re.search(rf'custom_call_target="jax_tma_ragged_all_to_all".*\bctas = {N} : i64',
                     text), text
    assert_bits_equal(layer(N)(x, ids, weights), layer(None)(x, ids, weights))


def test_the_debug_log_names_the_exchanges_and_the_call_site(rng, caplog):
    """A dispatch is two exchanges: the counts' all_to_all, then the pull,
    which brings each device's pairs with their rows (no ragged exchange
    of the pairs before it)."""
    ids = _routing(rng, "random", 2, 2, 8)
    x = _normal(rng, (N * 2, 3))
    f = _on_mesh(lambda x, ids: jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x")[0])
    with caplog.at_level(logging.DEBUG, logger="jax_tma"):
        f.lower(x, ids).compile()
    assert f"jax_tma.all_to_all over ('x',) at {__file__}:" in caplog.text
    assert f"jax_tma.moe_dispatch over ('x',) at {__file__}:" in caplog.text
    assert "jax_tma.ragged_all_to_all" not in caplog.text


def _random_pairs(rng, n: int, tokens: int, k: int, rows: int):
    """Each of n devices' pairs in send order as a dispatch's plan makes
    them: c[s, d] pairs from s to d (0 to T), device-major from row 0, each
    a random token (or, now and then, T: a pair that carries nothing) and
    slots that are -1 or rows of d's result no other pair there names;
    (T, -1, ...) past the pairs. Returns sent (n, n·T, k + 1), routes (n,
    n, 5) and c."""
    c = rng.integers(0, tokens + 1, (n, n))
    c[0, -1], c[-1, 0] = tokens, 0  # a full run and an empty one
    free = [list(rng.permutation(rows)) for _ in range(n)]
    sent = np.full((n, n * tokens, k + 1), -1, np.int32)
    sent[:, :, 0] = tokens
    first = np.cumsum(c, 1) - c
    for s in range(n):
        for d in range(n):
            for i in range(c[s, d]):
                row = sent[s, first[s, d] + i]
                row[0] = tokens if rng.random() < 0.1 else rng.integers(0, tokens)
                row[1:] = [free[d].pop() if rng.random() < 0.7 else -1 for _ in range(k)]
    below = np.cumsum(c, 1) - c  # [s, d]: the pairs s sends below d
    routes = np.stack([np.stack([first[d], c[d], np.full(n, d * tokens), c[:, d], below[:, d]],
                                1) for d in range(n)]).astype(np.int32)
    return sent, routes, c


def test_the_pull_and_its_lax_formulation_fill_each_slot_with_its_row(rng):
    """The dispatch's pull (every device from every position: random
    tokens, counts and slots, a pair now and then that carries nothing) and
    the lax.all_to_all formulation it falls back to across hosts: each slot
    of a pair holds its token's row, each device's slots result holds the
    pairs it got, region by source, -1 past them; the formulation's other
    rows are zeros."""
    tokens, k, width = 5, 3, 4
    rows = N * tokens * k
    x = random_array(rng, (N * tokens, width), np.float32)
    sent, routes, c = _random_pairs(rng, N, tokens, k, rows)

    def body(x, sent, routes):
        args = (x, sent[0], routes[0])
        ours = _pull_p.bind(*args, rows=rows, axis_name=("x",), size=N, site="test", ctas=0)
        composed = _pull_composed(*args, rows=rows, axis_name=("x",))
        return tuple(a[None] for a in (*ours, *composed))

    got = [np.asarray(a) for a in _on_mesh(body)(x, sent, routes)]
    first = np.cumsum(c, 1) - c
    for d in range(N):
        written = np.zeros(rows, bool)
        want = np.full((N * tokens, k), -1, np.int32)
        for s in range(N):
            for i in range(c[s, d]):
                token, *slots = sent[s, first[s, d] + i]
                if token == tokens:
                    continue
                want[s * tokens + i] = slots
                for slot in slots:
                    if slot >= 0:
                        written[slot] = True
                        for recv in (got[0], got[2]):
                            assert_bits_equal(recv[d, slot], x[s * tokens + token])
        np.testing.assert_array_equal(got[1][d], want)
        np.testing.assert_array_equal(got[3][d], want)
        assert not got[2][d, ~written].any()


# ---- the fp8 wire ----------------------------------------------------------------

def _quantised(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The contract of wire_dtype=float8_e4m3fn in NumPy: per block of 128,
    the scale is the least power of two (2**-126 at least) that brings the
    largest magnitude to 448 or below (0 for a block of zeros, the largest
    magnitude where that is not finite), the rows x / scale rounded (where
    the scale is 0 or not finite: 0, and NaN for an infinity or a NaN)."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 128)
    largest = np.abs(blocks).max(axis=2)
    finite = np.isfinite(largest)
    positive = finite & (largest > 0)
    fraction, exp = np.frexp(np.where(positive, largest, 1))  # fraction in [0.5, 1)
    exp = np.maximum(exp - 9 + (fraction > 448 / 512), -126)
    power = np.ldexp(np.float32(1), exp).astype(np.float32)
    scales = np.where(positive, power, np.where(finite, 0, largest)).astype(np.float32)
    wide = power.astype(np.float64)
    assert np.all(~positive | (largest <= 448 * wide) & ((largest > 224 * wide) | (exp == -126)))
    with np.errstate(invalid="ignore"):
        rows = blocks * np.where(positive, 1 / power, 0)[..., None]
    return rows.astype(ml_dtypes.float8_e4m3fn).reshape(x.shape), scales


def _fp8_body(num_experts: int, capacity: int | None):
    def body(x, ids):
        (rows, scales), plan = jax_tma.moe_dispatch(x, ids, num_experts=num_experts,
                                                    axis_name="x", capacity=capacity,
                                                    wire_dtype=jnp.float8_e4m3fn)
        return rows, scales, plan.group_sizes, plan.dropped
    return body


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16])
@pytest.mark.parametrize("capacity", [None, 3])
def test_fp8_wire_sends_the_quantised_rows_and_their_scales(rng, dtype, capacity):
    """Rows and scales bit for bit against the NumPy quantisation dispatched
    by the reference, a block of zeros (scale 0, rows 0) among them; group
    sizes and drops as without the wire."""
    num_experts, tokens, k, width = 16, 6, 3, 256
    x = _normal(rng, (N * tokens, width), dtype)
    x[1, 128:] = 0
    ids = _routing(rng, "random", tokens, k, num_experts)
    _, s = _check_fp8_dispatch(x, ids, num_experts, capacity)
    assert s[1, 1] == 0


def test_fp8_wire_scales_are_powers_of_two_exact_at_ties_and_ends(rng):
    """Blocks at the scales' edges, bit for bit against NumPy: largest
    magnitudes 448 (scale 1) and just past it (scale 2), elements halfway
    between two float8 values (232, 3.5·2**-9: rounded to even, once; a
    division by 448ths rounded them twice), a block too small for its scale
    (2**-126 at least) and one near float32's largest, an infinity and a NaN
    (a non-finite scale; NaN there, 0 elsewhere)."""
    num_experts, tokens, k, width = 16, 2, 2, 256
    x = _normal(rng, (N * tokens, width), np.float32)
    x[0, :6] = [448, 232, -232, 3.5 * 2**-9, -3.5 * 2**-9, 2.5 * 2**-9]
    x[0, 128] = np.nextafter(np.float32(448), np.float32(np.inf))
    magnitudes = rng.uniform(1, 2, (2, 128)).astype(np.float32) * rng.choice([-1, 1], (2, 128))
    x[1, :128] = magnitudes[0] * np.float32(2.0**-121)
    x[1, 128:] = magnitudes[1] * np.float32(2.0**126)
    x[1, 128] = np.finfo(np.float32).max
    x[2, 5], x[2, 200] = np.inf, np.nan
    ids = rng.integers(0, num_experts, (N * tokens, k)).astype(np.int32)
    q, s = _check_fp8_dispatch(x, ids, num_experts, None)
    assert s[0].tolist() == [1, 2] and s[1].tolist() == [2.0**-126, 2.0**120]
    assert s[2, 0] == np.inf and np.isnan(s[2, 1])
    assert np.asarray(q[0, :6], np.float32).tolist() == [448, 224, -224, 4 * 2**-9,
                                                           -4 * 2**-9, 2 * 2**-9]


def _check_fp8_dispatch(x, ids, num_experts, capacity):
    """Dispatches x with wire_dtype float8_e4m3fn and compares every device's
    rows and scales with the NumPy quantisation dispatched by the reference
    (NaNs of either sign alike); returns the quantisation."""
    rows, scales, sizes, dropped = _on_mesh(_fp8_body(num_experts, capacity))(x, ids)
    width = x.shape[1]
    assert rows.dtype == jnp.float8_e4m3fn and rows.shape[1] == width
    assert scales.dtype == np.float32 and scales.shape == (rows.shape[0], width // 128)
    q, s = _quantised(x)
    packed = np.concatenate([_canonical_nans(q), _canonical_nans(s)], axis=1)
    want, want_sizes, want_dropped, _ = moe_dispatch_reference(packed, ids, N, num_experts,
                                                               capacity)
    got_rows = _canonical_nans(np.asarray(rows)).reshape(N, -1, width)
    got_scales = _canonical_nans(np.asarray(scales)).reshape(N, -1, width // 32)
    for d in range(N):
        assert_bits_equal(got_rows[d, :len(want[d])], want[d][:, :width])
        assert_bits_equal(got_scales[d, :len(want[d])], want[d][:, width:])
    assert_bits_equal(sizes, want_sizes.reshape(-1))
    assert_bits_equal(dropped, want_dropped)
    return q, s


def _canonical_nans(values: np.ndarray) -> np.ndarray:
    """values' bytes, every NaN as the positive quiet NaN of its dtype."""
    values = np.where(np.isnan(values.astype(np.float32)), np.array(np.nan, values.dtype), values)
    return values.view(np.uint8).reshape(values.shape[0], -1)


def test_fp8_wire_gradients_pass_straight_through(rng):
    """grad through the dequantised rows (rows · scales) equals grad through
    the exact dispatch, bit for bit: every block's largest magnitude is 28,
    so every scale is 1/16 exactly, and the cotangents (multiples of 1/16
    up to k of them) are exact in float8_e4m3fn. jvp along x itself gives
    the rows back (x / scale, rounded), and zero for the scales."""
    num_experts, tokens, k, width = 16, 5, 3, 256
    x = rng.uniform(-27, 27, (N * tokens, width)).astype(np.float32)
    x[:, ::128] = 28 * rng.choice([-1, 1], (N * tokens, 2))
    ids = _routing(rng, "random", tokens, k, num_experts)
    fp8 = jax.shard_map(_fp8_body(num_experts, None), mesh=MESH, in_specs=P("x"),
                        out_specs=P("x"))
    rows, scales, sizes, _ = jax.jit(fp8)(x, ids)
    # the rows past those received are unspecified: c is 0 there
    per = rows.shape[0] // N
    received = (np.arange(per) < np.asarray(sizes).reshape(N, -1).sum(1)[:, None]).reshape(-1)
    assert set(np.unique(np.asarray(scales)[received])) == {1 / 16}
    c = np.where(received[:, None], rng.integers(-1, 2, rows.shape), 0).astype(np.float32)

    def dequantised(x):
        rows, scales, _, _ = fp8(x, ids)
        blocks = rows.astype(jnp.float32).reshape(rows.shape[0], -1, 128) * scales[..., None]
        return jnp.sum(blocks.reshape(rows.shape) * c)

    exact = jax.shard_map(
        lambda x, ids: jax_tma.moe_dispatch(x, ids, num_experts=num_experts, axis_name="x")[0],
        mesh=MESH, in_specs=P("x"), out_specs=P("x"))
    assert_bits_equal(jax.jit(jax.grad(dequantised))(x),
                      jax.jit(jax.grad(lambda x: jnp.sum(exact(x, ids) * c)))(x))
    _, (d_rows, d_scales, _, _) = jax.jit(lambda x: jax.jvp(lambda x: fp8(x, ids), (x,), (x,)))(x)
    assert_bits_equal(np.asarray(d_rows)[received], np.asarray(rows)[received])
    assert not np.asarray(d_scales).any()


# ---- validation ----------------------------------------------------------------------

def _trace(body, *args):
    return _on_mesh(body).trace(*args)


_X = np.zeros((N * 2, 3), np.float32)
_IDS = np.zeros((N * 2, 2), np.int32)


@pytest.mark.parametrize("kwargs,args,error,match", [
    (dict(num_experts=12), (), ValueError,
     r"num_experts = 12 is not a multiple of the 8 positions along \('x',\)"),
    (dict(num_experts=0), (), ValueError, r"num_experts = 0 is below 1"),
    (dict(num_experts=8.0), (), TypeError, r"num_experts must be an int, got 8\.0"),
    (dict(num_experts=True), (), TypeError, r"num_experts must be an int, got True"),
    (dict(capacity=-1), (), ValueError, r"capacity = -1 is below 0"),
    (dict(capacity=2.5), (), TypeError, r"capacity must be an int, got 2\.5"),
    (dict(num_sms=7), (), ValueError,
     r"num_sms = 7 is below 8, the 8 positions along \('x',\), whose rows take an SM each"),
    (dict(num_sms=8.0), (), TypeError, r"num_sms must be an int, got 8\.0"),
    (dict(num_sms=True), (), TypeError, r"num_sms must be an int, got True"),
    (dict(), (_X.astype(np.int32), _IDS), TypeError,
     r"x must be of a real floating dtype, got int32"),
    (dict(), (_X.astype(np.complex64), _IDS), TypeError,
     r"x must be of a real floating dtype, got complex64"),
    (dict(), (_X[:, 0], _IDS), ValueError, r"x must have rank 2, got shape \(2,\)"),
    (dict(), (_X, _IDS.astype(np.float32)), TypeError,
     r"expert_ids must be integers, got dtype float32"),
    (dict(), (_X, _IDS[:8]), ValueError,
     r"expert_ids must be \(T, k\) with k >= 1 for x of T = 2 tokens, got shape \(1, 2\)"),
    (dict(), (_X, _IDS[:, :0]), ValueError,
     r"expert_ids must be \(T, k\) with k >= 1 for x of T = 2 tokens, got shape \(2, 0\)"),
    (dict(axis_name="y"), (), NameError, r"axis name 'y' is not bound here"),
    (dict(axis_name=3), (), TypeError, r"axis_name must be a mesh axis name"),
    (dict(wire_dtype=jnp.float8_e5m2), (), ValueError,
     r"wire_dtype must be None or jnp.float8_e4m3fn, got <class '.*float8_e5m2'>"),
    (dict(wire_dtype="int8"), (), ValueError,
     r"wire_dtype must be None or jnp.float8_e4m3fn, got 'int8'"),
    (dict(wire_dtype=object), (), ValueError,
     r"wire_dtype must be None or jnp.float8_e4m3fn, got <class 'object'>"),
    (dict(wire_dtype=jnp.float8_e4m3fn), (), ValueError,
     r"wire_dtype=float8_e4m3fn quantises each row in blocks of 128 elements with one float32 "
     r"scale a block, so H must be a multiple of 128; x is \(2, 3\)"),
])
def test_dispatch_refuses_by_name(kwargs, args, error, match):
    kw = dict(num_experts=8, axis_name="x") | kwargs
    with pytest.raises(error, match=r"jax_tma\.moe_dispatch: " + match):
        _trace(lambda x, ids: jax_tma.moe_dispatch(x, ids, **kw), *(args or (_X, _IDS)))


def test_dispatch_refuses_known_ids_out_of_range_and_non_arrays():
    ids = _IDS[:2].copy()
    ids[1, 0] = 8
    with pytest.raises(ValueError, match=r"jax_tma\.moe_dispatch: expert_ids\[1, 0\] = 8 is "
                                         r"neither in \[0, 8\) nor -1 \(the mask\)"):
        _trace(lambda x: jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x"), _X)
    with pytest.raises(TypeError, match=r"jax_tma\.moe_dispatch: x must be an array"):
        _trace(lambda ids: jax_tma.moe_dispatch([1.0], ids, num_experts=8, axis_name="x"), _IDS)
    with pytest.raises(TypeError, match=r"jax_tma\.moe_dispatch: expert_ids must be an array"):
        _trace(lambda x: jax_tma.moe_dispatch(x, {"ids": 1}, num_experts=8, axis_name="x"), _X)


def test_dispatch_over_a_vmap_axis_is_not_implemented():
    with pytest.raises(NotImplementedError, match=r"jax_tma\.moe_dispatch: axis \('v',\) is "
                                                  r"not a mesh axis"):
        jax.vmap(lambda x, ids: jax_tma.moe_dispatch(x, ids, num_experts=2, axis_name="v"),
                 axis_name="v")(_X[:2, None], _IDS[:2, None])


_W = np.zeros((N * 2, 2), np.float32)


@pytest.mark.parametrize("change,error,match", [
    (lambda y, plan, w: (y, "plan", w), TypeError,
     r"plan must be the MoePlan that moe_dispatch returned, got str"),
    (lambda y, plan, w: (y[:-1], plan, w), ValueError,
     r"y has 31 rows but the dispatch's recv has 32 \(y\.shape=\(31, 3\)\)"),
    (lambda y, plan, w: (y.astype(jnp.int32), plan, w), TypeError,
     r"y must be of a real floating dtype, got int32"),
    (lambda y, plan, w: (y[:, 0], plan, w), ValueError, r"y must have rank 2, got shape \(32,\)"),
    (lambda y, plan, w: (y, plan, w[:, :1]), ValueError,
     r"weights has shape \(2, 1\) but expert_ids had \(2, 2\)"),
    (lambda y, plan, w: (y, plan, w.astype(jnp.int32)), TypeError,
     r"weights must be of a real floating dtype, got int32"),
    (lambda y, plan, w: (y, plan, [w]), TypeError, r"weights must be an array"),
    (lambda y, plan, w: ({"y": y}, plan, w), TypeError, r"y must be an array"),
])
def test_combine_refuses_by_name(change, error, match):
    def body(x, ids, w):
        recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=8, axis_name="x")
        return jax_tma.moe_combine(*change(recv, plan, w))
    with pytest.raises(error, match=r"jax_tma\.moe_combine: " + match):
        _trace(body, _X, _IDS, _W)


def test_combine_refuses_a_plan_of_another_axis():
    """A plan made over "b" (4 positions) of the 2 x 4 mesh, in a shard_map
    over the 8 devices of "x"."""
    dispatch = jax.shard_map(
        lambda x, ids: jax_tma.moe_dispatch(x, ids, num_experts=4, axis_name="b"), mesh=GRID,
        in_specs=P(("a", "b")), out_specs=P(("a", "b")))
    plan = jax.tree.map(lambda a: np.zeros(a.shape, a.dtype), jax.eval_shape(dispatch, _X, _IDS)[1])
    body = lambda p, w: jax_tma.moe_combine(jnp.zeros((p.source.shape[0], 3)), p, w)  # noqa: E731
    with pytest.raises(NameError, match=r"jax_tma\.moe_combine: axis name \('b',\) is not "
                                        r"bound here"):
        _trace(body, plan, _W)
    with pytest.raises(ValueError, match=r"jax_tma\.moe_combine: the plan is of 4 positions, but "
                                         r"\('x',\) has 8 here"):
        _trace(body, dataclasses.replace(plan, axis_name=("x",)), _W)
    batched = jax.tree.map(lambda a: a[None], dataclasses.replace(plan, axis_name=("v",)))
    with pytest.raises(NotImplementedError, match=r"jax_tma\.moe_combine: axis \('v',\) is not "
                                                  r"a mesh axis"):
        jax.vmap(body, axis_name="v")(batched, _W[None])
