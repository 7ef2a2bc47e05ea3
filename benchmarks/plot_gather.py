"""The README's plot: GB/s (read + write) against slab size for jax_tma.gather
and XLA, from the sweep of a `python benchmarks/run.py gather --out X.json`
result file. Needs matplotlib.

    python benchmarks/plot_gather.py X.json gather_sweep.svg
"""

from __future__ import annotations

import json
import sys

SERIES = (("auto", "jax_tma.gather"), ("tma", "jax_tma.gather(method='tma')"),
          ("simt", "jax_tma.gather(method='simt')"), ("xla_take", "XLA jnp.take"),
          ("xla_take_unique", "XLA, unique_indices=True"),
          ("memcpy", "cudaMemcpyAsync (copy ceiling)"))


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = result["sweep"]
    sizes = [s["slab_bytes"] for s in sweep]
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, label in SERIES:
        ax.plot(sizes, [s[key] for s in sweep], marker="o",
                linestyle="--" if key == "memcpy" else "-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [f"{b} B" if b < 1024 else f"{b // 1024} KiB" for b in sizes],
                  rotation=45)
    ax.set_xlabel("slab size")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title(f"gather of random slabs, {result.get('device', '')} ({result.get('date', '')})")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        plot(json.load(f), sys.argv[2])
