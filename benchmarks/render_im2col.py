"""How the im2col benchmark's results read (bench_im2col.py writes them): the
`im2col` section (im2col, col2im, and the convolution through im2col and a
GEMM against cuDNN's) and the README's headline rows, which report.py
collects from RENDERERS and HEADLINES."""

from __future__ import annotations

from typing import Any

from tables import WALL_NOTE, Headline, behind_text, range_text, tbps_headline, us_text

# The convolution's forms, as its table heads them.
_CONV = {"im2col_gemm": "`jax_tma.im2col` + GEMM", "slice_concat_gemm": "slice-concat + GEMM",
         "xla_conv": "`lax.conv_general_dilated`", "gemm": "the GEMM alone"}


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
    return "\n".join(lines + _render_conv(r))


def _render_conv(r: dict[str, Any]) -> list[str]:
    """The convolution through im2col and a GEMM against cuDNN's and the
    slice-and-concatenate patches' GEMM; none for a result written before
    it was timed."""
    conv = r.get("conv")
    if not conv:
        return []
    rows = conv["rows"]
    lines = ["", "The convolution a CNN user runs, 3×3 SAME, stride 1, HWIO weights, each form "
                 f"in the input's dtype at the default precision; GPU {WALL_NOTE}, TFLOP/s and "
                 "ratios by busy time (a ratio is the other form's time ÷ that of "
                 "`jax_tma.im2col` + GEMM: above 1, im2col + GEMM is faster):", "",
             "| input → output channels | " + " | ".join(_CONV.values())
             + " | im2col + GEMM TFLOP/s | vs `lax.conv_general_dilated` | "
               "vs slice-concat + GEMM | the GEMM's share |",
             "|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        t, vs = row["times"], row["im2col_gemm_vs"]
        lines.append(f"| {tuple(row['shape'])} {row['dtype']} → {row['channels_out']} | "
                     + " | ".join(us_text(t[k]) for k in _CONV)
                     + f" | {row['tflops']['im2col_gemm']:.1f} | {vs['xla_conv']:.2f}× | "
                       f"{vs['slice_concat_gemm']:.2f}× | {vs['gemm']:.2f} |")
    lines += ["", "Forms: " + "; ".join(f"{_CONV[k]}: `{code}`" if k != "gemm" else
                                        f"{_CONV[k]}: {code}"
                                        for k, code in conv["forms"].items())
              + f". Checked: {conv['checked']} (tolerance "
              + ", ".join(f"{d} {v:g}" for d, v in conv["tolerance"].items())
              + f"; the largest error seen: {max(max(row['max_error'].values()) for row in rows):.3g}"
                ")."]
    lines += ["", f"`jax_tma.im2col` + GEMM is {_conv_behind(r)} (busy time)."]
    return lines


def _conv_behind(r: dict[str, Any], versus: str = "`lax.conv_general_dilated`") -> str:
    return behind_text([row["im2col_gemm_vs"]["xla_conv"] for row in r["conv"]["rows"]], versus)


def _col2im_behind(r: dict[str, Any],
                   versus: str = "XLA's transpose of slice-and-concatenate") -> str:
    return behind_text([row["col2im_vs"]["xla_grad_slice_concat"] for row in r["rows"]], versus)


def _im2col_headline(r: dict[str, Any]) -> str:
    """im2col on the first case against the strongest XLA formulation
    first (slice-and-concatenate; the one-hot convolution of
    `conv_general_dilated_patches` after it), with the range over every case,
    and the convolution through it against cuDNN's where the result has
    it."""
    row = r["rows"][0]
    vs = row["im2col_vs"]
    concat = [x["im2col_vs"]["xla_slice_concat"] for x in r["rows"]]
    text = tbps_headline(row["busy_tbps"]["im2col_auto"],
                         f"{vs['xla_slice_concat']:.2f}× slice-and-concatenate "
                         f"({range_text(concat, '{:.2f}')}× over the {len(concat)} inputs), "
                         f"{vs['xla_patches']:.2f}× `lax.conv_general_dilated_patches`",
                         f"3×3 SAME patches of {tuple(row['shape'])} {row['dtype']}")
    if r.get("conv"):
        first = r["conv"]["rows"][0]
        text += (f"; as a convolution, im2col + GEMM runs at "
                 f"{first['im2col_gemm_vs']['xla_conv']:.2f}× `lax.conv_general_dilated` on "
                 f"{tuple(first['shape'])} {first['dtype']} → {first['channels_out']} channels "
                 f"({_conv_behind(r, 'it')})")
    return text


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
