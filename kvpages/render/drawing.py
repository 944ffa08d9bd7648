"""How `kvpages plot` draws on two CPUs (no torch; matplotlib only in the processes that draw), and how a finished
sweep has it draw its charts beside its analysis and report (`Beside`).

`draw_run`: a child forked first imports matplotlib and warms it (its font) while this process
loads and analyses the run, which it then hands over without the raw samples (the charts read the intervals the
analysis made; a chart that reads samples makes this process draw everything itself); the child draws the charts,
half of them in a process of its own (`side_by_side`), and hands back the files written. This process imports no
matplotlib but in that case: its import (a quarter of a second) and the warm-up are off the path to the first chart.
A third child, at the lowest priority, makes an analysis a later command will read (`kvpages plot`: the run's GPU
answer, for its report) on the CPU time these leave, and hands it back to be kept here; one not done soon after them
is killed. Elsewhere (one CPU; macOS, where fork is unsafe with some system libraries; Windows, which has none) the
charts are drawn here, one after the other, and nothing is made for a later command."""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import select
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kvpages.core.affinity import usable_cpus as cpus

if TYPE_CHECKING:
    from kvpages.analysis.cache import Pickled
    from kvpages.analysis.ratios import Analysis

Drawing = Callable[[], list[Path]]
"""Draws some charts; returns the files it wrote."""


def forks(processes: int = 2) -> bool:
    """Whether `processes` >= 2 draw in processes of their own here: on Linux, with two CPUs."""
    return processes >= 2 and cpus() >= 2 and sys.platform.startswith("linux")


@dataclass(frozen=True)
class _Child:
    """A forked child doing some work, and the pipe its result (or exception) comes back on."""

    pid: int
    reply: int

    @classmethod
    def start(cls, work: Callable[[], object], close: tuple[int, ...] = ()) -> _Child:
        """Fork a child that closes `close` (the other ends of this process's pipes), does `work`, sends back what it
        returned or raised, and leaves without any exit handler."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                for fd in (read, *close):
                    os.close(fd)
                try:
                    payload = pickle.dumps((True, work()))
                except BaseException as exc:
                    try:
                        payload = pickle.dumps((False, exc))
                    except Exception:
                        payload = pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")))
                with os.fdopen(write, "wb") as pipe:
                    pipe.write(payload)
            finally:
                os._exit(0)
        os.close(write)
        return cls(pid, read)

    def wait(self) -> tuple[bool, Any]:
        """Wait for the child: (True, what its work returned) or (False, its exception)."""
        with os.fdopen(self.reply, "rb") as pipe:
            payload = pipe.read()
        os.waitpid(self.pid, 0)
        return pickle.loads(payload) if payload else (False, RuntimeError("the chart process died"))

    def within(self, limit_s: float) -> Any:
        """What the child's work returned, where it is done within `limit_s` seconds; else (not done, failed, or what
        it sent cannot be read back) None, the child killed or gone."""
        if not select.select([self.reply], [], [], limit_s)[0]:  # it sends its result as it leaves
            os.kill(self.pid, signal.SIGKILL)
            os.close(self.reply)  # nothing read: it may have been half sent
            os.waitpid(self.pid, 0)
            return None
        try:
            done, value = self.wait()
        except Exception:  # an exception that pickles but does not unpickle
            return None
        return value if done else None


def _returned(outcome: tuple[bool, Any]) -> list[Path]:
    """What a child's work returned, or its exception raised here."""
    done, value = outcome
    if not done:
        raise value
    return value


def side_by_side(here: Drawing, there: Drawing, processes: int = 1) -> list[Path]:
    """`here() + there()`. With `forks(processes)`, `there` is drawn in a forked child at the same time (drawing is
    most of `kvpages plot`'s time, and no chart needs another); its exception, if any, is raised here once `here` is
    done, and an exception of `here` wins. Only `kvpages plot` asks for this: a benchmark session (torch, its threads)
    and the notebook draw in their own process."""
    if not forks(processes):
        return here() + there()
    child = _Child.start(there)
    try:
        mine = here()
    finally:  # the child is waited for even when `here` fails
        theirs = child.wait()
    return mine + _returned(theirs)


