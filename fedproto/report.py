"""Rendering run reports: rich tables for the terminal and matplotlib plots.

The report itself (:class:`~fedproto.metering.RunReport`) is data; this module only presents it.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from fedproto.metering import RunReport, is_setup_phase

__all__ = ["render_privacy", "render_report", "render_summary", "plot_report", "format_value", "MAX_TABLE_ROWS"]


#: Tables with more rows than this are summarised (first rows, a count of the rest, the totals)
#: unless ``full=True``.
MAX_TABLE_ROWS = 20
#: Rows a summarised table keeps.
HEAD_ROWS = 15


def format_value(value: Any, *, integer: bool = False) -> str:
    """One value as the tables print it.

    Integers (bytes, counts) get thousands separators (scientific notation from 10**15); floats get 4 significant digits (with
    separators from 10,000 on, scientific notation from 10**15 or below 10**-4); ``integer=True``
    rounds a float that counts something (e.g. bytes per round) to an integer. Booleans print as
    yes/no, ``None`` as a dash, anything else as ``str``.

    Args:
        value: the value.
        integer: the value counts something (print a float rounded, with separators).
    """
    if value is None:
        return "-"
    if isinstance(value, bool | np.bool_):
        return "yes" if value else "no"
    if isinstance(value, numbers.Integral):
        # exact counts beyond 10**15 (a grid's B^d bins, say) are read as magnitudes
        number = int(value)
        if abs(number) < 10**15:
            return f"{number:,}"
        digits = str(abs(number))  # not float(): B^d may pass 10**308
        return f"{'-' if number < 0 else ''}{digits[0]}.{digits[1:4]}e+{len(digits) - 1}"
    if isinstance(value, numbers.Real):
        number = float(value)
        if not math.isfinite(number):
            return str(number)
        if integer:
            return f"{round(number):,}"
        if number == 0:
            return "0"
        rounded = float(f"{number:.4g}")
        if 1e4 <= abs(rounded) < 1e15:
            return f"{rounded:,.0f}"
        return f"{number:.4g}"
    return str(value)


def _counts_something(name: str) -> bool:
    """A row's name says its value is a count of bytes, messages, rounds..."""
    words = name.lower().replace("_", " ").split()
    return any(word in ("bytes", "messages", "frames", "rounds", "parties") for word in words)


def _add_rows(
    table: Table, rows: Sequence[Sequence[str]], *, full: bool, total: Sequence[str] | None = None
) -> None:
    """Add ``rows``; more than :data:`MAX_TABLE_ROWS` (and not ``full``) become the first
    :data:`HEAD_ROWS`, a "... N more rows ..." line and ``total`` (the sums over every row)."""
    if full or len(rows) <= MAX_TABLE_ROWS:
        for row in rows:
            table.add_row(*row)
        return
    for row in rows[:HEAD_ROWS]:
        table.add_row(*row)
    blank = [""] * (len(table.columns) - 1)
    table.add_row(f"... {len(rows) - HEAD_ROWS:,} more rows ...", *blank, style="dim")
    if total is not None:
        table.add_section()
        table.add_row(*total, style="bold")
    table.caption = f"{HEAD_ROWS} of {len(rows):,} rows shown (--full prints them all)"
    table.caption_justify = "left"


def render_summary(console: Console, title: str, rows: Mapping[str, Any], *, full: bool = False) -> None:
    """Print ``rows`` (label -> value) as a two-column table.

    Args:
        console: where to print.
        title: the table's title.
        rows: label -> value (see :func:`format_value`; a float whose label mentions bytes,
            messages, frames, rounds or parties prints as an integer).
        full: print every row even when there are more than :data:`MAX_TABLE_ROWS`.
    """
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    body = [(name, format_value(value, integer=_counts_something(name))) for name, value in rows.items()]
    _add_rows(table, body, full=full)
    console.print(table)


