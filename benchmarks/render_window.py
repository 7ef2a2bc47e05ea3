"""How the window benchmark's results read (bench_window.py writes them): the
`window` section and the README's headline row, which report.py collects from
RENDERERS and HEADLINES."""

from __future__ import annotations

from typing import Any

from tables import WALL_NOTE, Headline, behind_text, ratio_text, tbps_headline, us_text


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
    beaten = [f"{_whole_case(r['rows'], i)}: `method=\"{m}\"` "
              f"{row['times'][m]['busy_us']:.1f} µs against `auto`'s "
              f"{row['times']['auto']['busy_us']:.1f} (busy)"
              for i, row in enumerate(r["rows"]) for m in ("tma", "simt")
              if _beats(row["times"], m)]
    lines += ["", f"Where a forced method beat `auto` by {BEAT_MARGIN:.0%} or more on busy time "
                  f"and span alike: " + ("; ".join(beaten) if beaten else "nowhere") + "."]
    return "\n".join(lines)


# A forced method beats `auto` where it takes this fraction less time by busy
# time and by span alike (less than that is within a run's noise).
BEAT_MARGIN = 0.03


def _whole_case(rows: list[dict[str, Any]], i: int) -> str:
    """Row i's case, "the same ..." spelt out from the row it refers to."""
    case = rows[i]["case"]
    if case.startswith("the same "):
        before = next(x["case"] for x in reversed(rows[:i]) if not x["case"].startswith("the same"))
        case = before.split(" at ")[0] + case.removeprefix("the same")
    return case


def _beats(t: dict[str, dict[str, float]], method: str) -> bool:
    return method in t and all(t[method][c] < (1 - BEAT_MARGIN) * t["auto"][c]
                               for c in ("busy_us", "span_us"))


def _window_headline(r: dict[str, Any]) -> str:
    """The case where `auto` does worst against XLA (by busy time), and how
    many of the cases it loses: a headline of one dtype's case alone would
    hide the other's (bf16 runs further below XLA than f32)."""
    rows = r["rows"]
    row = min(rows, key=lambda x: x["vs_xla"]["auto"])
    ratios = [x["vs_xla"]["auto"] for x in rows]
    return tbps_headline(row["busy_tbps"]["auto"], f"{row['vs_xla']['auto']:.2f}× XLA",
                         f"{row['case']} (the worst case: `auto` is {behind_text(ratios, 'XLA')})")


RENDERERS = {"window": render_window}
HEADLINES = (Headline(2, "window", "a strided box at any (traced) start; out of bounds reads a "
                      "fill", "window", _window_headline),)
