"""What a hybrid model's step pays per strategy, and what staging saves: one finding per payload preset beyond the main
KV (kvpages.core.payloads), each strategy against per payload, SGLang today (no torch).

A row is priced by what the meter counted in it (scenarios.csv: bytes, copies, host syncs, device ops), on the link
model's terms (kvpages.core.links), plus the host work the model carries over (pre-PR's stride alone):

- ready, until the page indices are on the host: the link model's formula, each copy waited for once (by the scheduler
  thread, or by the transfer worker);
- the scheduler thread's time: the same where it waits for its copies (a host sync each); where it waits for none (the
  staged strategy: 0 host syncs) only its launches are its own, each device op and each copy's enqueue at the launch
  term; the kernels, the copies, the bytes and the wait are the transfer worker's, in the ready time.

The model has no device queue: behind one (the next forward), every host sync also waits for it, which only a CUDA
run's busy-queue twin measures. On a CPU run the finding is the model's, per link profile with its range at the terms'
bounds; on a CUDA run it is measured, with each ratio's interval.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpages.analysis.cite import interval_text, sig
from kvpages.analysis.finding import MEASURED, MODEL, Finding, bounded, predicted_range, profile_name
from kvpages.analysis.predict import Prediction, predict_prices
from kvpages.analysis.ratios import Analysis, Record, estimate, records
from kvpages.core.links import LinkProfile, carries_host_work
from kvpages.core.names import STEP_CANDIDATE
from kvpages.core.payloads import DEFAULT_PAYLOADS, STAGED, STRATEGIES, get_payloads

TODAY = STEP_CANDIDATE
"""Per payload, SGLang today: what every strategy is set against."""


@dataclass(frozen=True)
class Cost:
    """What the meter counted in one request or step, and the host work the model carries over (µs)."""

    d2h_bytes: float
    copies: float
    syncs: float
    device_ops: float
    host_us: float

    def ready_us(self, profile: LinkProfile) -> float:
        return self.host_us + profile.modeled_us(self.d2h_bytes, self.copies, self.device_ops)

    def scheduler_us(self, profile: LinkProfile) -> float:
        """The scheduler thread's part (module doc): all of it where it waits for its copies, else its launches."""
        if self.syncs:
            return self.ready_us(profile)
        return self.host_us + (self.device_ops + self.copies) * profile.us("launch_us")


def cost(analysis: Analysis, row: Record) -> Cost:
    variant = str(row["variant"])
    host = analysis.scenario_time(row) if carries_host_work(variant, analysis.host_side(variant)) else 0.0
    return Cost(float(row["d2h_bytes"]), float(row["d2h_transfers"]), float(row["host_syncs"]), float(row["device_ops"]),
                host)


def predictions(analysis: Analysis, row: Record, today: Record, ready: bool = False) -> tuple[Prediction, ...]:
    """`row`'s scheduler-thread time (`ready`: its ready time) against per payload's, on every prediction profile."""
    mine, base = cost(analysis, row), cost(analysis, today)
    price = mine.ready_us if ready else mine.scheduler_us
    return tuple(predict_prices(profile, (price, base.scheduler_us)) for profile in analysis.predicting)


def counted(row: Record) -> str:
    """'96 D2H, 96 host sync(s) and 160 device op(s)' (metered)."""
    return f"{row['d2h_transfers']} D2H, {row['host_syncs']} host sync(s) and {row['device_ops']} device op(s)"


def hybrid_rows(analysis: Analysis) -> dict[str, dict[str, Record]]:
    """Per payload preset beyond the main KV: its largest step (else request) without a busy queue, by step variant."""
    frame = analysis.run.scenarios
    if frame is None:
        return {}
    ok = frame[(frame["status"] == "ok") & (frame["payloads"] != DEFAULT_PAYLOADS) & (frame["busy_us"] == 0)
               & frame["device_ops"].notna()]
    chosen: dict[str, dict[str, Record]] = {}
    for payloads, rows in ok.groupby("payloads", sort=False):
        top = max(records(rows), key=lambda r: (r["kind"] == "step", r["page_size"], r["requests"], r["tokens"]))
        at = {str(r["variant"]): r for r in records(rows[rows["scenario"] == top["scenario"]])}
        if TODAY in at:
            chosen[str(payloads)] = at
    return chosen