def render_privacy(console: Console, ledger: Mapping[str, Any], *, full: bool = False) -> None:
    """Print a run's privacy ledger (the report's ``privacy``) as the table "Privacy ledger".

    One row per noisy release (round, what is released and its shape, sensitivity, noise scale,
    epsilon and, for Gaussian releases, the GDP mu), then the composed total; the title names
    the mechanism, the accountant and the delta every epsilon is stated at, the caption the
    guarantee. Epsilons are in natural-log units.

    Args:
        console: where to print.
        ledger: the ledger dict (layout of the report schema's ``privacy``).
        full: print every release even when there are more than :data:`MAX_TABLE_ROWS`.
    """
    releases = ledger["releases"]
    gaussian = "gdp_mu" in ledger
    mechanisms = ", ".join(dict.fromkeys(r["mechanism"] for r in releases))
    norms = "/".join(dict.fromkeys(r["sensitivity_norm"].upper() for r in releases))
    accountant = {"gdp": "GDP"}.get(ledger["accountant"], ledger["accountant"].replace("_", " "))
    title = f"Privacy ledger: {mechanisms} noise, {accountant} accountant"
    if ledger["delta"]:
        title += f", epsilons at delta {format_value(ledger['delta'])}"
    table = Table(title=title, title_justify="left", caption=ledger["definition"], caption_justify="left")
    columns = ["round", "release", f"{norms} sensitivity", "noise std" if gaussian else "noise scale b", "epsilon"]
    for name in columns:
        table.add_column(name, justify="left" if name == "release" else "right")
    if gaussian:
        table.add_column("GDP mu", justify="right")
    rows = []
    for release in releases:
        shape = "×".join(str(n) for n in release["shape"])
        row = [
            format_value(release["round_idx"]),
            f"{release['name']} [{shape}]" if shape else release["name"],
            format_value(release["sensitivity"]),
            format_value(release["noise_scale"]),
            format_value(release["epsilon"]),
        ]
        if gaussian:
            row.append(format_value(release["gdp_mu"]))
        rows.append(row)
    total = ["all", "composed", "", "", format_value(ledger["epsilon"])]
    if gaussian:
        total.append(format_value(ledger["gdp_mu"]))
    _add_rows(table, rows, full=full, total=total)
    if full or len(rows) <= MAX_TABLE_ROWS:  # else _add_rows put the total below the first rows
        table.add_section()
        table.add_row(*total, style="bold")
    console.print(table)


def render_report(
    console: Console,
    report: RunReport,
    role_of: Callable[[str], str],
    *,
    phases: Sequence[str] = (),
    full: bool = False,
) -> None:
    """Print rounds, bytes per role, per round and per link.

    Args:
        console: where to print.
        report: the run report.
        role_of: party -> role name.
        phases: the protocol's phases in message order (others sort after them by name).
        full: print long tables whole; by default a table of more than :data:`MAX_TABLE_ROWS`
            rows shows its first :data:`HEAD_ROWS` and its totals (the JSON report has them all).
    """
    render_summary(
        console,
        f"Communication ({report.transport})",
        {
            "algorithm rounds": report.algorithm_rounds,
            "communication rounds": report.communication_rounds,
            "messages": report.messages,
            "payload bytes (all frames, envelopes included)": report.payload_bytes,
            "  of which setup bytes": report.setup_bytes,
            "transport framing overhead bytes": report.framing_overhead_bytes,
            **({"connection handshake bytes": report.handshake_bytes} if report.handshake_bytes else {}),
            **({"TLS record overhead bytes": report.tls_overhead_bytes} if report.tls_overhead_bytes else {}),
            **({"relay overhead bytes (star)": report.relay_overhead_bytes} if report.relay_overhead_bytes else {}),
            **(
                {"resumption overhead bytes (star)": report.resumption_overhead_bytes}
                if report.resumption_overhead_bytes
                else {}
            ),
            **({"bytes to refused connections": report.refused_bytes} if report.refused_bytes else {}),
            "rejected frames": report.rejected_frames,
            "wall time s": report.wall_time_s,
            "  of which JAX compile s": report.compile_s,
            "JAX device": report.device or "-",
        },
        full=full,
    )
    roles = Table(title="Bytes per role", title_justify="left")
    for col in ("role", "parties", "sent bytes", "received bytes"):
        roles.add_column(col, justify="right" if col != "role" else "left")
    by_role = sorted(report.bytes_by_role(role_of).items())
    _add_rows(
        roles,
        [(role, format_value(row["parties"]), format_value(row["sent_bytes"]), format_value(row["received_bytes"]))
         for role, row in by_role],
        full=full,
        total=(
            "total",
            format_value(sum(row["parties"] for _, row in by_role)),
            format_value(sum(row["sent_bytes"] for _, row in by_role)),
            format_value(sum(row["received_bytes"] for _, row in by_role)),
        ),
    )
    console.print(roles)

    per_round = Table(title="Bytes per round", title_justify="left")
    for col in ("round", "phase", "messages", "payload bytes"):
        per_round.add_column(col, justify="right" if col != "phase" else "left")
    grouped: dict[tuple[int, str], list[int]] = {}
    for link in report.links:
        c = grouped.setdefault((link.round_idx, link.phase), [0, 0])
        c[0] += link.messages
        c[1] += link.payload_bytes
    order = {phase: i for i, phase in enumerate(phases)}

    def position(item: tuple[tuple[int, str], list[int]]) -> tuple[int, int, str]:
        (round_idx, phase), _ = item
        return (round_idx, order.get(phase, len(order) + (0 if is_setup_phase(phase) else 1)), phase)

    ordered = sorted(grouped.items(), key=position)
    _add_rows(
        per_round,
        [(format_value(r), phase, format_value(m), format_value(b)) for (r, phase), (m, b) in ordered],
        full=full,
        total=(
            "total",
            "",
            format_value(sum(messages for _, (messages, _) in ordered)),
            format_value(sum(nbytes for _, (_, nbytes) in ordered)),
        ),
    )
    console.print(per_round)

    links = sorted(report.bytes_by_link().items(), key=lambda kv: -kv[1])
    per_link = Table(title="Bytes per link (busiest first)", title_justify="left")
    per_link.add_column("sender")
    per_link.add_column("receiver")
    per_link.add_column("payload bytes", justify="right")
    _add_rows(
        per_link,
        [(sender, receiver, format_value(nbytes)) for (sender, receiver), nbytes in links],
        full=full,
        total=("total", f"{len(links):,} links", format_value(sum(nbytes for _, nbytes in links))),
    )
    console.print(per_link)


