"""How a clock request is written, shared by the device backends and the governor's policies.

A request is a clock in MHz or "maxn" (leave the board's default governor). Standard library only.
"""
from __future__ import annotations

MAXN = "maxn"
FreqRequest = float | str  # a clock in MHz or "maxn"


def freq_label(freq: FreqRequest) -> str:
    """How a frequency appears in params, tags and tables: '816' or 'maxn'."""
    return MAXN if freq == MAXN else f"{float(freq):g}"