def _what(row: Record) -> str:
    preset = get_payloads(str(row["payloads"]))
    size = f"B={row['requests']} requests" if row["kind"] == "step" else f"a {row['side']} request of L={row['tokens']}"
    return f"{size} at page size {row['page_size']}, each send carrying {preset.carried(int(row['swa_window']))}"


def _predicted(analysis: Analysis, at: dict[str, Record], others: list[str]) -> tuple[str, str]:
    today, per = at[TODAY], at[TODAY]["kind"]
    found = {v: predictions(analysis, at[v], today) for v in others}
    ranges = "; ".join(f"{STRATEGIES[v].said} {predicted_range(found[v])}" for v in others)
    ready = (f"; the staged indices are on the host at {predicted_range(predictions(analysis, at[STAGED], today, True))}"
             " per payload's time" if STAGED in at else "")
    answer = (f"Predicted scheduler-thread time per {per} against per payload's (model): {ranges}{ready}. "
              f"On this CPU run blocked equals ready (no streams); the next forward each host sync also waits behind "
              f"is the busy-queue twin's, measured on CUDA.")
    figure = "; ".join(f"{STRATEGIES[v].said}: " + ", ".join(f"{profile_name(p.profile)} {bounded(p)}" for p in found[v])
                       for v in others)
    return answer, f"{figure} (model: predicted scheduler-thread time / per payload's [its range at the terms' bounds])"


def _measured(analysis: Analysis, at: dict[str, Record], others: list[str]) -> tuple[str, str]:
    scenario, per = str(at[TODAY]["scenario"]), at[TODAY]["kind"]
    pairs = {(v, latency): estimate(analysis.run, (scenario, TODAY), (scenario, v), latency)
             for v in others for latency in ("blocked", "ready")}
    said = [f"{STRATEGIES[v].said} {interval_text(pair.interval)} (ready {sig(ready.interval.ratio)}x)"
            for v in others if (pair := pairs[v, "blocked"]) is not None and (ready := pairs[v, "ready"]) is not None]
    busy = _behind_queue(analysis, scenario)
    answer = f"Measured blocked time per {per} against per payload's: {'; '.join(said) or 'no pair timed'}{busy}."
    staged = pairs.get((STAGED, "blocked"))
    return answer, interval_text(staged.interval) if staged is not None else "-"


def _behind_queue(analysis: Analysis, scenario: str) -> str:
    """'; behind the 500 µs busy queue, per payload 812 µs blocked, staged 41 µs' (CUDA runs), else ''."""
    frame = analysis.run.scenarios
    assert frame is not None
    twin = frame[(frame["scenario"].str.startswith(f"{scenario}-busy")) & (frame["status"] == "ok")]
    times = {str(r["variant"]): analysis.scenario_time(r) for r in records(twin) if r["variant"] in (TODAY, STAGED)}
    if len(times) < 2 or twin.empty:
        return ""
    return (f"; behind the {twin['busy_us'].iloc[0]} µs busy queue, per payload {sig(times[TODAY])} µs blocked, "
            f"staged {sig(times[STAGED])} µs")


def hybrid_findings(analysis: Analysis) -> tuple[Finding, ...]:
    """Per payload preset beyond the main KV: what each strategy's request or step pays (metered) and costs against per
    payload, SGLang today (modelled on a CPU run, measured on a CUDA run; module doc)."""
    made = []
    for payloads, at in hybrid_rows(analysis).items():
        others = [v for v in STRATEGIES if v in at and v != TODAY and STRATEGIES[v].on_device]
        today = at[TODAY]
        moved = "; ".join(f"{STRATEGIES[v].said} {counted(at[v])}" for v in [TODAY, *others])
        answer, figure = (_measured if analysis.run.link_crossed else _predicted)(analysis, at, others)
        cited = at.get(STAGED, at[others[-1]] if others else today)
        made.append(Finding(f"Per {today['kind']}, payloads {payloads}",
                            f"{_what(today)}: {moved} per {today['kind']} (metered). {answer}", figure, str(cited["id"]),
                            MEASURED if analysis.run.link_crossed else MODEL))
    return tuple(made)
