"""The gather/scatter benchmark: jax_tma.gather / jax_tma.scatter against the
XLA formulations a user would write (plain, and hinted with unique_indices as
a careful user would) and the copy ceiling (cudaMemcpyAsync of the same
bytes), for the cases of issue 18's target table, plus a sweep of GB/s
against slab size (128 B to 64 KiB) for the README's plot.

    python benchmarks/run.py gather [--out results.json]

Times are GPU busy time per call (harness.time_cases, cases interleaved).
Bytes: every byte read plus every byte written (gather: the slabs read and
written; scatter set: the updates read and the slabs written; scatter add:
also the slabs read). In-place cases keep their table in a closure and
donate it to each call, so every call updates the previous call's output.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import jax_tma
from harness import MIB, time_cases, time_device
from references import ffi_reference, register

KIB = 1024


def _memcpy_case(nbytes: int) -> tuple[Callable[[], Any], Any]:
    """The copy ceiling of a case moving `nbytes` (read + write): a
    cudaMemcpyAsync of nbytes / 2."""
    buf = jnp.zeros((nbytes // 2 // 4,), jnp.uint32)
    memcpy = ffi_reference("jax_tma_bench_memcpy")
    return lambda: memcpy(buf), buf


class _InPlace:
    """A case that donates its table to every call and keeps the result as
    the next call's table."""

    def __init__(self, fn: Callable[..., jax.Array], table: jax.Array, *args):
        self.fn = jax.jit(fn, donate_argnums=0)
        self.table = table.copy()
        self.args = args

    def __call__(self) -> jax.Array:
        self.table = self.fn(self.table, *self.args)
        return self.table


def _timed(cases: dict[str, Callable[[], Any]], nbytes: int, rounds: int = 10) -> dict[str, Any]:
    ceiling, _ = _memcpy_case(nbytes)
    times = time_cases({**cases, "memcpy": ceiling}, [()], rounds, rep=3, busy=True)
    out = {name: {"us": t * 1e6, "gbps": nbytes / t / 1e9, "vs_memcpy": times["memcpy"] / t}
           for name, t in times.items()}
    return out


def _gather_cases(table: jax.Array, idx: jax.Array) -> dict[str, Callable[[], Any]]:
    cases = {m: functools.partial(jax.jit(functools.partial(jax_tma.gather, method=m)), table, idx)
             for m in ("auto", "tma", "simt")}
    cases["xla_take"] = functools.partial(jax.jit(lambda t, i: jnp.take(t, i, axis=0)), table, idx)
    cases["xla_take_unique"] = functools.partial(
        jax.jit(lambda t, i: t.at[i].get(mode="promise_in_bounds", unique_indices=True)),
        table, idx)
    return cases


