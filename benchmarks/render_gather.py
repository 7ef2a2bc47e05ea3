"""How the gather/scatter benchmark's results read (bench_gather.py writes
them): the `gather` section with issue 18's targets and the Pallas kernel
beside `auto`, the README's `gather-limits`
bullet drawn from it, the headline rows of gather and scatter, and the GB/s
over slab size plot, which report.py collects from RENDERERS, DERIVED,
HEADLINES and PLOTS."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tables import (MIB, UNRECORDED, WALL_MIN_US, WALL_NOTE, Headline, Plot, bare_case,
                    behind_text, build_cells, mark, range_text, ratio_text, size_text, target_met,
                    tbps_headline, us_text)


# What L2 holds on an H100 (50 MiB): calls that rotate through less read
# their data from L2 (the tables say "L2-warm").
L2_BYTES = 50 * MIB
_GATHER_LABELS = {"memcpy": "ceiling", "xla": "XLA", "xla_hinted": "XLA hinted",
                  "pallas": "Pallas"}
# The sweep's cases and their labels in the plot.
_GATHER_SWEEP = {"auto": "jax_tma.gather", "tma": "jax_tma.gather(method='tma')",
                 "simt": "jax_tma.gather(method='simt')", "xla": "XLA jnp.take",
                 "xla_hinted": "XLA x.at[i].get, hinted",
                 "memcpy": "cudaMemcpyAsync (copy ceiling)"}
# The XLA formulations' names in a headline: the plain form and the hinted one.
_FORM = {"xla": "plain", "xla_hinted": "hinted"}
# The Pallas kernel's case (bench_gather.PALLAS) and its name in a headline.
_PALLAS = "pallas"
_PALLAS_HEADLINE = "the simplest Pallas kernel"
_GATHER_TARGET_TEXT = {"pages": "gather of pages", "set": "in-place page set",
                       "rows 512": "gather of 512 B rows", "rows 128": "gather of 128 B rows",
                       "add": "row scatter-add", "decode": "paged decode step"}


def _dtype_order(dtypes: list[str], use: str | None) -> list[str]:
    """The use case's dtype first, the uint32 control last."""
    return sorted(dict.fromkeys(dtypes), key=lambda d: (d != use, d == "uint32", d))


def _gather_key(row: dict[str, Any]) -> str:
    """The row's case key (results written before rows recorded theirs: from
    the case's kind and text)."""
    if "key" in row:
        return row["key"]
    kind = row.get("kind", "")
    if kind in ("scatter set", "scatter add", "decode step"):
        return {"scatter set": "set", "scatter add": "add", "decode step": "decode"}[kind]
    m = re.search(r"rows of (\d+) B", row["case"])
    return f"rows {m.group(1)}" if m else "pages"


def _ratios(t: dict[str, dict[str, float]], comps: tuple[str, ...], clock: str) -> str:
    return " / ".join(ratio_text(t, "auto", c, clock) for c in comps)


