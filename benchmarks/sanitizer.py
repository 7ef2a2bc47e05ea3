"""compute-sanitizer's results as a result file: scripts/gpu_check.sh's
sanitize stage writes one tab-separated line per run (self-test, tool, exit
status, arguments, the tool's summary line) and `benchmarks/run.py sanitizer
--tsv FILE` turns them into sanitizer_<devices>_<date>.json with the same
provenance as a benchmark's, which report.py renders into docs/benchmarks.md.

Lines: `PROGRAM\tTOOL\tRC\tARGS\tSUMMARY`, TOOL one of run, memcheck,
racecheck, synccheck; `probe\tsynccheck\tRC\tCLUSTER\tSUMMARY` for the
synccheck cluster probe; `largest_synccheck_cluster\tN`; `nvcc\tVERSION`
and `compute-sanitizer\tVERSION`.
"""

from __future__ import annotations

from typing import Any

OP = "sanitizer"
TOOLS = ("run", "memcheck", "racecheck", "synccheck")


def summarize(tsv: str) -> dict[str, Any]:
    """The result (less provenance) of gpu_check.sh's sanitize lines."""
    programs: dict[str, dict[str, Any]] = {}
    out: dict[str, Any] = {"op": OP, "programs": programs}
    for line in tsv.splitlines():
        if not line.strip():
            continue
        cells = line.split("\t")
        if cells[0] in ("nvcc", "compute-sanitizer"):
            out[cells[0].replace("-", "_")] = cells[1].strip()
        elif cells[0] == "largest_synccheck_cluster":
            out["largest_synccheck_cluster"] = int(cells[1])
        elif cells[0] == "probe":
            _, _, rc, cluster, summary = (cells + [""] * 5)[:5]
            out["synccheck_cluster_probe"] = {"cluster": int(cluster), "rc": int(rc),
                                              "summary": summary.strip()}
        else:
            prog, tool, rc, args, summary = (cells + [""] * 5)[:5]
            if tool not in TOOLS:
                raise ValueError(f"sanitizer: unknown tool {tool!r} in {line!r}")
            programs.setdefault(prog, {})[tool] = {"rc": int(rc), "args": args.strip(),
                                                   "summary": summary.strip()}
    if not programs:
        raise ValueError("sanitizer: no self-test ran")
    out["passed"] = all(x["rc"] == 0 for runs in programs.values() for x in runs.values())
    return out
