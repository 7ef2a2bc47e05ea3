"""How the bulk copy's pipeline-shape sweep reads (bench_tune_bulk.py writes
it): the `tune-bulk` section, which report.py collects from RENDERERS."""

from __future__ import annotations

from typing import Any

from tables import size_text

# The family whose code these results measure (report.py's staleness): the
# sweep times copy's bulk kernel.
FAMILY = "copy"


def render_tune_bulk(r: dict[str, Any]) -> str:
    lines = ["| size | shapes swept | best shape | best TB/s | shipped shape (schedule) | "
             "its rank | shipped ÷ best time |", "|---|---|---|---|---|---|---|"]
    for e in r["summary"]:
        lines.append(f"| {size_text(e['bytes'])} | {e['shapes']} | {e['best']} | "
                     f"{e['best_tbps']:.3f} | {e['shipped']} ({e['shipped_schedule']}) | "
                     f"{e['shipped_rank']} | {1 / e['shipped_vs_best']:.3f}× |")
    return "\n".join(lines)


RENDERERS = {"tune-bulk": render_tune_bulk}