def plot_report(
    report: RunReport,
    path: str | Path,
    *,
    phases: Sequence[str] = (),
    extra: Callable[[Any], None] | None = None,
    max_parties: int = 16,
) -> Path:
    """Save a figure of bytes per round (stacked by phase) and bytes per party.

    The figure is meant to stay readable at any scale: the party panel is a horizontal bar chart
    that shows every party when there are at most ``max_parties``, else the ``max_parties - 1``
    busiest (sent + received) and one bar for the mean of the rest (whiskers: their minimum and
    maximum); an axis of bytes switches to a log scale when its values span more than two
    decades; round numbers get integer ticks; more than ten phases get the twenty colours of
    ``tab20`` (its ten strong hues first) instead of a repeating ten-colour cycle; legends sit
    below their axes, never over the bars.

    Args:
        report: the run report.
        path: output file (PNG, SVG or PDF by suffix).
        phases: the protocol's phases in message order (for the legend and stacking).
        extra: optional callback that receives a third axis to draw protocol-specific results
            (e.g. the clusters found).
        max_parties: most bars in the party panel (the last one summarises the others), >= 2.

    Returns:
        The path written.

    Raises:
        ValueError: if ``max_parties < 2``.
    """
    if max_parties < 2:
        raise ValueError(f"max_parties must be at least 2, got {max_parties}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_axes = 3 if extra else 2
    fig, axes = plt.subplots(1, n_axes, figsize=(5.6 * n_axes, 5.0), layout="constrained")
    _plot_bytes_per_round(axes[0], report, phases)
    _plot_bytes_per_party(axes[1], report, max_parties)
    if extra:
        extra(axes[2])
    fig.suptitle(f"{report.protocol} over {report.transport}")
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


#: Bytes on a linear axis: integers with thousands separators.
_BYTES_FORMAT = "{x:,.0f}"


def _spans_decades(values: Sequence[float], decades: float = 2.0) -> bool:
    """Whether the positive ``values`` span more than ``decades`` powers of ten (a log axis is then
    the readable one)."""
    positive = [v for v in values if v > 0]
    return len(positive) >= 2 and max(positive) > 10**decades * min(positive)


def _log_bar_axis(ax: Any, axis: str, values: Sequence[float]) -> None:
    """Put the bars' value ``axis`` (``"x"`` or ``"y"``) on a log scale that starts at the power of
    ten below a tenth of the smallest positive value (so the shortest bar still shows a decade)
    and ends at twice the largest."""
    positive = [v for v in values if v > 0]
    low = 10.0 ** math.floor(math.log10(min(positive) / 10))
    if axis == "x":
        ax.set_xscale("log")
        ax.set_xlim(low, 2 * max(positive))
    else:
        ax.set_yscale("log")
        ax.set_ylim(low, 2 * max(positive))


def _series_colours(n: int) -> list[Any]:
    """``n`` distinguishable colours: ``tab10`` up to ten series, else ``tab20`` with its ten strong
    hues first and their light partners after (then ``tab20b``/``tab20c``; beyond sixty they repeat)."""
    import matplotlib

    if n <= 10:
        return [matplotlib.colormaps["tab10"](i) for i in range(n)]
    tab20 = matplotlib.colormaps["tab20"]
    pool = [tab20(i) for i in (*range(0, 20, 2), *range(1, 20, 2))]
    pool += [matplotlib.colormaps[name](i) for name in ("tab20b", "tab20c") for i in range(20)]
    return [pool[i % len(pool)] for i in range(n)]


def _legend_below(ax: Any, n_entries: int, *, columns: int = 3) -> None:
    """A legend under the axes (outside the data area), ``columns`` entries per row at most."""
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=max(1, min(columns, n_entries)),
              fontsize="small", frameon=False)


