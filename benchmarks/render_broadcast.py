"""How the broadcast benchmarks' results read (bench_broadcast.py writes
them): the `broadcast` and `broadcast-ncu` sections, the README's headline
row and the TB/s-per-method plot, which report.py collects from RENDERERS,
HEADLINES and PLOTS."""

from __future__ import annotations

import re
from typing import Any

from tables import WALL_NOTE, Headline, Plot, tbps_headline, us_text


def render_broadcast(r: dict[str, Any]) -> str:
    rows = r["rows"]
    labels = list(rows[0]["times"])
    lines = [f"GPU {WALL_NOTE} (TB/s by busy time); ratios by busy time:", "",
             "| method | " + " | ".join(row["case"] for row in rows) + " |",
             "|---|" + "---|" * len(rows)]
    for label in labels:
        lines.append(f"| {label} | " + " | ".join(
            f"{us_text(row['times'][label])} ({row['busy_tbps'][label]:.2f})" for row in rows)
            + " |")
    lines.append("| fastest jax_tma method (vs XLA) | " + " | ".join(
        f"{row['best']} ({row['best_vs_xla']:.2f}×)" for row in rows) + " |")
    lines.append("| auto: vs XLA, and vs the fastest | " + " | ".join(
        f"{row['auto_vs_xla']:.2f}×, {row['auto_vs_best']:.3f}" for row in rows) + " |")
    if all("auto_vs_pallas" in row for row in rows):
        lines.append("| auto vs Pallas: busy / span | " + " | ".join(
            f"{row['auto_vs_pallas']:.3f}× / {row['auto_vs_pallas_span']:.3f}×" for row in rows)
            + " |")
        lines += ["", f"Pallas: the simplest Pallas kernel a user would write, "
                      f"{r['pallas_kernel']}; `auto` vs Pallas is Pallas's time ÷ auto's (above "
                      f"1, `auto` is faster; near 1, a tie)."]
    push = r["dsmem_push"]
    lines += ["", f"SM-to-SM push of the dsmem path ({push['input']} in, n = 1; "
                  f"{push['bytes_convention']}):", "",
              "| cluster size | " + " | ".join(str(p["cluster_size"]) for p in push["rows"]) + " |",
              "|---|" + "---|" * len(push["rows"]),
              "| push TB/s | " + " | ".join(f"{p['push_tbps']:.2f}" for p in push["rows"]) + " |",
              "| busy / span µs | " + " | ".join(us_text(p) for p in push["rows"]) + " |"]
    return "\n".join(lines)


def _kernel_name(demangled: str) -> str:
    """'void ns::(anonymous namespace)::Kernel<T>(args)' -> 'Kernel'."""
    base = re.split(r"[<(]", demangled.replace("(anonymous namespace)", ""), maxsplit=1)[0]
    return (base.split("::")[-1].split() or [demangled])[-1]


def render_broadcast_ncu(r: dict[str, Any]) -> str:
    lines = [f"{r['case']}: x is {r['x_bytes'] / 1e6:.2f} MB, the output "
             f"{r['out_bytes'] / 1e6:.2f} MB; `{' '.join(r['command'])}` "
             f"({', '.join(r['ncu_version'])}):", "",
             "| method | DRAM read MB | read ÷ x | DRAM write MB | kernel µs (ncu) | kernels |",
             "|---|---|---|---|---|---|"]
    for row in r["rows"]:
        kernels = "; ".join(sorted({_kernel_name(k) for k in row["kernels"]}))
        lines.append(f"| {row['method']} | {row['dram_read_bytes'] / 1e6:.2f} | "
                     f"{row['read_over_x']:.3f} | {row['dram_write_bytes'] / 1e6:.2f} | "
                     f"{row['kernel_us']:.1f} | {kernels} |")
    return "\n".join(lines)


def _broadcast_headline(r: dict[str, Any]) -> str:
    """auto on the first case, against XLA and the Pallas kernel (where the
    result timed it), the faster of them first."""
    row = r["rows"][0]
    versus = [(row["times"]["xla"]["busy_us"], f"{row['auto_vs_xla']:.2f}× `jnp.broadcast_to`")]
    if "auto_vs_pallas" in row:
        versus.append((row["times"]["pallas"]["busy_us"],
                       f"{row['auto_vs_pallas']:.2f}× the simplest Pallas kernel"))
    return tbps_headline(row["busy_tbps"]["auto"], ", ".join(v for _, v in sorted(versus)),
                         row["case"])


def _plot(ax: Any, r: dict[str, Any]) -> None:
    row = r["rows"][0]
    labels = list(row["busy_tbps"])
    ax.bar(labels, [row["busy_tbps"][k] for k in labels])
    ax.set(ylabel="TB/s (read + write, by busy time)", title=row["case"])
    ax.tick_params(axis="x", rotation=60)


RENDERERS = {"broadcast": render_broadcast, "broadcast-ncu": render_broadcast_ncu}
HEADLINES = (Headline(4, "broadcast", "`n` materialised replicas, each input tile read once",
                      "broadcast", _broadcast_headline),)
PLOTS = (Plot("broadcast", "broadcast_tbps.png", _plot),)
