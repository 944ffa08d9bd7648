"""The `kvpages` command: list, report on, compare and set side by side the variants, options and runs.
Only `list` imports torch (the variant registry); each command imports what it uses, and the program imports neither
numpy nor pandas before a command needs them (a kept report or kept charts need neither: kvpages.render.kept). User
errors: one line, exit 2."""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, NoReturn

from kvpages.core.checks import UserError, check_runs, one_line
from kvpages.core.names import CANDIDATE

if TYPE_CHECKING:
    from kvpages.analysis.cache import Loaded, Pickled
    from kvpages.analysis.ratios import Analysis


class _Names:
    """The names of a table (the presets, compare's formats), read from it only where argparse needs them: a value
    given, an error or --help (the presets' module imports numpy)."""

    def __init__(self, table: Callable[[], Sequence[str]]):
        self._table = table

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())


def _presets() -> tuple[str, ...]:
    from kvpages.core.presets import PRESETS

    return tuple(PRESETS)


def _compare_formats() -> tuple[str, ...]:
    from kvpages.render.compare import FORMATS

    return tuple(FORMATS)


class _Parser(argparse.ArgumentParser):
    commands: Mapping[str, argparse.ArgumentParser] = MappingProxyType({})  # the program's: each command's (build_parser)

    def error(self, message: str):  # one line, no usage dump
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def cmd_list(args: argparse.Namespace) -> int:
    from kvpages.measure.steps import StepVariant, all_step_variants
    from kvpages.measure.variants import Variant, all_variants

    def show(listed: list[tuple[Variant | StepVariant, str, bool]]) -> None:  # (variant, what it moves, print its doc)
        needs = {v.name: ",".join(v.requires) or "-" for v, _, _ in listed}
        width, moved, needed = (max(map(len, column)) for column in (needs, (m for _, m, _ in listed), needs.values()))
        for v, moves, doc in listed:
            print(f"{v.name:<{width}}  {moves:<{moved}}  requires={needs[v.name]:<{needed}}  {v.description}")
            if args.verbose and doc:
                print("    " + v.doc.replace("\n", "\n    ") + "\n")

    show([(v, f"moves={v.moves.value}", True) for v in all_variants()])
    print("\nstep variants (whole requests and steps; `kvpages scenarios` lists the scenarios):")
    show([(s, "one D2H per step" if s.batched else "upkeep D2H per step" if s.extras else "one D2H per request",
           s.batched) for s in all_step_variants()])
    return 0


def cmd_scenarios(args: argparse.Namespace) -> int:
    from kvpages.core.presets import PRESETS
    from kvpages.core.scenarios import LENGTHS, describe

    print(f"scenarios of preset {args.preset!r} (kvpages/core/presets.py); step lengths: " + "; ".join(LENGTHS.values()))
    for scenario in PRESETS[args.preset].scenarios:
        lines = list(describe(scenario))
        print("\n".join(lines if args.verbose else lines[:4]))
        if not args.verbose and len(lines) > 4:
            print(f"  ... {len(lines) - 4} more call(s) (-v lists them)")
    return 0


def cmd_options(args: argparse.Namespace) -> int:
    from kvpages.core.options import OPTIONS, options_markdown, with_options_table

    if args.markdown is None:
        width = max(len(o.flag) for o in OPTIONS)
        for o in OPTIONS:
            print(f"{o.flag:<{width}}  {o.help}")
    elif not args.markdown:
        print(options_markdown())
    else:
        page = Path(args.markdown)
        try:
            text = with_options_table(page.read_text(), str(page))
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        page.write_text(text)
        print(f"written: the options table in {page}")
    return 0


def _pickled(path: Path, profile_files: Sequence[Path] = ()) -> Pickled:
    """The run's analysis, pickled, its meta.json first recording the user's link profiles (each read and checked
    before); the one kept since the folder's last change where there is one (kvpages.analysis.cache)."""
    from kvpages.analysis.cache import pickled
    from kvpages.schema.profiles import read_profile, record_profiles

    profiles = tuple(read_profile(f) for f in profile_files)
    if profiles:
        from kvpages.schema.reader import load_run

        run = load_run(path)
        record_profiles(run.path if run.path.is_dir() else run.path.parent, profiles)
    return pickled(path)


def _analysis(path: Path, profile_files: Sequence[Path] = ()) -> Analysis:
    """The run's analysis (`_pickled`), kept."""
    return _loaded(path, profile_files).analysis


