"""The report's appendix: every variant at every point, whole requests and steps in full, the link model (no torch)."""

from __future__ import annotations

from kvpages.analysis.cite import fraction, sig
from kvpages.analysis.families import records
from kvpages.analysis.predict import fitted_check, row_call, with_link_model
from kvpages.analysis.ratios import Analysis, variant_order
from kvpages.analysis.wording import in_sample, verdict_text
from kvpages.core.links import profile_for
from kvpages.core.names import CANDIDATE, called, label
from kvpages.render.text import ci_text, count, coverage, interval_cell, table


def groups(analysis: Analysis):
    return analysis.run.ok_rows().groupby(["dtype", "layout", "page_size"], sort=True)


def variants_section(analysis: Analysis) -> str:
    """Per page size: every other variant's bytes and latency against the baseline (the merged PR's are in the
    report's evidence tables, with the fastest variants per point)."""
    parts = []
    others = [r for r in analysis.ratios if r.variant != CANDIDATE]
    spread = analysis.run.ok_rows().set_index(["variant", "dtype", "layout", "page_size", "seq_len"])["rep_spread"]
    for (dtype, layout, page_size), _ in groups(analysis):
        rows = [[f"`{r.id}`", count(r.variant_d2h_bytes), fraction(r.bytes_ratio), sig(r.variant_median_us),
                 f"{sig(100 * spread.get((r.variant, dtype, layout, page_size, r.seq_len), float('nan')))}%", sig(r.ratio),
                 ci_text(r), verdict_text(r.verdict, r.stability)]
                for r in others if (r.dtype, r.layout, r.page_size) == (dtype, layout, page_size)]
        if rows:
            b = called(analysis.baseline)
            header = ["ratios.csv id", "bytes", f"bytes / {b}", "median µs", "spread", f"time / {b}",
                      coverage(analysis), "verdict"]
            parts.append(f"#### page_size {page_size} ({dtype}, {layout})\n\n{table(header, rows)}")
    return "\n\n".join(parts) or "No other variant was timed."


def link_model_section(analysis: Analysis) -> str:
    run = analysis.run
    modeled = with_link_model(analysis, run.ok_rows())  # one call: ops, syncs, copies, bytes
    modeled = modeled[modeled["variant"].isin([analysis.baseline, CANDIDATE])]
    longest = modeled.groupby(["dtype", "layout", "page_size"])["seq_len"].transform("max")
    chosen = modeled[modeled["seq_len"] == longest].sort_values(["page_size", "variant"])
    header = ["page_size", "seq_len", "variant", "bytes", "transfers", "measured µs"] + [p.label + " µs" for p in analysis.profiles]
    rows = [[r["page_size"], r["seq_len"], r["variant"], count(r["d2h_bytes"]), r["d2h_transfers"], sig(analysis.time_of(r))]
            + [sig(r[p.column]) for p in analysis.profiles] for _, r in chosen.iterrows()]
    lead = ("**Model, not measurement**: the link and device terms of one call per link profile, without host work "
            "(every term and its source: the report's link model section, `kvpages/core/links.py`), at the longest "
            "swept seq_len. ")
    lead += ("This run crossed a real link, so its measured median sits beside the model for comparison."
             if run.link_crossed else "This CPU run crossed no link: its measured column contains no transfer time at all.")
    return f"{lead}\n\n{table(header, rows)}" + model_vs_measurement(analysis)


def model_vs_measurement(analysis: Analysis) -> str:
    """On a run that crossed a link: each row's median beside the model of the link it crossed
    (the PCIe generation the link trains to, from meta.json); the difference is what the model leaves out."""
    run = analysis.run
    if not run.link_crossed:
        return ""
    pcie = run.meta.environment.pcie_link if run.meta else None
    rows = []
    for r in records(run.ok_rows().sort_values(["page_size", "seq_len", "variant"], key=variant_order)):
        profile = profile_for(pcie, r["link"], analysis.profiles)
        if profile is None:
            continue
        call = row_call(analysis, str(r["variant"]), r, 1)
        if call is None:  # its host work is not separable here
            continue
        modeled = profile.predicted_us(*call)
        time = analysis.time_of(r)
        rows.append([r["page_size"], r["seq_len"], f"`{r['variant']}`", r["link"], profile.label, sig(time),
                     sig(modeled), sig(time - modeled)])
    if not rows:
        return f"\n\nNo link profile matches this run's link (PCIe: {pcie}), so the model is not compared with it."
    header = ["page_size", "seq_len", "variant", "link", "profile", "measured µs", "modeled µs", "measured - modeled µs"]
    return ("\n\n#### Model vs measurement\n\nEach timed row beside the model of the link it crossed, its host work "
            "included (measured apart from its copy: kvpages.analysis.hostwork). The difference is what the model "
            "leaves out (device kernels, Python, synchronisation) or gets wrong (the profile's latency and "
            "bandwidth).\n\n" + table(header, rows) + _fitted_at_page_one(analysis))


