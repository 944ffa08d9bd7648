"""The report's evidence: one compact table per question, and the model's terms in one place (no torch). On a run
that crossed no link the times are host-side work: the tables say so and set the model's prediction beside them."""

from __future__ import annotations

from kvpages.analysis.cite import fraction, sig
from kvpages.analysis.findings import findings
from kvpages.analysis.gpu_answer import GpuAnswer
from kvpages.analysis.predict import crossover, point_predictions, scenario_predictions
from kvpages.analysis.ratios import Analysis
from kvpages.analysis.recommend import BATCHED
from kvpages.analysis.wording import bounded, profile_name, span, verdict_text
from kvpages.core.links import ASSUMED, HOST_WORK, SCALES, TERM_KEYS, Term
from kvpages.core.names import CANDIDATE, STEP_CANDIDATE, called
from kvpages.core.payloads import DEFAULT_PAYLOADS
from kvpages.render.captions import time_label
from kvpages.render.text import ci_text, count, coverage, interval_cell, table


def _predicted_header(analysis: Analysis) -> list[str]:
    if analysis.run.link_crossed:
        return []
    return [f"model: {profile_name(p)} [range at the bounds]" for p in analysis.predicting]


def per_call_table(analysis: Analysis) -> str:
    """The merged PR against pre-PR per call, at the shortest and longest length of each page size."""
    ratios = analysis.ratios_of(CANDIDATE)
    rows = []
    for r in sorted(ratios, key=lambda r: (r.page_size, r.seq_len)):
        at = [x.seq_len for x in ratios if x.page_size == r.page_size]
        if r.seq_len not in (min(at), max(at)):
            continue
        predicted = [] if analysis.run.link_crossed else [span(p) for p in point_predictions(analysis, r)]
        rows.append([r.page_size, r.seq_len, fraction(r.bytes_ratio), sig(r.baseline_median_us), sig(r.variant_median_us),
                     f"{sig(r.ratio)} {ci_text(r)} {verdict_text(r.verdict, r.stability)}", *predicted, f"`{r.id}`"])
    word = time_label(analysis, "µs")
    b = called(analysis.baseline)
    header = ["p", "L", f"bytes PR / {b}", f"{b} {word}", f"PR {word}", f"PR / {b} [{coverage(analysis)}]",
              *_predicted_header(analysis), "id"]
    return table(header, rows)


def crossover_table(analysis: Analysis) -> str:
    rows = []
    for c in analysis.crossovers:
        if c.page_size == 1:
            continue
        found = [r for r in analysis.ratios_of(CANDIDATE) if (r.dtype, r.layout, r.page_size) == (c.dtype, c.layout,
                                                                                                 c.page_size)]
        predicted = [] if analysis.run.link_crossed else [
            f"{x.at(x.seq_len)} [{x.span}]" for x in (crossover(analysis, found, p) for p in analysis.predicting)]
        rows.append([c.page_size, c.describe(), *predicted])
    what = "measured host-side (no transfer)" if not analysis.run.link_crossed else "measured"
    return table(["p", f"{what}: judged faster from", *_predicted_header(analysis)], rows)


def scenario_table(analysis: Analysis) -> str:
    """Whole requests and steps at the largest page size: the merged PR and the batched step against pre-PR."""
    frame = analysis.run.scenarios
    if frame is None or frame.empty:
        return ""
    ok = frame[(frame["status"] == "ok") & (frame["busy_us"] == 0) & frame["variant"].isin([STEP_CANDIDATE, BATCHED])
               & (frame["payloads"] == DEFAULT_PAYLOADS)]  # several payloads per send: kvpages.render.hybrid
    if ok.empty:
        return ""
    top = int(ok["page_size"].max())
    ok = ok[ok["page_size"] == top].sort_values(["kind", "side", "variant", "requests", "tokens"])
    rows = []
    for _, row in ok.iterrows():
        r = analysis.scenario_ratio(str(row["scenario"]), str(row["variant"]), "blocked")
        if r is None:
            continue
        size = f"L={row['tokens']}" if row["kind"] == "request" else f"B={row['requests']}"
        predicted = [] if analysis.run.link_crossed else [span(p) for p in scenario_predictions(analysis, r)]
        rows.append([f"{row['kind']} {row['side']}", size, row["variant"], count(row["d2h_bytes"]), row["d2h_transfers"],
                     sig(r.baseline_us), sig(r.variant_us), interval_cell(r.interval, r.verdict, r.stability), *predicted])
    word = time_label(analysis, "µs")
    b = called(analysis.scenario_baseline)
    header = ["what", "size", "step variant", "bytes", "D2H", f"{b} {word}", f"variant {word}",
              f"variant / {b} [{coverage(analysis)}]", *_predicted_header(analysis)]
    return f"At page size {top}; every page size and step variant is in the appendix.\n\n" + table(header, rows)


