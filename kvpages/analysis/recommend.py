"""What to do: each candidate change set against what it would replace (the merged PR's path, per call, request or
step, or per payload) at the settings it names, from the run's own data, by one rule (no torch; docs/method.md, "What
to do"):

- measured, on a run that crossed a link: *recommended* when the candidate is judged faster than what it replaces there
  (its interval below 1, the effect beyond the run's minimum effect, kept by the Benjamini-Hochberg step over the
  candidates' comparisons); the gain is that ratio, candidate / replaced, with its interval;
- predicted, on a CPU run: *recommended (predicted)* when every pageable prediction profile puts the candidate below
  what it replaces there; the gain is the middle of those predictions, its interval their range at the terms' bounds
  (the link model; the host-side ratio is not a gain).

A step is set by its scheduler thread's time (blocked). On a CPU run the staged strategy of a hybrid model's payloads,
which waits on no host sync, is priced as kvpages.analysis.hybrid prices it (its launches alone); every other candidate
is priced by the link model's time per call, request or step (each copy waited for where it makes one).

A candidate that does not pass is listed too, with its figure, so the section shows what was weighed."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from kvpages.analysis.cite import pair_repro, sig
from kvpages.analysis.families import Record, point_estimate, scenario_estimate
from kvpages.analysis.hybrid import TODAY, hybrid_rows, strategy_predictions
from kvpages.analysis.pairs import PairEstimate
from kvpages.analysis.predict import Prediction, predict, row_call, scenario_rows
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.verdicts import FASTER, judge_family
from kvpages.analysis.wording import verdicts_along
from kvpages.core.adaptive import ADAPTIVE
from kvpages.core.names import BASELINE, CANDIDATE, FLOOR, STEP_CANDIDATE, per_request_name
from kvpages.core.payloads import DEFAULT_PAYLOADS, PAYLOAD_PRESETS, STAGED
from kvpages.core.stats import Interval
from kvpages.core.sweep import DTYPES, LAYOUTS
from kvpages.schema.rows import TIMED

SHORTCUT, PINNED, BATCHED = "device_stride_shortcut", "device_stride_pinned", "batched_device_stride"
MEASURED, PREDICTED = "measured here", "predicted (model)"
DTYPE, LAYOUT = DTYPES[0], LAYOUTS[0]  # a sweep point's defaults: where every candidate is set


@dataclass(frozen=True)
class Setting:
    """Where a candidate is set against what it would replace: a point (page size, length) or a scenario."""

    candidate: str
    against: str
    page_size: int
    seq_len: int | None = None  # a point's length; None: `scenario`
    scenario: str = ""
    said: str = ""  # 'per call at p=1, L=512', 'a B=128 step at p=64'
    requests: int = 0  # a scenario's: its step's B
    scheduler: bool = False  # priced by the scheduler thread's time alone (a staged strategy: module doc)

    @property
    def size(self) -> tuple[str, int]:
        """('L=', 512) for a point, ('B=', 128) for a step: how `along` names it among its kind's other sizes."""
        return ("L=", self.seq_len) if self.seq_len is not None else ("B=", self.requests)