def _loaded(path: Path, profile_files: Sequence[Path] = ()) -> Loaded:
    """The run's analysis (`_pickled`), kept, as loaded (for `Loaded.remember`)."""
    from kvpages.analysis.cache import Loaded

    return Loaded.kept(_pickled(path, profile_files))


def cmd_plot(args: argparse.Namespace) -> int:
    from kvpages.render.kept import KeptCharts

    formats = ("png", "svg") if args.svg else ("png",)
    kept = None if args.link_profile else KeptCharts.of(args.run, formats)
    charts = None if kept is None else kept.charts()
    if charts is None:  # none kept, or a chart changed since: every chart drawn (the analysis loaded or made)
        from kvpages.analysis.gpu_answer import answer_ahead
        from kvpages.render.drawing import draw_run
        from kvpages.schema.reader import RunError

        charts = draw_run(lambda: _pickled(args.run, args.link_profile), formats, lambda: answer_ahead(args.run))
        if not charts:
            raise RunError(f"{args.run}: no timed rows (status ok), so there is nothing to plot")
        if kept is not None:  # for the next plot on the folder, as these charts stand now
            kept.keep(charts)
    for path in charts:
        print(path)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from kvpages.render.kept import KeptReport, write_files

    kept = None if args.link_profile else KeptReport.of(args.run, args.gpu_run)
    files = None if kept is None else kept.files()
    if files is not None:
        path = write_files(args.run, files)
    else:  # nothing kept: the analysis loaded (or made), its report made (or read from its memo)
        from kvpages.analysis.gpu_answer import gpu_answer
        from kvpages.render.report import made_report

        loaded = _loaded(args.run, args.link_profile)
        gpu = gpu_answer(loaded.analysis, args.gpu_run)
        files = made_report(loaded.analysis, gpu)
        for made in (loaded,) if gpu is None else (loaded, gpu.loaded):  # its findings, recommendations and estimates
            made.remember()
        path = write_files(loaded.analysis.run.path, files)
        if kept is not None:  # for the next report on the folder, once these are written
            kept.keep(files)
    print(files[-1][1], end="")  # REPORT.md, rendered once
    print(f"written: {path} and {path.parent / 'ratios.csv'}", file=sys.stderr)
    return 0


def cmd_summary(args: argparse.Namespace) -> int:
    from kvpages.render.summary import summary_text

    print(summary_text(_analysis(args.run)))
    return 0


