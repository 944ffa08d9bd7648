"""What one block leaves: its samples and the meter's reading, or the stop of its case; a worker logs it as one
JSON line. No torch import.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import sys
from array import array
from dataclasses import dataclass
from typing import Any

from kvpages.schema.rows import OK, TABLES, Samples, Table


@dataclass(frozen=True)
class MeterReading:
    """What the D2H meter counted for one call of a case (kvpages.measure.meter.D2HMeasurement, as data)."""

    d2h_bytes: int
    d2h_transfers: int
    link: str
    host_syncs: int
    device_ops: int | None = None


@dataclass(frozen=True)
class BlockOutcome:
    """One block of a case, as process `process` ran it: `status` 'ok' with its samples (one record, or one per
    rank and role of a multi-rank step) and what the meter read in that process, or the status its case stopped
    with (mismatch, skipped, ...), `fail` when its test fails."""

    case_id: str
    table: Table
    process: int
    samples: tuple[Samples, ...] = ()
    reading: MeterReading | None = None
    status: str = OK
    note: str = ""
    fail: bool = False

    @property
    def stopped(self) -> bool:
        return self.status != OK

    def to_json(self) -> str:
        """One JSON line; each series of samples as its float64 bytes in base64 (`SERIES`): a block's 1,000-2,000
        floats as JSON numbers took 0.25 ms to write in the worker's turn, as bytes 0.07 ms."""
        reading = None if self.reading is None else dataclasses.asdict(self.reading)
        samples = [{f.name: _packed(getattr(s, f.name)) for f in dataclasses.fields(s)} for s in self.samples]
        return json.dumps({**vars(self), "table": self.table.rows_csv, "reading": reading, "samples": samples})

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BlockOutcome:
        table, reading = TABLES[data["table"]], data["reading"]
        samples = tuple(table.samples_from({k: _unpacked(v) for k, v in s.items()}) for s in data["samples"])
        return cls(**{**data, "table": table, "samples": samples,
                      "reading": None if reading is None else MeterReading(**reading)})


SERIES = "float64_base64"
"""The key of a series of samples in a worker's log: {SERIES: base64 of its float64 bytes, little-endian}, the same
floats bit for bit."""


def _packed(value: object) -> object:
    if not isinstance(value, tuple):
        return value
    floats = array("d", value)
    if sys.byteorder == "big":
        floats.byteswap()
    return {SERIES: base64.b64encode(floats.tobytes()).decode("ascii")}


def _unpacked(value: object) -> object:
    if not (isinstance(value, dict) and SERIES in value):
        return value
    floats = array("d", base64.b64decode(value[SERIES]))
    if sys.byteorder == "big":
        floats.byteswap()
    return tuple(floats.tolist())