def _plot_bytes_per_round(ax: Any, report: RunReport, phases: Sequence[str]) -> None:
    """Stacked bars: payload bytes of each round, one colour per phase."""
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    seen = {link.phase for link in report.links}
    ordered = [p for p in phases if p in seen] + sorted(seen - set(phases))
    rounds = sorted({link.round_idx for link in report.links})
    by_key: dict[tuple[int, str], int] = {}
    for link in report.links:
        by_key[(link.round_idx, link.phase)] = by_key.get((link.round_idx, link.phase), 0) + link.payload_bytes
    bottom = [0] * len(rounds)
    for phase, colour in zip(ordered, _series_colours(len(ordered)), strict=True):
        heights = [by_key.get((r, phase), 0) for r in rounds]
        ax.bar(rounds, heights, bottom=bottom, label=phase, color=colour)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    if len(rounds) <= 20:
        ax.set_xticks(rounds)
    if _spans_decades(bottom):
        _log_bar_axis(ax, "y", bottom)
        ax.set_ylabel("payload bytes (log scale)")
    else:
        # Stacked zero-height bars make their bottoms sticky edges: set the head room explicitly.
        ax.set_ylim(0, 1.05 * max(bottom, default=0) or 1)
        ax.yaxis.set_major_formatter(StrMethodFormatter(_BYTES_FORMAT))
        ax.set_ylabel("payload bytes")
    ax.set_xlabel("round")
    ax.set_title("bytes per round")
    if ordered:
        _legend_below(ax, len(ordered))


def _plot_bytes_per_party(ax: Any, report: RunReport, max_parties: int) -> None:
    """Horizontal bars of bytes sent and received per party (the busiest, and the rest summarised)."""
    import numpy as np
    from matplotlib.ticker import MaxNLocator, StrMethodFormatter

    sent: dict[str, int] = {p: 0 for p in report.parties}
    received: dict[str, int] = {p: 0 for p in report.parties}
    for link in report.links:
        sent[link.sender] = sent.get(link.sender, 0) + link.payload_bytes
        received[link.receiver] = received.get(link.receiver, 0) + link.payload_bytes
    parties = list(dict.fromkeys([*report.parties, *sent, *received]))
    for party in parties:
        sent.setdefault(party, 0)
        received.setdefault(party, 0)
    if len(parties) <= max_parties:
        shown, rest = parties, []
    else:
        ranked = sorted(parties, key=lambda p: -(sent[p] + received[p]))  # stable: roster order on ties
        shown, rest = ranked[: max_parties - 1], ranked[max_parties - 1 :]
    labels = list(shown)
    sent_values = [float(sent[p]) for p in shown]
    received_values = [float(received[p]) for p in shown]
    ranges: list[tuple[float, float]] = []  # (min, max) of the summarised parties, sent then received
    if rest:
        labels.append(f"{len(rest)} others (mean, min-max)")
        for values, counts in ((sent_values, sent), (received_values, received)):
            block = np.array([counts[p] for p in rest], dtype=float)
            values.append(float(block.mean()))
            ranges.append((float(block.min()), float(block.max())))
    ys = np.arange(len(labels))
    for offset, values, label in ((-0.2, sent_values, "sent"), (0.2, received_values, "received")):
        ax.barh(ys + offset, values, height=0.4, label=label)
    if rest:
        for offset, values, (low, high) in zip((-0.2, 0.2), (sent_values, received_values), ranges, strict=True):
            ax.errorbar(values[-1], ys[-1] + offset, xerr=[[values[-1] - low], [high - values[-1]]], fmt="none",
                        ecolor="black", elinewidth=1, capsize=3)
    ax.set_yticks(ys, labels, fontsize="x-small" if len(labels) > 10 else "small")
    ax.set_ylim(len(labels) - 0.5, -0.5)  # first party on top
    if _spans_decades(sent_values + received_values):
        _log_bar_axis(ax, "x", sent_values + received_values)
        ax.set_xlabel("payload bytes (log scale)")
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=4))  # few ticks: wide labels stay apart, unrotated
        ax.xaxis.set_major_formatter(StrMethodFormatter(_BYTES_FORMAT))
        ax.set_xlabel("payload bytes")
    title = "bytes per party"
    if rest:
        title += f" (busiest {len(shown)} of {len(parties)})"
    ax.set_title(title)
    _legend_below(ax, 2)