def _fitted_at_page_one(analysis: Analysis) -> str:
    """The fitted profile's merged PR / pre-PR at page size 1 against the measured, per length (the findings' model
    check says the largest difference)."""
    check = fitted_check(analysis, CANDIDATE)
    if check is None:
        return ""
    own = in_sample(check.profile, analysis.run.run_id)
    rows = [[f"`{r.id}`", f"{sig(r.ratio)} {ci_text(r)}", sig(p.ratio), f"{100 * (p.ratio / r.ratio - 1):+.2f}%"]
            for r, p in check.rows]
    header = ["ratios.csv id", f"measured [{coverage(analysis)}]", f"{check.profile.name} predicts", "predicted / measured - 1"]
    return (f"\n\n#### The fitted profile at page size 1\n\n{check.profile.name}{own}: the merged PR / pre-PR it predicts "
            f"at p=1 against the measured ratio, at each length; the findings' \"within {check.within}\" is the largest "
            "difference, rounded up.\n\n"
            + table(header, rows))


def ratio_cell(analysis: Analysis, scenario: str, variant: str, latency: str) -> str:
    if variant == analysis.scenario_baseline:
        return "1"
    r = analysis.scenario_ratio(scenario, variant, latency)
    return "" if r is None else interval_cell(r.interval, r.verdict, r.stability)


def same_latencies(analysis: Analysis) -> bool:
    """Whether blocked and ready are the same column in this run (a CPU run: no device queue, no worker wait)."""
    frame = analysis.run.scenarios
    if frame is None:
        return True
    ok = frame[frame["status"] == "ok"]
    return not analysis.run.link_crossed and bool((ok["blocked_median_us"] == ok["ready_median_us"]).all())


def scenarios_section(analysis: Analysis) -> str:
    """Every step variant of every whole request and step, against the per-request baseline."""
    frame = analysis.run.scenarios
    if frame is None or frame.empty:
        return ""
    merged = same_latencies(analysis)
    parts = [f"Ratios against `{analysis.scenario_baseline}` ({label(analysis.scenario_baseline)}). A scenario's name "
             "says its side, prompt tokens L or requests per step B, chunk tokens C, page size p, dtype and busy queue."]
    ok = frame[frame["status"] == "ok"]
    for kind, title in (("request", "Per request"), ("step", "Per step")):
        rows = []
        chosen = ok[ok["kind"] == kind].sort_values(["side", "page_size", "busy_us", "requests", "tokens", "variant"],
                                                    key=variant_order)
        for r in records(chosen):
            latencies = ([sig(analysis.scenario_time(r)), ratio_cell(analysis, r["scenario"], r["variant"], "blocked")]
                         + ([] if merged else [sig(analysis.scenario_time(r, "ready")),
                                               ratio_cell(analysis, r["scenario"], r["variant"], "ready")]))
            rows.append([f"`{r['id']}`", r["calls"], count(r["d2h_bytes"]), r["d2h_transfers"], *latencies])
        if rows:
            b = called(analysis.scenario_baseline)
            time = ["blocked = ready µs", f"/ {b} [{coverage(analysis)}]"] if merged else [
                "blocked µs", f"blocked / {b} [{coverage(analysis)}]", "ready µs", f"ready / {b} [{coverage(analysis)}]"]
            header = ["scenarios.csv id: scenario:step variant", "calls", "bytes", "transfers", *time]
            parts.append(f"#### {title}\n\n" + table(header, rows))
    others = frame[frame["status"] != "ok"]
    notes = [f"- {variant}: {len(group)} scenario(s) {group['status'].iloc[0].replace('_', ' ')}: {note}"
             for (variant, note), group in others.groupby(["variant", "note"])]
    if notes:
        parts.append("\n".join(notes))
    return "\n\n".join(parts)
