"""The test helpers themselves: random_array mixes every special value of
each dtype into its draws (finite=True leaves out infinities and NaNs),
failures name the rng seed, the collective-op matcher finds every
collective (async forms too) and nothing else, and pytest-xdist's workers
steal each other's tests unless a --dist is named."""

import re
import types

import numpy as np
import pytest

import conftest
import reference
from reference import (ALL_DTYPES, SUB_BYTE_BITS, as_bits, assert_bits_equal, collectives_in,
                       random_array)

FLOATS = [d for d in ALL_DTYPES if d.kind == "c" or (d.kind not in "biu"
                                                     and not d.name.startswith(("int", "uint")))]
INTS = [d for d in ALL_DTYPES if d not in FLOATS and d != np.bool_]


def _float_words(a):
    """(words as unsigned ints, the float format's name): complex per part."""
    if a.dtype.kind == "c":
        return as_bits(a), "float32" if a.dtype == np.complex64 else "float64"
    return as_bits(a), a.dtype.name


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_every_special_float_value_is_drawn(rng, dtype):
    words, name = _float_words(random_array(rng, (50_000,), dtype))
    cats, _ = reference._float_specials(name, False)
    for label, members in cats.items():
        missing = [hex(int(m)) for m in members if not (words == m).any()]
        assert not missing, f"{dtype} {label}: {missing} never drawn{reference.seed_note()}"
    # About SPECIAL_FRACTION of the words on top of the specials that uniform
    # bits hit anyway (p0: many for 4- and 8-bit formats), spread over the array.
    specials = np.concatenate(list(cats.values()))
    p0 = specials.size / 2.0 ** (8 * np.dtype(name).itemsize
                                  if name not in SUB_BYTE_BITS else SUB_BYTE_BITS[name])
    special = np.isin(words, specials)
    extra = (special.mean() - p0) / (1 - p0)
    assert 0.6 * reference.SPECIAL_FRACTION < extra < 1.6 * reference.SPECIAL_FRACTION, extra
    assert special[:25_000].any() and special[25_000:].any()


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_finite_draws_have_no_inf_or_nan(rng, dtype):
    a = random_array(rng, (20_000,), dtype, finite=True)
    with np.errstate(invalid="ignore"):
        parts = a.astype(np.complex128).view(np.float64) if dtype.kind == "c" \
            else a.astype(np.float64)
    assert np.isfinite(parts).all(), reference.seed_note()
    words, name = _float_words(a)
    for label, members in reference._float_specials(name, True)[0].items():
        assert np.isin(members, words).all(), (dtype, label)


@pytest.mark.parametrize("dtype", INTS, ids=str)
def test_integer_edges_are_drawn(rng, dtype):
    a = random_array(rng, (50_000,), dtype)
    bits = SUB_BYTE_BITS.get(dtype.name)
    signed = dtype.name.startswith("int")
    if bits is not None:
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
    else:
        lo, hi = int(np.iinfo(dtype).min), int(np.iinfo(dtype).max)
    values = a.astype(np.int64) if dtype != np.uint64 else a
    for v in {lo, hi, 0, 1} | ({-1} if signed else set()):
        assert (values == np.array(v).astype(values.dtype)).any(), (dtype, v)


def test_shapes_dtypes_and_seeds_repeat():
    for dtype in ALL_DTYPES:
        a = random_array(reference.SeededGenerator(5), (3, 0, 2), dtype)
        assert a.shape == (3, 0, 2) and a.dtype == dtype
        x = random_array(reference.SeededGenerator(5), (4, 7), dtype)
        y = random_array(reference.SeededGenerator(5), (4, 7), dtype)
        assert x.shape == (4, 7) and x.dtype == dtype
        assert_bits_equal(x, y)


def test_failures_name_the_seed(rng):
    with pytest.raises(AssertionError, match=rf"rerun with JAX_TMA_SEED={rng.seed}\]$"):
        assert_bits_equal(np.float32([0.0]), np.float32([-0.0]))


def test_collectives_in_finds_every_collective_and_its_async_forms():
    text = ("%all-gather-start.1 = all-gather-start(a) %x = all-reduce(b) all-to-all(c) "
            "ragged-all-to-all(d) reduce-scatter(e) collective-permute-done(f) "
            "collective-broadcast(g) %send.2 = send(h) send-done(i) %recv.3 = recv(j) "
            "recv-done(k) custom_call_target=\"jax_tma_ppermute\" sender recvbuf resend")
    assert collectives_in(text) == sorted([
        "all-gather-start", "all-reduce", "all-to-all", "reduce-scatter",
        "collective-permute-done", "collective-broadcast", "send", "send-done", "recv",
        "recv-done"])
    assert collectives_in("fusion(a), custom-call(b), copy-start(c), jax_tma_copy") == []
    for name in reference.COLLECTIVE_OPS:
        assert collectives_in(f"%x = {name}-start(y)") == [f"{name}-start"]
        assert re.fullmatch(r"[a-z-]+", name)


def _configured_dist(args, addopts="", distload=False, monkeypatch=None):
    monkeypatch.setenv("PYTEST_ADDOPTS", addopts)
    config = types.SimpleNamespace(option=types.SimpleNamespace(dist="load", distload=distload),
                                   invocation_params=types.SimpleNamespace(args=tuple(args)))
    conftest.pytest_configure(config)
    return config.option.dist


def test_workers_steal_tests_unless_a_dist_is_named(monkeypatch):
    assert _configured_dist(["tests", "-n", "4"], monkeypatch=monkeypatch) == "worksteal"
    for args, addopts, distload in [(["-n", "4", "--dist", "load"], "", False),
                                    (["-n", "4", "--dist=load"], "", False),
                                    (["-n", "4"], "--dist load", False),
                                    (["-n", "4", "-d"], "", True)]:
        assert _configured_dist(args, addopts, distload, monkeypatch) == "load", args
