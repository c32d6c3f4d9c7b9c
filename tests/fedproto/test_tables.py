"""The terminal tables: one number format, long tables summarised with their totals unless full."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest
from rich.console import Console

from fedproto.metering import Meter
from fedproto.report import HEAD_ROWS, MAX_TABLE_ROWS, format_value, render_report, render_summary


@pytest.mark.parametrize(
    ("value", "integer", "text"),
    [
        (1234567, False, "1,234,567"),
        (np.int64(-4096), False, "-4,096"),
        (10**15 - 1, False, "999,999,999,999,999"),
        (123456 * 10**400, False, "1.234e+405"),  # beyond float range: from the digits
        (-2 * 10**20, False, "-2.000e+20"),
        (0.123456, False, "0.1235"),
        (1.25, False, "1.25"),
        (np.float32(2.0), False, "2"),
        (12345.678, False, "12,350"),
        (-987654.3, False, "-987,700"),
        (3.2e-6, False, "3.2e-06"),
        (6.02e23, False, "6.02e+23"),
        (0.0, False, "0"),
        (float("inf"), False, "inf"),
        (float("nan"), False, "nan"),
        (428.6666, True, "429"),
        (1234567.8, True, "1,234,568"),
        (True, False, "yes"),
        (np.bool_(False), False, "no"),
        (None, False, "-"),
        ("iris", False, "iris"),
    ],
)
def test_format_value(value, integer, text):
    assert format_value(value, integer=integer) == text


def _render(fn, *args, **kwargs) -> str:
    out = io.StringIO()
    fn(Console(file=out, width=160), *args, **kwargs)
    return out.getvalue()


def test_a_long_summary_is_cut_unless_full():
    rows = {f"row {i:02d}": i * 1000 for i in range(MAX_TABLE_ROWS + 10)}
    text = _render(render_summary, "many", rows)
    assert "row 00" in text and f"row {HEAD_ROWS - 1:02d}" in text and f"row {HEAD_ROWS:02d}" not in text
    assert f"... {len(rows) - HEAD_ROWS} more rows ..." in text and "--full" in text
    full = _render(render_summary, "many", rows, full=True)
    assert all(name in full for name in rows) and "more rows" not in full
    short = {f"row {i}": i for i in range(MAX_TABLE_ROWS)}
    assert "more rows" not in _render(render_summary, "exactly the limit", short)
    # a float that counts bytes prints as an integer; other floats keep 4 significant digits
    text = _render(render_summary, "units", {"payload bytes per round": 1234.5, "loss ratio": 1.234567})
    assert "1,234" in text and "1,234.5" not in text and "1.235" in text


def test_a_report_with_many_links_shows_the_busiest_and_the_totals():
    meter = Meter()
    n_clients = 40
    for i in range(n_clients):
        meter.record_sent(0, "update", f"client-{i}", "server", "t", 1000 + i)
        meter.record_sent(0, "aggregate", "server", f"client-{i}", "t", 10)
    parties = ["server", *(f"client-{i}" for i in range(n_clients))]
    report = meter.report(protocol="p", transport="t", session=0, parties=parties)
    role_of = lambda p: p.split("-")[0]  # noqa: E731
    text = _render(render_report, report, role_of, phases=("update", "aggregate"))
    links_table = text[text.index("Bytes per link"):]
    assert "client-39" in links_table and "client-0 " not in links_table.split("...")[0]  # busiest first
    assert f"... {2 * n_clients - HEAD_ROWS} more rows ..." in links_table
    total = re.search(r"total\s+│\s+80 links\s+│\s+([\d,]+)", links_table)
    assert total and int(total.group(1).replace(",", "")) == report.payload_bytes
    full = _render(render_report, report, role_of, full=True)
    assert "more rows" not in full and all(f"client-{i} " in full for i in range(n_clients))
