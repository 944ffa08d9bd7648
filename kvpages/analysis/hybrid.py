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
from kvpages.analysis.families import Record, records, scenario_estimate
from kvpages.analysis.hostwork import scenario_host_work
from kvpages.analysis.predict import Prediction, predict_prices, scenario_predictions
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.wording import MEASURED, MODEL, Finding, predicted_figure, predicted_range
from kvpages.core.links import LinkProfile
from kvpages.core.names import STEP_CANDIDATE
from kvpages.core.payloads import DEFAULT_PAYLOADS, STAGED, STRATEGIES

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


def cost(analysis: Analysis, row: Record) -> Cost | None:
    """`row`'s cost; None where its host work cannot be told apart from its copy (kvpages.analysis.hostwork)."""
    host = scenario_host_work(analysis, str(row["variant"]), row, analysis.scenario_time(row)).us
    if host is None:
        return None
    return Cost(float(row["d2h_bytes"]), float(row["d2h_transfers"]), float(row["host_syncs"]), float(row["device_ops"]),
                host)


def strategy_predictions(analysis: Analysis, row: Record, today: Record, ready: bool = False) -> tuple[Prediction, ...]:
    """`row`'s scheduler-thread time (`ready`: its ready time) against per payload's, on every prediction profile; ()
    where either cannot be priced."""
    mine, base = cost(analysis, row), cost(analysis, today)
    if mine is None or base is None:
        return ()
    price = mine.ready_us if ready else mine.scheduler_us
    return tuple(predict_prices(profile, (price, base.scheduler_us)) for profile in analysis.predicting)


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
    """'B=32, p=64, hybrid' (a step) or 'prefill 4608 tokens (all payloads), p=64, hybrid' (a request: `tokens` sums
    every payload's conversions, not the prompt's length)."""
    size = f"B={row['requests']}" if row["kind"] == "step" else f"{row['side']} {row['tokens']} tokens (all payloads)"
    return f"{size}, p={row['page_size']}, {row['payloads']}"


def _moved(at: dict[str, Record], shown: list[str]) -> str:
    """'per payload 96 D2H/96 syncs, per request 32/32, staged 1/0 (metered)'."""
    first, *rest = shown
    said = [f"{STRATEGIES[first].said} {at[first]['d2h_transfers']} D2H/{at[first]['host_syncs']} syncs",
            *(f"{STRATEGIES[v].said} {at[v]['d2h_transfers']}/{at[v]['host_syncs']}" for v in rest)]
    return ", ".join(said) + " (metered)"


def _predicted(analysis: Analysis, at: dict[str, Record], others: list[str]) -> tuple[str, str, tuple[Prediction, ...]]:
    """The answer, and the staged strategy's figure against per payload with the predictions it quotes."""
    today = at[TODAY]
    found = {v: strategy_predictions(analysis, at[v], today) for v in others}
    ranges = ", ".join(f"{STRATEGIES[v].said} {predicted_range(found[v], False)}" for v in others)
    answer = f"predicted scheduler-thread time vs per payload's: {ranges} (model). Blocked equals ready here"
    staged = found.get(STAGED, ())
    return answer, predicted_figure(staged), staged


def _measured(analysis: Analysis, at: dict[str, Record], others: list[str]) -> tuple[str, str, tuple[Prediction, ...]]:
    """The answer, and the staged strategy's figure against per payload (no predictions)."""
    scenario = str(at[TODAY]["scenario"])
    pairs = {v: scenario_estimate(analysis.run, (scenario, TODAY), (scenario, v), "blocked") for v in others}
    said = ", ".join(f"{STRATEGIES[v].said} {sig(pair.found.interval.ratio)}" for v, pair in pairs.items()
                     if pair is not None)
    answer = f"measured blocked time vs per payload's: {said or 'no pair timed'}{_behind_queue(analysis, scenario)}"
    staged = pairs.get(STAGED)
    return answer, "-" if staged is None else interval_text(staged.found.interval), ()


def _against_pre_pr(analysis: Analysis, at: dict[str, Record],
                    strategy: str) -> tuple[str, str, tuple[Prediction, ...]] | None:
    """`strategy`'s row against pre-PR per payload (scenario_ratios.csv) and the figure `kvpages cite` prints of it:
    a finding's row and figure where no recommendation sets staging against per payload at its step; None where
    pre-PR per payload was not timed there."""
    ratio = analysis.scenario_ratio(str(at[TODAY]["scenario"]), strategy, "blocked")
    if ratio is None:
        return None
    if analysis.run.link_crossed:
        return ratio.id, interval_text(ratio.interval), ()
    quoted = scenario_predictions(analysis, ratio)
    return ratio.id, predicted_figure(quoted), quoted


def _behind_queue(analysis: Analysis, scenario: str) -> str:
    """'; behind the busy queue per payload 812 µs, staged 41 µs' (a CUDA run's busy twin), else ''."""
    frame = analysis.run.scenarios
    assert frame is not None
    twin = frame[(frame["scenario"].str.startswith(f"{scenario}-busy")) & (frame["status"] == "ok")]
    times = {str(r["variant"]): analysis.scenario_time(r) for r in records(twin) if r["variant"] in (TODAY, STAGED)}
    if len(times) < 2:
        return ""
    return f"; behind the busy queue per payload {sig(times[TODAY])} µs, staged {sig(times[STAGED])} µs"


def hybrid_findings(analysis: Analysis, cite_as: dict[str, str]) -> tuple[Finding, ...]:
    """Per payload preset beyond the main KV: what each strategy's request or step moves (metered) and costs against
    per payload, SGLang today (modelled on a CPU run, measured on a CUDA run; module doc); the detail: the report's
    hybrid table (kvpages.render.hybrid). Its row and figure: where a row of recommendations.csv sets the staged
    strategy against per payload there (`cite_as`: its id by scenario, kvpages.analysis.recommend.staging_row_ids),
    that row and the same comparison; else the staged (or the last) strategy's row against pre-PR per payload and its
    figure, which the answer says; either way `kvpages cite` of the row prints the figure's numbers. Where neither
    row exists (pre-PR per payload not timed there), the staged figure without a row ('-')."""
    made = []
    for payloads, at in hybrid_rows(analysis).items():
        others = [v for v in STRATEGIES if v in at and v != TODAY and STRATEGIES[v].on_device]
        if not others:
            continue
        today = at[TODAY]
        answer, figure, quoted = (_measured if analysis.run.link_crossed else _predicted)(analysis, at, others)
        cited = cite_as.get(str(today["scenario"]), "-")
        strategy = STAGED if STAGED in at else others[-1]
        if cited == "-" and (found := _against_pre_pr(analysis, at, strategy)) is not None:  # no row sets staging
            cited, figure, quoted = found  # against per payload here: the strategy's row against pre-PR
            answer += f"; figure: {STRATEGIES[strategy].said} / pre-PR per payload"
        made.append(Finding(f"Per {today['kind']}, payloads {payloads}",
                            f"{_what(today)}: {_moved(at, [TODAY, *others])}; {answer}.", figure, cited,
                            MEASURED if analysis.run.link_crossed else MODEL, predictions=quoted))
    return tuple(made)
