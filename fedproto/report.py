"""Rendering run reports: rich tables for the terminal and matplotlib plots.

The report itself (:class:`~fedproto.metering.RunReport`) is data; this module only presents it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from fedproto.metering import RunReport, is_setup_phase

__all__ = ["render_report", "render_summary", "plot_report"]


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render_summary(console: Console, title: str, rows: Mapping[str, Any]) -> None:
    """Print ``rows`` (name -> value) as a two-column table."""
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("", justify="right")
    for name, value in rows.items():
        table.add_row(name, _fmt(value))
    console.print(table)


def render_report(
    console: Console,
    report: RunReport,
    role_of: Callable[[str], str],
    *,
    phases: Sequence[str] = (),
    max_links: int = 12,
) -> None:
    """Print rounds, bytes per role, per round and per link.

    Args:
        console: where to print.
        report: the run report.
        role_of: party -> role name.
        phases: the protocol's phases in message order (others sort after them by name).
        max_links: print at most this many links (the busiest); the JSON report has them all.
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
            "rejected frames": report.rejected_frames,
            "wall time s": report.wall_time_s,
        },
    )
    roles = Table(title="Bytes per role", title_justify="left")
    for col in ("role", "parties", "sent bytes", "received bytes"):
        roles.add_column(col, justify="right" if col != "role" else "left")
    for role, row in sorted(report.bytes_by_role(role_of).items()):
        roles.add_row(role, _fmt(row["parties"]), _fmt(row["sent_bytes"]), _fmt(row["received_bytes"]))
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

    for (round_idx, phase), (messages, nbytes) in sorted(grouped.items(), key=position):
        per_round.add_row(_fmt(round_idx), phase, _fmt(messages), _fmt(nbytes))
    console.print(per_round)

    links = sorted(report.bytes_by_link().items(), key=lambda kv: -kv[1])
    per_link = Table(title=f"Bytes per link ({min(len(links), max_links)} of {len(links)})", title_justify="left")
    per_link.add_column("sender")
    per_link.add_column("receiver")
    per_link.add_column("payload bytes", justify="right")
    for (sender, receiver), nbytes in links[:max_links]:
        per_link.add_row(sender, receiver, _fmt(nbytes))
    console.print(per_link)


def plot_report(
    report: RunReport,
    path: str | Path,
    *,
    phases: Sequence[str] = (),
    extra: Callable[[Any], None] | None = None,
) -> Path:
    """Save a figure of bytes per round (stacked by phase) and bytes sent per party.

    Args:
        report: the run report.
        path: output file (PNG, SVG or PDF by suffix).
        phases: the protocol's phases in message order (for the legend and stacking).
        extra: optional callback that receives a third axis to draw protocol-specific results
            (e.g. the clusters found).

    Returns:
        The path written.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_axes = 3 if extra else 2
    fig, axes = plt.subplots(1, n_axes, figsize=(5.2 * n_axes, 4.0))
    seen = {link.phase for link in report.links}
    ordered = [p for p in phases if p in seen] + sorted(seen - set(phases))
    rounds = sorted({link.round_idx for link in report.links})
    bottom = [0] * len(rounds)
    for phase in ordered:
        heights = [
            sum(link.payload_bytes for link in report.links if link.round_idx == r and link.phase == phase)
            for r in rounds
        ]
        axes[0].bar(rounds, heights, bottom=bottom, label=phase)
        bottom = [b + h for b, h in zip(bottom, heights)]
    if len(rounds) <= 20:
        axes[0].set_xticks(rounds)
    axes[0].set_xlabel("round")
    axes[0].set_ylabel("payload bytes")
    axes[0].set_title("bytes per round")
    axes[0].legend(fontsize="small")

    sent: dict[str, int] = {p: 0 for p in report.parties}
    received: dict[str, int] = {p: 0 for p in report.parties}
    for link in report.links:
        sent[link.sender] = sent.get(link.sender, 0) + link.payload_bytes
        received[link.receiver] = received.get(link.receiver, 0) + link.payload_bytes
    parties = list(report.parties)
    if len(parties) > 40:
        parties = parties[:40]
    xs = range(len(parties))
    axes[1].bar([x - 0.2 for x in xs], [sent[p] for p in parties], width=0.4, label="sent")
    axes[1].bar([x + 0.2 for x in xs], [received[p] for p in parties], width=0.4, label="received")
    axes[1].set_xticks(list(xs), parties, rotation=90, fontsize="x-small")
    axes[1].set_ylabel("payload bytes")
    axes[1].set_title("bytes per party")
    axes[1].legend(fontsize="small")
    if extra:
        extra(axes[2])
    fig.suptitle(f"{report.protocol} over {report.transport}")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
