"""jax_tma.copy on the CPU: bit-exactness for every dtype and shape class,
the transformations (jit, vmap, jvp/vjp/grad/transpose), and errors."""

import functools
import inspect
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import jax_tma
from jax_tma import _devices
from reference import (ALL_DTYPES, assert_bits_equal, assert_no_collectives, cpu_device, cpu_mesh,
                       random_array)

SHAPES = [(), (0,), (3, 0, 2), (1,), (7,), (3, 5, 7), (1000003,), (2,) * 8]
METHODS = ["auto", "tma", "simt", "tiled"]



def on_cpu(a):
    return jax.device_put(a, cpu_device())


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=str)
@pytest.mark.parametrize("method", METHODS)
def test_every_dtype_bit_exact(rng, dtype, method):
    x = random_array(rng, (5, 37), dtype)
    y = jax.jit(functools.partial(jax_tma.copy, method=method))(on_cpu(x))
    assert_bits_equal(y, x)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", [np.uint8, jnp.bfloat16, np.float32, np.complex128], ids=str)
def test_every_shape_class(rng, shape, dtype):
    x = random_array(rng, shape, dtype)
    assert_bits_equal(jax_tma.copy(on_cpu(x)), x)
    assert_bits_equal(jax.jit(jax_tma.copy)(on_cpu(x)), x)
    assert_bits_equal(jax.jit(functools.partial(jax_tma.copy, method="tiled"))(on_cpu(x)), x)


def test_special_float_bits_survive():
    # NaN with payloads and both signs, -0.0, infinities, subnormals.
    bits = np.array([0x7FC00001, 0xFFC12345, 0x7F800001, 0x80000000, 0x7F800000,
                     0xFF800000, 0x00000001, 0x807FFFFF], np.uint32)
    x = bits.view(np.float32)
    assert_bits_equal(jax.jit(jax_tma.copy)(on_cpu(x)), x)


def test_numpy_inputs_and_scalars(rng):
    x = random_array(rng, (4, 4), np.int32)
    assert_bits_equal(jax_tma.copy(x), x)
    assert_bits_equal(jax_tma.copy(np.float32(2.5)), np.float32(2.5))


def test_output_is_a_new_buffer(rng):
    x = on_cpu(random_array(rng, (64,), np.float32))
    y = jax_tma.copy(x)
    assert y.unsafe_buffer_pointer() != x.unsafe_buffer_pointer()



@pytest.mark.parametrize("in_axes", [0, 1, 2])
def test_vmap_folds_batch_into_one_call(rng, in_axes):
    x = random_array(rng, (3, 4, 5), np.float32)
    f = jax.vmap(jax_tma.copy, in_axes=in_axes, out_axes=in_axes)
    assert_bits_equal(f(on_cpu(x)), x)
    jaxpr = jax.make_jaxpr(f)(x).jaxpr
    names = [e.primitive.name for e in jaxpr.eqns]
    assert names.count("jax_tma_copy") == 1
    assert not {"scan", "while"} & set(names), names


def test_nested_vmap_and_out_axes(rng):
    x = random_array(rng, (2, 3, 4), np.int16)
    f = jax.vmap(jax.vmap(jax_tma.copy), in_axes=1, out_axes=0)
    assert_bits_equal(f(on_cpu(x)), np.swapaxes(x, 0, 1))


def test_jvp_vjp_grad_transpose(rng):
    x = on_cpu(random_array(rng, (6, 3), np.float32))
    t = on_cpu(random_array(rng, (6, 3), np.float32))
    y, ty = jax.jvp(jax_tma.copy, (x,), (t,))
    assert_bits_equal(y, np.asarray(x))
    assert_bits_equal(ty, np.asarray(t))
    y, pullback = jax.vjp(jax_tma.copy, x)
    (ct,) = pullback(t)
    assert_bits_equal(ct, np.asarray(t))
    (tr,) = jax.linear_transpose(jax_tma.copy, x)(t)
    assert_bits_equal(tr, np.asarray(t))
    w = jnp.arange(18.0, dtype=jnp.float32).reshape(6, 3)
    g = jax.jit(jax.grad(lambda a: (jax_tma.copy(a) * w).sum()))(x)
    np.testing.assert_array_equal(g, w)


def test_higher_order_and_check_grads(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((4, 3))))
    check_grads(lambda a: jnp.sin(jax_tma.copy(a)), (x,), order=2,
                              modes=("fwd", "rev"))


def test_vmap_of_grad_and_grad_of_vmap(rng):
    x = on_cpu(jnp.asarray(rng.standard_normal((5, 3))))
    f = lambda a: (jax_tma.copy(a) ** 2).sum()  # noqa: E731
    np.testing.assert_allclose(jax.vmap(jax.grad(f))(x), 2 * x)
    np.testing.assert_allclose(jax.grad(lambda a: jax.vmap(f)(a).sum())(x), 2 * x)


def test_sub_byte_grad_free_types_roundtrip(rng):
    for name in ("int4", "uint4"):
        if hasattr(jnp, name):
            x = random_array(rng, (9,), getattr(jnp, name))
            assert_bits_equal(jax.jit(jax_tma.copy)(on_cpu(x)), x)


