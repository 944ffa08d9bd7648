"""What `kvpages calibrate` prints: each fitted term with its interval and source, then every row's residual (no torch)."""

from __future__ import annotations

from kvpages.analysis.calibrate import Calibration
from kvpages.analysis.cite import sig
from kvpages.core.links import TERM_KEYS, TERM_NAMES
from kvpages.render.text import table


def calibration_text(calibration: Calibration) -> str:
    runs = calibration.run_ids
    lines = [f"Link model fitted from run{'s' if len(runs) > 1 else ''} {', '.join(runs)} ({len(calibration.residuals)} "
             f"rows, up to {calibration.repetitions} repetitions each):"]
    lines += [f"refused: {line}" for line in calibration.refused]
    for profile in calibration.profiles:
        lines.append(f"\n{profile.name}: {profile.label}")  # the label names its memory (pageable, pinned)
        for key in TERM_KEYS:
            t = profile.term(key)
            if t.low is not None and t.high is not None:
                where = f"[{sig(t.low)}, {sig(t.high)}]"
            else:  # a prior's value, or a fitted one whose interval reaches 0 or infinity (its source says which)
                where = "(fitted, no finite interval)" if t.source.startswith("fitted") else "(not fitted)"
            lines.append(f"  {TERM_NAMES[key]:<30} {sig(t.value):>8} {t.unit:<4} {where}")
    lines += [f"note: {n}" for n in calibration.notes if n not in calibration.refused]
    rows = [[r.id, r.memory, sig(r.measured_us), sig(r.modeled_us), sig(r.residual_us),
             f"{r.residual_us / r.measured_us:+.1%}"] for r in calibration.residuals]
    lines += ["", table(["row", "memory", "measured µs", "fitted µs", "residual µs", "residual"], rows)]
    return "\n".join(lines)