@dataclass(frozen=True)
class Recommendation:
    """One candidate at its setting (recommendations.csv; `kvpages cite RUN <id>` prints it)."""

    id: str
    action: str
    setting: str
    candidate: str
    against: str
    ratio: float  # candidate / against: measured, or the middle of the predictions
    ci_low: float  # its interval; predicted: the lowest prediction over the profiles and their bounds
    ci_high: float
    recommended: bool
    basis: str  # MEASURED or PREDICTED
    verdict: str  # measured: the verdict; predicted: `PREDICTED_VERDICTS`'s
    cites: str  # the rows of ratios.csv or scenario_ratios.csv behind it (each against pre-PR)
    along: str = ""  # the verdict at each other size of its kind and page size (agreeing or not)
    # ('slower at B=1; faster at B=8, 32'; '' where it has none), judged as a family of their own: each a row of its own
    of: str = ""  # that row's: the id of the candidate's row it is another size of ('' on the candidate's own row)
    across: str = ""  # the verdict at each size of the other kind at its page size ('per step: faster at B=1, 8, 32,
    # 128' beside a per-call setting), each a row of its own; '' where it has none

    @property
    def gain(self) -> str:
        """'0.508 [0.474, 0.543]' measured (its interval; '0.508 (no interval)' for a pair of one repetition); '0.500
        [0.369-0.732]' predicted (the range over the profiles and their bounds, as every model figure is written)."""
        low, high = sig(self.ci_low), sig(self.ci_high)
        if self.basis != MEASURED:
            return f"{sig(self.ratio)} [{low}-{high}]"
        return f"{sig(self.ratio)} [{low}, {high}]" if math.isfinite(self.ci_high) else f"{sig(self.ratio)} (no interval)"

    @property
    def others(self) -> str:
        """' (other sizes: slower at B=1; faster at B=8, 32)': `along` as the report and `kvpages cite` say it."""
        return f" (other sizes: {self.along})" if self.along else ""

    @property
    def where(self) -> str:
        """'a B=128 step at p=64 (other sizes: slower at B=1; faster at B=8, 32)': the setting, `along` and `across`
        ('per call at p=1, L=512 (...; per step: faster at B=1, 8, 32, 128)')."""
        if not self.across:
            return f"{self.setting}{self.others}"
        return f"{self.setting} ({f'other sizes: {self.along}; ' if self.along else ''}{self.across})"


@dataclass(frozen=True)
class _Candidate:
    key: str
    action: str
    settings: Callable[[Analysis], list[Setting]]  # the first is the one the gain is given at


def _points(analysis: Analysis, candidate: str, against: str, keep: Callable[[int, int], bool]) -> list[Setting]:
    """Every point where both were timed and `keep(page_size, seq_len)`, shortest first."""
    rows = sorted((r for r in analysis.ratios_of(against) if keep(r.page_size, r.seq_len)
                   and (r.dtype, r.layout) == (DTYPE, LAYOUT)  # where `_measured` and `_predicted` set them
                   and analysis.ratio_at(candidate, r.dtype, r.layout, r.page_size, r.seq_len) is not None),
                  key=lambda r: (r.seq_len, r.page_size))
    return [Setting(candidate, against, r.page_size, r.seq_len, said=f"per call at p={r.page_size}, L={r.seq_len}")
            for r in rows]


def _step(analysis: Analysis, candidate: str, against: str, page_size: int) -> list[Setting]:
    """Every step of page size `page_size` (idle queue, the default payloads) where both were timed, largest first."""
    return [Setting(candidate, against, page_size, scenario=str(row["scenario"]), requests=int(row["requests"]),
                    said=f"a B={row['requests']} step at p={page_size}")
            for row in _steps(analysis, candidate, against, page_size, DEFAULT_PAYLOADS)]


def _steps(analysis: Analysis, candidate: str, against: str, page_size: int, payloads: str) -> list[Record]:
    """`against`'s rows of the idle-queue steps of page size `page_size` and payloads `payloads` (int32) where it and
    `candidate` were both timed (a row skipped, out of memory or mismatched has no counters to price), largest
    first."""
    if analysis.run.scenarios is None:
        return []
    rows = [at[against] for at in scenario_rows(analysis).values()
            if all(v in at and at[v]["status"] in TIMED for v in (candidate, against))
            and at[against]["kind"] == "step" and at[against]["busy_us"] == 0 and at[against]["page_size"] == page_size
            and at[against]["dtype"] == DTYPE and at[against]["payloads"] == payloads]
    return sorted(rows, key=lambda r: (r["requests"], r["scenario"]), reverse=True)


STAGED_PRESET = "hybrid"
"""The payload preset the staging candidate is set on where the run has it; else the first of PAYLOAD_PRESETS it has."""