def cmd_cite(args: argparse.Namespace) -> int:
    from kvpages.analysis.citations import all_ids, cite

    if args.id is None and not args.list:
        raise UserError(f"give a row id to cite; `kvpages cite {args.run} --list` lists them")
    analysis = _analysis(args.run)
    print("\n".join(all_ids(analysis)) if args.list else cite(analysis, args.id))
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from kvpages.analysis.cache import Loaded
    from kvpages.analysis.calibrate import calibrate
    from kvpages.core.links import MEMORIES, profile_for
    from kvpages.render.calibrate import calibration_text
    from kvpages.schema.profiles import NAME, built_in_profiles, profile_text, read_profile
    from kvpages.schema.store import write_atomic

    if args.name is not None and not NAME.fullmatch(args.name):
        raise UserError(f"--name {args.name!r}: a profile name is lower-case letters, digits and '_', e.g. h200_lab")
    check_runs(*args.run, out=args.out)
    analyses = [Loaded.of(path).analysis for path in args.run]  # kept between commands
    runs = [a.run for a in analyses]
    pcie = runs[0].meta.environment.pcie_link if runs[0].meta else None
    built_in = built_in_profiles()
    prior = {m: profile_for(pcie, f"pcie {m}", built_in) or next(p for p in built_in if p.name == f"pcie5_{m}")
             for m in MEMORIES}
    calibration = calibrate(analyses, prior, args.name)
    first = runs[0].path
    out = args.out or (first if first.is_dir() else first.parent)
    given = " ".join(str(path) for path in args.run)
    written = []
    for profile in calibration.profiles:
        path = out / f"{profile.name}.toml"
        text = profile_text(profile, f"Fitted by `kvpages calibrate {given}`: pass it to `kvpages report --link-profile` "
                                     f"or a sweep's --kv-link-profile.\nPrior (terms the runs cannot separate or a "
                                     f"link cannot reach): {prior[profile.memory].name}.")
        if path.exists() and dataclasses.replace(read_profile(path), origin=profile.origin, sha256="") != profile:
            raise UserError(f"{path}: exists with other terms; remove it or pass --out to write elsewhere")
        written.append((path, text))
    print(calibration_text(calibration))
    out.mkdir(parents=True, exist_ok=True)
    for path, text in written:
        write_atomic(path, text)
        print(f"written: {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from kvpages.analysis.cache import kept_run
    from kvpages.analysis.compare import compare_runs
    from kvpages.render.compare import FORMATS, Compared

    check_runs(args.a, args.b, fail_above=args.fail_above)
    a, b = kept_run(args.a), kept_run(args.b)  # each as its kept analysis holds it, else read now
    kinds = [run.meta.environment.device if run.meta else None for run in (a, b)]
    if args.fail_above is not None and None not in kinds and kinds[0] != kinds[1]:  # host-side work against transfers
        raise UserError(f"--fail-above: A ran on {kinds[0]} and B on {kinds[1]}; a gate compares runs of one kind of "
                        "device (without --fail-above, compare shows the two side by side)")
    compared = Compared(a, b, compare_runs(a, b), args.fail_above)
    print(FORMATS[args.format or next(iter(FORMATS))](compared))
    if compared.regressions:
        print(compared.gate_line(), file=sys.stderr)
        return 1
    return 0


def cmd_noise(args: argparse.Namespace) -> int:
    from kvpages.analysis.noise import aa_figures

    check_runs(args.a, args.b, fail_above=args.fail_above)
    a, b = _analysis(args.a), _analysis(args.b)
    print(aa_figures(a, b, args.variant, args.fail_above).text())
    return 0


def cmd_fleet(args: argparse.Namespace) -> int:
    from kvpages.analysis.fleet import analysed, fleet_of
    from kvpages.render.fleet import checked_out, write_fleet

    out = checked_out(args.out)
    for path in write_fleet(fleet_of(analysed(args.runs)), out):
        print(path)
    return 0


def build_parser() -> _Parser:
    parser = _Parser(prog="kvpages", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    parser.commands = sub.choices

    def command(func: Callable[[argparse.Namespace], int], text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(func.__name__.removeprefix("cmd_"), help=text)
        p.set_defaults(func=func)
        return p

    p = command(cmd_list, "list the registered variants")
    p.add_argument("-v", "--verbose", action="store_true", help="also print each variant's docstring (its hypothesis)")
    p = command(cmd_options, "list the --kv-* options of `pytest bench/` (the one table they are parsed from)")
    p.add_argument("--markdown", nargs="?", const="", metavar="PAGE",
                   help="print them as a markdown table; with PAGE, rewrite the table between its markers in PAGE "
                        "(docs/guide.md)")
    p = command(cmd_scenarios, "print the calls each whole-request and step scenario of a preset makes")
    p.add_argument("--preset", default="default", choices=_Names(_presets), metavar="NAME",
                   help="the preset: %(choices)s (default: default)")
    p.add_argument("-v", "--verbose", action="store_true", help="list every call")
    for func, text in (
        (cmd_plot, "regenerate the charts of a run folder (or results CSV) into that folder; where the folder and its "
                   "charts are as the last plot left them, nothing is drawn (KVPAGES_CACHE=off draws them anyway)"),
        (cmd_report, "write REPORT.md into a run folder and print it"),
        (cmd_summary, "print bytes, time per call and ratio per page size at a few sequence lengths"),
    ):
        command(func, text).add_argument("run", type=Path, help="run folder, e.g. results/<run-id>, or its results.csv")
    sub.choices["plot"].add_argument("--svg", action="store_true", help="also write SVG")
    for name in ("plot", "report"):
        sub.choices[name].add_argument("--link-profile", type=Path, action="append", default=[], metavar="PATH",
                                       help="add a link profile (TOML, e.g. from `kvpages calibrate`) to the predictions; "
                                            "recorded in the run's meta.json (repeatable)")
    sub.choices["report"].add_argument("--gpu-run", type=Path, metavar="RUN",
                                       help="a CPU run's report gives this CUDA run's measured figures beside its "
                                            "predictions (default: the newest CUDA run of the same points beside it)")
    p = command(cmd_calibrate, "fit the link model's terms from CUDA runs' rows: each with its interval, every residual")
    p.add_argument("run", type=Path, nargs="+", help="CUDA run folders of one kind of machine, e.g. results/<run-id>; "
                                                     "several fit one profile whose intervals cover machine to machine")
    p.add_argument("--out", type=Path, help="folder for the fitted profile files (default: the first run's folder)")
    p.add_argument("--name", help="name the profiles <NAME>_pageable and <NAME>_pinned (default: fit_<first run id>)")
    p = command(cmd_cite, "print one row's figure in one line: interval and coverage, machine, commit, command")
    p.add_argument("run", type=Path, help="run folder, e.g. results/<run-id>")
    p.add_argument("id", nargs="?", help="a row id: r-..., req-..., step-... or rec-... (--list)")
    p.add_argument("--list", action="store_true", help="list the run's row ids instead")
    p = command(cmd_compare, "compare run B against run A point by point")
    p.add_argument("a", type=Path, help="baseline run folder")
    p.add_argument("b", type=Path, help="run folder to compare")
    p.add_argument("--fail-above", type=float, metavar="PCT",
                   help="exit 1 if any variant's ratio to the baseline is worse in B by more than PCT percent "
                        "beyond noise")
    p.add_argument("--format", choices=_Names(_compare_formats), metavar="FORMAT",
                   help="text (default), markdown (a table for a pull-request comment) or json (a document for CI)")
    p = command(cmd_noise, "A/A figures of two runs of the same code: do their intervals hold each other?")
    p.add_argument("a", type=Path, help="first run folder")
    p.add_argument("b", type=Path, help="second run folder, same code and machine")
    p.add_argument("--variant", default=CANDIDATE, help=f"the variant whose ratio to the baseline is checked "
                                                        f"(default {CANDIDATE})")
    p.add_argument("--fail-above", type=float, default=10.0, metavar="PCT",
                   help="the compare gate to try on the pair (default 10)")
    p = command(cmd_fleet, "one sweep's runs from several machines side by side: FLEET.md and a chart")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN", help="run folders, two or more machines (runs of one "
                                                                       "machine are pooled as repetitions)")
    p.add_argument("--out", type=Path, help="folder for FLEET.md and fleet_ratios.png (default: a new fleet-<UTC time> "
                                            "here); never overwrites a finished report")
    return parser


def _no_reader() -> bool:
    """Whether what this program prints has no reader any more (`kvpages scenarios | head`, once head is done): then it
    stops quietly, as a pipe's writer does, and prints nothing else (stdout points at os.devnull, so that Python's
    flush at exit raises nothing either); False for a pipe of its own that broke (a drawing process that died)."""
    import select

    try:
        out = sys.stdout.fileno()
    except (AttributeError, ValueError, OSError):  # stdout replaced by an object without a file (a test's capture)
        return False
    if not hasattr(select, "poll"):  # Windows: said as an error
        return False
    polled = select.poll()
    polled.register(out, select.POLLOUT)
    if not any(events & select.POLLERR for _, events in polled.poll(0)):  # a pipe's write end, its reader gone
        return False
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, out)
    os.close(null)
    return True


def _refuse(parser: _Parser, given: list[str], command: str, extra: list[str]) -> NoReturn:
    """Arguments nothing takes, refused in one line: by the program if given before the command, else by the command."""
    if any(given.index(arg) < given.index(command) for arg in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    sub = parser.commands[command]
    options = ["/".join(a.option_strings) for a in sub._actions if a.option_strings and a.dest != "help"]
    sub.error(f"unrecognized arguments: {' '.join(extra)}; its options: {', '.join(options) or 'none'}")


def main(argv: Sequence[str] | None = None) -> int:
    """The `kvpages` program (`argv` None: the console script and `python -m kvpages`), or a command run in-process
    with `argv`, which keeps its collector. The program runs without the cyclic collector (matplotlib's figures are
    its cycles) and freezes what it holds at exit, so exit collects nothing either (reference run, 2 CPUs: `kvpages
    plot` 3.05 -> 2.85 s, `kvpages report` 1.50 -> 1.39 s)."""
    program = argv is None
    if program:
        gc.disable()
    parser = build_parser()
    args, extra = parser.parse_known_args(given := list(sys.argv[1:] if argv is None else argv))
    if extra:
        _refuse(parser, given, args.command, extra)
    try:
        return args.func(args)
    except (UserError, OSError) as exc:  # OSError: e.g. a run folder we may not write charts into
        if isinstance(exc, BrokenPipeError) and _no_reader():
            return 1
        print(f"kvpages: error: {one_line(exc)}", file=sys.stderr)
        return 2
    finally:
        if program:
            gc.freeze()


if __name__ == "__main__":
    sys.exit(main())
