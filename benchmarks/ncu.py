"""Nsight Compute (ncu) as a subprocess: profiles a command's kernels for a
few metrics, exports the report and reads it back as CSV, so that every
number comes from ncu's own output."""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from typing import Any

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum", "gpu__time_duration.sum")
# ncu's unit names (--print-units base gives the first of each) in bytes and ns.
_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "B": 1, "KB": 1e3, "MB": 1e6,
          "GB": 1e9, "nsecond": 1, "usecond": 1e3, "msecond": 1e6, "second": 1e9, "ns": 1,
          "us": 1e3, "ms": 1e6, "s": 1e9}


def parse_csv(text: str, metrics: Sequence[str] = METRICS) -> list[dict[str, Any]]:
    """Kernels of an `ncu --csv --page details` listing, in launch order:
    {"id", "name", "metrics": {metric: value in bytes or ns}} for `metrics`
    (other rows are left out). Lines that are not CSV rows (ncu's ==PROF==
    lines) are skipped."""
    rows = list(csv.DictReader(line for line in text.splitlines() if line.startswith('"')))
    kernels: dict[int, dict[str, Any]] = {}
    for r in rows:
        k = kernels.setdefault(int(r["ID"]), {"id": int(r["ID"]), "name": r["Kernel Name"],
                                              "metrics": {}})
        if r["Metric Name"] not in metrics:
            continue
        unit = r["Metric Unit"]
        if unit not in _SCALE:
            raise ValueError(f"ncu: unknown unit {unit!r} of {r['Metric Name']}")
        # Thousands are grouped with commas in ncu's listing.
        k["metrics"][r["Metric Name"]] = float(r["Metric Value"].replace(",", "")) * _SCALE[unit]
    return [kernels[i] for i in sorted(kernels)]


def profile(argv: Sequence[str], shown: Sequence[str]) -> dict[str, Any]:
    """Runs `argv` under `ncu --clock-control none` for METRICS; returns
    {"kernels": parse_csv(...), "stdout": the command's output, "command"
    (the ncu command line with `shown` for argv), "ncu_version"}. Raises
    RuntimeError where ncu is missing or fails."""
    ncu = shutil.which("ncu")
    if ncu is None:
        raise RuntimeError("ncu (Nsight Compute) is not on PATH")
    with tempfile.TemporaryDirectory() as d:
        report = os.path.join(d, "report")
        options = ["--clock-control", "none", "--metrics", ",".join(METRICS)]
        cmd = [ncu, *options, "--export", report, "--force-overwrite", *argv]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=500)
        if run.returncode != 0:
            raise RuntimeError(f"ncu failed (rc {run.returncode}): {run.stderr[-2000:]}"
                               f"{run.stdout[-2000:]}")
        listing = subprocess.run([ncu, "--import", report + ".ncu-rep", "--csv", "--page",
                                  "details", "--print-units", "base"],
                                 capture_output=True, text=True, check=True, timeout=120)
    version = subprocess.run([ncu, "--version"], capture_output=True, text=True).stdout
    return {"kernels": parse_csv(listing.stdout), "stdout": run.stdout,
            "command": ["ncu", *options, *shown],
            "ncu_version": version.strip().splitlines()[-1:]}
