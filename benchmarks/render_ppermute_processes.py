"""How the ppermute_processes benchmark's results read
(bench_ppermute_processes.py writes them: two processes of one host under
jax.distributed): the `ppermute_processes` section, a table per layout and
the host time of one call. No headline row: the README's ppermute row is the
two-GPU benchmark's."""

from __future__ import annotations

from typing import Any

from tables import MIB, size_text

# The family whose code these results measure (report.py's staleness).
FAMILY = "ppermute"

_LAYOUTS = {
    "shared": "both processes on one GPU, without MPS (the GPU time-slices their contexts)",
    "per_gpu": "one GPU each (`jax.distributed.initialize(local_device_ids=[i])`, both GPUs "
               "visible to each)",
    "shared_mps": "both processes on one GPU under an MPS daemon of the benchmark's own",
}
# Layouts whose blocks cross from one GPU to another: the link between them
# bounds the copy, so a copy within one GPU's memory is no ceiling for it.
_ACROSS_GPUS = {"per_gpu"}


def _num(x: float | None, suffix: str = "", digits: int = 1) -> str:
    """x to `digits` places, or a dash where it was not measured."""
    return "—" if x is None else f"{x:.{digits}f}{suffix}"


def _layout_table(name: str, layout: dict[str, Any]) -> list[str]:
    """A layout's table of GB/s by block size, and what it must say beside."""
    nccl = any("nccl_us" in row for row in layout["rows"])
    ceiling = name not in _ACROSS_GPUS
    head = (["block per device", "auto", "push (TMA bulk)", "pull (TMA bulk)"]
            + (["cudaMemcpyAsync", "auto vs cudaMemcpyAsync"] if ceiling else [])
            + (["lax.ppermute (NCCL)", "auto vs NCCL"] if nccl else []))
    devices = ", ".join(dict.fromkeys(layout["devices"]))
    lines = [f"`{name}`, {_LAYOUTS[name]} ({devices}):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in layout["rows"]:
        cells = [size_text(row["block_mib"] * MIB)]
        cells += [_num(row[f"{case}_gbps"]) for case in ("auto", "push", "pull")]
        if ceiling:
            cells += [_num(row["memcpy_gbps"]), _num(row["auto_vs_memcpy"], "×", 2)]
        if nccl:
            cells += [_num(row["nccl_gbps"]), _num(row["auto_vs_nccl"], "×", 2)]
        lines.append("| " + " | ".join(cells) + " |")
    if not ceiling:
        lines += ["", "Each block crosses the link between the GPUs here, which bounds the copy: "
                  "`cudaMemcpyAsync` within one GPU's memory is no ceiling for it, and NCCL is "
                  "the comparator."]
    fallbacks = [x.removeprefix("lax.ppermute, because ") for x in layout["lowerings"]
                 if x.startswith("lax.ppermute")]
    if fallbacks:
        lines += ["", "`jax_tma.ppermute` lowered to `lax.ppermute` here, because "
                  + "; ".join(fallbacks) + "."]
    if layout["untraced"]:
        lines += ["", "No profiler clocks in " + "; ".join(
            f"process {pid}: {why}" for pid, why in layout["untraced"].items()) + "."]
    return lines


def _host_rows(r: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(where, host-time clocks) of every layout, and of one process."""
    rows = [(f"two processes, `{name}`", layout["host_time"])
            for name, layout in r["layouts"].items()]
    if r.get("in_process_host_time"):
        rows.append(("one process, two GPUs", r["in_process_host_time"]))
    return rows


def render_ppermute_processes(r: dict[str, Any]) -> str:
    lines = [f"Two processes of one host under `jax.distributed` swap blocks (`perm={r['perm']}`), "
             f"{r['chain']} permutations chained per program; GB/s per direction by span (worker "
             f"0's span per program ÷ {r['chain']}). On one GPU, the ceiling is `cudaMemcpyAsync` of the "
             f"same block bytes on worker 0's GPU while worker 1 waits (its GB/s counts the "
             f"block once, though it reads and writes it); *auto vs cudaMemcpyAsync* is its time "
             f"for the blocks an op moves through that GPU's memory (two where both processes "
             f"share it, one each copying at once) ÷ `auto`'s time, *auto vs NCCL* NCCL's ÷ "
             f"`auto`'s. MPS: {r['mps']}."]
    for name, layout in r["layouts"].items():
        lines += ["", *_layout_table(name, layout)]
    host = _host_rows(r)
    block = size_text(host[0][1]["block_bytes"])
    lines += ["", f"Host time of one un-chained call, {block} blocks (wall: calls dispatched "
                  f"without waiting, one sync; span: first to last GPU activity of a call), "
                  f"µs per call:", "",
              "| where | `auto` span | `auto` wall | NCCL span | NCCL wall |",
              "|---|---|---|---|---|"]
    for where, t in host:
        cells = [_num(t["cases"].get(case, {}).get(clock))
                 for case in ("auto", "nccl") for clock in ("span_us", "wall_us")]
        lines.append(f"| {where} | " + " | ".join(cells) + " |")
    notes = [f"`{name}` not run: {why}" for name, why in r["not_run"].items()]
    notes += [f"{size} blocks left out: {why}" for size, why in r["sizes_left_out"].items()]
    if notes:
        lines += ["", "; ".join(notes) + "."]
    return "\n".join(lines)


def _time_text(us: float) -> str:
    """A time in µs, or in ms from a millisecond."""
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def _row(layout: dict[str, Any], mib: float) -> dict[str, Any] | None:
    return next((row for row in layout["rows"] if row["block_mib"] == mib), None)


def render_mps(results: dict[str, tuple[str, dict[str, Any]]]) -> str | None:
    """The ppermute page's paragraph on MPS: a call and a large block, both
    processes on one GPU without MPS and under it, from the
    ppermute_processes result; None without its `shared` and `shared_mps`
    layouts."""
    if "ppermute_processes" not in results:
        return None
    r = results["ppermute_processes"][1]
    plain, mps = r["layouts"].get("shared"), r["layouts"].get("shared_mps")
    if plain is None or mps is None:
        return None
    prov = r.get("provenance") or {}
    where = (f"on an {prov.get('devices', ['?'])[0]} ({str(prov.get('date', '?'))[:10]}, "
             f"`benchmarks/run.py ppermute_processes` at {str(prov.get('commit', '?'))[:10]}, "
             f"the result below)")
    block = size_text(plain["host_time"]["block_bytes"])
    big = 256 if _row(plain, 256) and _row(mps, 256) else plain["rows"][-1]["block_mib"]
    # A middle block and the smallest, where a call's fixed costs show.
    small = [row for row in (_row(mps, 16), mps["rows"][0]) if row and row["block_mib"] < big]
    t_plain, t_mps = plain["host_time"]["cases"]["auto"], mps["host_time"]["cases"]["auto"]
    return (f"Without MPS the GPU time-slices the processes' contexts, and a call's kernels wait "
            f"a time slice for the peer's: {where} one un-chained call of {block} blocks took "
            f"{_time_text(t_plain['span_us'])} by span ({_time_text(t_plain['wall_us'])} of host "
            f"wall clock a call), and {size_text(big * MIB)} blocks moved at "
            f"{_row(plain, big)['auto_gbps']:.1f} GB/s per direction. Under MPS the same call "
            f"took {_time_text(t_mps['span_us'])} ({_time_text(t_mps['wall_us'])} wall) and "
            f"{size_text(big * MIB)} blocks {_row(mps, big)['auto_gbps']:.1f} GB/s per "
            f"direction, both processes copying at once through the same memory: "
            f"{_row(mps, big)['auto_vs_memcpy']:.2f}× a `cudaMemcpyAsync` of the two blocks ("
            + ", ".join(f"{row['auto_vs_memcpy']:.2f}× at {size_text(row['block_mib'] * MIB)}"
                        for row in small)
            + ", where a call's three kernels and two waits across processes dominate).")


RENDERERS = {"ppermute_processes": render_ppermute_processes}
DERIVED = {"ppermute-mps": render_mps}
# The command that writes the result (it is not in `run.py all`).
WRITTEN_BY = {"ppermute_processes": "`python benchmarks/run.py ppermute_processes --out-dir "
                                     "benchmarks/results` (one GPU or more; not in `all`; "
                                     "`run.py multi` runs it)"}
