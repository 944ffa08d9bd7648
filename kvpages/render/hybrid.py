"""The report's evidence on a hybrid model's sends (no torch): every request and step of several payloads, each
strategy's metered D2H, host syncs and device ops, its times, and against per payload (SGLang today) the model's
scheduler-thread ratio per link profile on a CPU run (kvpages.analysis.hybrid), or the measured one on a CUDA run."""

from __future__ import annotations

from kvpages.analysis.cite import interval_text, sig
from kvpages.analysis.families import Record, records, scenario_estimate
from kvpages.analysis.hybrid import TODAY, strategy_predictions
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.wording import profile_name, span
from kvpages.core.payloads import DEFAULT_PAYLOADS, STRATEGIES
from kvpages.render.captions import time_label
from kvpages.render.text import count, table


def _against(analysis: Analysis, row: Record, today: Record | None) -> list[str]:
    """`row` against per payload: measured blocked time with its interval (a CUDA run), or the model's
    scheduler-thread time per prediction profile with its range at the bounds ('-': no queue-free per payload row)."""
    if analysis.run.link_crossed:
        found = None if today is None or row["variant"] == TODAY else scenario_estimate(
            analysis.run, (row["scenario"], TODAY), (row["scenario"], row["variant"]), "blocked")
        return ["1" if row["variant"] == TODAY else "-" if found is None else interval_text(found.found.interval)]
    if today is None or row["busy_us"] or row["variant"] == TODAY:
        return ["-" if today is None or row["busy_us"] else "1"] * len(analysis.predicting)
    priced = strategy_predictions(analysis, row, today)
    return [span(p) for p in priced] or ["not priced"] * len(analysis.predicting)


def hybrid_table(analysis: Analysis) -> str:
    frame = analysis.run.scenarios
    if frame is None:
        return ""
    ok = frame[(frame["status"] == "ok") & (frame["payloads"] != DEFAULT_PAYLOADS) & frame["device_ops"].notna()]
    rows = []
    for scenario, group in ok.groupby("scenario", sort=False):
        at = {str(r["variant"]): r for r in records(group)}
        for variant in (v for v in STRATEGIES if v in at):
            r = at[variant]
            rows.append([f"`{scenario}`", STRATEGIES[variant].said, count(r["d2h_bytes"]), r["d2h_transfers"],
                         r["host_syncs"], r["device_ops"], sig(analysis.scenario_time(r)),
                         sig(analysis.scenario_time(r, "ready")), *_against(analysis, r, at.get(TODAY))])
    if not rows:
        return ""
    word = time_label(analysis, "µs")
    against = (["blocked / per payload [interval]"] if analysis.run.link_crossed else
               [f"model: {profile_name(p)}, scheduler thread / per payload [range at the bounds]" for p in analysis.predicting])
    lead = ("Every request and step of several payloads per send (`--kv-payloads`), each strategy's D2H, host syncs and "
            "device ops as the meter counted them (per request or step), and its times; against per payload (SGLang "
            "today), " + ("the measured blocked time with its interval." if analysis.run.link_crossed else
                          "the model's scheduler-thread time per link profile (a staged strategy's thread pays its "
                          "launches alone), as the finding gives it."))
    header = ["scenario", "strategy", "bytes", "D2H", "host syncs", "device ops", f"blocked {word}", f"ready {word}",
              *against]
    return f"{lead}\n\n{table(header, rows)}"