# ---- bad input: Python-side validation (trace time) ----

@pytest.mark.parametrize("scalar", [3.0, -0.0, float("nan"), 7, True, 1 - 2j, 1j], ids=repr)
def test_python_scalars_copy_as_jnp_copy(scalar):
    """The dtype (weakly typed where jnp's is) and the bits, eager and jitted."""
    for wrap in (lambda f: f, jax.jit):
        y, want = wrap(jax_tma.copy)(scalar), wrap(jnp.copy)(scalar)
        assert jax.typeof(y) == jax.typeof(want), f"{jax.typeof(y)}, jnp: {jax.typeof(want)}"
        assert_bits_equal(y, want)


@pytest.mark.parametrize("bad", [[1, 2, 3], None, "abc"])
def test_non_array_input_is_a_type_error(bad):
    with pytest.raises(TypeError, match=r"jax_tma\.copy: x must be an array .* got "):
        jax_tma.copy(bad)


@pytest.mark.parametrize("method", ["fast", "BULK", None, 1])
def test_unknown_method_is_a_value_error(method):
    with pytest.raises(ValueError, match=r"jax_tma\.copy: method must be one of "
                                         r"'auto', 'tma', 'simt', 'tiled', got " + repr(method)):
        jax_tma.copy(jnp.ones(3), method=method)


def test_bulk_is_the_deprecated_name_of_tma(rng):
    """method="bulk" warns at the caller's line (also inside a jitted
    function), then runs exactly what method="tma" runs."""
    x = on_cpu(random_array(rng, (5, 37), np.float32))
    match = r"jax_tma\.copy: method='bulk' is deprecated, use method='tma'"
    with pytest.warns(DeprecationWarning, match=match) as eager:
        line, y = inspect.currentframe().f_lineno, jax_tma.copy(x, method="bulk")
    with pytest.warns(DeprecationWarning, match=match) as traced:
        line_jit, jaxpr = (inspect.currentframe().f_lineno,
                           jax.make_jaxpr(lambda a: jax_tma.copy(a, method="bulk"))(x))
    assert [(w.filename, w.lineno) for w in (*eager, *traced)] == \
        [(__file__, line), (__file__, line_jit + 1)]
    assert_bits_equal(y, x)
    assert str(jaxpr) == str(jax.make_jaxpr(lambda a: jax_tma.copy(a, method="tma"))(x))


def test_tma_on_a_gpu_without_tma_names_the_compute_capability(monkeypatch):
    monkeypatch.setattr(_devices, "gpu_compute_capabilities", lambda: [(9, 0), (8, 6)])
    f = jax.jit(functools.partial(jax_tma.copy, method="tma"))
    with pytest.raises(RuntimeError, match=r"jax_tma\.copy: method='tma' needs TMA, but "
                                           r"device 1 has compute capability 8\.6 "
                                           r"\(TMA needs >= 9\.0\)"):
        f.trace(jnp.ones(3)).lower(lowering_platforms=("cuda",))
    # auto and simt lower fine for the same devices.
    for method in ("auto", "simt"):
        g = jax.jit(functools.partial(jax_tma.copy, method=method))
        assert "jax_tma_copy" in g.trace(jnp.ones(3)).lower(
            lowering_platforms=("cuda",)).as_text()


# ---- bad input reaching the C++ handler directly (e.g. exported HLO) ----

def _raw_ffi(x, out_shape, out_dtype, method="auto"):
    call = jax.ffi.ffi_call("jax_tma_copy", jax.ShapeDtypeStruct(out_shape, out_dtype))
    return jax.jit(lambda a: call(a, method=method))(on_cpu(x))


def test_handler_rejects_unknown_method():
    with pytest.raises(Exception, match=r"jax_tma\.copy: method must be one of 'auto', "
                                        r"'tma', 'bulk', 'simt', got 'fast'"):
        _raw_ffi(jnp.ones(4, jnp.float32), (4,), jnp.float32, method="fast")


def test_handler_rejects_element_count_mismatch():
    with pytest.raises(Exception, match=r"jax_tma\.copy: output has 5 elements but "
                                        r"input has 4"):
        _raw_ffi(jnp.ones(4, jnp.float32), (5,), jnp.float32)


def test_handler_rejects_dtype_mismatch():
    with pytest.raises(Exception, match=r"jax_tma\.copy: output element type s32 "
                                        r"differs from input element type f32"):
        _raw_ffi(jnp.ones(4, jnp.float32), (4,), jnp.int32)


def test_build_info_reports_the_build():
    info = jax_tma.build_info()
    assert isinstance(info["cuda_compiled"], bool)
    assert info["ffi_api_version"] >= (0, 1)
    if info["cuda_compiled"]:
        # The default build's architectures, or those a source build chose
        # (scripts/gpu_check.sh passes CMAKE_ARGS=-DCMAKE_CUDA_ARCHITECTURES=...).
        chosen = re.search(r"-DCMAKE_CUDA_ARCHITECTURES=(\S+)", os.environ.get("CMAKE_ARGS", ""))
        for arch in (chosen[1].split(";") if chosen else ["90a", "100a"]):
            assert arch in info["cuda_archs"], (arch, info["cuda_archs"])
    for gpu in info["gpus"]:
        assert gpu["tma"] == (tuple(map(int, gpu["compute_capability"].split("."))) >= (9, 0))


