"""The gather/scatter benchmark: jax_tma.gather and jax_tma.scatter against
the XLA formulations a user would write (plain, and hinted as a careful user
would), the simplest Pallas kernel (pages, rows and the page set) and the
copy ceiling, for the cases of issue 18's target table at the
dtypes their use cases have (bf16 pages and K/V pools, bf16 and f32 rows and
scatter-adds, fp8 pages) with uint32 as the control dtype, a chain of tiny
gathers against a minimal FFI kernel, small gathers (256 KiB to 32 MiB moved,
where a kernel's fixed cost shows), and a sweep of slab sizes (128 B to
64 KiB) for the README's plot. `bench_wheel` times one case again, for the
run against the wheel.

    python benchmarks/run.py gather [--out-dir DIR]
    python benchmarks/run.py wheel --out-dir DIR   # one case, against another install
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma
import pallas_kernels
from harness import MIB, Benchmark, Session, rotate, rotate_all
from tables import size_text, target_met

OP = "gather"
WHEEL_OP = "wheel"
BYTES = ("read + write, indices not counted: gather reads and writes every gathered slab; "
         "scatter set reads the updates and writes their slabs; scatter add also reads the "
         "slabs it adds to (3 × the updates); the decode step adds its append (set) to its "
         "gathers")
KIB = 1024
METHODS = ("auto", "tma", "simt")
# The dtype of the use cases (a paged KV cache, an embedding table, a MoE
# activation buffer): every method of jax_tma is timed there. XLA's kernels
# change with the element type and jax_tma's move bytes, so the other dtypes
# (f32 rows, fp8 pages, and uint32, the control) time `auto` against XLA.
USE_DTYPE = "bfloat16"
FULL = {
    # (table rows, slab bytes, slabs gathered) of the pages case and the row
    # cases, and their dtypes (the first is the use case's)
    "pages": (32768, 32 * KIB, 8192), "page_dtypes": (USE_DTYPE, "float8_e4m3fn", "uint32"),
    "rows": [(1 << 20, 512, 262144), (4 << 20, 128, 1 << 20)],
    "row_dtypes": (USE_DTYPE, "float32", "uint32"),
    # (table rows, row elements, dtype, updates) of the row scatter-adds
    "adds": [(262144, 256, "float32", 65536), (262144, 256, USE_DTYPE, 65536)],
    # batch, pages per sequence, tokens per page, heads, head dim (bf16 K and V pools)
    "decode": (64, 32, 16, 8, 128),
    "chain_ops": 100, "chain_bytes": 4 * KIB,
    # Each sweep case gathers `sweep_gathered` bytes of random distinct slabs
    # of a `sweep_table` table (bf16), more than L2 holds (50 MiB on H100).
    "sweep_slabs": [128, 512, 2 * KIB, 8 * KIB, 32 * KIB, 64 * KIB], "sweep_table": 256 * MIB,
    "sweep_gathered": 128 * MIB,
    # (table rows, slab bytes, slabs gathered, dtypes) of the small gathers:
    # the sizes where a kernel's fixed cost shows (a decode step's append
    # moves 64 rows of 2 KiB), for auto's choice of path there.
    "small": [(65536, 2 * KIB, 64, (USE_DTYPE, "uint32")),
              (65536, 2 * KIB, 1024, (USE_DTYPE, "uint32")),
              (65536, 2 * KIB, 16384, (USE_DTYPE,))],
    # Calls smaller than L2 rotate through inputs (index sets, ceiling
    # inputs) of at least this many bytes together, so that no call finds
    # its data in L2 (50 MiB on H100), as the copy benchmark's inputs do.
    "rotate_bytes": 64 * MIB, "max_inputs": 1024,
    "rounds": 10, "sweep_rounds": 6, "chain_rounds": 30}
SMOKE = {"pages": (64, 1 * KIB, 16), "page_dtypes": FULL["page_dtypes"],
         "rows": [(256, 512, 64)], "row_dtypes": FULL["row_dtypes"],
         "adds": [(256, 256, "float32", 64), (256, 256, USE_DTYPE, 64)],
         "decode": (4, 2, 4, 2, 8), "chain_ops": 4, "chain_bytes": 4 * KIB,
         "sweep_slabs": [128, 1024], "sweep_table": 64 * KIB, "sweep_gathered": 16 * KIB,
         "small": [(64, 2 * KIB, 4, (USE_DTYPE, "uint32")), (64, 2 * KIB, 16, (USE_DTYPE,))],
         "rotate_bytes": 64 * KIB, "max_inputs": 8,
         "rounds": 2, "sweep_rounds": 2, "chain_rounds": 2}
# What each kind of case times jax_tma against (the result records it). The
# gathered and set indices are distinct; the added ones repeat, so no hint
# applies there; no case's indices are sorted.
XLA = {
    "gather": {"xla": "jnp.take(x, i, axis=0)",
               "xla_hinted": "x.at[i].get(mode='promise_in_bounds', unique_indices=True)"},
    "scatter set": {"xla": "x.at[i].set(u)", "xla_hinted": "x.at[i].set(u, unique_indices=True)"},
    "scatter add": {"xla": "x.at[i].add(u)"},
    "decode step": {"xla": "pool.at[slots].set(token); jnp.take(pool, pages, axis=0)",
                    "xla_hinted": "pool.at[slots].set(token, unique_indices=True); "
                                  "pool.at[pages].get(mode='promise_in_bounds', "
                                  "unique_indices=True)"},
}
# The comparators of each kind of case that are no XLA formulation: the
# simplest Pallas kernel (pallas_kernels.py), timed on the pages, rows and the
# page set.
PALLAS = "pallas"
# Issue 18's targets, judged at the dtype of the use case (and the adds at
# f32 too): comparator time ÷ auto's time must reach the ratio by busy time
# and by span alike (tables.target_met). Keyed by (case key, dtype).
TARGETS = {("pages", USE_DTYPE): {"memcpy": 0.95, "xla": 1.15},
           ("set", USE_DTYPE): {"memcpy": 0.90, "xla": 5.0, "xla_hinted": 1.05},
           ("rows 512", USE_DTYPE): {"memcpy": 0.90},
           ("rows 128", USE_DTYPE): {"memcpy": 0.85},
           ("add", "float32"): {"xla": 1.2}, ("add", USE_DTYPE): {"xla": 1.2},
           ("decode", USE_DTYPE): {"xla_hinted": 1.15}}
CHAIN_TARGET_US = 0.3  # gap per call over the minimal FFI kernel, by span


def _take(x, i):
    return jnp.take(x, i, axis=0)


def _take_hinted(x, i):
    return x.at[i].get(mode="promise_in_bounds", unique_indices=True)


def _set(x, i, u):
    return x.at[i].set(u)


def _set_hinted(x, i, u):
    return x.at[i].set(u, unique_indices=True)


_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


def _bits(x: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, _UINT[x.dtype.itemsize])


def _unbits(b: jax.Array, dtype: Any) -> jax.Array:
    return jax.lax.bitcast_convert_type(b, dtype)


# The reference formulations every case is checked against, bit for bit.
# Gathers and sets move the elements' bits (unsigned integers of their
# width), as jax_tma does, so that the reference holds for every dtype
# (XLA's own float8 kernels included or not); adds add in the dtype.
@jax.jit
def _gather_ref(x, i):
    return _unbits(jnp.take(_bits(x), i, axis=0, mode="fill", fill_value=0), x.dtype)


@jax.jit
def _set_ref(x, i, u):
    return _unbits(_bits(x).at[i].set(_bits(u), mode="drop"), x.dtype)


_ADD_REF = jax.jit(lambda x, i, u: x.at[i].add(u, mode="drop"))


def _finite(key: jax.Array, shape: tuple[int, ...], dtype: Any) -> jax.Array:
    """Random bits of `dtype`; a float whose exponent is all ones (inf, NaN,
    and e4m3fn's top binade) has its exponent's top bit cleared, so that every
    value is finite and the XLA formulations, whose float kernels may quiet a
    NaN, move the same bits as the reference."""
    dtype = jnp.dtype(dtype)
    width = _UINT[dtype.itemsize]
    bits = jax.random.bits(key, shape, width)
    if jnp.issubdtype(dtype, jnp.floating):
        info = jnp.finfo(dtype)
        exp = np.asarray(((1 << int(info.nexp)) - 1) << int(info.nmant), width)
        keep = np.asarray(~(1 << (int(info.nexp) - 1 + int(info.nmant))) & (
            (1 << (8 * dtype.itemsize)) - 1), width)
        bits = jnp.where((bits & exp) == exp, bits & keep, bits)
    return _unbits(bits, dtype)


class _Donated:
    """A case whose jitted `fn` donates its first argument (the state) and
    gets the previous call's output as its next state (the first element of
    the output where `split`), so that every call updates the state in place
    as a program that donates its table does; the state starts as a copy of
    `state`."""

    def __init__(self, fn: Callable[..., Any], state: Any, args: tuple, split: bool = False):
        self.fn = jax.jit(fn, donate_argnums=0)
        self.state = jax.tree.map(jnp.copy, state)
        self.args, self.split = args, split

    def __call__(self) -> Any:
        out = self.fn(self.state, *self.args)
        self.state = out[0] if self.split else out
        return out


def _ceiling(s: Session, p: dict[str, Any], case: str, nbytes: int,
             key: jax.Array) -> tuple[Callable, int]:
    """The copy ceiling of a case that moves `nbytes`: the reference memcpy
    of nbytes / 2 (it too reads and writes nbytes), rotated through inputs of
    rotate_bytes together where one is smaller, checked first; and the
    number of inputs."""
    copied = max(16, nbytes // 2 // 16 * 16)
    count = max(1, min(p["max_inputs"], p["rotate_bytes"] // copied))
    inputs = [(jax.random.bits(k, (copied // 4,), jnp.uint32),)
              for k in jax.random.split(key, count)]
    s.check(f"{case}: memcpy ceiling", s.refs.memcpy(inputs[0][0]), inputs[0][0])
    return rotate(s.refs.memcpy, inputs), count


def _row(s: Session, p: dict[str, Any], rounds: int, key: str, dtype: str, case: str,
         kind: str, nbytes: int, checks: dict[str, Callable[[], Any]],
         timed: dict[str, Callable[[], Any]], xla: Sequence[str], want: Any,
         inputs: int = 1) -> dict[str, Any]:
    """Checks each case (`checks`: zero-argument calls) against `want`, then
    times the `timed` calls of the same cases interleaved with the copy
    ceiling. The comparators (`xla`: the XLA formulations, and the Pallas
    kernel where there is one) that fail for this dtype (XLA rejects it,
    Pallas's lowering does) are recorded and left out. `inputs`: the index
    sets the timed calls rotate through."""
    rejects = {}
    for name, fn in checks.items():
        if name not in xla:
            s.check(f"{case}: {name}", fn(), want)
            continue
        try:
            got = jax.block_until_ready(fn())
        except Exception as e:  # noqa: BLE001  (XLA's own rejection, recorded)
            rejects[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300]}"
            s.log(f"gather: {case}: {name} fails: {rejects[name]}")
            continue
        s.check(f"{case}: {name}", got, want, comparator=True)
    timed = {k: v for k, v in timed.items() if k not in rejects}
    memcpy, ceiling_inputs = _ceiling(s, p, case, nbytes,
                                      jax.random.key(nbytes % (1 << 30)))
    # Fewer calls a wall-clock sample where so many outputs would crowd memory.
    t = s.time({**timed, "memcpy": memcpy}, rounds, rep=2,
               wall_calls=max(2, min(20, (8 << 30) // max(nbytes, 1))))
    times = t["cases"]
    ours = [k for k in timed if k not in xla]
    comps = [k for k in times if k not in ours]

    def ratios(clock):
        return {m: {c: times[c][clock] / times[m][clock] for c in comps
                    if clock in times[c] and clock in times[m]} for m in ours}

    row = {"case": case, "key": key, "kind": kind, "dtype": dtype, "bytes": nbytes,
           "inputs": inputs, "ceiling_inputs": ceiling_inputs, "protocol": t["protocol"],
           "times": times,
           "busy_tbps": {k: nbytes / v["busy_us"] / 1e6 for k, v in times.items()},
           "span_tbps": {k: nbytes / v["span_us"] / 1e6 for k, v in times.items()},
           "vs": ratios("busy_us"), "vs_span": ratios("span_us"), "vs_wall": ratios("wall_us"),
           "xla_rejects": rejects}
    targets = {c: r for c, r in TARGETS.get((key, dtype), {}).items() if c in times}
    if targets:
        row["targets"] = targets
        row["targets_met"] = {c: target_met(row, c, r) for c, r in targets.items()}
    s.log(f"gather: {case}: " + ", ".join(
        f"{k} {v:.3f} TB/s" for k, v in row["busy_tbps"].items()))
    return row


def _table(key: jax.Array, rows: int, slab: int, dtype: str) -> jax.Array:
    """A table of `rows` random finite slabs of `slab` bytes of `dtype`."""
    return _finite(key, (rows, slab // jnp.dtype(dtype).itemsize), dtype)


def _index_sets(key: jax.Array, rows: int, count: int, slab: int,
                p: dict[str, Any]) -> list[jax.Array]:
    """Sets of `count` distinct random int32 indices into `rows` rows, as
    many as make rotate_bytes of slabs together (one where a set does; at
    most max_inputs), no row in two sets: a call that takes the next set
    reads rows that no call has read since L2 last turned over."""
    perm = jax.random.permutation(key, rows).astype(jnp.int32)
    n = max(1, min(p["max_inputs"], rows // count, -(-p["rotate_bytes"] // (count * slab))))
    return [perm[k * count:(k + 1) * count] for k in range(n)]


def _gather_row(s: Session, p: dict[str, Any], rounds: int, key: str, table: jax.Array,
                idx_sets: list[jax.Array], case: str, methods: Sequence[str] = ("auto",),
                pallas: bool = False) -> dict[str, Any]:
    """A gather case: `methods` of jax_tma, the XLA formulations and, with
    `pallas`, the Pallas kernel."""
    fns = {m: jax.jit(functools.partial(jax_tma.gather, method=m)) for m in methods}
    fns.update(xla=jax.jit(_take), xla_hinted=jax.jit(_take_hinted))
    if pallas:
        fns[PALLAS] = jax.jit(pallas_kernels.gather)
    first = idx_sets[0]
    checks = {name: functools.partial(fn, table, first) for name, fn in fns.items()}
    timed = rotate_all(fns, [(table, i) for i in idx_sets])
    nbytes = 2 * first.size * table.shape[1] * table.dtype.itemsize
    return _row(s, p, rounds, key, table.dtype.name, case, "gather", nbytes, checks, timed,
                ("xla", "xla_hinted", PALLAS), _gather_ref(table, first), inputs=len(idx_sets))


def _methods(dtype: str) -> tuple[str, ...]:
    return METHODS if dtype == USE_DTYPE else ("auto",)


def _pages(s: Session, p: dict[str, Any], key: jax.Array, dtype: str) -> list[dict[str, Any]]:
    """The page gather at `dtype` and the in-place page scatter into its
    table (its indices, as many updates)."""
    n_rows, slab, count = p["pages"]
    table = _table(jax.random.fold_in(key, 0), n_rows, slab, dtype)
    idx = _index_sets(jax.random.fold_in(key, 1), n_rows, count, slab, p)[0]
    out = [_gather_row(s, p, p["rounds"], "pages", table, [idx],
                       f"gather {count:,} random {dtype} pages of {size_text(slab)} of a "
                       f"{size_text(n_rows * slab)} table", _methods(dtype), pallas=True)]
    upd = _table(jax.random.fold_in(key, 2), count, slab, dtype)
    args = (idx, upd)
    cases = {m: _Donated(functools.partial(jax_tma.scatter, method=m), table, args)
             for m in _methods(dtype)}
    cases.update(xla=_Donated(_set, table, args), xla_hinted=_Donated(_set_hinted, table, args))
    cases[PALLAS] = _Donated(pallas_kernels.scatter, table, args)
    out.append(_row(s, p, p["rounds"], "set", dtype,
                    f"scatter set of those {count:,} {dtype} pages in place (table donated)",
                    "scatter set", 2 * upd.size * upd.dtype.itemsize, cases, cases,
                    ("xla", "xla_hinted", PALLAS), _set_ref(table, *args)))
    return out


def _rows(s: Session, p: dict[str, Any], key: jax.Array, dtype: str) -> list[dict[str, Any]]:
    out = []
    for n_rows, slab, count in p["rows"]:
        k = jax.random.fold_in(key, slab)
        table = _table(k, n_rows, slab, dtype)
        idx = _index_sets(jax.random.fold_in(k, 1), n_rows, count, slab, p)
        out.append(_gather_row(s, p, p["rounds"], f"rows {slab}", table, idx,
                               f"gather {count:,} random {dtype} rows of {size_text(slab)} of "
                               f"{n_rows:,}", _methods(dtype), pallas=True))
        del table, idx
    return out


def _small_ints(key: jax.Array, shape: tuple[int, ...], dtype: str) -> jax.Array:
    """Integers in [-8, 8): with k updates of a row every partial sum is an
    integer of magnitude at most 8 (k + 1), exact even in bf16 up to k = 31
    (random rows get a handful), so float adds in any order compare bit for
    bit."""
    return jax.random.randint(key, shape, -8, 8).astype(dtype)


def _adds(s: Session, p: dict[str, Any], key: jax.Array) -> list[dict[str, Any]]:
    """Row scatter-adds with repeated indices (random rows, as in a
    mixture-of-experts combine or an embedding gradient), in place."""
    out = []
    for n_rows, width, dtype, count in p["adds"]:
        k = jax.random.fold_in(key, len(out))
        table = _small_ints(k, (n_rows, width), dtype)
        idx = jax.random.randint(jax.random.fold_in(k, 1), (count,), 0, n_rows, jnp.int32)
        upd = _small_ints(jax.random.fold_in(k, 2), (count, width), dtype)
        args = (idx, upd)
        add = functools.partial(jax_tma.scatter, mode="add")
        cases = {m: _Donated(functools.partial(add, method=m), table, args) for m in METHODS}
        cases["deterministic"] = _Donated(functools.partial(add, deterministic=True), table, args)
        cases["xla"] = _Donated(lambda x, i, u: x.at[i].add(u), table, args)
        slab = width * jnp.dtype(dtype).itemsize
        out.append(_row(s, p, p["rounds"], "add", dtype,
                        f"scatter add of {count:,} {dtype} rows of {size_text(slab)} into "
                        f"{n_rows:,} (in place)", "scatter add", 3 * count * slab, cases, cases,
                        ("xla",), _ADD_REF(table, *args)))
    return out


def _decode_step(append: Callable[..., jax.Array], take: Callable[..., jax.Array],
                tokens: int) -> Callable[..., Any]:
    """A paged decode step over K and V pools held as token rows (pages of
    `tokens` rows): append one token per sequence (`append(pool, slots,
    token)`), then gather every sequence's pages (`take(pages, table)`),
    a call per pool. The pools stay rows: XLA copies a donated pool that
    jax_tma.scatter updates through a reshape (it does on the CPU)."""
    def step(pools, slots, table, new):
        pools = tuple(append(pool, slots, token) for pool, token in zip(pools, new))
        return pools, tuple(take(_as_pages(pool, tokens), table) for pool in pools)
    return step


def _as_pages(pool: jax.Array, tokens: int) -> jax.Array:
    return pool.reshape(-1, tokens, *pool.shape[1:])


def _decode_step_tables(tokens: int) -> Callable[..., Any]:
    """The decode step with both pools as the tables of one jax_tma.scatter
    and one jax_tma.gather (one kernel each)."""
    def step(pools, slots, table, new):
        pools = jax_tma.scatter(pools, slots, tuple(new))
        return pools, jax_tma.gather(tuple(_as_pages(pool, tokens) for pool in pools), table)
    return step


def kernels_with(hlo_text: str, opcode: str) -> int:
    """How many kernels of a compiled (optimized) HLO module hold an
    `opcode` instruction: the fusions whose fused computation holds one
    (a multi-output fusion of two gathers is one kernel), plus the unfused
    `opcode` instructions of other computations (the entry, command
    buffers, loop bodies)."""
    comps: dict[str, list[str]] = {}
    name = None
    for line in hlo_text.splitlines():
        # A computation opens at column 0 ("%name (params) -> shape {", the
        # entry with "ENTRY ") and closes with "}" there; its instructions
        # are indented.
        head = re.match(r"(?:ENTRY\s+)?%?([\w.\-]+)\s", line)
        if head and line.rstrip().endswith("{"):
            name = head.group(1)
            comps[name] = []
        elif line.rstrip() == "}":
            name = None
        elif name is not None:
            comps[name].append(line)
    op = re.compile(rf"=\s.*?\b{re.escape(opcode)}\(")
    fused = {c for lines in comps.values() for line in lines
             for c in re.findall(r"\bfusion\(.*?calls=%?([\w.\-]+)", line)}

    def holds(comp: str, seen: frozenset = frozenset()) -> bool:
        lines = comps.get(comp, [])
        return any(op.search(line) for line in lines) or any(
            holds(c, seen | {comp}) for line in lines
            for c in re.findall(r"calls=%?([\w.\-]+)", line) if c not in seen)

    count = 0
    for comp, lines in comps.items():
        if comp in fused:
            continue
        for line in lines:
            called = re.findall(r"\bfusion\(.*?calls=%?([\w.\-]+)", line)
            if called:
                count += holds(called[0])
            elif op.search(line):
                count += 1
    return count


def _decode(s: Session, p: dict[str, Any], key: jax.Array) -> dict[str, Any]:
    """The decode step at a batch of sequences with distinct pages, each
    appending at a random position; the pools are donated state."""
    batch, per_seq, tokens, heads, dim = p["decode"]
    pages = 2 * batch * per_seq  # half of the pool in use
    pools = tuple(jax.random.normal(jax.random.fold_in(key, n), (pages * tokens, heads, dim),
                                    USE_DTYPE) for n in range(2))
    table = jax.random.permutation(jax.random.fold_in(key, 2), pages)[:batch * per_seq]
    table = table.reshape(batch, per_seq).astype(jnp.int32)
    pos = jax.random.randint(jax.random.fold_in(key, 3), (batch,), 0, per_seq * tokens)
    slots = (table[jnp.arange(batch), pos // tokens] * tokens + pos % tokens).astype(jnp.int32)
    new = jax.random.normal(jax.random.fold_in(key, 4), (2, batch, heads, dim), USE_DTYPE)
    args = (slots, table, new)
    cases = {"auto": _Donated(_decode_step_tables(tokens), pools, args, split=True),
             "per_pool": _Donated(_decode_step(jax_tma.scatter, jax_tma.gather, tokens), pools,
                                  args, split=True),
             "xla": _Donated(_decode_step(_set, _take, tokens), pools, args, split=True),
             "xla_hinted": _Donated(_decode_step(_set_hinted, _take_hinted, tokens), pools, args,
                                    split=True)}
    # How many kernels gather in XLA's compiled step (the README says so).
    kernels = {name: kernels_with(cases[name].fn.lower(cases[name].state, *args).compile()
                                  .as_text(), "gather") for name in ("xla", "xla_hinted")}
    want = jax.jit(_decode_step(_set_ref, _gather_ref, tokens))(pools, *args)
    row_bytes, page_bytes = heads * dim * 2, tokens * heads * dim * 2
    nbytes = 2 * (2 * batch * row_bytes + 2 * batch * per_seq * page_bytes)
    row = _row(s, p, p["rounds"], "decode", USE_DTYPE,
               f"paged decode step, batch {batch}, pools of {USE_DTYPE}: append one token's K "
               f"and V per sequence, gather its {per_seq} pages of {size_text(page_bytes)} of K "
               f"and V", "decode step", nbytes, cases, cases, ("xla", "xla_hinted"), want)
    row["xla_gather_kernels"] = kernels
    return row


def _chain(s: Session, p: dict[str, Any]) -> dict[str, Any]:
    """One page gathered `chain_ops` times in one jit, by each method,
    against the minimal FFI kernel of the benchmarks' module, the seed-style
    TMA copy (one 32-thread CTA: one bulk load and one bulk store) of the
    same page, chained alike. L2-warm: every call moves the same page."""
    ops = p["chain_ops"]
    x = jax.random.bits(jax.random.key(0), (1, p["chain_bytes"] // 4), jnp.uint32)
    idx = jnp.zeros((1,), jnp.int32)

    def chained(op):
        def fn(a):
            for _ in range(ops):
                a = op(a)
            return a
        return jax.jit(fn)

    # "gather" is method="auto"; the other methods are timed beside it.
    fns = {("gather" if m == "auto" else f"gather_{m}"):
           chained(functools.partial(jax_tma.gather, indices=idx, method=m)) for m in METHODS}
    fns["minimal_ffi"] = chained(s.refs.seed_copy)
    for name, fn in fns.items():
        s.check(f"{ops} chained {size_text(p['chain_bytes'])} {name}", fn(x), x)
    timed = s.time({name: rotate(fn, [(x,)]) for name, fn in fns.items()}, p["chain_rounds"],
                   wall=False)
    per_op = {name: {k: v / ops for k, v in t.items()} for name, t in timed["cases"].items()}
    gap = per_op["gather"]["span_us"] - per_op["minimal_ffi"]["span_us"]
    s.log(f"gather: {ops} chained gathers: {gap:+.2f} µs per call over the minimal FFI kernel")
    return {"ops": ops, "bytes": p["chain_bytes"], "dtype": "uint32", "l2": "warm",
            "minimal_ffi": "the seed-style TMA copy", "per_op": per_op,
            "protocol": timed["protocol"], "gap_us": gap, "target_gap_us": CHAIN_TARGET_US,
            "target_met": gap <= CHAIN_TARGET_US}


def bench_gather(s: Session) -> dict[str, Any]:
    """Issue 18's cases at their use case's dtype and the others: each
    jax_tma method, the XLA formulations and the copy ceiling interleaved,
    every case checked bit for bit first against the reference formulation
    (jnp.take(mode="fill"), .at[].set/add(mode="drop")). In-place cases donate
    their table to every call and get the previous call's output back
    (harness-level state, one scatter per call). Then the chained tiny
    gathers, the small gathers (rotating their indices) and the slab-size
    sweep."""
    p = SMOKE if s.smoke else FULL
    pages, rows_key, adds, decode, small_key, sweep_key = jax.random.split(jax.random.key(18), 6)
    rows = []
    for n, dtype in enumerate(p["page_dtypes"]):
        rows += _pages(s, p, jax.random.fold_in(pages, n), dtype)
    for n, dtype in enumerate(p["row_dtypes"]):
        rows += _rows(s, p, jax.random.fold_in(rows_key, n), dtype)
    rows += _adds(s, p, adds) + [_decode(s, p, decode)]
    chain = _chain(s, p)
    small = []
    for n_rows, slab, count, dtypes in p["small"]:
        for dtype in dtypes:
            k = jax.random.fold_in(small_key, count * 7 + len(small))
            table = _table(k, n_rows, slab, dtype)
            idx = _index_sets(jax.random.fold_in(k, 1), n_rows, count, slab, p)
            small.append(_gather_row(s, p, p["rounds"], f"small {count}", table, idx,
                                     f"gather {count:,} random {dtype} rows of {size_text(slab)} "
                                     f"of {n_rows:,}", _methods(dtype)))
            del table, idx
    sweep = {"table_bytes": p["sweep_table"], "gathered_bytes": p["sweep_gathered"],
             "dtype": USE_DTYPE, "rows": []}
    for slab in p["sweep_slabs"]:
        k = jax.random.fold_in(sweep_key, slab)
        n_rows = p["sweep_table"] // slab
        table = _table(k, n_rows, slab, USE_DTYPE)
        idx = _index_sets(jax.random.fold_in(k, 1), n_rows, p["sweep_gathered"] // slab, slab, p)
        sweep["rows"].append({"slab_bytes": slab, **_gather_row(
            s, p, p["sweep_rounds"], "sweep", table, idx,
            f"gather {idx[0].size:,} of {n_rows:,} {USE_DTYPE} slabs of {size_text(slab)}",
            METHODS)})
        del table, idx
    return {"op": OP, "bytes_convention": BYTES, "use_dtype": USE_DTYPE,
            "xla_formulations": XLA, "rows": rows, "chained_tiny_gathers": chain,
            "pallas_kernels": {"gather": pallas_kernels.describe("gather"),
                               "scatter set": pallas_kernels.describe("scatter")},
            "small_gathers": small, "sweep": sweep}


def bench_wheel(s: Session) -> dict[str, Any]:
    """One case of the gather benchmark again (the use case's page gather:
    auto, jnp.take and the ceiling), for a run against another install of
    jax_tma (gpu_check.sh runs it against the wheel), so that the README can
    set its time beside the measured build's."""
    p = SMOKE if s.smoke else FULL
    dtype = p["page_dtypes"][0]
    key = jax.random.fold_in(jax.random.split(jax.random.key(18), 6)[0], 0)
    n_rows, slab, count = p["pages"]
    table = _table(jax.random.fold_in(key, 0), n_rows, slab, dtype)
    idx = _index_sets(jax.random.fold_in(key, 1), n_rows, count, slab, p)[0]
    row = _gather_row(s, p, p["rounds"], "pages", table, [idx],
                      f"gather {count:,} random {dtype} pages of {size_text(slab)} of a "
                      f"{size_text(n_rows * slab)} table")
    return {"op": WHEEL_OP, "bytes_convention": BYTES, "xla_formulations": XLA,
            "rows": [row]}


BENCHMARKS = {
    "gather": Benchmark(lambda s, args: bench_gather(s), budget_s=120),
    # Against another install of jax_tma (gpu_check.sh: the wheel), not in `all`.
    "wheel": Benchmark(lambda s, args: bench_wheel(s), budget_s=30, in_all=False),
}
