"""How the ppermute benchmark's results read (bench_ppermute.py writes them,
on two GPUs): the `ppermute` section and the README's headline row, which
report.py collects from RENDERERS and HEADLINES."""

from __future__ import annotations

from typing import Any

from tables import MIB, Headline, size_text


def render_ppermute(r: dict[str, Any]) -> str:
    # Only what bench_ppermute.topology() recorded (an older file's text
    # was added by hand).
    topo = r.get("topology")
    link = topo.get("gpu0_gpu1") if isinstance(topo, dict) else None
    lines = [f"GB/s per direction by span, {r['chain']} permutations chained per program, "
             f"`perm={r['perm']}`; GPU0–GPU1 link: {link or 'not recorded'}:", "",
             "| block per GPU | push (TMA bulk) | pull (TMA bulk) | pull (SIMT) | auto | "
             "lax.ppermute (NCCL) | auto vs NCCL |", "|---|---|---|---|---|---|---|"]
    for row in r["rows"]:
        lines.append(f"| {size_text(row['block_mib'] * MIB)} | {row['push_gbps']:.1f} | "
                     f"{row['pull_gbps']:.1f} | {row['simt_pull_gbps']:.1f} | "
                     f"{row['auto_gbps']:.1f} | {row['nccl_gbps']:.1f} | "
                     f"{row['auto_vs_nccl']:.2f}× |")
    return "\n".join(lines)


def _ppermute_headline(r: dict[str, Any]) -> str:
    row = r["rows"][-1]
    return (f"{row['auto_gbps']:.1f} GB/s per direction, {row['auto_vs_nccl']:.2f}× "
            f"`lax.ppermute` (NCCL), by span: {size_text(row['block_mib'] * MIB)} blocks")


RENDERERS = {"ppermute": render_ppermute}
HEADLINES = (Headline(7, "ppermute", "each device's block to its peer, GPU to GPU", "ppermute",
                      _ppermute_headline,
                      no_result="no result at this commit (it needs two GPUs)"),)