@pytest.mark.parametrize("method", ["auto", "simt", "tma"])
def test_export_with_symbolic_dims(rng, method):
    """jax.export of a copy with symbolic dims, serialized, deserialized and
    called at two sizes; method='tiled' needs static dims and says so."""
    pytest.importorskip("flatbuffers")
    from jax import export
    f = jax.jit(lambda a: jax_tma.copy(a, method=method))
    checks = [export.DisabledSafetyCheck.custom_call("jax_tma_copy")]
    exp = export.export(f, platforms=("cpu",), disabled_checks=checks)(
        jax.ShapeDtypeStruct(export.symbolic_shape("n, 3"), jnp.bfloat16))
    call = export.deserialize(exp.serialize()).call
    for n in (1, 6):
        x = random_array(rng, (n, 3), jnp.bfloat16)
        assert_bits_equal(call(on_cpu(x)), x)
    with pytest.raises(ValueError, match=r"jax_tma\.copy: method='tiled' views x as rows of a "
                                         r"static length, but x\.shape=\(n, 3\) has symbolic dims"):
        export.export(jax.jit(lambda a: jax_tma.copy(a, method="tiled")), disabled_checks=checks)(
            jax.ShapeDtypeStruct(export.symbolic_shape("n, 3"), jnp.bfloat16))


# ---- sharded over 8 host devices: no collectives for the dims the op splits ----

SHARDING_CASES = [
    ((2, 4), ("a", "b"), (64, 32), P("a", "b")),
    ((8,), ("x",), (16, 8, 6), P(None, "x", None)),
    ((8,), ("x",), (16, 8, 24), P(None, None, "x")),
    ((2, 4), ("a", "b"), (8, 4, 12), P(("a", "b"), None, None)),
    ((2, 2, 2), ("a", "b", "c"), (4, 6, 2, 10), P("b", None, "c", "a")),
    ((8,), ("x",), (8 * 1024,), P("x")),
]


@pytest.mark.parametrize("mesh_shape,names,shape,spec", SHARDING_CASES, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.uint8, jnp.bfloat16, np.complex64], ids=str)
def test_jit_over_named_sharding_splits_every_dim(rng, mesh_shape, names, shape, spec, dtype):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, dtype)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    f = jax.jit(jax_tma.copy)
    assert_no_collectives(f.lower(x).compile().as_text())
    y = f(x)
    assert y.sharding.is_equivalent_to(x.sharding, len(shape))
    assert_bits_equal(y, host)


@pytest.mark.parametrize("mesh_shape,names,shape,spec", SHARDING_CASES, ids=str)
def test_shard_map_of_every_sharding_case(rng, mesh_shape, names, shape, spec):
    mesh = cpu_mesh(mesh_shape, names)
    host = random_array(rng, shape, np.float32)
    x = jax.device_put(host, NamedSharding(mesh, spec))
    f = jax.jit(jax.shard_map(jax_tma.copy, mesh=mesh, in_specs=spec, out_specs=spec))
    assert_no_collectives(f.lower(x).compile().as_text())
    assert_bits_equal(f(x), host)


def test_vjp_and_vmap_keep_the_sharding(rng):
    mesh = cpu_mesh((2, 4), ("a", "b"))
    sharding = NamedSharding(mesh, P("a", "b"))
    host = random_array(rng, (8, 16), np.float32)
    x = jax.device_put(host, sharding)
    ct = jax.device_put(random_array(rng, (8, 16), np.float32), sharding)

    def pullback(a, c):
        return jax.vjp(jax_tma.copy, a)[1](c)[0]

    f = jax.jit(pullback)
    assert_no_collectives(f.lower(x, ct).compile().as_text())
    assert_bits_equal(f(x, ct), np.asarray(ct))
    g = jax.jit(jax.vmap(jax_tma.copy, in_axes=1, out_axes=1))
    assert_no_collectives(g.lower(x).compile().as_text())
    assert_bits_equal(g(x), host)


def test_explicit_mesh_axes_keep_the_sharding(rng):
    mesh = cpu_mesh((2, 4), ("a", "b"), AxisType.Explicit)
    host = rng.standard_normal((8, 16)).astype(np.float32)  # arithmetic below: no subnormals
    with jax.set_mesh(mesh):
        x = jax.device_put(host, NamedSharding(mesh, P("a", "b")))
        f = jax.jit(jax_tma.copy)
        assert jax.typeof(f(x)).sharding.spec == P("a", "b")
        assert_no_collectives(f.lower(x).compile().as_text())
        assert_bits_equal(f(x), host)
        g = jax.jit(jax.grad(lambda a: (jax_tma.copy(a) * a).sum()))
        np.testing.assert_array_equal(g(x), 2 * host)
