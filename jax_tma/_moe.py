"""jax_tma.moe_dispatch and jax_tma.moe_combine: expert parallelism inside
``shard_map``, composed in Python on jax_tma's exchanges (``all_to_all`` of
the counts, ``ragged_all_to_all`` of rows home and of the derivatives'
rows) and the dispatch's pull of its pairs and their rows
(ffi/ppermute/moe_dispatch.h), each token read once by each device that
holds one of its experts; derivatives in both modes, whose sums run in
float32 in one order on every platform."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.extend.core import Primitive
from jax.interpreters import ad, mlir

from jax_tma import _checks, _ffi, _lowering
from jax_tma._all_to_all import all_to_all, lower_exchange
from jax_tma._gather import gather
from jax_tma._ppermute import bound_axes, call_site
from jax_tma._ragged_all_to_all import bind as ragged_bind

_DISPATCH = "jax_tma.moe_dispatch"
_COMBINE = "jax_tma.moe_combine"
_I32 = np.dtype(np.int32)
# wire_dtype's format, and the elements a scale covers.
_FP8 = np.dtype(jnp.float8_e4m3fn)
_FP8_BLOCK = 128
# A block's scale is the least power of two s (2**-126 at least) with
# largest magnitude / s <= 448, the format's largest finite value: read from
# the float32 bits, so x / s is exact and the one rounding, to
# float8_e4m3fn, is the same on every backend. (x / (largest / 448) would
# not be: XLA turns a division by a broadcast into a multiplication by its
# reciprocal, and divides approximately on GPUs.)
_F32_MANTISSA = 23
_F32_BIAS = 127
# largest / s <= 448 = 1.75 * 2**8: s = 2**(E - 135) for the float32
# exponent field E, twice that where the mantissa passes 0.75.
_FP8_EXP_OFFSET = _F32_BIAS + 8
_FP8_MANTISSA_175 = 3 << (_F32_MANTISSA - 2)
_F32_MIN_EXP = -126


# ---- the public ops -----------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MoePlan:
    """What :func:`moe_dispatch` decided, for :func:`moe_combine`: a pytree of
    one device's int32 and bool arrays (inside ``shard_map``), with the axis
    names as static data. It passes through ``jit``, ``shard_map``'s
    ``out_specs`` (each array has this device's rows first: ``P(axis)``
    stacks them), ``custom_vjp`` residuals and ``scan`` carries.

    ``T`` tokens with ``k`` choices each on each of ``n`` devices, ``E``
    experts, ``S`` rows of ``recv``. ``group_sizes`` and ``dropped`` are the
    contract; the other arrays are how the rows travel, for
    :func:`moe_combine` and the derivatives, and may change.

    Attributes:
      group_sizes: ``(E/n,)`` int32, the rows of ``recv`` of each local
        expert after drops, as ``lax.ragged_dot`` takes them.
      dropped: ``(T, k)`` bool on the sending device: True where a choice
        was dropped for ``capacity`` (masked choices are False).
      routes: ``(n, 5)`` int32: for each position along the axis, where this
        device's rows for it start in its send order and how many there
        are, where they land there (``T`` rows a source), how many it
        receives from there, and where its rows sent home land there.
      pair_token: ``(T·min(k, n),)`` int32: the token of each
        (token, device) pair in send order (device-major, then token),
        ``T`` past the pairs.
      choice_row: ``(T, k)`` int32: the pair of each choice (its token and
        its expert's device) in send order, -1 where masked.
      slots: ``(n·T, k)`` int32: for each row received (``T`` rows from each
        source position), the row of ``recv`` of each of its choices, -1
        where the choice is not placed here.
      source: ``(S,)`` int32: for each row of ``recv``, the row received and
        the choice it holds, as ``row·k + choice``; ``n·T·k`` where empty.
      axis_name: the mesh axes the tokens were dispatched over.
      num_sms: the SM budget of the transfers, as :func:`moe_dispatch` took
        it (``None``: none).
    """

    group_sizes: jax.Array
    dropped: jax.Array
    routes: jax.Array
    pair_token: jax.Array
    choice_row: jax.Array
    slots: jax.Array
    source: jax.Array
    axis_name: tuple[str, ...]
    num_sms: int | None = None


MoePlan.__module__ = "jax_tma"  # its public name, which the API reference documents
jax.tree_util.register_dataclass(
    MoePlan, data_fields=["group_sizes", "dropped", "routes", "pair_token", "choice_row",
                          "slots", "source"], meta_fields=["axis_name", "num_sms"])


def moe_dispatch(x: Any, expert_ids: Any, *, num_experts: int, axis_name: str | Sequence[str],
                 capacity: int | None = None, wire_dtype: Any = None, num_sms: int | None = None,
                 ) -> tuple[jax.Array | tuple[jax.Array, jax.Array], MoePlan]:
    """Sends each token to the devices that own its experts, inside
    ``shard_map``: the rows each device receives come back grouped by its
    local expert, ready for ``lax.ragged_dot``, with the plan that
    :func:`moe_combine` takes to bring the experts' outputs home.

    With ``n`` positions along ``axis_name``, device ``d`` owns experts
    ``d·E/n`` to ``(d+1)·E/n − 1`` (``E = num_experts``). The rows of
    ``recv`` are grouped by local expert, expert-major, packed from row 0;
    within an expert they are in the order of (source position, token,
    choice). Rows past the received total are unspecified (not written).

    A token crosses to each device once, whatever number of its choices
    that device holds: one ``all_to_all`` of the counts (every device learns
    every device's count per expert and per destination), then one pull:
    each receiver reads, from each source, the pairs (token, device) that
    source sends it, each with the rows of ``recv`` its choices take there,
    and each pair's token row, once, which it stores to those rows. The
    sender knows every count, so it decides the drops itself
    (``plan.dropped``) and no count comes back. With a ``capacity``, a token
    whose choices on a device are all dropped still crosses to it (and is
    not placed): knowing in advance would take one more exchange.

    With ``wire_dtype=jnp.float8_e4m3fn`` the rows cross quantised, ready
    for an fp8 grouped GEMM: each block of 128 elements of a row has one
    float32 scale, the least power of two (``2**-126`` at least) that
    brings its largest magnitude to 448 or below (448: the format's largest
    finite value), and its elements are ``x / scale`` (exact) rounded to
    float8_e4m3fn: one rounding, so every backend sends the same bits. A
    block of zeros has scale 0; one that holds an infinity or a NaN, a
    non-finite scale. ``recv`` is then ``(rows, scales)``:
    ``(R, H)`` float8_e4m3fn and ``(R, H/128)`` float32, ``rows[r, i] ·
    scales[r, i // 128]`` standing for the row. The scales cross in an
    exchange of their own. Derivatives pass straight through the
    quantisation, as if the wire were exact: the tangent of ``rows`` is the
    dispatched ``dx / scale`` (rounded to float8_e4m3fn, as JAX keeps a
    tangent in its primal's dtype), that of ``scales`` zero; so the
    cotangent reaching ``x`` is that of the dequantised rows.

    Works under ``jit``, ``grad``, ``jvp``/``linearize`` (linear in ``x``;
    the transpose brings the cotangents' rows home and sums each token's in
    float32, as :func:`moe_combine` does with unit weights) and ``vmap``
    (each member its own exchanges, whose derivatives are then jax's of the
    composition).

    Args:
      x: ``(T, H)``, this device's tokens, of a real floating dtype.
      expert_ids: ``(T, k)`` integers: each token's ``k`` experts in
        ``[0, num_experts)``; ``-1`` masks a choice (nothing is sent for
        it). Traced ids outside ``[0, num_experts)`` are masked too; ids
        known at trace time must be in range or -1.
      num_experts: ``E``, a multiple of ``n``.
      axis_name: a mesh axis name of the enclosing ``shard_map`` or a tuple
        of them in the mesh's order.
      capacity: ``None`` (dropless: ``recv`` has ``n·T·k`` rows) or ``c >=
        0``: each local expert keeps its first ``c`` rows in the order
        above, and ``recv`` has ``(E/n)·c`` rows.
      wire_dtype: ``None`` (the rows cross as they are) or
        ``jnp.float8_e4m3fn`` (quantised, above; ``H`` a multiple of 128).
      num_sms: ``None`` or the SM budget of the transfers, ``>= n``: on a
        GPU, each kernel that copies rows between the devices (this
        dispatch's, and those of :func:`moe_combine` and of the derivatives,
        which take it from the plan) runs at most ``num_sms`` CTAs, so it
        holds at most that many SMs and leaves the others to independent
        work, such as a GEMM on another stream. Each device's rows take a
        CTA at least (under ``vmap``, each member's). The exchanges of
        counts take a CTA a device for each KiB of counts they send a peer
        (one up to about 250 experts). Nothing changes on the CPU or across
        hosts, and no result changes.

    Returns:
      ``(recv, plan)``: ``recv`` in ``x``'s dtype with ``x``'s row shape
      (with ``wire_dtype``, the pair ``(rows, scales)``), and the
      :class:`MoePlan` (``plan.group_sizes``, ``plan.dropped``).

    Raises:
      TypeError: ``x`` or ``expert_ids`` is not an array, ``x`` is not of a
        real floating dtype or ``expert_ids`` not of integers,
        ``num_experts`` or ``capacity`` is not an int, ``axis_name`` is not
        a name or a tuple of names.
      NameError: ``axis_name`` is not bound here.
      NotImplementedError: ``axis_name`` is not a mesh axis (a ``vmap``
        axis).
      ValueError: ``x`` not of rank 2, ``expert_ids`` not ``(T, k)`` with
        ``k >= 1``, ``num_experts < 1`` or not a multiple of ``n``,
        ``capacity < 0``, ids known at trace time out of range, a
        ``wire_dtype`` other than ``None`` and ``jnp.float8_e4m3fn``, or
        ``H`` not a multiple of 128 with it.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> mesh = Mesh(jax.devices()[:1], ("i",))
      >>> def f(x, ids):
      ...     recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=2, axis_name="i")
      ...     return recv, plan.group_sizes
      >>> g = jax.jit(jax.shard_map(f, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
      >>> recv, sizes = g(jnp.array([[1.0], [2.0], [3.0]]), jnp.array([[1, 0], [1, -1], [0, 1]]))
      >>> sizes.tolist(), recv[:5, 0].tolist()
      ([2, 3], [1.0, 3.0, 1.0, 2.0, 3.0])

    Expert 0 got tokens 0 and 2, expert 1 tokens 0, 1 and 2; token 1's
    second choice is masked.
    """
    x = _checks.as_array(_DISPATCH, "x", x)
    ids = _checks.as_array(_DISPATCH, "expert_ids", expert_ids)
    names, n = _axes(_DISPATCH, axis_name)
    _check_count(_DISPATCH, "num_experts", num_experts, 1)
    if capacity is not None:
        _check_count(_DISPATCH, "capacity", capacity, 0)
    if num_sms is not None:
        _check_count(_DISPATCH, "num_sms", num_sms, n, f"the {n} positions along {names}, "
                     "whose rows take an SM each at least")
    _check_rows(_DISPATCH, "x", x)
    if not jnp.issubdtype(ids.dtype, jnp.integer):
        raise TypeError(f"{_DISPATCH}: expert_ids must be integers, got dtype {ids.dtype}")
    if ids.ndim != 2 or ids.shape[0] != x.shape[0] or ids.shape[1] < 1:
        raise ValueError(f"{_DISPATCH}: expert_ids must be (T, k) with k >= 1 for x of T = "
                         f"{x.shape[0]} tokens, got shape {ids.shape}")
    if num_experts % n:
        raise ValueError(f"{_DISPATCH}: num_experts = {num_experts} is not a multiple of the {n} "
                         f"positions along {names} (each device owns num_experts / {n} experts)")
    _check_known_ids(expert_ids, num_experts)
    quantised = _check_wire(wire_dtype, x)
    tokens, k = ids.shape
    rows = n * tokens * k if capacity is None else num_experts // n * capacity
    sends = _planned(ids, num_experts, capacity, names, n)
    x, sent, routes, pair_token, choice_row, dropped, group_sizes = _checks.align_varying(
        x, sends.sent, sends.routes, sends.pair_token, sends.choice_row, sends.dropped,
        sends.group_sizes)
    ex = dict(axis_name=names, size=n, site=call_site(), ctas=num_sms or 0)
    if quantised:
        x, scales = _quantise(x)
    recv, slots, source = _dispatch_p.bind(x, sent, routes, pair_token, choice_row, dropped,
                                           rows=rows, **ex)
    if quantised:
        recv = recv, _rows_p.bind(scales, routes, pair_token, choice_row, dropped, slots, source,
                                  toward="experts", **ex)
    return recv, MoePlan(group_sizes=group_sizes, dropped=dropped, routes=routes,
                         pair_token=pair_token, choice_row=choice_row, slots=slots,
                         source=source, axis_name=names,
                         num_sms=None if num_sms is None else int(num_sms))


def moe_combine(y: Any, plan: MoePlan, weights: Any) -> jax.Array:
    """Brings the experts' output rows home, inside ``shard_map``, as each
    token's weighted sum: ``out[t] = Σ_j weights[t, j] · y[row of (t, j)]``,
    where masked and dropped choices contribute 0.

    Each device first sums, for every token it received, the weighted rows
    of that token's choices it holds, and sends that one row home in
    ``y``'s dtype (as DeepEP's combine does); home adds the rows of the
    token's devices. Both sums run in float32 (float64 for float64 ``y``),
    each product rounded before it is added, each sum from its first term,
    and each is then cast to ``y``'s dtype:

    - on the expert's device, over the token's choices there in ascending
      ``j``;
    - at home, over the token's devices in the order of each one's first
      kept choice (+0.0 for a token without one).

    Where each device holds at most one kept choice of a token (top-k
    routing over distinct devices), that is the float32 sum in order ``j =
    0 … k−1``, each device's term rounded to ``y``'s dtype on its way home
    (no rounding for float32 ``y``). The weights travel to the experts'
    devices first (one ``ragged_all_to_all`` of ``(rows, k)``), then the
    rows home: for float16, bfloat16, float32 and float64 ``y`` whose pair
    rows are over 4 MiB a device, each device's sums are computed as they
    are sent (one kernel, which reads ``y`` once and writes each sum
    straight into its home's result, across the link where home is another
    GPU); otherwise summed first and sent by a second ``ragged_all_to_all``
    (up to 4 MiB through the transport's inbox, one crossing of the link). CPUs and GPUs sum in this
    order; where a float32 product or sum at home is subnormal, XLA's CPU
    code flushes it to zero (the experts' sums keep subnormals on both).

    Derivatives in both modes, bilinear in ``(y, weights)``: ``y``'s
    cotangent is the dispatch of the output's cotangent, each row scaled by
    its weight; ``weights[t, j]``'s is ``⟨ct_out[t], y[row of (t, j)]⟩``,
    reduced where ``y`` lives, so ``k`` floats a token and device go home
    rather than rows.

    Args:
      y: ``(S, H)`` of a real floating dtype: the experts' outputs, a row
        for each row of :func:`moe_dispatch`'s ``recv``.
      plan: the :class:`MoePlan` of that dispatch.
      weights: ``(T, k)`` of a real floating dtype, on the tokens' device.

    Returns:
      ``(T, H)`` in ``y``'s dtype, on the tokens' device.

    Raises:
      TypeError: ``plan`` is not a :class:`MoePlan`; ``y`` or ``weights``
        is not an array of a real floating dtype.
      NameError: the plan's axis is not bound here.
      NotImplementedError: the plan's axis is not a mesh axis.
      ValueError: ``y`` does not have the rows of ``recv``, ``weights`` not
        the shape of ``expert_ids``, or the plan is of another number of
        positions.

    Examples:
      >>> import jax, jax.numpy as jnp, jax_tma
      >>> from jax.sharding import Mesh, PartitionSpec as P
      >>> mesh = Mesh(jax.devices()[:1], ("i",))
      >>> def layer(x, ids, w):
      ...     recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=2, axis_name="i")
      ...     return jax_tma.moe_combine(recv * 10, plan, w)
      >>> g = jax.jit(jax.shard_map(layer, mesh=mesh, in_specs=P("i"), out_specs=P("i")))
      >>> g(jnp.array([[1.0], [2.0], [3.0]]), jnp.array([[1, 0], [1, -1], [0, 1]]),
      ...   jnp.array([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75]]))[:, 0].tolist()
      [10.0, 20.0, 30.0]
    """
    if not isinstance(plan, MoePlan):
        raise TypeError(f"{_COMBINE}: plan must be the MoePlan that moe_dispatch returned, got "
                        f"{type(plan).__name__}")
    y = _checks.as_array(_COMBINE, "y", y)
    weights = _checks.as_array(_COMBINE, "weights", weights)
    names, n = _axes(_COMBINE, plan.axis_name)
    _check_rows(_COMBINE, "y", y)
    _check_rows(_COMBINE, "weights", weights)
    if plan.routes.shape[0] != n:
        raise ValueError(f"{_COMBINE}: the plan is of {plan.routes.shape[0]} positions, but "
                         f"{names} has {n} here")
    if y.shape[0] != plan.source.shape[0]:
        raise ValueError(f"{_COMBINE}: y has {y.shape[0]} rows but the dispatch's recv has "
                         f"{plan.source.shape[0]} (y.shape={y.shape})")
    if weights.shape != plan.dropped.shape:
        raise ValueError(f"{_COMBINE}: weights has shape {weights.shape} but expert_ids had "
                         f"{plan.dropped.shape}")
    args = _checks.align_varying(y, weights, *_routes(plan))
    return _combine_p.bind(*args, axis_name=names, size=n, site=call_site(),
                           ctas=plan.num_sms or 0)


# ---- checks -------------------------------------------------------------------

def _axes(op: str, axis_name) -> tuple[tuple[str, ...], int]:
    names, n = bound_axes(op, axis_name)
    mesh_axes = jax.sharding.get_abstract_mesh().axis_names
    if not set(names) <= set(mesh_axes):
        raise NotImplementedError(
            f"{op}: axis {names} is not a mesh axis of the enclosing shard_map (mesh axes "
            f"{tuple(mesh_axes)}); its exchanges run over mesh axes only")
    return names, n


def _check_count(op: str, name: str, value: Any, low: int, what: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{op}: {name} must be an int, got {value!r}")
    if value < low:
        raise ValueError(f"{op}: {name} = {value} is below {low}" + (f", {what}" if what else ""))


def _check_rows(op: str, name: str, a: jax.Array) -> None:
    if not jnp.issubdtype(a.dtype, jnp.floating):
        raise TypeError(f"{op}: {name} must be of a real floating dtype, got {a.dtype}")
    if a.ndim != 2:
        raise ValueError(f"{op}: {name} must have rank 2, got shape {a.shape}")


def _check_wire(wire_dtype: Any, x: jax.Array) -> bool:
    """Whether the rows cross quantised (wire_dtype float8_e4m3fn)."""
    if wire_dtype is None:
        return False
    try:
        fp8 = np.dtype(wire_dtype) == _FP8
    except TypeError:
        fp8 = False
    if not fp8:
        raise ValueError(f"{_DISPATCH}: wire_dtype must be None or jnp.float8_e4m3fn, got "
                         f"{wire_dtype!r}")
    if x.shape[1] % _FP8_BLOCK:
        raise ValueError(f"{_DISPATCH}: wire_dtype=float8_e4m3fn quantises each row in blocks "
                         f"of {_FP8_BLOCK} elements with one float32 scale a block, so H must "
                         f"be a multiple of {_FP8_BLOCK}; x is {x.shape}")
    return True


@jax.custom_jvp
def _quantise(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(T, H) rows as float8_e4m3fn and (T, H/128) float32 scales (see
    _FP8_EXP_OFFSET): x / scale, exact, rounded once."""
    rows, scales, _ = _quantised(x)
    return rows, scales


def _quantised(x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """_quantise's rows and scales, and what each block was multiplied by:
    1 / scale where the scale is finite and not 0, else 0 (so a block of
    zeros sends zeros, and one with an infinity or a NaN sends NaN there and
    0 elsewhere)."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, _FP8_BLOCK)
    largest = jnp.max(jnp.abs(blocks), axis=2)
    bits = lax.bitcast_convert_type(largest, np.int32)
    exp = ((bits >> _F32_MANTISSA) - _FP8_EXP_OFFSET
           + ((bits & ((1 << _F32_MANTISSA) - 1)) > _FP8_MANTISSA_175).astype(np.int32))
    exp = jnp.maximum(exp, _F32_MIN_EXP)
    finite = jnp.isfinite(largest)
    positive = finite & (largest > 0)
    scales = jnp.where(positive, _power_of_two(exp), jnp.where(finite, 0, largest))
    inverses = jnp.where(positive, _power_of_two(-exp), 0)
    return _scaled(blocks, inverses).astype(_FP8).reshape(x.shape), scales, inverses


def _power_of_two(exp: jax.Array) -> jax.Array:
    """2**exp in float32 for exp in [-126, 127], from its bits."""
    return lax.bitcast_convert_type((exp + _F32_BIAS) << _F32_MANTISSA, np.float32)


def _scaled(blocks: jax.Array, inverses: jax.Array) -> jax.Array:
    """Each block times its 1 / scale (exact: a power of two)."""
    return (blocks * inverses[..., None]).reshape(blocks.shape[0], -1)


@_quantise.defjvp
def _quantise_jvp(primals, tangents):
    """Straight through: the rows' tangent is dx / scale (the scale held
    fixed), rounded to the rows' dtype; the scales' is zero."""
    (x,), (dx,) = primals, tangents
    rows, scales, inverses = _quantised(x)
    d_blocks = dx.astype(np.float32).reshape(x.shape[0], -1, _FP8_BLOCK)
    d_rows = _scaled(d_blocks, inverses).astype(_FP8).reshape(x.shape)
    return (rows, scales), (d_rows, jnp.zeros_like(scales))


def _check_known_ids(expert_ids: Any, num_experts: int) -> None:
    """Ids known at trace time are in range or -1 (traced ones out of range
    are masked)."""
    if isinstance(expert_ids, jax.core.Tracer):
        return
    values = np.asarray(expert_ids)
    bad = np.argwhere((values < -1) | (values >= num_experts))
    if bad.size:
        t, j = bad[0]
        raise ValueError(f"{_DISPATCH}: expert_ids[{t}, {j}] = {values[t, j]} is neither in "
                         f"[0, {num_experts}) nor -1 (the mask)")


# ---- the plan: who sends what where -----------------------------------------------

class _Sends(NamedTuple):
    group_sizes: jax.Array
    dropped: jax.Array
    routes: jax.Array
    pair_token: jax.Array
    choice_row: jax.Array
    # (pairs, k + 1): each pair's token, then the slot of each choice on the
    # pair's device (-1 elsewhere); (T, -1, ...) past the pairs.
    sent: jax.Array


def _exclusive(a: jax.Array, axis: int = 0) -> jax.Array:
    return jnp.cumsum(a, axis, dtype=_I32) - a


def _plan_sends(ids, num_experts: int, capacity: int | None, names, n: int) -> _Sends:
    """The sending device's half of the plan, and the slots its rows carry:
    integer work and one all_to_all, which gives every device every
    device's count per expert (so that each sender places, and drops, its
    own choices) and per destination (so that each knows what it
    receives). Within the limits of the plan's kernels
    (ffi/ppermute/moe_dispatch_plan.h), a call before the all_to_all and one
    after it; beyond them, the same plan in jnp (_plan_in_jnp)."""
    rules = _ffi.rules()
    if (num_experts > rules["ppermute.moe_plan_max_experts"]
            or n > rules["ppermute.moe_plan_max_parts"]
            or ids.size > rules["ppermute.moe_plan_max_choices"]):
        return _plan_in_jnp(ids, num_experts, capacity, names, n)
    ids = _ids32(ids, num_experts)
    attrs = dict(experts=num_experts, parts=n)
    table = all_to_all(_plan_counts_p.bind(ids, **attrs), names, 0, 0, tiled=True)
    return _Sends(*_plan_p.bind(ids, table, capacity=-1 if capacity is None else capacity,
                                 **attrs))


def _ids32(ids: jax.Array, num_experts: int) -> jax.Array:
    """`ids` as int32, each id outside [0, num_experts) still outside it."""
    dtype = np.dtype(ids.dtype)
    if dtype == _I32:
        return ids
    if dtype.itemsize < 4:
        return ids.astype(_I32)
    low = 0 if jnp.issubdtype(dtype, jnp.unsignedinteger) else -1
    return jnp.clip(ids, low, num_experts).astype(_I32)


def _plan_in_jnp(ids, num_experts: int, capacity: int | None, names, n: int) -> _Sends:
    """_plan_sends in jnp, the same bits (ffi/ppermute/moe_dispatch_plan.h says
    which), for any number of experts and positions."""
    tokens, k = ids.shape
    local = num_experts // n
    pairs_max = tokens * min(k, n)
    valid = (ids >= 0) & (ids < num_experts)
    expert = jnp.where(valid, ids, num_experts).astype(_I32)  # num_experts: none
    device = jnp.where(valid, expert // local, n)  # n: none
    # Each token's choices of each expert (invalid ones of none), then over
    # the tokens.
    of_expert = jnp.sum(expert[:, :, None] == jnp.arange(num_experts, dtype=_I32), axis=1,
                        dtype=_I32)  # (T, E)
    per_expert = jnp.sum(of_expert, 0, dtype=_I32)
    has = jnp.any(device[:, :, None] == jnp.arange(n, dtype=_I32), axis=1)  # (T, n)
    per_device = jnp.sum(has, 0, dtype=_I32)
    # Each chunk also carries its destination's position, so that every
    # device learns its own from what it receives. lax.axis_index would put
    # XLA's partition-id memset ahead of the program's command buffer, and
    # the GPU would then idle while the host launches that buffer (on an
    # H200, traced: 105-130 µs of a dispatch's span).
    # (The barrier keeps XLA from fusing the counts' reductions into the
    # table's concatenation, where a one-device decode step's took 11.6 µs
    # against 2.8 + 1.1 apart, on an H200.)
    row = lax.optimization_barrier(jnp.concatenate([per_expert, per_device]))
    table = all_to_all(jnp.concatenate(
        [jnp.broadcast_to(row, (n, num_experts + n)), jnp.arange(n, dtype=_I32)[:, None]], 1),
        names, 0, 0, tiled=True)
    counts, pairs = table[:, :num_experts], table[:, num_experts:-1]  # [source, expert / device]
    me = table[0, -1]

    # Each choice's place among its expert's rows: those of lower positions
    # first, then this device's in (token, choice) order: its expert's
    # choices in earlier tokens, then in earlier choices of its own token.
    # No sort: XLA sorts T·k keys on a GPU with several kernels and host work
    # between them (hundreds of µs at 32768 keys, on an H200).
    earlier = jnp.take_along_axis(_exclusive(of_expert), jnp.minimum(expert, num_experts - 1),
                                  axis=1)
    same = (expert[:, :, None] == expert[:, None, :]) & jnp.tri(k, k, -1, dtype=bool)
    rank = earlier + jnp.sum(same, axis=2, dtype=_I32)  # invalid choices' unused
    before = jnp.concatenate([_exclusive(counts)[me], jnp.zeros(1, _I32)])
    place = before[expert] + rank
    total = jnp.sum(counts, 0, dtype=_I32)
    kept_total = total if capacity is None else jnp.minimum(total, capacity)
    kept = valid if capacity is None else valid & (place < capacity)
    group = kept_total.reshape(n, local)
    group_start = jnp.concatenate([_exclusive(group, 1).reshape(-1), jnp.zeros(1, _I32)])
    slot = jnp.where(kept, group_start[expert] + place, -1)

    # The (token, device) pairs in send order: device-major, then token.
    send_start = _exclusive(per_device)
    pair_row = jnp.where(has, send_start + _exclusive(has.astype(_I32)), pairs_max)  # (T, n)
    pair_token = jnp.full(pairs_max, tokens, _I32).at[pair_row.reshape(-1)].set(
        jnp.repeat(jnp.arange(tokens, dtype=_I32), n), mode="drop")
    choice_row = jnp.where(valid, jnp.take_along_axis(pair_row, jnp.minimum(device, n - 1), 1),
                           -1)
    on = device[:, None, :] == jnp.arange(n, dtype=_I32)[None, :, None]  # (T, n, k)
    meta = jnp.full((pairs_max, k), -1, _I32).at[pair_row.reshape(-1)].set(
        jnp.where(on, slot[:, None, :], -1).reshape(tokens * n, k), mode="drop")
    routes = jnp.stack([send_start, per_device, jnp.full(n, me * tokens, _I32), pairs[:, me],
                        _exclusive(pairs, 1)[:, me]], axis=1)
    return _Sends(group[me], valid & ~kept, routes, pair_token, choice_row,
                  jnp.concatenate([pair_token[:, None], meta], 1))


# One program for the routing's many small steps, also where shard_map runs
# eagerly (op by op); inside jit it is inlined.
_planned = jax.jit(_plan_sends, static_argnums=(1, 2, 3, 4))


class _Routes(NamedTuple):
    """The plan's arrays that the data movement reads, in the order the
    primitives take them after their own operands."""
    routes: jax.Array
    pair_token: jax.Array
    choice_row: jax.Array
    dropped: jax.Array
    slots: jax.Array
    source: jax.Array


def _routes(plan: MoePlan) -> _Routes:
    return _Routes(plan.routes, plan.pair_token, plan.choice_row, plan.dropped, plan.slots,
                   plan.source)


# ---- moving rows ----------------------------------------------------------------

def _take(a: jax.Array, index: jax.Array) -> jax.Array:
    """Rows `index` of `a`; negative indices and those past the end read as
    zeros."""
    if a.shape[0] == 0:  # jnp.take refuses an empty table
        return jnp.zeros(index.shape + a.shape[1:], a.dtype)
    return jnp.take(a, jnp.where(index >= 0, index, a.shape[0]), axis=0, mode="fill",
                    fill_value=0)


def _gather(a: jax.Array, index: jax.Array) -> jax.Array:
    """_take through jax_tma.gather: rows `index` of `a`, zeros where an
    index is negative or past the end."""
    if a.shape[0] == 0:
        return jnp.zeros(index.shape + a.shape[1:], a.dtype)
    return gather(a, jnp.where(index >= 0, index, a.shape[0]))


def _after(rows: jax.Array, index: jax.Array, *values: jax.Array) -> jax.Array:
    """`rows`, computed from `values` too, so that an exchange of them runs
    after whatever made `values`: XLA's runtime orders calls by the buffers
    they read and runs the others side by side, and two exchanges side by
    side can starve each other on the CPU (docs/limits.md). Each value's
    first element is read where `index` (the plan's, one per row: pair_token
    or source) is negative, which it never is, and which XLA cannot know.
    (An optimization barrier orders nothing at run time: its results are
    its operands' buffers.)"""
    never = (index < 0).reshape((-1,) + (1,) * (rows.ndim - 1))
    for v in values:
        if rows.size and v.size:
            rows = jnp.where(never, v.reshape(-1)[0].astype(rows.dtype), rows)
    return rows


def _exchange(operand, rows: int, fill, *indices, axis_name, size, site, ctas) -> jax.Array:
    """The ragged exchange into `rows` rows, those that no slice writes
    `fill`, or unspecified where `fill` is None (no buffer filled only to be
    overwritten: the rows it would fill are never read)."""
    dtype = operand.dtype
    wide = _checks.widen(operand)
    shape = (0 if fill is None else rows,) + wide.shape[1:]
    got = ragged_bind(wide, jnp.full(shape, fill or 0, wide.dtype), *indices,
                      axis_name=axis_name, size=size, site=site,
                      rows=rows if fill is None else None, ctas=ctas)
    return _checks.narrow(got, dtype)


def _to_experts(rows: jax.Array, r: _Routes, fill, **ex) -> jax.Array:
    """Rows in send order (one per pair) into their devices' regions, `T`
    rows a source position (the rows of a region past what it sent keep
    `fill`: unspecified where it is None)."""
    regions = r.routes.shape[0] * r.choice_row.shape[0]
    return _exchange(rows, regions, fill, *r.routes.T[:4], **ex)


def _home_indices(r: _Routes) -> tuple[jax.Array, ...]:
    """The inverse route's ragged exchange: each region (T rows a source
    position, the pairs it sent here) back to that position, into the rows
    of its pairs there; input_offsets, send_sizes, output_offsets,
    recv_sizes."""
    n, tokens = r.routes.shape[0], r.choice_row.shape[0]
    return (jnp.arange(n, dtype=_I32) * tokens, r.routes[:, 3], r.routes[:, 4], r.routes[:, 1])


def _home(regions: jax.Array, r: _Routes, **ex) -> jax.Array:
    """The inverse route: each region's rows back to its source position,
    into the rows of its pairs (send order; the rows of no pair are
    unspecified)."""
    return _exchange(regions, r.pair_token.shape[0], None, *_home_indices(r), **ex)


def _accumulator(dtype) -> np.dtype:
    """float32, but float64 for float64 rows."""
    return np.dtype(np.float64 if np.dtype(dtype) == np.float64 else np.float32)


def _accumulate(out, started, here, term):
    """`out` plus `term` where `here` (`term` itself where `out` holds no term
    yet), `out` elsewhere; and where `out` now holds a term."""
    return jnp.where(here, jnp.where(started, out + term, term), out), started | here


def _rounded(product: jax.Array, index: jax.Array) -> jax.Array:
    """`product` as it is, rounded on its own before any sum takes it: its
    bits pass through an integer or with `index < -1` (the plan's slots are
    never below -1), which is zero at run time and which no compiler can
    know. Else XLA fuses a multiply and the add after it into one
    multiply-add, rounding once, wherever one of its fusions holds both (on
    CPUs and GPUs alike), and a sum's bits would depend on its fusions."""
    ints = np.dtype(f"int{8 * product.dtype.itemsize}")
    zero = (index < -1).astype(ints).reshape((-1,) + (1,) * (product.ndim - 1))
    return lax.bitcast_convert_type(lax.bitcast_convert_type(product, ints) | zero,
                                    product.dtype)


def _per_pair(terms, slots: jax.Array, acc) -> jax.Array:
    """On the experts' device, one row per received row: the sum in `acc`
    over its choices here (slot >= 0) in ascending j of each term's
    `values[slot] * weights[row, j]` (weights None: 1), terms in their
    order; +0.0 where there are none."""
    rows, k = slots.shape
    out = jnp.zeros((rows,) + terms[0][0].shape[1:], acc)
    started = jnp.zeros((rows,) + (1,) * (out.ndim - 1), bool)
    for j in range(k):
        here = (slots[:, j] >= 0).reshape(started.shape)
        for values, weights in terms:
            term = _take(values, slots[:, j]).astype(acc)
            if weights is not None:
                term = _rounded(term * weights[:, j, None].astype(acc), slots[:, j])
            out, started = _accumulate(out, started, here, term)
    return out


def _per_token(home: jax.Array, r: _Routes, acc) -> jax.Array:
    """At home, one row per token: the sum in `acc` of the rows of its pairs
    that hold a kept choice, each added at the first kept choice of its
    device; +0.0 where there are none. A token has at most one pair a
    device: min(k, n) reads of rows a token, not k (most of which would
    read nothing)."""
    k, n = r.choice_row.shape[1], r.routes.shape[0]
    kept = (r.choice_row >= 0) & ~r.dropped
    same = (r.choice_row[:, :, None] == r.choice_row[:, None, :]) & kept[:, None, :]
    first = kept & ~jnp.any(same & jnp.tri(k, k, -1, dtype=bool), axis=2)
    # The pair rows in the order of their first kept choice; -1 past them.
    rank = jnp.where(first, jnp.cumsum(first, axis=1, dtype=_I32) - 1, -1)
    terms = min(k, n)
    at = rank[:, :, None] == jnp.arange(terms, dtype=_I32)
    ordered = jnp.sum(jnp.where(at, r.choice_row[:, :, None] + 1, 0), axis=1, dtype=_I32) - 1
    out = jnp.zeros((r.choice_row.shape[0],) + home.shape[1:], acc)
    started = jnp.zeros((out.shape[0],) + (1,) * (out.ndim - 1), bool)
    for i in range(terms):
        term = _take(home, ordered[:, i]).astype(acc)
        out, started = _accumulate(out, started, (ordered[:, i] >= 0).reshape(started.shape),
                                   term)
    return out


def _sources(slots: jax.Array, rows: int) -> jax.Array:
    """For each of `rows` rows of recv, the received row and choice that
    fill it (row * k + choice); n·T·k where none does."""
    flat = slots.reshape(-1)
    return jnp.full(rows, flat.shape[0], _I32).at[jnp.where(flat >= 0, flat, rows)].set(
        jnp.arange(flat.shape[0], dtype=_I32), mode="drop")


# ---- the primitives -----------------------------------------------------------
# jax_tma_moe_dispatch: the dispatch (the routing is traced before it); its
# tangent is jax_tma_moe_rows toward "experts", whose transpose is the same
# primitive toward "home". jax_tma_moe_combine: the combine; its tangent is
# jax_tma_moe_combine_tangent, linear in (dy, dweights), whose transpose is
# _combine_transpose. Each lowers to its composition of exchanges.

_dispatch_p = Primitive("jax_tma_moe_dispatch")
_dispatch_p.multiple_results = True
_rows_p = Primitive("jax_tma_moe_rows")
_combine_p = Primitive("jax_tma_moe_combine")
_combine_tangent_p = Primitive("jax_tma_moe_combine_tangent")
# jax_tma_moe_pull: the dispatch's rows, pulled by their experts' devices
# (ffi/ppermute/moe_dispatch.h); no AD of its own (the dispatch's rules hold
# it), vmap folding the members into one pull.
_pull_p = Primitive("jax_tma_moe_pull")
_pull_p.multiple_results = True
# jax_tma_moe_home_sums: the combine's pair rows, summed as they are sent
# home (ffi/ppermute/moe_combine.h); no AD of its own (the combine's rules
# hold it), vmap mapping its composition over the members.
_home_sums_p = Primitive("jax_tma_moe_home_sums")


# jax_tma_moe_dispatch_counts and jax_tma_moe_dispatch_plan: the routing plan before and
# after the counts' all_to_all (ffi/ppermute/moe_dispatch_plan.h); integer results
# (no AD), vmap as a batch of plans.
_plan_counts_p = Primitive("jax_tma_moe_dispatch_counts")
_plan_p = Primitive("jax_tma_moe_dispatch_plan")
_plan_p.multiple_results = True


def _aval(like, shape, dtype=None):
    return _lowering.out_aval(like, shape, dtype, spec=(None,) * len(shape))


def _dispatch_abstract_eval(x, sent, routes, *_, rows, **__):
    slots = (routes.shape[0] * x.shape[0], sent.shape[1] - 1)
    return (_aval(x, (rows,) + x.shape[1:]), _aval(x, slots, _I32), _aval(x, (rows,), _I32))


def _rows_abstract_eval(v, *route, toward, **_):
    r = _Routes(*route)
    rows = r.source.shape[0] if toward == "experts" else r.choice_row.shape[0]
    return _aval(v, (rows,) + v.shape[1:])


def _combine_abstract_eval(y, weights, *_, **__):
    return _aval(y, (weights.shape[0],) + y.shape[1:])


def _combine_tangent_abstract_eval(dy, dweights, y, weights, after, *_, **__):
    return _aval(after, after.shape)


def _dispatch(x, sent, routes, pair_token, choice_row, dropped, *, rows, **ex):
    """Each device pulls, from every source, its pairs (`sent`: a row of
    k + 1 int32 a pair, the token and its slots) and their token rows, once
    each, into their slots (_pull_p): the pairs travel in the rows' own
    meeting."""
    recv, slots = _pull_p.bind(_checks.widen(x), sent, routes, rows=rows, **ex)
    return _checks.narrow(recv, x.dtype), slots, _sources(slots, rows)


def _plan_counts_abstract_eval(ids, *, experts, parts):
    return _aval(ids, ids.shape[:-2] + (parts, experts + parts + 1), _I32)


def _plan_abstract_eval(ids, table, *, experts, parts, capacity):
    *lead, tokens, k = ids.shape
    lead, pairs = tuple(lead), tokens * min(k, parts)
    return (_aval(ids, lead + (experts // parts,), _I32), _aval(ids, ids.shape, np.dtype(bool)),
            _aval(ids, lead + (parts, 5), _I32), _aval(ids, lead + (pairs,), _I32),
            _aval(ids, ids.shape, _I32), _aval(ids, lead + (pairs, k + 1), _I32))


def _plan_lowering(target: str):
    def rule(ctx, *args, **attrs):
        return jax.ffi.ffi_lowering(target)(ctx, *args,
                                            **{a: np.int64(v) for a, v in attrs.items()})
    return rule


def _plan_batcher(prim):
    """vmap: the batch dims in front (an unbatched operand broadcast), each
    member its own plan."""
    def rule(args, dims, **attrs):
        batch = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
        args = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (batch,) + a.shape)
                for a, d in zip(args, dims)]
        out = prim.bind(*args, **attrs)
        return out, ((0,) * len(out) if prim.multiple_results else 0)
    return rule


def _pull_abstract_eval(x, sent, routes, *, rows, **_):
    slots = (routes.shape[0] * x.shape[0], sent.shape[1] - 1)
    return _aval(x, (rows,) + x.shape[1:]), _aval(x, slots, _I32)


def _pull_by_transport(x, sent, routes, *, rows, ctas, attrs):
    """One jax_tma_moe_dispatch call: result rows that no slot names are
    unspecified."""
    slots = (routes.shape[0] * x.shape[0], sent.shape[1] - 1)
    return jax.ffi.ffi_call("jax_tma_moe_dispatch",
                            (jax.ShapeDtypeStruct((rows,) + x.shape[1:], x.dtype),
                             jax.ShapeDtypeStruct(slots, _I32)))(
        x, sent, routes, ctas=np.int64(ctas), **attrs)


def _pull_composed(x, sent, routes, *, rows, axis_name):
    """The pull on lax.all_to_all: each device's pairs to their devices
    (T rows a destination, (T, -1, ...) past its pairs), then their token
    rows, each into its slots there (zeros in the other rows). Where the
    transport cannot run (across hosts)."""
    n, tokens, k = routes.shape[0], x.shape[0], sent.shape[1] - 1
    exchange = functools.partial(lax.all_to_all, axis_name=axis_name, split_axis=0,
                                 concat_axis=0, tiled=True)
    i = jnp.arange(tokens, dtype=_I32)
    mine = i < routes[:, 1, None]  # (n, T): row i of each destination's is a pair
    at = jnp.where(mine, routes[:, 0, None] + i, 0).reshape(-1)
    past = jnp.concatenate([jnp.full(1, tokens, _I32), jnp.full(k, -1, _I32)])
    pairs = jnp.where(mine.reshape(-1, 1), sent[at], past)
    got = exchange(pairs)
    rows_of = exchange(_take(x, jnp.where(pairs[:, 0] < tokens, pairs[:, 0], -1)))
    slots = jnp.where(got[:, :1] < tokens, got[:, 1:], -1)
    return _take(rows_of, _sources(slots, rows) // k), slots


def _pull_batcher(args, dims, *, rows, **ex):
    """The members folded into one pull: member b's rows of the operand at
    b * T on, its slots at b * rows on; each source's pairs destination-major,
    then by member, so that a reader's pairs from a source are one run, in
    which member b's start after those of the members below it."""
    x, sent, routes = (jnp.moveaxis(a, d, 0) if d is not None else a
                       for a, d in zip(args, dims))
    batch = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    x, sent, routes = (a if d is not None else jnp.broadcast_to(a, (batch,) + a.shape)
                       for a, d in zip((x, sent, routes), dims))
    tokens, (pairs, width), n = x.shape[1], sent.shape[1:], routes.shape[1]
    b = jnp.arange(batch, dtype=_I32)
    token = sent[..., 0]
    token = jnp.where(token == tokens, batch * tokens, token + b[:, None] * tokens)
    slots = jnp.where(sent[..., 1:] >= 0, sent[..., 1:] + b[:, None, None] * rows,
                      sent[..., 1:])
    first, count = routes[..., 0], routes[..., 1]  # (batch, n)
    # Where member b's pairs to device d start in the folded pairs.
    start = _exclusive(count.T.reshape(-1), 0).reshape(n, batch).T
    used = jnp.sum(count, 1, dtype=_I32)
    i = jnp.arange(pairs, dtype=_I32)
    device = jnp.minimum(jnp.sum(i[None, :, None] >= (first + count)[:, None, :], 2,
                                 dtype=_I32), n - 1)  # (batch, pairs)
    in_pairs = i < used[:, None]
    past = (jnp.sum(used) + b * pairs - _exclusive(used, 0))[:, None] + i - used[:, None]
    to = jnp.where(in_pairs, jnp.take_along_axis(start, device, 1) + i
                   - jnp.take_along_axis(first, device, 1), past)
    folded = jnp.zeros((batch * pairs, width), _I32).at[to.reshape(-1)].set(
        jnp.concatenate([token[..., None], slots], -1).reshape(-1, width),
        unique_indices=True, mode="promise_in_bounds")
    totals = jnp.sum(routes, 0, dtype=_I32)
    folded_routes = totals.at[:, 0].set(start[0]).at[:, 1].set(jnp.sum(count, 0, dtype=_I32))
    recv, got = _pull_p.bind(x.reshape((batch * tokens,) + x.shape[2:]), folded,
                             folded_routes, rows=batch * rows, **ex)
    # Member b's pairs from s: after those of the members below it.
    gets = routes[..., 3]  # (batch, n)
    at = (jnp.arange(n, dtype=_I32)[None, :, None] * (batch * tokens)
          + _exclusive(gets, 0)[..., None] + jnp.arange(tokens, dtype=_I32))
    mine = jnp.arange(tokens, dtype=_I32) < gets[..., None]  # (batch, n, T)
    got = _take(got, jnp.where(mine, at, -1))
    got = jnp.where(mine[..., None] & (got >= 0), got - b[:, None, None, None] * rows, -1)
    return ((recv.reshape((batch, rows) + x.shape[2:]), got.reshape(batch, n * tokens, -1)),
            (0, 0))


def _pull_lowering(ctx, *args, platform, rows, axis_name, size, site, ctas):
    return lower_exchange(
        ctx, *args, op=_DISPATCH, target="jax_tma_moe_dispatch", platform=platform,
        axis_name=axis_name, size=size, site=site,
        by_transport=functools.partial(_pull_by_transport, rows=rows, ctas=ctas),
        fallback=functools.partial(_pull_composed, rows=rows, axis_name=axis_name),
        fallback_name="lax.all_to_all of the pairs and their rows", multiple_results=True)


def _rows(v, *route, toward, **ex):
    """toward "experts": token rows to their slots, as the dispatch moves
    them (after the dispatch's own exchange, on which the slots wait);
    toward "home": slot rows summed into their tokens (unit weights), the
    dispatch's transpose."""
    r = _Routes(*route)
    if toward == "experts":
        rows = _after(_gather(v, r.pair_token), r.pair_token, r.source)
        return _gather(_to_experts(rows, r, None, **ex), r.source // r.slots.shape[1])
    acc = _accumulator(v.dtype)
    return _per_token(_pairs_home(v, None, r, **ex), r, acc).astype(v.dtype)


def _combine(y, weights, *route, **ex):
    """The weights to the experts' devices (once the dispatch's exchange is
    done), each pair's weighted sum home, each token's sum there. Rows of
    f16, bf16, f32 or f64 are summed on their way home (_home_sums_p); the
    other dtypes' pair rows are summed first, then exchanged."""
    r = _Routes(*route)
    got = _to_experts(_after(_take(weights, r.pair_token), r.pair_token, y), r, 0, **ex)
    return _per_token(_pairs_home(y, got, r, **ex), r, _accumulator(y.dtype)).astype(y.dtype)


# The dtypes whose pair rows jax_tma_moe_combine sums as it sends them
# (ffi/ppermute/moe_combine.h).
_SUMMED_ON_THE_WAY = {np.dtype(t) for t in (jnp.float16, jnp.bfloat16, jnp.float32, jnp.float64)}


def _pairs_home(v, weights, r: _Routes, **ex) -> jax.Array:
    """Each pair row's sum of the rows of `v` its slots name, times
    `weights` (None: 1), home into the rows of its pairs: summed on the way
    (_home_sums_p) for the dtypes of _SUMMED_ON_THE_WAY where the pair rows
    are over the inbox's limit, else summed here (_per_pair) and sent by a
    ragged exchange, which takes the inbox up to its limit (one crossing of
    the link a call, where PeerScatter's meetings take two)."""
    acc = _accumulator(v.dtype)
    row_bytes = int(np.prod(v.shape[1:], dtype=np.int64)) * np.dtype(v.dtype).itemsize
    large = r.slots.shape[0] * row_bytes > _ffi._ext.exchange_inbox_max_bytes
    if np.dtype(v.dtype) in _SUMMED_ON_THE_WAY and large:
        w = jnp.ones(r.slots.shape, acc) if weights is None else weights.astype(acc)
        return _home_sums_p.bind(v, w, r.slots, *_home_indices(r), rows=r.pair_token.shape[0],
                                 **ex)
    return _home(_per_pair([(v, weights)], r.slots, acc).astype(v.dtype), r, **ex)


def _home_sums(y, weights, slots, *indices, rows, axis_name, size, site, ctas):
    """_home_sums_p's composition: each pair row's weighted sum (_per_pair),
    then the ragged exchange home (`indices`: _home_indices's) into `rows`
    rows, those of no pair unspecified."""
    pairs = _per_pair([(y, weights)], slots, _accumulator(y.dtype)).astype(y.dtype)
    return _exchange(pairs, rows, None, *indices, axis_name=axis_name, size=size, site=site,
                     ctas=ctas)


def _home_sums_by_transport(y, weights, slots, *indices, rows, ctas, attrs):
    """One jax_tma_moe_combine call: the rows of no pair are unspecified."""
    return jax.ffi.ffi_call("jax_tma_moe_combine",
                            jax.ShapeDtypeStruct((rows,) + y.shape[1:], y.dtype))(
        y, weights, slots, *indices, ctas=np.int64(ctas), **attrs)


def _home_sums_lowering(ctx, *args, platform, rows, axis_name, size, site, ctas):
    return lower_exchange(
        ctx, *args, op=_COMBINE, target="jax_tma_moe_combine", platform=platform,
        axis_name=axis_name, size=size, site=site,
        by_transport=functools.partial(_home_sums_by_transport, rows=rows, ctas=ctas),
        fallback=functools.partial(_home_sums, rows=rows, axis_name=axis_name, size=size,
                                   site=site, ctas=ctas),
        fallback_name="the pairs' sums, then lax.all_to_all of them")


def _home_sums_abstract_eval(y, *_, rows, **__):
    return _aval(y, (rows,) + y.shape[1:])


def _combine_tangent(dy, dweights, y, weights, after, *route, **ex):
    """combine(dy, weights) + combine(y, dweights) in one pass: both weights
    in one exchange (after the primal combine's result `after`), the terms
    of choice j in that order."""
    r = _Routes(*route)
    acc = _accumulator(y.dtype)
    k = weights.shape[1]
    sent = _after(_take(jnp.concatenate([weights, dweights], 1), r.pair_token), r.pair_token,
                  dy, after)
    got = _to_experts(sent, r, 0, **ex)
    pairs = _per_pair([(dy, got[:, :k]), (y, got[:, k:])], r.slots, acc).astype(dy.dtype)
    return _per_token(_home(pairs, r, **ex), r, acc).astype(dy.dtype)


def _combine_transpose(ct, y, weights, r: _Routes, want_y: bool, want_weights: bool, **ex):
    """The cotangents of y and weights: where y's is wanted, the weights to
    the experts' devices (once ct is there), then ct's rows; y's, each
    slot's row scaled by its weight; the weights', ⟨ct, y⟩ of each choice
    there, (rows, k) sent home. Each exchange waits for the one before, so
    that no later exchange of the step runs beside one."""
    acc = _accumulator(y.dtype)
    k = weights.shape[1]
    rows = _gather(ct, r.pair_token)
    if want_y:
        w_got = _to_experts(_after(_take(weights, r.pair_token), r.pair_token, ct), r, 0, **ex)
        rows = _after(rows, r.pair_token, w_got)
    ct_got = _to_experts(rows, r, None, **ex)
    ct_y = ct_weights = None
    if want_y:
        scale = _take(w_got.reshape(-1), r.source).astype(acc)
        ct_y = (_take(ct_got, r.source // k).astype(acc) * scale[:, None]).astype(y.dtype)
    if want_weights:
        wide = ct_got.astype(acc)
        dots = jnp.stack([jnp.where(r.slots[:, j] >= 0, jnp.sum(
            _take(y, r.slots[:, j]).astype(acc) * wide, axis=1), 0) for j in range(k)], axis=1)
        home = _home(dots, r, **ex)
        kept = (r.choice_row >= 0) & ~r.dropped
        at = jnp.where(kept, r.choice_row * k + jnp.arange(k, dtype=_I32), -1)
        ct_weights = _take(home.reshape(-1), at).astype(weights.dtype)
        if want_y:
            ct_y = _after(ct_y, r.source, home)
    return ct_y, ct_weights


# ---- vmap ---------------------------------------------------------------------

def _vmapped(impl, outputs: int | None):
    """A vmap rule that maps the primitive's composition over the batch (each
    member its own exchanges, which batch as theirs do); `outputs`: the
    number of results, None for one."""
    def rule(args, dims, **params):
        out = jax.vmap(functools.partial(impl, **params), in_axes=tuple(dims))(*args)
        return out, (0 if outputs is None else (0,) * outputs)
    return rule


# ---- AD -----------------------------------------------------------------------

def _zero_like(x):
    return ad.Zero(jax.typeof(x).to_tangent_aval())


def _dispatch_jvp(primals, tangents, *, rows, **ex):
    x, sent, routes, pair_token, choice_row, dropped = primals
    recv, slots, source = _dispatch_p.bind(*primals, rows=rows, **ex)
    dx = tangents[0]
    d_recv = _zero_like(recv) if type(dx) is ad.Zero else _rows_p.bind(
        dx, routes, pair_token, choice_row, dropped, slots, source, toward="experts", **ex)
    return (recv, slots, source), (d_recv, _zero_like(slots), _zero_like(source))


def _rows_jvp(primals, tangents, **params):
    out = _rows_p.bind(*primals, **params)
    dv = tangents[0]
    if type(dv) is ad.Zero:
        return out, _zero_like(out)
    return out, _rows_p.bind(dv, *primals[1:], **params)


def _rows_transpose(ct, v, *route, toward, **ex):
    if type(ct) is ad.Zero:
        return [ad.Zero(v.aval)] + [None] * len(route)
    back = "home" if toward == "experts" else "experts"
    return [_rows_p.bind(ct, *route, toward=back, **ex)] + [None] * len(route)


def _combine_jvp(primals, tangents, **ex):
    y, weights, *route = primals
    out = _combine_p.bind(*primals, **ex)
    dy, dweights = tangents[:2]
    if type(dy) is ad.Zero and type(dweights) is ad.Zero:
        return out, _zero_like(out)
    return out, _combine_tangent_p.bind(ad.instantiate_zeros(dy), ad.instantiate_zeros(dweights),
                                        y, weights, out, *route, **ex)


def _combine_tangent_jvp(primals, tangents, **ex):
    """t(dy, dw; y, w) = combine(dy, w) + combine(y, dw) is symmetric,
    t(a, b; c, d) = t(c, d; a, b), so its derivative in (y, w) along (ty, tw)
    is t(ty, tw; dy, dw): each term one more bind, linear in its first two,
    each after the one before."""
    dy, dweights, y, weights, _, *route = primals
    after = out = _combine_tangent_p.bind(*primals, **ex)
    terms = []
    for a, b, c, d in ((tangents[0], tangents[1], y, weights),
                       (tangents[2], tangents[3], dy, dweights)):
        if type(a) is not ad.Zero or type(b) is not ad.Zero:
            after = _combine_tangent_p.bind(ad.instantiate_zeros(a), ad.instantiate_zeros(b), c,
                                            d, after, *route, **ex)
            terms.append(after)
    if not terms:
        return out, _zero_like(out)
    return out, functools.reduce(jnp.add, terms)


def _combine_tangent_transpose(ct, dy, dweights, y, weights, after, *route, **ex):
    want_y, want_weights = ad.is_undefined_primal(dy), ad.is_undefined_primal(dweights)
    rest = [None] * (3 + len(route))
    if type(ct) is ad.Zero:
        return [ad.Zero(dy.aval) if want_y else None,
                ad.Zero(dweights.aval) if want_weights else None] + rest
    ct_y, ct_weights = _combine_transpose(ct, y, weights, _Routes(*route), want_y, want_weights,
                                          **ex)
    return [ct_y, ct_weights] + rest


# ---- registration ---------------------------------------------------------------

for _prim, _eval, _impl, _outputs in (
        (_dispatch_p, _dispatch_abstract_eval, _dispatch, 3),
        (_rows_p, _rows_abstract_eval, _rows, None),
        (_combine_p, _combine_abstract_eval, _combine, None),
        (_combine_tangent_p, _combine_tangent_abstract_eval, _combine_tangent, None)):
    _lowering.register(_prim, _eval, mlir.lower_fun(_impl, multiple_results=_outputs is not None),
                       batcher=_vmapped(_impl, _outputs), jitted=False)
_lowering.register(_pull_p, _pull_abstract_eval,
                   {p: functools.partial(_pull_lowering, platform=p) for p in ("cpu", "cuda")},
                   batcher=_pull_batcher, jitted=False)
_lowering.register(_home_sums_p, _home_sums_abstract_eval,
                   {p: functools.partial(_home_sums_lowering, platform=p)
                    for p in ("cpu", "cuda")},
                   batcher=_vmapped(_home_sums, None), jitted=False)
for _prim, _eval, _target in ((_plan_counts_p, _plan_counts_abstract_eval,
                               "jax_tma_moe_dispatch_counts"),
                              (_plan_p, _plan_abstract_eval, "jax_tma_moe_dispatch_plan")):
    _lowering.register(_prim, _eval, _plan_lowering(_target), batcher=_plan_batcher(_prim))
ad.primitive_jvps[_dispatch_p] = _dispatch_jvp
ad.primitive_jvps[_rows_p] = _rows_jvp
ad.primitive_transposes[_rows_p] = _rows_transpose
ad.primitive_jvps[_combine_p] = _combine_jvp
ad.primitive_jvps[_combine_tangent_p] = _combine_tangent_jvp
ad.primitive_transposes[_combine_tangent_p] = _combine_tangent_transpose
