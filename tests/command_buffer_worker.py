"""One process of tests/test_command_buffers.py: every op in a jitted loop
that XLA runs from command buffers (CUDA graphs), bit-exact at every step,
with the proof that a graph ran. XLA's flags are per process, hence this
script.

    usage: python -P tests/command_buffer_worker.py GROUP PLATFORM SEED DUMP_DIR

GROUP: "local" (one device: copy with its dynamic schedule, window, im2col,
col2im, broadcast, gather, scatter, and ppermute, all_to_all,
ragged_all_to_all, moe_combine's summing exchange, and moe_dispatch with
moe_combine over a one-device mesh) or "multi" (two devices in this process: ppermute, all_to_all,
ragged_all_to_all, moe_combine's summing exchange, and moe_dispatch with
moe_combine over 200 steps). Each case is a `lax.scan` of >= 100 steps whose
inputs change with the step (data XOR a word of the step, starts, indices,
slice sizes and expert ids computed from it), so that a graph replayed with
stale arguments gives wrong bits; every step's output is kept (or, for the
32 MiB copy, its mismatch count and a sample) and compared with NumPy bit for
bit, twice, with fresh inputs.

PLATFORM "gpu": XLA_FLAGS force command buffers
(--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL
--xla_gpu_graph_min_graph_size=1) and dump each case's module into DUMP_DIR.
A case passes only if (1) XLA's thunk sequence after its thunk passes
(`*.thunk_sequence_after_thunk_passes.txt`, written by
CommandBufferConversionPass's pipeline) holds at least as many custom-call
thunks inside kCommandBuffer thunks (the while loop's body is converted when
the loop itself is not) as the optimized HLO has jax_tma custom calls, and
none outside but XLA's own (check_command_buffers); and (2) each of the
case's CUDA paths (jax_tma's per-path handler counters) ran, yet fewer times
than the loop has steps: the other steps ran from the recorded graph, not
through the handler. PLATFORM "cpu" (two host devices, no command buffers):
the same loops and comparisons, each CPU handler called at least once a
step, and the case's targets found in its dumped optimized HLO.

Prints "cases: NAME ...", then "case NAME: ok ..." for each, then
"command buffer worker: ok"; an error's traceback and exit status 1."""

from __future__ import annotations

import os
import re
import sys