def _staged(analysis: Analysis) -> list[Setting]:
    """The staged strategy against per payload on one payload preset's idle-queue steps (`STAGED_PRESET`): first the
    step its finding quotes (kvpages.analysis.hybrid.hybrid_rows), then its other steps, largest first (its other
    sizes); none where that step did not time the staged strategy. Another preset's finding cites its own rows."""
    chosen = hybrid_rows(analysis)
    preset = STAGED_PRESET if STAGED_PRESET in chosen else next((p for p in PAYLOAD_PRESETS if p in chosen), None)
    if preset is None or STAGED not in chosen[preset] or chosen[preset][TODAY]["kind"] != "step":
        return []
    first = chosen[preset][TODAY]
    others = [r for r in _steps(analysis, STAGED, TODAY, int(first["page_size"]), preset)
              if r["scenario"] != first["scenario"]]
    return [Setting(STAGED, TODAY, int(row["page_size"]), scenario=str(row["scenario"]), requests=int(row["requests"]),
                    said=f"a B={row['requests']} step at p={row['page_size']}, payloads {preset}", scheduler=True)
            for row in (first, *others)]


def _main_p(analysis: Analysis) -> int:
    """The page size a recommendation is shown at: 64 (the default steps') where swept, else the largest."""
    swept = {r.page_size for r in analysis.ratios_of(CANDIDATE)}
    return 64 if 64 in swept else max(swept, default=1)


CANDIDATES = (
    _Candidate("shortcut", "Restore the page_size == 1 shortcut (copy the token indices as they are at page size 1)",
               lambda a: _points(a, SHORTCUT, CANDIDATE, lambda p, L: p == 1)
               + _step(a, per_request_name(SHORTCUT), STEP_CANDIDATE, 1)),
    _Candidate("by-length", f"Choose by length: the `{ADAPTIVE}` variant, device stride from its threshold on, host "
                            "stride below it and at page size 1",
               lambda a: _points(a, ADAPTIVE, CANDIDATE, lambda p, L: p == _main_p(a))
               + _step(a, per_request_name(ADAPTIVE), STEP_CANDIDATE, _main_p(a))),
    _Candidate("batch-per-step", "Batch one D2H per scheduler step instead of one per request",
               lambda a: _step(a, BATCHED, STEP_CANDIDATE, 64) or _step(a, BATCHED, STEP_CANDIDATE, _main_p(a))),
    _Candidate("no-pinned-short", "Avoid the per-request pinned pattern (SGLang 0.5.23): a plain `.cpu()` "
                                  "instead",
               lambda a: _points(a, CANDIDATE, PINNED, lambda p, L: p == _main_p(a))),
    _Candidate("host-page-table", "Keep a host page table (the floor: vLLM's and TensorRT-LLM's connectors read "
                                  "host-side block ids)",
               lambda a: _step(a, per_request_name(FLOOR), STEP_CANDIDATE, 64) + _points(a, FLOOR, CANDIDATE,
                                                                                        lambda p, L: True)),
    _Candidate("stage-payloads", "Stage a hybrid model's payloads: one D2H per step, read by the transfer worker (no "
                                 "host sync on the scheduler thread), instead of a D2H and host sync per payload",
               _staged),
)


def _measured(analysis: Analysis, s: Setting) -> PairEstimate | None:
    if s.seq_len is not None:
        return point_estimate(analysis.run, (s.against, DTYPE, LAYOUT, s.seq_len, s.page_size),
                              (s.candidate, DTYPE, LAYOUT, s.seq_len, s.page_size), analysis.baseline)
    return scenario_estimate(analysis.run, (s.scenario, s.against), (s.scenario, s.candidate), "blocked")


def _predicted(analysis: Analysis, s: Setting) -> tuple[Prediction, ...]:
    """The candidate against what it replaces on every prediction profile (the what-if pinned ones too: the
    pageable ones alone decide, `_judge`); () where either cannot be priced."""
    mine, theirs = _row(analysis, s, s.candidate), _row(analysis, s, s.against)
    if mine is None or theirs is None:
        return ()
    if s.scheduler:
        return strategy_predictions(analysis, mine, theirs)
    calls = [row_call(analysis, v, row, 1) if s.seq_len is not None
             else row_call(analysis, v, row, int(row["calls"]), analysis.scenario_time(row))
             for v, row in ((s.candidate, mine), (s.against, theirs))]
    if calls[0] is None or calls[1] is None:
        return ()
    return tuple(predict(p, (calls[0], calls[1])) for p in analysis.predicting)


