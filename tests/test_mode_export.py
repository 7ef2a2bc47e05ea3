"""Every op, its vjp included, through jax.export with concrete and with
symbolic (shape-polymorphic) shapes, serialized and deserialized, then
called: the NumPy result and the jnp equivalent's grads, at the exported
size and, for symbolic shapes, at another batch size. An export needs
DisabledSafetyCheck.custom_call(target) for each jax_tma_* FFI target."""

import re

import jax
import numpy as np
import pytest
from jax.export import DisabledSafetyCheck
from jax.sharding import NamedSharding

import ops_table as T
from families import BY_NAME, OP_NAMES, build
from reference import assert_bits_equal

_TARGET = re.compile(r"@(jax_tma_\w+)")


def ffi_targets(fn, *args) -> list[str]:
    """The jax_tma FFI targets that `fn`'s program calls."""
    return sorted(set(_TARGET.findall(jax.jit(fn).lower(*args).as_text())))


def disabled_checks(targets):
    return [DisabledSafetyCheck.custom_call(t) for t in targets]


def _forward_and_vjp(case):
    def run(ct, *args):
        return T.vjp(case, case.ours, args, ct)
    return run


def _placed(case, args):
    """Arguments as the call takes them: a collective's on the 2 x 4 mesh, its
    blocks split along dim 0 (the exported shard_map's devices)."""
    if not case.collective:
        return args
    mesh = T.cpu_mesh()
    return tuple(jax.device_put(a, NamedSharding(mesh, s))
                 for a, s in zip(args, (T.BATCH,) + case.batch_specs()))


def _symbolic(case, shapes):
    """Per operand, per dim, the name of a symbolic dim or None: every name
    of case.symbolic ("symbolic"); none ("concrete"); those of one of the
    op's export_variants (ops_table.Op)."""
    if shapes == "concrete":
        return [(None,) * a.ndim for a in case.args]
    if shapes == "symbolic":
        return case.symbolic
    keep = BY_NAME[case.op].export_variants[shapes]
    return [tuple(n if n in keep else None for n in names) for names in case.symbolic]


def _specs(case, ct, shapes):
    args = (ct,) + case.args
    sharding = ([NamedSharding(T.cpu_mesh(), s) for s in (T.BATCH,) + case.batch_specs()]
                if case.collective else [None] * len(args))
    scope = jax.export.SymbolicScope()
    sym = [tuple(n or str(d) for n, d in zip(names, a.shape))
           for names, a in zip(_symbolic(case, shapes), case.args)]
    arg_specs = [jax.ShapeDtypeStruct(jax.export.symbolic_shape(", ".join(s), scope=scope),
                                      a.dtype, sharding=sh)
                 for s, a, sh in zip(sym, case.args, sharding[1:])]
    out = jax.eval_shape(case.ours, *arg_specs)
    return [jax.ShapeDtypeStruct(out.shape, ct.dtype, sharding=sharding[0])] + arg_specs


def _check(case, exp, ct, args):
    y, grads = exp.call(*_placed(case, (ct,) + args))
    assert_bits_equal(y, case.want(*args))
    _, want = jax.jit(lambda c, *a: T.vjp(case, case.ref, a, c))(*_placed(case, (ct,) + args))
    for g, w in zip(grads, want):
        T.assert_like_jnp(g, w)


# Every op concrete and symbolic, and the variants an op adds (ops_table.Op).
CASES = [(n, s) for n in OP_NAMES
         for s in ("concrete", *(("symbolic",) if BY_NAME[n].symbolic_export is None else ()),
                   *BY_NAME[n].export_variants)]


@pytest.mark.parametrize("name,shapes", CASES)
def test_serialized_export_round_trip(rng, name, shapes):
    case = build(name, rng, np.float32)
    ct = T.cotangent(rng, T.out_struct(case).shape, np.float32)
    f = _forward_and_vjp(case)
    targets = ffi_targets(f, *_placed(case, (ct,) + case.args))
    assert targets or case.collective, "no jax_tma FFI call in the program"
    # A collective's program runs on the host devices' mesh, also on a GPU machine
    platforms = ("cpu",) if case.collective else None
    exp = jax.export.export(jax.jit(f), platforms=platforms,
                            disabled_checks=disabled_checks(targets))(*_specs(case, ct, shapes))
    exp = jax.export.deserialize(exp.serialize())
    _check(case, exp, ct, case.args)
    if shapes == "symbolic":  # the same program at half the batch
        half = case.args[0].shape[0] // 2
        args = tuple(a[:half] if i in case.batch else a for i, a in enumerate(case.args))
        _check(case, exp, ct[:half], args)


@pytest.mark.parametrize("name", [n for n in OP_NAMES if not BY_NAME[n].collective][:1])
def test_export_without_the_safety_check_names_the_target(rng, name):
    """Why the README tells users to disable the custom-call check."""
    case = build(name, rng, np.float32)
    with pytest.raises(ValueError, match=r"jax_tma_\w+"):
        jax.export.export(jax.jit(case.ours))(*case.args)
