"""One colour, marker and line style per variant, in every chart: the one table the charts read (no torch)."""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from kvpages.core.names import STEP_FLOOR, label, per_request_of


@dataclass(frozen=True)
class Style:
    color: str
    marker: str
    linestyle: str = "-"
    zorder: float = 2.0

    def kwargs(self) -> dict[str, object]:
        return {"color": self.color, "marker": self.marker, "ls": self.linestyle, "zorder": self.zorder}


STYLES: dict[str, Style] = {
    "host_stride": Style("#000000", "o", "-", 4.0),  # pre-PR: black, on top, so no other line hides it
    "device_stride": Style("#d62728", "s"),  # merged PR
    "device_stride_pinned": Style("#1f77b4", "D"),
    "device_stride_shortcut": Style("#2ca02c", "^", "--", 3.0),  # dashed: at p=1 it runs pre-PR's path
    "device_shift": Style("#9467bd", "v"),
    "batched_device_stride": Style("#ff7f0e", "P"),
    "batched_device_stride_pinned": Style("#8c564b", "X"),
    "host_mirror": Style("#7f7f7f", ".", ":", 3.5),  # the zero-D2H floor: a grey dotted reference line
}
"""Per variant; per_request[v] takes v's style. A variant not listed gets one of SPARE, by a hash of its name."""
SPARE = (Style("#e377c2", "<"), Style("#7f7f7f", ">"), Style("#bcbd22", "h"), Style("#17becf", "*"))


def style(variant: str) -> Style:
    name = per_request_of(variant) or variant
    return STYLES.get(name) or SPARE[zlib.crc32(name.encode()) % len(SPARE)]


def legend_label(variant: str) -> str:
    """What a legend says: the name with what it stands for (kvpages.core.names.LABELS); in whole requests and steps
    the host mirror keeps its table up to date, so there it is the host mirror plus its upkeep, not a floor."""
    return f"{variant}, host mirror + upkeep" if variant == STEP_FLOOR else label(variant)