def _row(analysis: Analysis, s: Setting, variant: str) -> Record | None:
    """`variant`'s results.csv row at `s`'s point, or its scenarios.csv row on `s`'s scenario; None where it has none."""
    if s.seq_len is not None:
        return analysis.row_at(variant, DTYPE, LAYOUT, s.page_size, s.seq_len)
    return scenario_rows(analysis)[s.scenario].get(variant)


def _cites(analysis: Analysis, s: Setting) -> str:
    ids = []
    for variant in (s.candidate, s.against):
        if s.seq_len is not None:
            r = analysis.ratio_at(variant, DTYPE, LAYOUT, s.page_size, s.seq_len)
            ids.append(r.id if r is not None else "")
        else:
            r2 = analysis.scenario_ratio(s.scenario, variant, "blocked")
            ids.append(r2.id if r2 is not None else "")
    return " ".join(i for i in ids if i)


@dataclass(frozen=True)
class _Made:
    """A run's recommendations, each row's setting and (a CPU run's) predictions on every profile, by row id."""

    rows: tuple[Recommendation, ...] = ()
    settings: dict[str, Setting] = field(default_factory=dict)
    predictions: dict[str, tuple[Prediction, ...]] = field(default_factory=dict)


def recommendations(analysis: Analysis) -> tuple[Recommendation, ...]:
    """Every candidate at its first setting where the run can set it against what it replaces (module doc); made once
    per run and baseline (the report, its CSV and the findings cite them)."""
    return _made(analysis).rows


def recommendation_predictions(analysis: Analysis, row_id: str) -> tuple[Prediction, ...]:
    """A recommendation's candidate against what it replaces on every prediction profile (its predicted gain is over
    the pageable ones), as a finding quotes it; () on a run that crossed a link, or for no such row."""
    return _made(analysis).predictions.get(row_id, ())


def recommendation_repro(analysis: Analysis, row_id: str) -> str:
    """The command that re-runs a recommendation's candidate and what it replaces together, interleaved
    (`pair_repro` of the candidate's row); '' where there is none."""
    s = _made(analysis).settings.get(row_id)
    row = None if s is None else _row(analysis, s, s.candidate)
    return "" if s is None or row is None else pair_repro(str(row["repro"]), s.candidate, s.against)


def staging_row_ids(analysis: Analysis) -> dict[str, str]:
    """The ids of the rows that set staging against per payload, by scenario (a hybrid finding cites its step's:
    kvpages.analysis.hybrid)."""
    return {s.scenario: i for i, s in _made(analysis).settings.items() if s.candidate == STAGED}


def _made(analysis: Analysis) -> _Made:
    return analysis.run.cached(("recommendations", analysis.baseline), lambda: _recommendations(analysis))


def _recommendations(analysis: Analysis) -> _Made:
    """Each candidate's row at its first setting, then one row per other size of that setting's kind and page size,
    and per size of the other kind (a step beside a call) at that page size (`Recommendation.of`: the rows `along` and
    `across` word, so that each of their verdicts has a row of its own to cite; each kind a family of its own)."""
    if analysis.baseline != BASELINE:
        return _Made()
    chosen = [(c, settings) for c in CANDIDATES if (settings := c.settings(analysis))]
    heads = _judge(analysis, [ss[0] for _, ss in chosen])
    own, others = [], []
    for (c, ss), head in zip(chosen, heads, strict=True):
        if head is None:
            continue
        first = ss[0]
        judged, crossed = ([j for j in _judge(analysis, [s for s in ss[1:] if s.page_size == first.page_size
                                                         and (s.seq_len is None) == same]) if j is not None]
                           for same in (first.seq_len is None, first.seq_len is not None))
        along = _along(judged) if judged else ""
        across = f"{'per step' if first.seq_len is not None else 'per call'}: {_along(crossed)}" if crossed else ""
        key = f"rec-{c.key}"
        own.append((head, head.row(analysis, key, c.action, along=along, across=across)))
        judged = sorted(judged, key=lambda j: j.setting.size[1]) + sorted(crossed, key=lambda j: j.setting.size[1])
        others += [(j, j.row(analysis, f"{key}-{name}", c.action, of=key))
                   for j, name in zip(judged, size_names([j.setting for j in judged]), strict=True)]
    made = own + others
    return _Made(tuple(r for _, r in made), {r.id: j.setting for j, r in made},
                 {r.id: j.predictions for j, r in made if j.predictions})


