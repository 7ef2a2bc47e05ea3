"""How the copy benchmark's results read (bench_copy.py writes them): the
`copy` section, the README's headline row and the TB/s-over-size plot, which
report.py collects from this module's RENDERERS, HEADLINES and PLOTS."""

from __future__ import annotations

from typing import Any

from tables import (MIB, WALL_MIN_US, Headline, Plot, behind_text, range_text, ratio_text,
                    size_text)


# Each case's column head; Pallas where the result timed it (results written
# before it was a case have none).
_LABELS = {"auto": "auto", "bulk": "bulk", "simt": "simt", "seed_tma": "seed-style TMA",
           "xla_copy": "XLA `jnp.copy`", "pallas": "Pallas", "memcpy": "cudaMemcpyAsync"}


def render_copy(r: dict[str, Any]) -> str:
    cases = [c for c in _LABELS if c != "pallas" or "pallas" in r["rows"][0]["repeat"]]
    head = ["size", "dtype", "inputs rotated", *(_LABELS[c] for c in cases),
            "auto vs XLA, repeated: span / wall",
            "after a write: auto vs XLA (bulk vs cudaMemcpyAsync), span"]
    lines = [f"TB/s by span in the repeated regime (vs cudaMemcpyAsync in parentheses), then "
             f"`auto` vs XLA in both regimes (the wall clock from {WALL_MIN_US:g} µs of busy "
             f"time):", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in r["rows"]:
        rep, after = row["repeat"], row["after_write"]
        cells = [size_text(row["bytes"]), row.get("dtype", "uint32"),
                 f"{row['inputs']} ({size_text(row['inputs'] * row['bytes'])})"]
        cells += [f"{rep[c]['tbps']:.2f} ({rep[c]['vs_memcpy']:.3f}×)" for c in cases]
        wall = ratio_text(rep, "auto", "xla_copy", "wall_us")
        cells.append(f"{rep['auto']['vs_xla']:.3f}× / {wall}{'×' if wall != '—' else ''}")
        cells.append(f"{after['auto']['vs_xla']:.3f}× ({after['bulk']['vs_memcpy']:.3f}×)")
        lines.append("| " + " | ".join(cells) + " |")
    bounded = [row for row in r["rows"] if "serial_bound" in row]
    if bounded:
        lines += ["", "| size | read-only TB/s | write-only TB/s | serial bound "
                  "2n/(t_read+t_write) TB/s | bulk TB/s ÷ bound | seed-style ÷ bound | "
                  "cudaMemcpyAsync ÷ bound |", "|---|---|---|---|---|---|---|"]
        for row in bounded:
            b = row["serial_bound"]
            lines.append(f"| {size_text(row['bytes'])} | {b['read_tbps']:.2f} | "
                         f"{b['write_tbps']:.2f} | {b['copy_tbps']:.2f} | "
                         f"{b['bulk_fraction']:.3f} | {b['seed_tma_fraction']:.3f} | "
                         f"{b['memcpy_fraction']:.3f} |")
    chain = r["chained_tiny_copies"]
    lines += ["", f"{chain['bulk']['ops']} chained 1 KiB copies inside one `jit` (L2-warm: "
                  f"the same 1 KiB every call): {chain['bulk']['us_per_op']:.2f} µs per op "
                  f"(bulk), {chain['simt']['us_per_op']:.2f} µs per op (simt), by span."]
    rep = [row["repeat"]["auto"]["vs_xla"] for row in r["rows"]]
    after = [row["after_write"]["auto"]["vs_xla"] for row in r["rows"]]
    lines += ["", f"`auto` vs XLA over these sizes, by span: {range_text(rep)}× repeated, "
                  f"{range_text(after)}× after a write."]
    if bounded:
        lines[-1] += (f" From {size_text(bounded[0]['bytes'])} up `bulk` runs at "
                      f"{range_text([row['repeat']['bulk']['vs_memcpy'] for row in bounded])}× "
                      f"cudaMemcpyAsync, "
                      f"{range_text([row['repeat']['bulk']['vs_xla'] for row in bounded])}× "
                      f"XLA and "
                      f"{range_text([row['serial_bound']['bulk_fraction'] for row in bounded])} of "
                      f"the serial bound.")
    if "pallas" in cases:
        lines += ["", f"`auto` vs the simplest Pallas copy ({r['pallas_kernel']}), Pallas's "
                      f"time ÷ auto's by span, repeated / after a write: " + ", ".join(
                          f"{size_text(row['bytes'])} {row.get('dtype', 'uint32')} "
                          f"{_vs(row, 'repeat'):.3f} / {_vs(row, 'after_write'):.3f}×"
                          for row in r["rows"])
                  + f". Repeated, `auto` is "
                    f"{behind_text([_vs(row, 'repeat') for row in r['rows']], 'Pallas')}."]
    return "\n".join(lines)


def _vs(row: dict[str, Any], regime: str) -> float:
    """Pallas's span ÷ auto's in one regime of a row."""
    t = row[regime]
    return t["pallas"]["span_us"] / t["auto"]["span_us"]


def _copy_headline(r: dict[str, Any]) -> str:
    row = max((row for row in r["rows"] if row.get("dtype", "uint32") == "uint32"),
              key=lambda row: row["bytes"])
    auto = row["repeat"]["auto"]
    pallas = f", {_vs(row, 'repeat'):.2f}× a Pallas copy" if "pallas" in row["repeat"] else ""
    return (f"{auto['tbps']:.2f} TB/s copying {size_text(row['bytes'])}, "
            f"{auto['vs_memcpy']:.2f}× `cudaMemcpyAsync`, {auto['vs_xla']:.2f}× `jnp.copy`"
            f"{pallas} (by span)")


def _plot(ax: Any, r: dict[str, Any]) -> None:
    # The sizes of one dtype (the uint32 sweep; the bf16 row is a point of
    # comparison in the table).
    rows = [row for row in r["rows"] if row.get("dtype", "uint32") == "uint32"]
    for case in rows[0]["repeat"]:
        ax.plot([row["bytes"] / MIB for row in rows],
                [row["repeat"][case]["tbps"] for row in rows], marker="o", label=case)
    ax.set(xscale="log", xlabel="MiB copied", ylabel="TB/s (read + write, by span)",
           title="jax_tma.copy of uint32 arrays, repeated calls")
    ax.legend()


RENDERERS = {"copy": render_copy}
HEADLINES = (Headline(1, "copy", "a new buffer equal to `x`, bit for bit", "copy",
                      _copy_headline),)
PLOTS = (Plot("copy", "copy_tbps.png", _plot),)
