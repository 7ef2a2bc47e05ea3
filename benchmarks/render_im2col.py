"""How the im2col benchmark's results read (bench_im2col.py writes them): the
`im2col` section (im2col and col2im) and the README's headline row, which
report.py collects from RENDERERS and HEADLINES."""

from __future__ import annotations

from typing import Any

from tables import WALL_NOTE, Headline, behind_text, tbps_headline, us_text


def _im2col_rows(r: dict[str, Any], ours: tuple[str, ...], xla: tuple[str, ...],
                 ceiling: str, vs: str) -> list[str]:
    """Table rows: input, µs of `ours`, `xla` and `ceiling`, TB/s of ours[0],
    then its ratios to `xla` and to the ceiling (row[vs])."""
    out = []
    for row in r["rows"]:
        t = row["times"]
        cells = [f"{tuple(row['shape'])} {row['dtype']}"]
        cells += [us_text(t[k]) for k in (*ours, *xla, ceiling)]
        cells += [f"{row['busy_tbps'][ours[0]]:.2f}",
                  " / ".join(f"{row[vs][k]:.2f}" for k in xla), f"{row[vs][ceiling]:.2f}"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def render_im2col(r: dict[str, Any]) -> str:
    lines = [f"GPU {WALL_NOTE}; TB/s and ratios by busy time:", "",
             "| input (3×3 SAME) | auto | tma | simt | XLA patches | XLA slice-concat | "
             "copy ceiling | auto TB/s | auto vs XLA: patches / slice-concat | "
             "auto vs ceiling |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += _im2col_rows(r, ("im2col_auto", "im2col_tma", "im2col_simt"),
                          ("xla_patches", "xla_slice_concat"), "memcpy", "im2col_vs")
    lines += ["", "| input | col2im | XLA grad of patches | XLA grad of slice-concat | "
              "copy ceiling | col2im TB/s | col2im vs XLA: grad of patches / of "
              "slice-concat | col2im vs ceiling |", "|---|---|---|---|---|---|---|---|"]
    lines += _im2col_rows(r, ("col2im",), ("xla_grad_patches", "xla_grad_slice_concat"),
                          "memcpy_col2im_run", "col2im_vs")
    lines += ["", f"`col2im` is {_col2im_behind(r)} (busy time)."]
    return "\n".join(lines)


def _col2im_behind(r: dict[str, Any],
                   versus: str = "XLA's transpose of slice-and-concatenate") -> str:
    return behind_text([row["col2im_vs"]["xla_grad_slice_concat"] for row in r["rows"]], versus)


def _im2col_headline(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    vs = row["im2col_vs"]
    return tbps_headline(row["busy_tbps"]["im2col_auto"],
                         f"{vs['xla_patches']:.2f}× `lax.conv_general_dilated_patches`, "
                         f"{vs['xla_slice_concat']:.2f}× slice-and-concatenate",
                         f"3×3 SAME patches of {tuple(row['shape'])} {row['dtype']}")


def _col2im_headline(r: dict[str, Any]) -> str:
    """col2im on the im2col headline's case, against XLA's transposes of
    both formulations, and how many cases it loses to the faster one."""
    row = r["rows"][0]
    vs = row["col2im_vs"]
    return tbps_headline(row["busy_tbps"]["col2im"],
                         f"{vs['xla_grad_slice_concat']:.2f}× XLA's transpose of "
                         f"slice-and-concatenate ({_col2im_behind(r, 'it')}), "
                         f"{vs['xla_grad_patches']:.2f}× that of "
                         f"`lax.conv_general_dilated_patches`",
                         f"the transpose of 3×3 SAME patches of {tuple(row['shape'])} "
                         f"{row['dtype']}")


RENDERERS = {"im2col": render_im2col}
HEADLINES = (Headline(3, "im2col", "convolution patches, GEMM-ready (`col2im`: their transpose)",
                      "im2col", _im2col_headline),
             Headline(3.5, "col2im", "the transpose of `im2col` (its gradient): patches summed "
                      "back into the image", "im2col", _col2im_headline, page="im2col"))