def _along(judged: list[_Judged]) -> str:
    """'slower at B=1; faster at B=8, 32': each judged size's verdict (one kind of setting, `verdicts_along`)."""
    return verdicts_along([(j.setting.size[1], j.verdict) for j in judged], judged[0].setting.size[0])


def size_names(settings: list[Setting]) -> list[str]:
    """Each other size's name in its row id: 'L2048' (a call), 'B8' (a step); where two steps share a B (other
    distributions of lengths), every step by its scenario instead (a call's length is unique at one page size)."""
    names = [f"{s.size[0][0]}{s.size[1]}" for s in settings]
    steps = [n for s, n in zip(settings, names, strict=True) if s.seq_len is None]
    shared = len(set(steps)) < len(steps)
    return [s.scenario if shared and s.seq_len is None else n for s, n in zip(settings, names, strict=True)]


@dataclass(frozen=True)
class _Judged:
    """A candidate at one setting: its gain and verdict (measured: the verdict; predicted: 'below' or 'not below')."""

    setting: Setting
    interval: Interval
    verdict: str
    measured: bool
    predictions: tuple[Prediction, ...] = ()  # predicted: on every profile

    def row(self, analysis: Analysis, id: str, action: str, along: str = "", of: str = "",
            across: str = "") -> Recommendation:
        s, i = self.setting, self.interval
        recommended = self.verdict == (FASTER if self.measured else _said(True))
        verdict = self.verdict if self.measured else PREDICTED_VERDICTS[self.verdict]
        return Recommendation(id, action, s.said, s.candidate, s.against, i.ratio, i.ci_low, i.ci_high, recommended,
                              MEASURED if self.measured else PREDICTED, verdict, _cites(analysis, s), along, of, across)


def _judge(analysis: Analysis, settings: list[Setting]) -> list[_Judged | None]:
    """Each setting judged (None where it cannot be): measured on a run that crossed a link, the settings a family of
    their own; else predicted, below or not below on every pageable profile (the gain the middle prediction, its
    interval the range over the profiles and their bounds)."""
    if analysis.run.link_crossed:
        found = [_measured(analysis, s) for s in settings]
        verdicts = iter(_judged(analysis, [e for e in found if e is not None]))
        return [None if e is None else _Judged(s, e.found.interval, next(verdicts), True)
                for s, e in zip(settings, found, strict=True)]
    out: list[_Judged | None] = []
    for s in settings:
        every = _predicted(analysis, s)
        predictions = tuple(p for p in every if not p.profile.pinned)  # what `.cpu()` copies over decides
        if not predictions:
            out.append(None)
            continue
        ratios = sorted(p.ratio for p in predictions)
        interval = Interval(ratios[len(ratios) // 2], min(p.low for p in predictions), max(p.high for p in predictions),
                            len(predictions), float("nan"), "profile")
        out.append(_Judged(s, interval, _said(_below(predictions)), False, every))
    return out


def _below(predictions: tuple[Prediction, ...]) -> bool:
    """Whether every profile puts the candidate below what it replaces."""
    return all(p.ratio < 1 for p in predictions)


def _said(below: bool) -> str:
    return "below" if below else "not below"


PREDICTED_VERDICTS = {_said(True): "below on every pageable profile", _said(False): "not below on some pageable profile"}
"""A predicted verdict as recommendations.csv and the report say it (`_below`: over the pageable profiles)."""


def _judged(analysis: Analysis, estimates: list[PairEstimate]) -> tuple[str, ...]:
    if not estimates:
        return ()
    return judge_family([e.found.interval for e in estimates], [e.found.p_value for e in estimates],
                        [e.disturbed for e in estimates], analysis.noise.min_effect).verdicts
