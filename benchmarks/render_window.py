"""How the window benchmark's results read (bench_window.py writes them): the
`window` section and the README's headline row, which report.py collects from
RENDERERS and HEADLINES."""

from __future__ import annotations

from typing import Any

from tables import WALL_NOTE, Headline, ratio_text, tbps_headline, us_text


def render_window(r: dict[str, Any]) -> str:
    lines = [f"GPU {WALL_NOTE}; TB/s and ratios by busy time (auto vs XLA by span and wall "
             f"too):", "",
             "| case | auto ran | auto | tma | simt | XLA | copy ceiling | "
             "auto TB/s | vs XLA, busy: auto / tma / simt | auto vs XLA: span / wall | "
             "auto vs ceiling |", "|" + "---|" * 11]
    for row in r["rows"]:
        t = row["times"]
        cell = {m: us_text(t[m]) if m in t else "—" for m in ("auto", "tma", "simt")}
        vs = " / ".join(f"{row['vs_xla'][m]:.2f}" if m in t else "—"
                        for m in ("auto", "tma", "simt"))
        lines.append(f"| {row['case']} | `{row['auto_path']}` | "
                     f"{cell['auto']} | {cell['tma']} | {cell['simt']} | {us_text(t['xla'])} | "
                     f"{us_text(t['memcpy'])} | {row['busy_tbps']['auto']:.2f} | {vs} | "
                     f"{ratio_text(t, 'auto', 'xla', 'span_us')} / "
                     f"{ratio_text(t, 'auto', 'xla', 'wall_us')} | "
                     f"{row['vs_ceiling']['auto']:.2f} |")
    return "\n".join(lines)


def _window_headline(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    return tbps_headline(row["busy_tbps"]["auto"], f"{row['vs_xla']['auto']:.2f}× XLA",
                         row["case"])


RENDERERS = {"window": render_window}
HEADLINES = (Headline(2, "window", "a strided box at any (traced) start; out of bounds reads a "
                      "fill", "window", _window_headline),)