def _gather_row(name: str, rows: int, row_bytes: int, count: int, key) -> dict[str, Any]:
    table = jax.random.bits(key, (rows, row_bytes // 4), jnp.uint32)
    idx = jax.random.choice(jax.random.fold_in(key, 1), rows, (count,), replace=False)
    res = _timed(_gather_cases(table, idx.astype(jnp.int32)), 2 * count * row_bytes)
    del table
    return {"case": name, "bytes": 2 * count * row_bytes, **_ratios(res, "xla_take"), "times": res}


def _ratios(res: dict[str, Any], xla: str, ours: str = "auto") -> dict[str, float]:
    return {"vs_memcpy": res[ours]["vs_memcpy"], "vs_xla": res[xla]["us"] / res[ours]["us"]}


def bench_gather() -> dict[str, Any]:
    register()
    key = jax.random.key(18)
    rows = []

    def report(row):
        rows.append(row)
        print(f"{row['case']}: {row['vs_memcpy']:.3f}x memcpy, {row['vs_xla']:.3f}x XLA",
              flush=True)

    # Gathers: 32 KiB pages of a 1 GiB table, 512 B and 128 B rows.
    report(_gather_row("gather 8,192 of 32,768 pages of 32 KiB (1 GiB table)", 32768, 32 * KIB,
                       8192, key))
    report(_gather_row("gather 262,144 of 1 M rows of 512 B", 1 << 20, 512, 262144, key))
    report(_gather_row("gather 1 M of 4 M rows of 128 B", 4 << 20, 128, 1 << 20, key))

    # In-place page scatter (set), table donated.
    pages = 8192
    table = jax.random.bits(key, (32768, 8 * KIB), jnp.uint32)
    idx = jax.random.choice(jax.random.fold_in(key, 2), 32768, (pages,), replace=False)
    idx = idx.astype(jnp.int32)
    upd = jax.random.bits(jax.random.fold_in(key, 3), (pages, 8 * KIB), jnp.uint32)
    cases = {
        "auto": _InPlace(jax_tma.scatter, table, idx, upd),
        "tma": _InPlace(functools.partial(jax_tma.scatter, method="tma"), table, idx, upd),
        "simt": _InPlace(functools.partial(jax_tma.scatter, method="simt"), table, idx, upd),
        "xla_set": _InPlace(lambda t, i, u: t.at[i].set(u), table, idx, upd),
        "xla_set_unique": _InPlace(lambda t, i, u: t.at[i].set(u, unique_indices=True), table,
                                   idx, upd),
    }
    del table
    res = _timed(cases, 2 * pages * 32 * KIB)
    del cases
    row = {"case": "scatter set 8,192 pages of 32 KiB in place (donated 1 GiB table)",
           "bytes": 2 * pages * 32 * KIB, **_ratios(res, "xla_set"),
           "vs_xla_unique": res["xla_set_unique"]["us"] / res["auto"]["us"], "times": res}
    report(row)

    # Scatter-add of rows: 1 KiB f32 and 512 B bf16, duplicates allowed.
    for name, dtype, width in (("f32 rows of 1 KiB", jnp.float32, 256),
                               ("bf16 rows of 512 B", jnp.bfloat16, 256)):
        n_rows, n_upd = 1 << 18, 1 << 16
        table = jax.random.normal(key, (n_rows, width), dtype)
        idx = jax.random.randint(jax.random.fold_in(key, 4), (n_upd,), 0, n_rows, jnp.int32)
        upd = jax.random.normal(jax.random.fold_in(key, 5), (n_upd, width), dtype)
        add = functools.partial(jax_tma.scatter, mode="add")
        cases = {
            "auto": _InPlace(add, table, idx, upd),
            "tma": _InPlace(functools.partial(add, method="tma"), table, idx, upd),
            "simt": _InPlace(functools.partial(add, method="simt"), table, idx, upd),
            "deterministic": _InPlace(functools.partial(add, deterministic=True), table, idx, upd),
            "xla_add": _InPlace(lambda t, i, u: t.at[i].add(u), table, idx, upd),
        }
        del table
        nbytes = 3 * n_upd * width * np.dtype(dtype).itemsize
        res = _timed(cases, nbytes)
        del cases
        report({"case": f"scatter add of 65,536 {name} into 262,144 rows", "bytes": nbytes,
                **_ratios(res, "xla_add"), "times": res})

    rows.append(_decode_step(key))
    print(f"{rows[-1]['case']}: {rows[-1]['vs_xla']:.3f}x XLA", flush=True)
    return {"rows": rows, "chained_tiny_gathers": _chained(), "sweep": _sweep(key)}


def _decode_step(key) -> dict[str, Any]:
    """A paged decode step at batch 64: append one token's K and V per
    sequence into its current page, then gather each sequence's 32 pages of
    K and V (pages of 16 tokens x 8 heads x 128 dims bf16 = 32 KiB)."""
    batch, per_seq, page_tokens, heads, dim = 64, 32, 16, 8, 128
    num_pages = batch * per_seq * 2
    shape = (num_pages, page_tokens, heads, dim)
    k_pool = jax.random.normal(key, shape, jnp.bfloat16)
    v_pool = jax.random.normal(jax.random.fold_in(key, 1), shape, jnp.bfloat16)
    table = jax.random.permutation(jax.random.fold_in(key, 2), num_pages)[: batch * per_seq]
    table = table.reshape(batch, per_seq).astype(jnp.int32)
    pos = jnp.full((batch,), per_seq * page_tokens - 5, jnp.int32)  # next token slot
    slot = table[jnp.arange(batch), pos // page_tokens] * page_tokens + pos % page_tokens
    new = jax.random.normal(jax.random.fold_in(key, 3), (2, batch, heads, dim), jnp.bfloat16)

    def ours(pools, slot, table, new):
        k, v = pools
        rows = (num_pages * page_tokens, heads, dim)
        k = jax_tma.scatter(k.reshape(rows), slot, new[0]).reshape(shape)
        v = jax_tma.scatter(v.reshape(rows), slot, new[1]).reshape(shape)
        return (k, v), (jax_tma.gather(k, table), jax_tma.gather(v, table))

    def xla(pools, slot, table, new):
        k, v = pools
        rows = (num_pages * page_tokens, heads, dim)
        k = k.reshape(rows).at[slot].set(new[0], unique_indices=True).reshape(shape)
        v = v.reshape(rows).at[slot].set(new[1], unique_indices=True).reshape(shape)
        take = functools.partial(jnp.take, axis=0, unique_indices=True, indices_are_sorted=False,
                                 mode="promise_in_bounds")
        return (k, v), (take(k, table), take(v, table))

    class Step:
        def __init__(self, fn):
            self.fn = jax.jit(fn, donate_argnums=0)
            self.pools = (k_pool.copy(), v_pool.copy())

        def __call__(self):
            self.pools, out = self.fn(self.pools, slot, table, new)
            return out

    page = page_tokens * heads * dim * 2
    nbytes = 2 * (2 * batch * heads * dim * 2) + 2 * (2 * batch * per_seq * page)
    res = _timed({"auto": Step(ours), "xla_hinted": Step(xla)}, nbytes)
    return {"case": "paged decode step, batch 64: append 1 token, gather 32 pages of 32 KiB "
                    "per sequence (K and V)", "bytes": nbytes, **_ratios(res, "xla_hinted"),
            "times": res}


def _chained(ops: int = 100) -> dict[str, Any]:
    """One 4 KiB page gathered `ops` times in one jit, against a minimal FFI
    kernel (the write-only stream of the benchmarks' module) chained alike."""
    x = jax.random.bits(jax.random.key(0), (1, 1024), jnp.uint32)
    idx = jnp.zeros((1,), jnp.int32)
    write = ffi_reference("jax_tma_bench_write")

    def gathers(a):
        for _ in range(ops):
            a = jax_tma.gather(a, idx)
        return a

    def writes(a):
        for _ in range(ops):
            a = write(a)
        return a

    out = {}
    for name, fn in (("gather", gathers), ("minimal_ffi", writes)):
        out[name] = {"us_per_op": time_device(jax.jit(fn), [(x,)], 30) * 1e6 / ops}
    out["ops"] = ops
    out["gap_us"] = out["gather"]["us_per_op"] - out["minimal_ffi"]["us_per_op"]
    print(f"chained 4 KiB gathers: {out['gap_us']:+.2f} us per op over a minimal FFI kernel",
          flush=True)
    return out


def _sweep(key, table_bytes: int = 512 * MIB, moved: int = 128 * MIB) -> list[dict[str, Any]]:
    """GB/s (read + write) against slab size, 128 B to 64 KiB: gather of
    `moved` bytes of random distinct slabs of a `table_bytes` table."""
    out = []
    for slab in [128 << k for k in range(10)]:
        rows, count = table_bytes // slab, moved // slab
        table = jax.random.bits(key, (rows, slab // 4), jnp.uint32)
        idx = jax.random.permutation(jax.random.fold_in(key, slab), rows)[:count]
        res = _timed(_gather_cases(table, idx.astype(jnp.int32)), 2 * moved, rounds=6)
        del table
        out.append({"slab_bytes": slab, **{k: v["gbps"] for k, v in res.items()}})
        print(f"slab {slab:>6} B: " + ", ".join(f"{k} {v['gbps']:.0f} GB/s"
                                                  for k, v in res.items()), flush=True)
    return out


def gather_table(result: dict[str, Any]) -> str:
    lines = ["| case | jax_tma auto µs | ÷ copy ceiling | × XLA | tma ÷ ceiling | simt ÷ ceiling |",
             "|---|---|---|---|---|---|"]
    for row in result["rows"]:
        t = row["times"]
        cells = [row["case"], f"{t['auto']['us']:.1f}", f"{row['vs_memcpy']:.3f}",
                 f"{row['vs_xla']:.3f}"]
        cells += [f"{t[m]['vs_memcpy']:.3f}" if m in t else "—" for m in ("tma", "simt")]
        lines.append("| " + " | ".join(cells) + " |")
    chain = result["chained_tiny_gathers"]
    lines += ["", f"{chain['ops']} chained 4 KiB gathers in one `jit`: "
                  f"{chain['gather']['us_per_op']:.2f} µs per op, "
                  f"{chain['gap_us']:+.2f} µs over a minimal FFI kernel.", "",
              "| slab | auto GB/s | tma | simt | XLA take | XLA take (unique) | memcpy |",
              "|---|---|---|---|---|---|---|"]
    for s in result["sweep"]:
        lines.append(f"| {s['slab_bytes']} B | {s['auto']:.0f} | {s['tma']:.0f} | {s['simt']:.0f} "
                     f"| {s['xla_take']:.0f} | {s['xla_take_unique']:.0f} | {s['memcpy']:.0f} |")
    return "\n".join(lines)