def term_text(t: Term) -> str:
    """'16.5 µs [14.3, 20.6] (fitted)' or '5 µs, bounds 2.5-10 (0.5-2x)': 3 significant figures, as the interval
    supports (torch.utils.benchmark prints its figures so)."""
    if t.fitted and t.low is not None and t.high is not None:
        return f"{sig(t.value)} {t.unit} [{sig(t.low)}, {sig(t.high)}], fitted, varied within that interval"
    if t.key not in ASSUMED:  # an assumption's figure as its source gives it
        return f"{t.value:g} {t.unit}, not varied"
    (low, _), (high, _) = t.bounds()
    return f"{t.value:g} {t.unit}, bounds {low:.3g}-{high:.3g} ({SCALES[0]:g}-{SCALES[1]:g}x)"


def _terms(analysis: Analysis) -> list[str]:
    """Each term once where every priced profile shares it (value and source), else once per profile."""
    lines = []
    for key in TERM_KEYS:
        terms = {(p.term(key).value, p.term(key).source, p.term(key).low, p.term(key).high): p for p in analysis.profiles}
        for t in (p.term(key) for p in terms.values()):
            owners = [p for p in analysis.profiles if p.term(key) == t]
            where = "" if len(terms) == 1 else f" ({', '.join(p.label for p in owners)})"
            own = " *In-sample here*: fitted from this run." if t.fitted and any(
                p.in_sample(analysis.run.run_id) for p in owners) else ""  # a prior it kept was not
            lines.append(f"- {t.name}{where}: {term_text(t)}. {t.source}{own}")
    return lines


def _user_profiles(analysis: Analysis) -> str:
    mine = [p for p in analysis.profiles if p.origin != "built-in"]
    return "".join(f" Profile `{p.name}` ({p.label}, {p.memory}) is the user's: `{p.origin}`, SHA-256 {p.sha256[:16]}..., "
                   "recorded in meta.json `link_profiles`." for p in mine)


def model_section(analysis: Analysis) -> str:
    """Every term of the model, its bounds and its source, in one place."""
    crossed = ("This run crossed a link: its findings are measured, and one finding sets the model against them."
               if analysis.run.link_crossed else
               "This run crossed no link: the findings' times are this model's predictions, each with its range when "
               "the assumed terms (launch, kernel, sync, fixed cost) move to their bounds, one at a time and all "
               "together; a crossover names the terms that move it.")
    return ("predicted µs = measured host work (pre-PR's numpy stride and divide, the host mirror's slice: host work "
            "on any box) + device ops x (launch + kernel) + copies x fixed cost + host syncs x sync (a blocking copy: "
            "one of each) + bytes / bandwidth. A device variant's measured time on a CPU run is its divide on this "
            f"CPU, so it is not carried over. Host work: {HOST_WORK}. `.cpu()` copies into pageable memory, so pre-PR "
            "and the merged PR are priced on pageable profiles and on GH200's C2C; the pinned profile is a what-if. "
            f"{crossed}{_user_profiles(analysis)} The public GPU figures the model is tested against, and what it "
            "leaves out of those it misses: docs/method.md, \"The public record\". Terms (link profiles: "
            "kvpages/schema/profiles/*.toml; `kvpages calibrate` fits them from a CUDA run):\n\n" + "\n".join(_terms(analysis)))


def predictions_section(analysis: Analysis, gpu: GpuAnswer | None = None) -> str:
    """APPENDIX.md: every prediction a finding quotes (`gpu`: the report's GPU answer, which its findings name), per
    profile by its label, with the variation at each end."""
    if analysis.run.link_crossed:
        return ""
    rows = [[f.question, f"`{f.id}`", profile_name(p.profile, analysis.run.run_id), bounded(p)]
            for f in findings(analysis, gpu) for p in f.predictions]  # each against what its finding sets it
    return ("Each finding's predicted ratio per link profile, with the variation of the assumed terms that gives each "
            "end of its range.\n\n" + table(["finding", "row id", "profile", "predicted [low if ..., high if ...]"], rows))