COMMAND_BUFFER_FLAGS = ("--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                        "--xla_gpu_graph_min_graph_size=1")
MODULE_PREFIX = "cmdbuf_"  # jit names its module jit_cmdbuf_<case>


def _configure(platform: str, dump_dir: str) -> None:
    """The process's XLA flags and platform, before jax is imported."""
    dump = f"--xla_dump_to={dump_dir} --xla_dump_hlo_module_re={MODULE_PREFIX}"
    if platform == "gpu":
        os.environ["XLA_FLAGS"] = f"{COMMAND_BUFFER_FLAGS} {dump}"
        # The CPU too: the references' fills are converted there (ops_table).
        os.environ["JAX_PLATFORMS"] = "cuda,cpu"
        os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    elif platform == "cpu":
        os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count=2 {dump}"
        os.environ["JAX_PLATFORMS"] = "cpu"
    else:
        raise SystemExit(f"command_buffer_worker.py: unknown platform {platform!r} (gpu, cpu)")


if __name__ == "__main__":
    _configure(sys.argv[2], sys.argv[4])

import dataclasses  # noqa: E402
import glob  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Callable  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import jax_tma  # noqa: E402
from families.broadcast import broadcast_reference  # noqa: E402
from families.gather import gather_reference, scatter_reference  # noqa: E402
from families.im2col import col2im_reference, im2col_reference  # noqa: E402
from families.ppermute import (all_to_all_reference, combine_sums,  # noqa: E402
                               ppermute_reference, ragged_geometry, ragged_reference)
from families.window import window_expect  # noqa: E402
from jax_tma import _ffi  # noqa: E402
from jax_tma._moe import _home_sums_p  # noqa: E402
from paths import paths_ran  # noqa: E402
from reference import moe_dispatch_reference, random_array  # noqa: E402

EXECUTIONS = 2  # of each case's loop, each with fresh inputs


# ---- the marker: custom calls inside command buffers in XLA's thunk dump ----

# A thunk's line in XLA's thunk-sequence dump: its indent (two spaces a
# nesting level), the thunk id ("005: ", printed by newer XLA) and its kind.
# A command buffer's thunks, a while loop's condition and body, are printed
# below their parent, one level deeper.
_THUNK_LINE = re.compile(r"^(?P<indent> *)(?:\d+:\s+)?(?P<kind>k[A-Z]\w*)")


def custom_calls_in_command_buffers(thunk_text: str) -> tuple[int, int]:
    """(inside, outside): the kCustomCall thunks of XLA's thunk-sequence
    dump nested (at any depth) under a kCommandBuffer thunk, and the
    others."""
    inside = outside = 0
    parents: list[tuple[int, str]] = []  # the enclosing thunks: (indent, kind)
    for line in thunk_text.splitlines():
        m = _THUNK_LINE.match(line)
        if m is None:  # "condition:", "body:", blank lines
            continue
        indent, kind = len(m["indent"]), m["kind"]
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if kind == "kCustomCall":
            if any(k == "kCommandBuffer" for _, k in parents):
                inside += 1
            else:
                outside += 1
        parents.append((indent, kind))
    return inside, outside


def module_files(dump_dir: str, module: str, suffix: str) -> list[str]:
    """The dumped files of jit module `module` ("jit_cmdbuf_copy") whose
    name ends in `suffix` (XLA names them module_<id>.<module>.<suffix>,
    the optimized HLO with a platform prefix: sm_9.0_gpu_after_optimizations)."""
    return sorted(f for f in glob.glob(os.path.join(dump_dir, f"module_*.{module}.*"))
                  if f.endswith(suffix) and os.path.basename(f).split(".")[1] == module)


def custom_call_targets(hlo_text: str) -> list[str]:
    """The targets of an HLO text's custom calls, one per call."""
    return re.findall(r'custom_call_target="([^"]+)"', hlo_text)


def check_command_buffers(dump_dir: str, module: str, targets, *, gpu: bool) -> str:
    """That module `module` calls `targets` (its optimized HLO) and, on the
    GPU, that its thunk dump has at least as many custom-call thunks inside
    command buffers as the module has jax_tma custom calls, and outside
    them no more than it has custom calls of XLA's own (a cub scan or sort
    that XLA rewrote a jnp op into: the dump names a thunk's kind, not its
    target). Without those, every custom-call thunk must be inside. Returns
    a summary; raises AssertionError naming what is missing. (The handler
    counts, check_paths, tell the rest: a call outside a graph would call
    its handler every step.)"""
    hlo_files = module_files(dump_dir, module, "after_optimizations.txt")
    assert hlo_files, (f"{module}: no optimized HLO dumped in {dump_dir}: "
                       f"{sorted(os.listdir(dump_dir))[:40]}")
    calls = [t for f in hlo_files for t in custom_call_targets(open(f).read())]
    ours = [t for t in calls if t.startswith("jax_tma_")]
    missing = set(targets) - set(ours)
    assert not missing, f"{module}: its optimized HLO has no custom call to {sorted(missing)}"
    foreign = sorted(t for t in calls if not t.startswith("jax_tma_"))
    if not gpu:
        return f"{len(ours)} jax_tma custom calls in the optimized HLO"
    converted = module_files(dump_dir, module, "thunk_sequence_after_thunk_passes.txt")
    if not converted:
        plain = module_files(dump_dir, module, "thunk_sequence.txt")
        raise AssertionError(
            f"{module}: XLA formed no command buffer: " + (
                f"its thunk passes changed nothing (only {plain} was dumped)" if plain else
                f"no thunk-sequence dump at all in {dump_dir} (does this XLA name it "
                f"otherwise?)"))
    assert len(converted) == len(hlo_files), (converted, hlo_files)
    per_module, others = len(ours) // len(hlo_files), len(foreign) // len(hlo_files)
    for f in converted:
        text = open(f).read()
        inside, outside = custom_calls_in_command_buffers(text)
        assert outside <= others and inside >= max(per_module, 1), (
            f"{module}: {inside} custom-call thunks inside command buffers and {outside} "
            f"outside, for {per_module} jax_tma custom calls and {others} others "
            f"({sorted(set(foreign))}) in the optimized HLO; "
            f"{os.path.basename(f)}:\n{text[:6000]}")
    return (f"{inside} custom-call thunks inside command buffers and {outside} outside, for "
            f"{per_module} jax_tma custom calls" + (f" and XLA's {sorted(set(foreign))}"
                                                    if foreign else ""))


# ---- what changes with the step --------------------------------------------

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def step_word(i, salt: int):
    """A 32-bit word of step `i`: (i * 0x9E3779B1) XOR salt, wrapping; `i` a
    traced int32 (a jnp uint32 results) or a Python int (a Python int)."""
    if isinstance(i, int):
        return ((i * 0x9E3779B1) & 0xFFFFFFFF) ^ salt
    return i.astype(jnp.uint32) * jnp.uint32(0x9E3779B1) ^ jnp.uint32(salt)


def _out_salt(k: int) -> int:
    return (0x27D4EB2F + k * 0x165667B1) & 0xFFFFFFFF


def xor_step(x, i, salt: int):
    """x with its bits XOR the step's word (cut to the element width): new
    data every step. jnp for a traced `i`, NumPy for a Python int."""
    if isinstance(i, int):
        u = _UINT[x.dtype.itemsize]
        word = np.array(step_word(i, salt) & ((1 << 8 * x.dtype.itemsize) - 1), u)
        return (x.view(u) ^ word).view(x.dtype)
    u = jnp.dtype(f"uint{8 * jnp.dtype(x.dtype).itemsize}")
    return lax.bitcast_convert_type(lax.bitcast_convert_type(x, u) ^ step_word(i, salt).astype(u),
                                    x.dtype)


def _as_uint(y):
    """An output as unsigned ints of its width (bool as uint8)."""
    if y.dtype == jnp.bool_:
        return y.astype(jnp.uint8)
    return lax.bitcast_convert_type(y, jnp.dtype(f"uint{8 * jnp.dtype(y.dtype).itemsize}"))


def _host_bits(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.uint8) if a.dtype == np.bool_ else a.view(_UINT[a.dtype.itemsize])


# ---- cases --------------------------------------------------------------------

@dataclasses.dataclass
class Built:
    """A case's loop on concrete devices. draw(rng): fresh NumPy operands;
    specs: their PartitionSpecs over `mesh` (None: one device); step(i,
    *operands): the step's outputs (jnp, i a traced int32); want(i,
    *operands): the same in NumPy."""

    draw: Callable
    step: Callable
    want: Callable
    mesh: Mesh | None = None
    specs: tuple | None = None


@dataclasses.dataclass(frozen=True)
class Case:
    """name: its module is jit_cmdbuf_<name>. paths: the CUDA paths it runs
    (its targets: jax_tma_<op> of each "op.path"). build(devices, big) ->
    Built; big: the GPU's sizes (the CPU run takes small ones)."""

    name: str
    paths: tuple[str, ...]
    build: Callable[[list, bool], Built]
    steps: int = 128

    @property
    def targets(self) -> tuple[str, ...]:
        return tuple(sorted({"jax_tma_" + p.split(".")[0] for p in self.paths}))


def _one(build_one):
    """A case on one device: build_one(big) -> Built."""
    return lambda devices, big: build_one(big)


def _copy_dynamic(big: bool) -> Built:
    # From copy.dynamic_bulk_min_bytes up, a TMA copy claims its chunks from a
    # work counter: the schedule that must reset itself for the next replay.
    n = (_ffi.rules()["copy.dynamic_bulk_min_bytes"] + 3 * 4096 + 48) // 4 if big else 70_000
    stride = 997

    def step(i, x):
        v = xor_step(x, i, 0x51ED270B)
        y = jax_tma.copy(v, method="tma")
        return jnp.sum(y != v, dtype=jnp.uint32), y[::stride]

    def want(i, x):  # x XOR a word, sampled: the sample XOR the word
        return np.uint32(0), xor_step(x[::stride], i, 0x51ED270B)

    return Built(lambda rng: (random_array(rng, (n,), np.uint32),), step, want)


def _copy_simt(big: bool) -> Built:
    def step(i, x):
        return (jax_tma.copy(xor_step(x, i, 0x2545F491), method="simt"),)

    return Built(lambda rng: (random_array(rng, (37, 211), np.float32),), step,
                 lambda i, x: (xor_step(x, i, 0x2545F491),))


def _window(method: str) -> Callable[[bool], Built]:
    """tma: a traced row start (its tensor map fills the rows outside x);
    simt: traced starts in both dims, strided, a fill."""
    if method == "tma":
        shape, box, strides, fill = (200, 64), (64, 48), (1, 1), 0

        def start(xp, i):
            return (i * 7) % 260 - 60, 8  # column 8: 32 B, a tensor map's alignment
    else:
        shape, box, strides, fill = (50, 37), (20, 21), (2, 1), -1.5

        def start(xp, i):
            return (i * 5) % 80 - 30, (i * 3) % 60 - 20

    def step(i, x):
        return (jax_tma.window(xor_step(x, i, 0x6C8E9CF5), start(jnp, i), box, strides=strides,
                               fill=fill, method=method),)

    def want(i, x):
        return (window_expect(xor_step(x, i, 0x6C8E9CF5), start(np, i), box, strides, fill),)

    return lambda big: Built(lambda rng: (random_array(rng, shape, np.float32),), step, want)


def _im2col(method: str) -> Callable[[bool], Built]:
    if method == "tma":  # 8 float32 channels: 32 B, a tensor map's alignment
        shape, kernel, strides, dilation = (2, 14, 13, 8), (3, 2), (2, 1), (1, 2)
        pads, order = ((1, 2), (0, 1)), "tap_major"
    else:
        shape, kernel, strides, dilation = (1, 6, 7, 5, 3), (2, 2, 2), (1, 2, 1), (1, 1, 2)
        pads, order = ((1, 0), (0, 1), (1, 1)), "channel_major"

    def step(i, x):
        return (jax_tma.im2col(xor_step(x, i, 0x1B873593), kernel, strides=strides, padding=pads,
                               dilation=dilation, order=order, method=method),)

    def want(i, x):
        return (im2col_reference(xor_step(x, i, 0x1B873593), kernel, strides, pads, dilation,
                                 order, fill=0),)

    return lambda big: Built(lambda rng: (random_array(rng, shape, np.float32),), step, want)


def _col2im(big: bool) -> Built:
    # int32 patches: the sums wrap, so every order gives the same bits
    # (the kernel adds in tap order anyway).
    shape, kernel, strides, dilation, pads = (2, 9, 10, 3), (3, 3), (1, 2), (1, 1), \
        ((1, 1), (2, 1))
    out = [(n + lo + hi - d * (k - 1) - 1) // s + 1
           for n, k, s, d, (lo, hi) in zip(shape[1:-1], kernel, strides, dilation, pads)]
    patches = (shape[0], *out, 9 * shape[-1])

    def step(i, p):
        return (jax_tma.col2im(xor_step(p, i, 0x68E31DA4), shape, kernel, strides=strides,
                               padding=pads, dilation=dilation),)

    def want(i, p):
        return (col2im_reference(xor_step(p, i, 0x68E31DA4), shape, kernel, strides, pads,
                                 dilation),)

    return Built(lambda rng: (random_array(rng, patches, np.int32),), step, want)


def _broadcast(method: str, cluster_size: int | None, dtype) -> Callable[[bool], Built]:
    shape = (48, 256 // np.dtype(dtype).itemsize)  # 256-byte rows: multicast slices align

    def step(i, x):
        return (jax_tma.broadcast(xor_step(x, i, 0x3C6EF372), 6, axis=1, method=method,
                                  cluster_size=cluster_size),)

    def want(i, x):
        return (broadcast_reference(xor_step(x, i, 0x3C6EF372), 6, 1),)

    return lambda big: Built(lambda rng: (random_array(rng, shape, dtype),), step, want)


def _gather(method: str, dtype, shape, count: int) -> Callable[[bool], Built]:
    """Indices that move with the step: negative ones (wrapping once) and
    ones past the end (fill) among them."""
    n = shape[0]

    def indices(xp, i, base):
        return (base + i * 11) % (n + 40) - 20

    def step(i, x, base):
        return (jax_tma.gather(xor_step(x, i, 0x7F4A7C15), indices(jnp, i, base), method=method),)

    def want(i, x, base):
        return (gather_reference(xor_step(x, i, 0x7F4A7C15), indices(np, i, base), 0,
                                 np.zeros(1, dtype)),)

    def draw(rng):
        return random_array(rng, shape, dtype), rng.integers(0, n, count).astype(np.int32)

    return lambda big: Built(draw, step, want)


def _scatter(method: str, dtype, shape, count: int, mode: str = "set") -> Callable[[bool], Built]:
    """set: unique rows that move with the step, the first 4 as negative
    indices (wrapping once), the next 4 past the end (dropped); add
    (deterministic, integers): duplicates in index order."""
    n = shape[0]

    def indices(xp, i, base):
        rows = (base + i * 5) % n
        if mode == "add":
            return rows
        first = xp.arange(count) < 4
        past = (xp.arange(count) >= 4) & (xp.arange(count) < 8)
        return xp.where(first, rows - n, xp.where(past, rows + n, rows)).astype(np.int32)

    def step(i, x, base, u):
        return (jax_tma.scatter(xor_step(x, i, 0x4F1BBCDC), indices(jnp, i, base),
                                xor_step(u, i, 0x94D049BB), mode=mode,
                                method="auto" if mode == "add" else method,
                                deterministic=mode == "add"),)

    def want(i, x, base, u):
        return (scatter_reference(xor_step(x, i, 0x4F1BBCDC), indices(np, i, base),
                                  xor_step(u, i, 0x94D049BB), 0, mode),)

    def draw(rng):
        base = (rng.integers(0, n, count) if mode == "add"
                else rng.permutation(n)[:count]).astype(np.int32)
        return (random_array(rng, shape, dtype), base,
                random_array(rng, (count,) + shape[1:], dtype))

    return lambda big: Built(draw, step, want)


def _geometries(rng, n: int, per: int, count: int, max_size: int):
    """`count` ragged exchanges among `n` devices: each index array stacked
    (count, n * n * per), and the operand's and output's rows per device,
    the same for every draw (one compilation)."""
    gs = [ragged_geometry(rng, n, per, max_size=max_size) for _ in range(count)]
    names = ("input_offsets", "send_sizes", "output_offsets", "recv_sizes")
    rows = n * per * (max_size + 1) + 3  # ragged_geometry's most: sizes, gaps, 2 more
    assert all(g["rows"] <= rows and g["out_rows"] <= rows for g in gs), gs
    return rows, [np.stack([g[k] for g in gs]) for k in names]


def _pick(table, i):
    """Row i % len(table) of a stacked index table, as a sum (no slice of
    the table meets the custom call)."""
    pick = jnp.arange(table.shape[0]) == i % table.shape[0]
    return jnp.sum(jnp.where(pick[:, None], table, 0), axis=0, dtype=table.dtype)


def _collective(devices, body, want, specs, draw) -> Built:
    """A step that runs `body(i, *blocks)` in shard_map over `devices`
    (axis "i"), the operands split as `specs`, every output along "i"."""
    mesh = Mesh(np.array(devices), ("i",))

    def step(i, *args):
        out = jax.shard_map(body, mesh=mesh, in_specs=(P(),) + specs, out_specs=P("i"))(i, *args)
        return out if isinstance(out, tuple) else (out,)

    return Built(draw, step, want, mesh, specs)


def _ppermute(method: str, direction: str, perm=None):
    def build(devices, big):
        n = len(devices)
        p = perm or [(d, (d + 1) % n) for d in range(n)]
        rows = 2048 if big else 64

        def body(i, b):
            return jax_tma.ppermute(xor_step(b, i, 0x5851F42D), "i", p, method=method,
                                    direction=direction)

        def want(i, x):
            return (ppermute_reference(xor_step(x, i, 0x5851F42D), n, p),)

        return _collective(devices, body, want, (P("i"),),
                           lambda rng: (random_array(rng, (n * rows, 24), np.float32),))
    return build


def _all_to_all(rows: int):
    """An exchange of blocks of n * rows rows of 160 B a device (96 rows on
    the CPU): up to the inbox's limit (_ffi._ext.exchange_inbox_max_bytes),
    through the inbox."""
    def build(devices, big) -> Built:
        n, rows_here = len(devices), rows if big else 96

        def body(i, b):
            return jax_tma.all_to_all(xor_step(b, i, 0x14057B7E), "i", 0, 0, tiled=True)

        def want(i, x):
            return (all_to_all_reference(xor_step(x, i, 0x14057B7E), n, 0, 0, True),)

        return _collective(devices, body, want, (P("i"),),
                           lambda rng: (random_array(rng, (n * n * rows_here, 40), np.float32),))
    return build


def _ragged(max_size: int, width: int):
    """Four exchanges of other slice sizes and places, one per step in turn:
    the sizes the kernels read on the device change every step. Slices of
    up to `max_size` rows of `width` float32 (6 rows of 16 on the CPU): up
    to the inbox's limit (_ffi._ext.exchange_inbox_max_bytes) of operand,
    through the inbox."""
    def build(devices, big) -> Built:
        return _ragged_built(devices, max_size if big else 6, width if big else 16)
    return build


def _ragged_built(devices, max_size: int, width: int) -> Built:
    n = len(devices)

    def draw(rng):
        rows, tables = _geometries(rng, n, 2, 4, max_size)
        return (random_array(rng, (n * rows, width), np.float32),
                random_array(rng, (n * rows, width), np.float32), *tables)

    def body(i, operand, output, *tables):
        index = [_pick(t, i) for t in tables]
        return jax_tma.ragged_all_to_all(xor_step(operand, i, 0x2F8A1C35),
                                         xor_step(output, i, 0x0B4C1A2D), *index, axis_name="i")

    def want(i, operand, output, *tables):
        index = [t[i % len(t)] for t in tables]
        return (ragged_reference(xor_step(operand, i, 0x2F8A1C35),
                                 xor_step(output, i, 0x0B4C1A2D), *index, n),)

    return _collective(devices, body, want, (P("i"), P("i")) + (P(None, "i"),) * 4, draw)


def _home_sums(per: int, width: int):
    """moe_combine's summing exchange alone (_home_sums_p, past the size
    rule that picks it in moe_combine): each device's n * per pair rows of
    `width` float32 (16 on the CPU), each the weighted sum of two rows of
    y that random slots name (-1 among them), y new bits every step (NaNs,
    subnormals: both platforms keep subnormals and quiet NaNs alike); the
    rows of position p's slice land at rows me * per of p's result."""
    def build(devices, big) -> Built:
        n, w = len(devices), width if big else 16
        y_rows = 2 * per

        def draw(rng):
            return (random_array(rng, (n * y_rows, w), np.float32),
                    rng.standard_normal((n * n * per, 2)).astype(np.float32),
                    rng.integers(-1, y_rows, (n * n * per, 2)).astype(np.int32))

        def body(i, y, weights, slots):
            starts = jnp.arange(n, dtype=np.int32) * per
            sizes = jnp.full(n, per, np.int32)
            at = jnp.full(n, lax.axis_index("i") * per, np.int32)
            return _home_sums_p.bind(xor_step(y, i, 0x3C6EF372), weights, slots, starts, sizes,
                                     at, sizes, rows=n * per, axis_name=("i",), size=n,
                                     site="command_buffers", ctas=0)

        def want(i, y, weights, slots):
            y = xor_step(y, i, 0x3C6EF372).reshape(n, y_rows, w)
            sums = [combine_sums(y[d], weights.reshape(n, -1, 2)[d], slots.reshape(n, -1, 2)[d])
                    .reshape(n, per, w) for d in range(n)]
            # position p's result: row block s is what position s sent it
            return (np.stack([np.concatenate([sums[s][p] for s in range(n)])
                              for p in range(n)]).reshape(n * n * per, w),)

        return _collective(devices, body, want, (P("i"),) * 3, draw)
    return build


def _moe(capacity: int | None):
    """moe_dispatch then moe_combine of its rows, 200 steps. Each token's
    row: random bfloat16 bits (moved bit for bit), then small integers that
    combine sums exactly in any order (times 1 to 3 by the step); expert
    ids shifted by the step (masked choices stay masked); positive integer
    weights, so every kept sum is exact and non-zero."""
    def build(devices, big):
        n, tokens, k, experts, width = len(devices), 32, 2, 8, 32
        rows = n * tokens * k if capacity is None else experts // n * capacity

        def draw(rng):
            bits = random_array(rng, (n * tokens, width), jnp.bfloat16)
            values = (rng.integers(1, 9, (n * tokens, width)) *
                      rng.choice([-1, 1], (n * tokens, width))).astype(jnp.bfloat16)
            ids = rng.integers(-1, experts, (n * tokens, k)).astype(np.int32)
            weights = rng.integers(1, 4, (n * tokens, k)).astype(np.float32)
            return bits, values, ids, weights

        def inputs(xp, i, bits, values, ids):
            # Joined as bits: XLA:CPU may convert a bfloat16 concatenate to
            # float32 and back, which quiets NaNs (jax 0.10.2).
            as16 = (lambda a: a.view(np.uint16)) if xp is np else \
                (lambda a: lax.bitcast_convert_type(a, jnp.uint16))
            scaled = values * xp.asarray(1 + i % 3).astype(values.dtype)
            x = xp.concatenate([as16(xor_step(bits, i, 0x61C88647)), as16(scaled)], axis=1)
            x = x.view(bits.dtype) if xp is np else lax.bitcast_convert_type(x, bits.dtype)
            return x, xp.where(ids >= 0, (ids + i) % experts, -1).astype(np.int32)

        def body(i, bits, values, ids, weights):
            x, ids = inputs(jnp, i, bits, values, ids)
            recv, plan = jax_tma.moe_dispatch(x, ids, num_experts=experts, axis_name="i",
                                              capacity=capacity)
            out = jax_tma.moe_combine(recv[:, width:], plan, weights)
            # Rows past the received total are unspecified: zero them, as
            # bits (XLA:CPU's select of floats may quiet a NaN, jax 0.10.2).
            kept = jnp.arange(rows)[:, None] < jnp.sum(plan.group_sizes)
            recv = jnp.where(kept, lax.bitcast_convert_type(recv, jnp.uint16), 0)
            return recv, plan.group_sizes, plan.dropped, out

        def want(i, bits, values, ids, weights):
            x, ids = inputs(np, i, bits, values, ids)
            recv, sizes, dropped, placed = moe_dispatch_reference(x, ids, n, experts, capacity)
            blocks = np.zeros((n, rows, 2 * width), x.dtype)
            for d, r in enumerate(recv):
                blocks[d, :len(r)] = r
            coef = np.zeros((n * tokens, 1))
            for (s, t, j) in placed:
                coef[s * tokens + t] += weights[s * tokens + t, j]
            # +0.0 for a token with no kept choice (not x * 0, -0.0 for x < 0)
            out = np.where(coef > 0, x[:, width:].astype(np.float64) * coef, 0.0)
            out = out.astype(jnp.bfloat16)
            return (blocks.reshape(n * rows, 2 * width).view(np.uint16), sizes.reshape(-1),
                    dropped, out)

        return _collective(devices, body, want, (P("i"),) * 4, draw)
    return build


# moe_dispatch with moe_combine at _moe's sizes: the plan's kernels, its
# counts' and slots' exchanges (inboxes), the pull; combine's exchanges home.
_MOE_PATHS = ("moe_dispatch_counts.simt", "all_to_all.inbox", "moe_dispatch_plan.simt",
              "ragged_all_to_all.inbox", "moe_dispatch.peer")

CASES: dict[str, tuple[Case, ...]] = {
    "local": (
        Case("copy_dynamic", ("copy.tma",), _one(_copy_dynamic)),
        Case("copy_simt", ("copy.simt",), _one(_copy_simt)),
        Case("window_tiled", ("window.tiled",), _one(_window("tma"))),
        Case("window_simt", ("window.simt",), _one(_window("simt"))),
        Case("im2col_tma", ("im2col.tma",), _one(_im2col("tma"))),
        Case("im2col_simt", ("im2col.simt",), _one(_im2col("simt"))),
        Case("col2im", ("im2col.simt",), _one(_col2im)),
        Case("broadcast_store", ("broadcast.store",),
             _one(_broadcast("store", None, np.float32))),
        Case("broadcast_multicast", ("broadcast.multicast",),
             _one(_broadcast("multicast", 4, jnp.bfloat16))),
        Case("broadcast_dsmem", ("broadcast.dsmem",),
             _one(_broadcast("dsmem", 8, jnp.bfloat16))),
        Case("broadcast_simt", ("broadcast.simt",), _one(_broadcast("simt", None, np.float32))),
        Case("gather_tma", ("gather.tma",), _one(_gather("tma", np.float32, (300, 64), 40))),
        Case("gather_simt", ("gather.simt",),
             _one(_gather("simt", jnp.bfloat16, (500, 24), 64))),
        Case("scatter_tma", ("scatter.tma",), _one(_scatter("tma", np.float32, (256, 32), 48))),
        Case("scatter_simt", ("scatter.simt",),
             _one(_scatter("simt", jnp.bfloat16, (200, 20), 40))),
        Case("scatter_ordered", ("scatter.ordered",),
             _one(_scatter("auto", np.int32, (64, 16), 100, mode="add"))),
        # Over a one-device mesh: each op's peer path within the GPU.
        Case("ppermute_self_tma", ("ppermute.tma",), _ppermute("tma", "pull")),
        Case("ppermute_self_simt", ("ppermute.simt",), _ppermute("simt", "push")),
        Case("all_to_all_self", ("all_to_all.inbox",), _all_to_all(96)),
        Case("ragged_all_to_all_self", ("ragged_all_to_all.inbox",), _ragged(48, 16)),
        Case("moe_combine_sums_self", ("moe_combine.peer",), _home_sums(24, 4096), steps=200),
        Case("moe_self", _MOE_PATHS, _moe(None), steps=200),
    ),
    "multi": (
        Case("ppermute_pull", ("ppermute.tma",), _ppermute("tma", "pull")),
        Case("ppermute_push", ("ppermute.tma",), _ppermute("tma", "push")),
        Case("ppermute_partial_simt", ("ppermute.simt",), _ppermute("simt", "pull", [(0, 1)])),
        Case("all_to_all", ("all_to_all.inbox",), _all_to_all(96)),
        Case("all_to_all_large", ("all_to_all.peer",), _all_to_all(16_000)),
        Case("ragged_all_to_all", ("ragged_all_to_all.inbox",), _ragged(48, 16)),
        Case("ragged_all_to_all_large", ("ragged_all_to_all.peer",), _ragged(100, 4096)),
        Case("moe_combine_sums", ("moe_combine.peer",), _home_sums(24, 4096), steps=200),
        Case("moe_dropless", _MOE_PATHS, _moe(None), steps=200),
        Case("moe_capacity", _MOE_PATHS, _moe(12), steps=200),
    ),
}
DEVICES = {"local": 1, "multi": 2}


# ---- running a case -------------------------------------------------------------

def loop(case: Case, built: Built):
    """The jitted loop of case.steps steps: every output of every step,
    stacked, as unsigned ints XOR a word of the step and the output (a real
    op between the custom call and the stack, which no slice fusion takes
    for an alias)."""
    def run(*operands):
        def body(_, i):
            outs = (_as_uint(y) for y in built.step(i, *operands))
            return None, tuple(y ^ step_word(i, _out_salt(k)).astype(y.dtype)
                               for k, y in enumerate(outs))

        return lax.scan(body, None, jnp.arange(case.steps, dtype=jnp.int32))[1]

    run.__name__ = run.__qualname__ = MODULE_PREFIX + case.name
    return jax.jit(run)


def compare(case: Case, execution: int, got, want_steps) -> None:
    """Every step's outputs, bit for bit."""
    for k, stacked in enumerate(got):
        stacked = np.asarray(stacked)
        width = stacked.dtype.itemsize
        words = np.array([step_word(i, _out_salt(k)) & ((1 << 8 * width) - 1)
                          for i in range(case.steps)], stacked.dtype)
        bits = stacked ^ words.reshape((-1,) + (1,) * (stacked.ndim - 1))
        for i, want in enumerate(want_steps):
            w = _host_bits(want[k])
            a = bits[i]
            assert a.dtype == w.dtype and a.shape == w.shape, (
                f"{case.name}: output {k} of step {i} is {a.dtype}{list(a.shape)}, NumPy's "
                f"{w.dtype}{list(w.shape)}")
            if not np.array_equal(a, w):
                bad = np.flatnonzero(a.reshape(-1) != w.reshape(-1))
                raise AssertionError(
                    f"{case.name}: execution {execution}, step {i} of {case.steps}: output {k} "
                    f"has {bad.size} of {a.size} words wrong; first at flat index {bad[0]}: "
                    f"got {a.reshape(-1)[bad[0]]:#x}, want {w.reshape(-1)[bad[0]]:#x}")


def check_paths(case: Case, ran: dict[str, int], gpu: bool, executions: int) -> None:
    """GPU: each of the case's paths ran, fewer times than one loop has
    steps (the other steps replayed the graph), and no other path of its
    ops. CPU: each op's CPU handler ran at least once a step."""
    ops = {p.split(".")[0] for p in case.paths}
    if gpu:
        for p in case.paths:
            assert 0 < ran.get(p, 0) < case.steps, (
                f"{case.name}: {p} ran {ran.get(p, 0)} times in {executions} loops of "
                f"{case.steps} steps (want 1 to {case.steps - 1}: a handler call for each "
                f"recording, none for a replay); the handlers ran {ran}")
        others = {k: v for k, v in ran.items() if k.split(".")[0] in ops and k not in case.paths}
        assert not others, f"{case.name}: expected {case.paths} alone, the handlers ran {ran}"
    else:
        for op in ops:
            assert ran.get(f"{op}.cpu", 0) >= executions * case.steps, (
                f"{case.name}: {op}.cpu ran {ran.get(f'{op}.cpu', 0)} times in {executions} "
                f"loops of {case.steps} steps; the handlers ran {ran}")


def run_case(case: Case, devices, rng, gpu: bool, dump_dir: str) -> str:
    built = case.build(devices, gpu)
    f = loop(case, built)
    start = time.monotonic()
    with paths_ran() as ran:
        for execution in range(EXECUTIONS):
            host = built.draw(rng)
            if built.mesh is None:
                args = tuple(jax.device_put(a, devices[0]) for a in host)
            else:
                args = tuple(jax.device_put(a, NamedSharding(built.mesh, s))
                             for a, s in zip(host, built.specs))
            got = jax.block_until_ready(f(*args))
            compare(case, execution, got, [built.want(i, *host) for i in range(case.steps)])
    check_paths(case, ran, gpu, EXECUTIONS)
    dump = check_command_buffers(dump_dir, f"jit_{MODULE_PREFIX}{case.name}", case.targets,
                                 gpu=gpu)
    return (f"{EXECUTIONS} x {case.steps} steps bit-exact, handler calls {ran}, {dump}, "
            f"{time.monotonic() - start:.1f} s")


def main(argv) -> None:
    group, platform, seed, dump_dir = argv[1], argv[2], int(argv[3]), argv[4]
    # Every module compiled here, so that XLA dumps it (a persistent
    # compilation cache's hit would not).
    jax.config.update("jax_enable_compilation_cache", False)
    cases = CASES[group]
    devices = jax.devices()[:DEVICES[group]]
    assert len(devices) == DEVICES[group], f"group {group} needs {DEVICES[group]} devices: " \
                                           f"{jax.devices()}"
    print(f"cases: {' '.join(c.name for c in cases)}", flush=True)
    print(f"devices: {devices}; jax {jax.__version__}; XLA_FLAGS={os.environ['XLA_FLAGS']}",
          flush=True)
    rng = np.random.default_rng(seed)
    for case in cases:
        print(f"case {case.name}: ok, {run_case(case, devices, rng, platform == 'gpu', dump_dir)}",
              flush=True)
    print("command buffer worker: ok", flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.exit(1)
