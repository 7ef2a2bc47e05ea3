"""How the ppermute benchmark's results read (bench_ppermute.py writes them,
on two GPUs): the `ppermute` section and the README's headline row, which
report.py collects from RENDERERS and HEADLINES."""

from __future__ import annotations

from typing import Any

from tables import MIB, Headline, size_text


def _ceiling_cells(row: dict[str, Any]) -> list[str]:
    """The ceiling's GB/s (both directions at once, and one way) and auto's
    ratio to it; dashes where the result has none (written before it was
    measured, or not measured: the text under the table says why)."""
    ceiling = row.get("ceiling") or {}
    if "ring" not in ceiling:
        return ["—", "—", "—"]
    lag = "" if ceiling["ring"]["back_to_back"] and ceiling["one_way"]["back_to_back"] else "*"
    return [f"{ceiling['ring']['gbps']:.1f}{lag}", f"{ceiling['one_way']['gbps']:.1f}{lag}",
            f"{row['auto_vs_ceiling']:.2f}×"]


def render_ppermute(r: dict[str, Any]) -> str:
    # Only what bench_ppermute.topology() recorded (an older file's text
    # was added by hand).
    topo = r.get("topology")
    link = topo.get("gpu0_gpu1") if isinstance(topo, dict) else None
    lines = [f"GB/s per direction by span, {r['chain']} permutations chained per program, "
             f"`perm={r['perm']}`; GPU0–GPU1 link: {link or 'not recorded'}; the link's "
             f"ceiling is `cudaMemcpyPeerAsync` of the same bytes (CUDA events):", "",
             "| block per GPU | push (TMA bulk) | pull (TMA bulk) | pull (SIMT) | auto | "
             "lax.ppermute (NCCL) | cudaMemcpyPeerAsync, every pair at once | "
             "cudaMemcpyPeerAsync, one way | auto vs NCCL | auto vs the ceiling |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        ring, one_way, vs = _ceiling_cells(row)
        lines.append(f"| {size_text(row['block_mib'] * MIB)} | {row['push_gbps']:.1f} | "
                     f"{row['pull_gbps']:.1f} | {row['simt_pull_gbps']:.1f} | "
                     f"{row['auto_gbps']:.1f} | {row['nccl_gbps']:.1f} | {ring} | {one_way} | "
                     f"{row['auto_vs_nccl']:.2f}× | {vs} |")
    ceilings = [row.get("ceiling") or {} for row in r["rows"]]
    notes = [f"The ceiling: {r['ceiling']}."] if "ceiling" in r else []
    if any("*" in _ceiling_cells(row)[0] for row in r["rows"]):
        notes.append("*: the host queued that size's copies for longer than the streams were "
                     "held, so they may not have run back to back (the ceiling reads low).")
    if any(not all(c[k]["peer_access"]) for c in ceilings if "ring" in c
           for k in ("ring", "one_way")):
        notes.append("Some pair of GPUs has no peer access: the driver staged its copies "
                     "through the host, which is no link's ceiling.")
    missing = sorted({c["not_measured"] for c in ceilings if "not_measured" in c})
    if missing:
        notes.append("The ceiling was not measured: " + "; ".join(missing) + ".")
    elif not any("ring" in c for c in ceilings):
        notes.append("This result predates the ceiling's measurement (`cudaMemcpyPeerAsync`).")
    if notes:
        lines += ["", " ".join(notes)]
    return "\n".join(lines)


def _ppermute_headline(r: dict[str, Any]) -> str:
    row = r["rows"][-1]
    text = (f"{row['auto_gbps']:.1f} GB/s per direction, {row['auto_vs_nccl']:.2f}× "
            f"`lax.ppermute` (NCCL)")
    if "auto_vs_ceiling" in row:
        text += f", {row['auto_vs_ceiling']:.2f}× `cudaMemcpyPeerAsync` (the link's ceiling)"
    return text + f", by span: {size_text(row['block_mib'] * MIB)} blocks"


RENDERERS = {"ppermute": render_ppermute}
HEADLINES = (Headline(7, "ppermute", "each device's block to its peer, GPU to GPU", "ppermute",
                      _ppermute_headline,
                      no_result="no result at this commit (it needs two GPUs)"),)