def gather_targets(r: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 18's targets that the gather result's rows carry, judged by
    target_met: [{"target", "case", "dtype", "comparator", "ratio", "busy",
    "span", "wall" (None unless shown), "met", "bound"}], where "bound" is
    the highest ratio to the comparator that a call at the copy ceiling
    would reach (by busy time; None where the row has no ceiling)."""
    out = []
    for row in r["rows"]:
        t = row["times"]
        for comp, ratio in row.get("targets", {}).items():
            wall = ratio_text(t, "auto", comp, "wall_us")
            out.append({"target": f"{_GATHER_TARGET_TEXT.get(_gather_key(row), row['case'])}: "
                                  f"`auto` ≥ {ratio:g}× {_GATHER_LABELS[comp]}",
                        "case": bare_case(row), "dtype": row.get("dtype", UNRECORDED),
                        "comparator": comp, "ratio": ratio,
                        "busy": t[comp]["busy_us"] / t["auto"]["busy_us"],
                        "span": t[comp]["span_us"] / t["auto"]["span_us"],
                        "wall": None if wall == "—" else float(wall),
                        "met": target_met(row, comp, ratio),
                        "bound": (t[comp]["busy_us"] / t["memcpy"]["busy_us"]
                                  if "memcpy" in t else None)})
    return out


def _render_gather_targets(r: dict[str, Any]) -> list[str]:
    lines = ["Issue 18's targets, judged at the dtype of their use case (the row scatter-add at "
             "float32 too): a target is met where `auto` reaches it by busy time and by span "
             f"alike; the wall clock is given from {WALL_MIN_US:g} µs. \"At the ceiling\" is "
             f"the ratio a call moving its bytes at the copy ceiling (`cudaMemcpyAsync` of the "
             f"same bytes, same run) would reach: a target above it is above the hardware's "
             f"limit.", "",
             "| target | case | dtype | clock | measured | at the ceiling | met |",
             "|---|---|---|---|---|---|---|"]
    for t in gather_targets(r):
        wall = f", wall {t['wall']:.2f}×" if t["wall"] is not None else ""
        bound = "—" if t["bound"] is None else f"{t['bound']:.2f}×"
        beyond = (" (above the ceiling)" if not t["met"] and t["bound"] is not None
                  and t["bound"] < t["ratio"] else "")
        lines.append(f"| {t['target']} | {t['case']} | {t['dtype']} | busy and span | "
                     f"{t['busy']:.2f}× busy, {t['span']:.2f}× span{wall} | {bound} | "
                     f"{mark(t['met'])}{beyond} |")
    c = r["chained_tiny_gathers"]
    lines.append(f"| chained tiny gathers: ≤ {c['target_gap_us']:g} µs per call over a minimal "
                 f"FFI kernel | {c['ops']} chained gathers of one {size_text(c['bytes'])} page "
                 f"(L2-warm) | {c.get('dtype', 'uint32')} | span | {c['gap_us']:+.2f} µs | — | "
                 f"{mark(c['target_met'])} |")
    return lines


def _rotation(row: dict[str, Any]) -> str:
    """How many index sets a gather row's calls rotate through, and the slab
    bytes they read together ("L2-warm" below L2's size)."""
    sets = row.get("inputs", 1)
    read = sets * row["bytes"] // 2
    return f"{sets} ({size_text(read)}{': L2-warm' if read < L2_BYTES else ''})"


def _render_pallas(r: dict[str, Any]) -> list[str]:
    """The Pallas kernel beside `auto` on the cases that timed it: µs and
    ratios by each clock, every case listed (ties too); none for a result
    written before Pallas was timed."""
    rows = [row for row in r["rows"] if _PALLAS in row["times"]]
    failed = [row for row in r["rows"] if _PALLAS in row.get("xla_rejects", {})]
    if not rows and not failed:
        return []
    kernels = r.get("pallas_kernels", {})
    lines = ["", "The in-JAX peer: the simplest Pallas kernel a user would write, "
                 + "; ".join(kernels.values())
                 + f". GPU {WALL_NOTE}; `auto` vs Pallas is Pallas's time ÷ auto's (above 1, "
                   f"`auto` is faster; near 1, a tie):", "",
             "| case | dtype | auto | Pallas | auto vs Pallas: busy | span | wall |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        t = row["times"]
        lines.append(f"| {bare_case(row)} | {row.get('dtype', UNRECORDED)} | "
                     f"{us_text(t['auto'])} | {us_text(t[_PALLAS])} | "
                     + " | ".join(ratio_text(t, "auto", _PALLAS, clock)
                                  for clock in ("busy_us", "span_us", "wall_us")) + " |")
    if rows:
        ratios = [row["times"][_PALLAS]["busy_us"] / row["times"]["auto"]["busy_us"]
                  for row in rows]
        lines += ["", f"By busy time `auto` is {behind_text(ratios, 'Pallas')}."]
    return lines


def render_gather(r: dict[str, Any]) -> str:
    cols = ("auto", "tma", "simt", "deterministic", "xla", "xla_hinted", "memcpy")
    comps = ("xla", "xla_hinted", "memcpy")
    lines = _render_gather_targets(r)
    lines += ["", f"GPU {WALL_NOTE}; ratios of `auto` to XLA, XLA hinted and the copy ceiling "
                  f"(their time ÷ auto's) by each clock:", "",
              "| case | dtype | auto | tma | simt | deterministic | XLA | XLA hinted | "
              "copy ceiling | auto TB/s (busy) | auto vs XLA / hinted / ceiling: busy | span | "
              "wall |", "|" + "---|" * 13]
    for row in r["rows"]:
        t = row["times"]
        cells = [bare_case(row), row.get("dtype", UNRECORDED)]
        cells += [us_text(t[k]) if k in t else "—" for k in cols]
        cells += [f"{row['busy_tbps']['auto']:.2f}"]
        cells += [_ratios(t, comps, clock) for clock in ("busy_us", "span_us", "wall_us")]
        lines.append("| " + " | ".join(cells) + " |")
    dtypes = _dtype_order([row["dtype"] for row in r["rows"] if "dtype" in row],
                          r.get("use_dtype"))
    keyed: dict[str, dict[str, dict[str, Any]]] = {}
    for row in r["rows"]:
        if "dtype" in row:
            keyed.setdefault(_gather_key(row), {})[row["dtype"]] = row
    if len(dtypes) > 1:
        lines += ["", "The dtype's effect: each case's speed as a fraction of the copy ceiling "
                      "(ceiling time ÷ the case's, busy) at each dtype, XLA / XLA hinted / "
                      "`auto`:", "",
                  "| case | " + " | ".join(dtypes) + " |", "|---|" + "---|" * len(dtypes)]
        for key, rows in keyed.items():
            cells = []
            for d in dtypes:
                if d not in rows:
                    cells.append("—")
                    continue
                t = rows[d]["times"]
                cells.append(" / ".join(ratio_text(t, k, "memcpy", "busy_us")
                                        for k in ("xla", "xla_hinted", "auto")))
            lines.append(f"| {_GATHER_TARGET_TEXT.get(key, key)} | " + " | ".join(cells) + " |")
    lines += ["", "XLA formulations:"]
    lines += [f"- {kind}: " + "; ".join(f"{_GATHER_LABELS[k]} `{code}`" for k, code in f.items())
              for kind, f in r["xla_formulations"].items()]
    for row in r["rows"]:
        for name, why in row.get("xla_rejects", {}).items():
            fails = "the Pallas kernel fails" if name == _PALLAS else \
                f"XLA rejects {_GATHER_LABELS[name]}"
            lines.append(f"- {bare_case(row)} ({row.get('dtype')}): {fails}: `{why}`")
        if "per_pool" in row["times"]:
            lines.append(f"- {row['case'].split(':')[0]}, auto: both pools as the tables of one "
                         f"`jax_tma.scatter` and one `jax_tma.gather`; with a call per pool "
                         f"instead: {us_text(row['times']['per_pool'])} µs "
                         f"({ratio_text(row['times'], 'per_pool', 'xla_hinted', 'busy_us')}× XLA "
                         f"hinted by busy time)")
        if "xla_gather_kernels" in row:
            n = row["xla_gather_kernels"]
            lines.append(f"- {row['case'].split(':')[0]}: XLA's compiled step gathers K and V "
                         f"in {n['xla']} kernel{'s' * (n['xla'] != 1)} (hinted: "
                         f"{n['xla_hinted']}), counted in its optimized HLO")
    lines += _render_pallas(r)
    c = r["chained_tiny_gathers"]
    g, m = c["per_op"]["gather"], c["per_op"]["minimal_ffi"]
    lines += ["", f"{c['ops']} chained gathers of one {size_text(c['bytes'])} page in one "
                  f"`jit` (L2-warm: every call moves the same page): {g['span_us']:.2f} µs per "
                  f"call by span ({g['busy_us']:.2f} busy); {c['minimal_ffi']} of the same page "
                  f"(a minimal FFI kernel) chained alike: {m['span_us']:.2f} µs "
                  f"({m['busy_us']:.2f}); the gather costs {c['gap_us']:+.2f} µs per call more "
                  f"(target ≤ {c['target_gap_us']:g} µs {mark(c['target_met'])})."]
    others = [f"`method='{k[len('gather_'):]}'` {v['span_us']:.2f} µs ({v['busy_us']:.2f})"
              for k, v in c["per_op"].items() if k.startswith("gather_")]
    if others:
        lines[-1] += " The other methods, chained alike: " + ", ".join(others) + "."
    if "small_gathers" in r:
        lines += ["", "Small gathers, GPU busy µs per call (the profiler's clock ticks every "
                      "32 ns); the calls of a case rotate through index sets of distinct rows "
                      "(count, and the slab bytes they read together; a copy ceiling's inputs "
                      "rotate alike):", "",
                  "| case | dtype | index sets | auto | tma | simt | XLA | XLA hinted | "
                  "copy ceiling | auto vs XLA / hinted: busy | span |", "|" + "---|" * 11]
        for row in r["small_gathers"]:
            t = row["times"]
            lines.append(f"| {bare_case(row)} | {row.get('dtype', UNRECORDED)} | "
                         f"{_rotation(row)} | "
                         + " | ".join(f"{t[k]['busy_us']:.2f}" if k in t else "—"
                                      for k in _GATHER_SWEEP)
                         + f" | {_ratios(t, ('xla', 'xla_hinted'), 'busy_us')} | "
                           f"{_ratios(t, ('xla', 'xla_hinted'), 'span_us')} |")
    sweep = r["sweep"]
    lines += ["", f"GB/s by busy time against slab size, each case gathering "
                  f"{size_text(sweep['gathered_bytes'])} of random distinct slabs of a "
                  f"{size_text(sweep['table_bytes'])} {sweep.get('dtype', 'uint32')} table:", "",
              "| slab | auto | tma | simt | XLA | XLA hinted | copy ceiling | auto vs XLA / "
              "hinted: busy | span |", "|" + "---|" * 9]
    for row in sweep["rows"]:
        gbps, t = row["busy_tbps"], row["times"]
        lines.append(f"| {size_text(row['slab_bytes'])} | "
                     + " | ".join(f"{gbps[k] * 1e3:.0f}" for k in _GATHER_SWEEP)
                     + f" | {_ratios(t, ('xla', 'xla_hinted'), 'busy_us')} | "
                       f"{_ratios(t, ('xla', 'xla_hinted'), 'span_us')} |")
    return "\n".join(lines)


def _find(rows: list[dict[str, Any]], key: str, dtype: str | None = None) -> dict | None:
    return next((row for row in rows if _gather_key(row) == key
                 and (dtype is None or row.get("dtype") == dtype)), None)


def render_gather_limits(results: dict[str, tuple[str, dict[str, Any]]]) -> str | None:
    """The README's limits bullet on gather's speed, every number from the
    gather result; None without one."""
    if "gather" not in results:
        return None
    r = results["gather"][1]
    use = r.get("use_dtype")
    device = (r.get("provenance") or {}).get("devices", ["?"])[0]

    def vs(row, comp, clock="busy_us"):
        return ratio_text(row["times"], "auto", comp, clock) if row else "—"

    rows, parts = r["rows"], []
    sweep = r["sweep"]["rows"]
    sweep_dtype = r["sweep"].get("dtype", "uint32")
    parts.append(f"over the slab sweep ({sweep_dtype}) `auto` runs at "
                 f"{range_text([row['vs']['auto']['xla'] for row in sweep], '{:.2f}')}× "
                 f"`jnp.take` and "
                 f"{range_text([row['vs']['auto']['xla_hinted'] for row in sweep], '{:.2f}')}× "
                 f"its hinted form")
    fits = [x for x in (_find(rows, "rows 128", use), _find(rows, "rows 512", use)) if x]
    pages = _find(rows, "pages", use)
    if fits and pages:
        parts.append(f"{use or 'its'} rows of 128–512 B at "
                     f"{range_text([x['vs']['auto']['memcpy'] for x in fits], '{:.2f}')}× the "
                     f"copy ceiling, pages at {vs(pages, 'memcpy')}× the copy ceiling, "
                     f"{vs(pages, 'xla_hinted')}× the hinted gather and {vs(pages, 'xla')}× "
                     f"`jnp.take`")
    page_set = _find(rows, "set", use)
    if page_set:
        parts.append(f"the in-place page set at {vs(page_set, 'xla_hinted')}× XLA's hinted "
                     f"`.at[].set(..., unique_indices=True)` and {vs(page_set, 'xla')}× its "
                     f"plain form")
    small = {(_gather_key(x).split()[-1], x.get("dtype")): x for x in r.get("small_gathers", [])}
    for count in ("64", "1024"):
        x = small.get((count, use)) or small.get((count, None))
        if x:
            t = x["times"]
            hinted = (f" and its hinted form's {t['xla_hinted']['busy_us']:.2f}"
                      if "xla_hinted" in t else "")
            parts.append(f"a gather of {int(count):,} rows of 2 KiB ({x.get('dtype', 'uint32')}, "
                         f"index sets rotated: {_rotation(x)}) takes {t['auto']['busy_us']:.2f} "
                         f"µs against `jnp.take`'s {t['xla']['busy_us']:.2f}{hinted}")
    c = r["chained_tiny_gathers"]
    parts.append(f"one {size_text(c['bytes'])} page chained {c['ops']} times costs "
                 f"{c['gap_us']:+.2f} µs per call over a minimal FFI kernel (by span, L2-warm)")
    decode = _find(rows, "decode")
    if decode:
        text = (f"the paged decode step ({decode.get('dtype', 'bfloat16')} pools) runs at "
                f"{vs(decode, 'xla_hinted')}× its hinted XLA form with K and V as the tables of "
                f"one call")
        if "per_pool" in decode["times"]:
            text += (f", {ratio_text(decode['times'], 'per_pool', 'xla_hinted', 'busy_us')}× with "
                     f"a call per pool")
        if "xla_gather_kernels" in decode:
            n = decode["xla_gather_kernels"]["xla_hinted"]
            text += f" (XLA's hinted step gathers both pools in {n} kernel{'s' * (n != 1)})"
        parts.append(text)
    adds = [x for x in rows if _gather_key(x) == "add"]
    if adds:
        parts.append("the row scatter-add runs at " + ", ".join(
            f"{vs(x, 'xla')}× XLA's " + (f"in {x['dtype']}" if "dtype" in x else
                                         f"({x['case']})") for x in adds))
    return (f"- `gather`/`scatter` speed ({device}, GPU busy time, the gather results above; "
            f"ratios are XLA's time ÷ `auto`'s): " + "; ".join(parts) + ". `auto` moves slabs "
            "of up to 4 KiB and gathers of up to 64 MiB with a thread per 16-byte vector, the "
            "layout of XLA's own gather kernel, in 32-bit arithmetic where the table allows.")


def _slab_headline(key: str, kind: str) -> Callable[[dict[str, Any]], str]:
    """The headline of the `key` case at the use case's dtype: `auto`'s TB/s,
    its ratio to each XLA formulation of `kind` that the result measured
    (plain and hinted) and to the Pallas kernel where it was timed, the
    fastest of them first (the strongest baseline leads), and to the copy
    ceiling."""
    def headline(r: dict[str, Any]) -> str:
        row = _find(r["rows"], key, r.get("use_dtype")) or _find(r["rows"], key)
        pages = _find(r["rows"], "pages", row.get("dtype"))
        t = row["times"]
        forms = {k: f"{_FORM[k]} `{code}`" for k, code in r["xla_formulations"][kind].items()
                 if k in t}
        if _PALLAS in t:
            forms[_PALLAS] = _PALLAS_HEADLINE
        versus = [f"{ratio_text(t, 'auto', k, 'busy_us')}× {forms[k]}"
                  for k in sorted(forms, key=lambda k: t[k]["busy_us"])]
        # The in-place case names "those pages" of the gather case before it.
        case = re.sub(r"those [\d,]+ pages", bare_case(pages).split(" ", 1)[1],
                      bare_case(row)) if pages else bare_case(row)
        return tbps_headline(row["busy_tbps"]["auto"],
                             ", ".join(versus) + f", {ratio_text(t, 'auto', 'memcpy', 'busy_us')}"
                                                 f"× the copy ceiling",
                             f"{case} ({row.get('dtype', 'uint32')})")
    return headline


def _plot(ax: Any, r: dict[str, Any]) -> None:
    rows = r["sweep"]["rows"]
    sizes = [row["slab_bytes"] for row in rows]
    for case, label in _GATHER_SWEEP.items():
        ax.plot(sizes, [row["busy_tbps"][case] * 1e3 for row in rows], marker="o",
                linestyle="--" if case == "memcpy" else "-", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes, [size_text(b) for b in sizes], rotation=45)
    ax.set(xlabel="slab size", ylabel="GB/s (read + write, by busy time)",
           title=f"gather of random slabs of a {size_text(r['sweep']['table_bytes'])} "
                 f"{r['sweep'].get('dtype', 'uint32')} table, "
                 f"{r['provenance']['devices'][0]}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def render_wheel(r: dict[str, Any]) -> str:
    row = r["rows"][0]
    t = row["times"]
    return (f"{bare_case(row)} ({row.get('dtype')}), {WALL_NOTE}: `auto` {us_text(t['auto'])}, "
            f"XLA `jnp.take` {us_text(t['xla'])}, copy ceiling {us_text(t['memcpy'])}.")


def render_wheel_build(results: dict[str, tuple[str, dict[str, Any]]]) -> str:
    """The case `run.py wheel` timed on the wheel beside the same case of the
    gather result (the measured build)."""
    wheel = results.get("wheel")
    if wheel is None:
        return ("No wheel timing at this commit: `scripts/gpu_check.sh bench` times one case on "
                "the `cp312-abi3` wheel too (`benchmarks/run.py wheel`).")
    gather = results.get("gather")
    wrow = wheel[1]["rows"][0]
    same = next((row for row in (gather[1]["rows"] if gather else [])
                 if row["case"] == wrow["case"]), None)
    lines = [f"One case on the wheel as well, in a run of its own on the same GPU "
             f"(`{wheel[0]}`), {WALL_NOTE}:", "",
             "| install | CUDA architectures | FFI API | case | `auto` | XLA `jnp.take` | "
             "copy ceiling | auto vs XLA: busy / span |", "|---|---|---|---|---|---|---|---|"]
    for r, row in ((gather[1] if gather else None, same), (wheel[1], wrow)):
        if r is None or row is None:
            continue
        t = row["times"]
        lines.append("| " + " | ".join(build_cells(r)[:3]) + f" | {bare_case(row)} "
                     f"({row.get('dtype')}) | {us_text(t['auto'])} | {us_text(t['xla'])} | "
                     f"{us_text(t['memcpy'])} | {ratio_text(t, 'auto', 'xla', 'busy_us')} / "
                     f"{ratio_text(t, 'auto', 'xla', 'span_us')} |")
    return "\n".join(lines)


RENDERERS = {"gather": render_gather, "wheel": render_wheel}
DERIVED = {"gather-limits": render_gather_limits, "wheel": render_wheel_build}
HEADLINES = (
    Headline(5, "gather", "whole slabs (rows, pages) picked by index", "gather",
             _slab_headline("pages", "gather")),
    Headline(6, "scatter", "slabs set or added by index, in place", "gather",
             _slab_headline("set", "scatter set"), page="gather"),
)
PLOTS = (Plot("gather", "gather_gbps.png", _plot),)