def draw_run(analysed: Callable[[], Pickled], formats: tuple[str, ...],
             meanwhile: Callable[[], Pickled | None] | None = None) -> list[Path]:
    """Every chart of the run whose pickled analysis `analysed()` gives (kvpages.render.plots.plot_run), drawn as the
    module says, the analysis kept (`Pickled.keep`) while the child draws; an exception of `analysed()` is raised
    here, once the child (still warming matplotlib: it writes nothing before it has the analysis) has been stopped.
    With `forks()`, `meanwhile()` (an analysis a later command will read: `kvpages plot`'s, the run's GPU answer for
    its report) is made from the start in a child of its own at the lowest priority (`_lowest`), on the CPU time the
    others leave: the drawing child's while it waits for the analysis, and the ends of the drawing. It is kept here,
    where it is done within ASIDE_GRACE_S of the rest (the charts drawn, or the analysis failed); else the child is
    killed (on a busy box it gets almost no CPU), having written nothing. Elsewhere it is not made."""
    if not forks():
        from kvpages.analysis.cache import loads
        from kvpages.render.plots import plot_run

        found = analysed()
        found.keep()
        return plot_run(loads(found.payload), formats)
    aside = None if meanwhile is None else _Child.start(lambda: _lowest(meanwhile))  # first: it holds no pipe below
    try:
        return _draw_here_and_there(analysed, formats)
    finally:
        ahead = None if aside is None else aside.within(ASIDE_GRACE_S)
        if ahead is not None:
            ahead.keep()


ASIDE_GRACE_S = 1.0
"""How long `draw_run` waits for what it makes meanwhile once the rest is done; then a later command makes it."""


def _lowest(work: Callable[[], Pickled | None]) -> Pickled | None:
    """`work()` at niceness 19, printing nothing (it may outlive a `kvpages plot` killed meanwhile: its output would
    keep a caller's pipe open)."""
    os.nice(19)
    quiet = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(quiet, fd)
    return work()


def _draw_here_and_there(analysed: Callable[[], Pickled], formats: tuple[str, ...]) -> list[Path]:
    """`draw_run`'s charts on two CPUs (the module's doc)."""
    from kvpages.analysis.cache import loads, without_samples
    from kvpages.schema.reader import SamplesWithheld

    given, give = os.pipe()
    child = _Child.start(lambda: _draw_given(given, formats), close=(give,))
    os.close(given)
    try:
        found = analysed()
        light = without_samples(found.payload)  # 4 of the reference run's 28 MB: 0.04 s less to hand over and unpickle
        with os.fdopen(give, "wb") as pipe:
            give = -1
            pipe.write(light)
        found.keep()
    finally:
        if give >= 0:
            os.close(give)
            os.kill(child.pid, signal.SIGKILL)
        drawn = child.wait()
    done, value = drawn
    if not done and isinstance(value, SamplesWithheld):  # a chart read the raw samples after all: drawn here, whole
        from kvpages.render.plots import plot_run

        return plot_run(loads(found.payload), formats)
    return _returned(drawn)


def _draw_given(given: int, formats: tuple[str, ...]) -> list[Path]:
    """The child of `draw_run`: matplotlib imported and warmed, then the analysis read from `given` and drawn, the
    per-point charts here and the others in a process of its own; nothing for no analysis."""
    from kvpages.analysis.cache import loads
    from kvpages.render.figures import warm_up
    from kvpages.render.plots import other_charts, point_charts

    warm_up()
    with os.fdopen(given, "rb") as pipe:
        payload = pipe.read()
    if not payload:
        return []
    analysis = loads(payload)
    return side_by_side(lambda: point_charts(analysis, formats), lambda: other_charts(analysis, formats), 2)


@dataclass
class Beside:
    """A finished sweep's charts (`--kv-analyze`), drawn by a process of their own that starts before the session
    loads and analyses the run: it imports and warms matplotlib meanwhile (`python -m kvpages.render.drawing`), is
    handed the analysis without its raw samples (`give`), draws it as `kvpages plot` does while the session goes on
    (its GPU answer; its report, which links the charts, once `wait` has them), and prints the files it wrote. Where a
    chart reads the raw samples after all, the session draws everything itself, from the whole analysis. What it
    prints goes to files, never to pipes: nothing reads them while the analysis is handed over, and a child whose
    start printed more than a pipe holds (PYTHONVERBOSE, say) would wait on its pipe as the session waits on it."""

    child: subprocess.Popen[bytes]
    give_fd: int  # the write end of its stdin (-1 once handed over or closed)
    out: IO[bytes]  # what it prints: the files it wrote
    err: IO[bytes]
    formats: tuple[str, ...] = ("png",)
    analysis: Analysis | None = None

    @classmethod
    def start(cls, formats: tuple[str, ...] = ("png",)) -> Beside | None:
        """The process started; None where matplotlib or pandas is not installed (the session says which, where it
        needs it: a missing matplotlib after the summary, which needs pandas alone)."""
        import importlib.util
        import tempfile

        if any(importlib.util.find_spec(name) is None for name in ("matplotlib", "pandas")):
            return None
        out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115 (open until `stop`)
        given, give = os.pipe()
        try:
            child = subprocess.Popen([sys.executable, "-m", "kvpages.render.drawing", *formats], stdin=given,
                                     stdout=out, stderr=err)
        except BaseException:
            for opened in (out, err):
                opened.close()
            os.close(give)
            raise
        finally:
            os.close(given)
        return cls(child, give, out, err, formats)

    def give(self, analysis: Analysis) -> None:
        """Hand `analysis` over (without its raw samples: 4 of the reference run's 28 MB); the drawing starts."""
        from kvpages.analysis.cache import light

        self.analysis = analysis
        payload = pickle.dumps(light(analysis), protocol=pickle.HIGHEST_PROTOCOL)
        with contextlib.suppress(BrokenPipeError), os.fdopen(self.give_fd, "wb") as pipe:  # it failed: `wait` says why
            self.give_fd = -1
            pipe.write(payload)

    def wait(self) -> list[Path]:
        """The charts' files, once written (none where it was handed nothing). A failure is raised, with the
        process's last line."""
        self._hand_nothing_more()
        self.child.wait()
        if self.child.returncode == WITHHELD and self.analysis is not None:  # a chart read the raw samples
            from kvpages.render.plots import plot_run

            return plot_run(self.analysis, self.formats)
        if self.child.returncode == MISSING:  # raised here as the session's own import would raise it
            name = _said(self.err).strip().splitlines()[-1]
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        if self.child.returncode != 0:
            where = "" if self.analysis is None else f" {self.analysis.run.path}"
            last = (_said(self.err).strip().splitlines() or [f"exit status {self.child.returncode}"])[-1]
            raise RuntimeError(f"kvpages plot{where}: {last}")
        return [Path(line) for line in _said(self.out).splitlines() if line]

    def stop(self) -> None:
        """Once the session is done with it, or failed or was interrupted: one handed nothing is stopped (it has
        drawn nothing); one drawing is waited for, so that no chart is left half-written."""
        drawing = self.analysis is not None
        self._hand_nothing_more()
        if self.child.returncode is None:
            if not drawing:
                self.child.kill()
            self.child.wait()
        for opened in (self.out, self.err):
            opened.close()

    def _hand_nothing_more(self) -> None:
        if self.give_fd >= 0:
            os.close(self.give_fd)
            self.give_fd = -1


def _said(printed: IO[bytes]) -> str:
    printed.seek(0)
    return printed.read().decode(errors="replace")


WITHHELD = 3
"""The exit status of `main` where a chart read the raw samples it was not handed..."""
MISSING = 4
"""...and where a module it imports is missing (its name its last line)."""


def main(formats: tuple[str, ...]) -> int:
    """`python -m kvpages.render.drawing FORMAT...` (`Beside`'s process): an analysis pickled on stdin, drawn (matplotlib
    warmed while it waits), each file written printed on a line; nothing for nothing on stdin. It draws without the
    cyclic collector and freezes what it holds at its exit, as the `kvpages` program does (kvpages.cli.main)."""
    from kvpages.schema.reader import SamplesWithheld

    gc.disable()
    try:
        drawn = _draw_given(sys.stdin.fileno(), formats)
    except SamplesWithheld:
        return WITHHELD
    except ModuleNotFoundError as exc:
        if exc.name is None:
            raise
        print(exc.name, file=sys.stderr)
        return MISSING
    finally:
        gc.freeze()
    for path in drawn:
        print(path)
    return 0


if __name__ == "__main__":  # its functions from the module itself, not from this copy of it run as __main__
    from kvpages.render.drawing import main as drawn_by_the_module

    sys.exit(drawn_by_the_module(tuple(sys.argv[1:])))
