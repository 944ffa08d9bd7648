"""Drawing on two CPUs (kvpages.render.figures.side_by_side): the same files in the same order, and the other
process's error raised here, as if one process had drawn everything."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from kvpages.render.figures import cpus, side_by_side

FORKS = sys.platform.startswith("linux") and cpus() >= 2
forks = pytest.mark.skipif(not FORKS, reason="draws in a second process on Linux with two CPUs only")


def drawing(tmp_path: Path, name: str):
    def draw() -> list[Path]:
        path = tmp_path / name
        path.write_text(f"{name} by {os.getpid()}")
        return [path]
    return draw


@pytest.mark.parametrize("processes", [1, 2])
def test_the_files_come_back_in_order_whoever_draws_them(tmp_path, processes):
    here, there = drawing(tmp_path, "here.png"), drawing(tmp_path, "there.png")
    assert side_by_side(here, there, processes) == [tmp_path / "here.png", tmp_path / "there.png"]
    drawn_by = {p.name: p.read_text().split(" by ")[1] for p in tmp_path.iterdir()}
    assert drawn_by["here.png"] == str(os.getpid())
    assert (drawn_by["there.png"] != str(os.getpid())) == (processes == 2 and FORKS)


@forks
def test_the_other_process_error_is_raised_here(tmp_path):
    def fails() -> list[Path]:
        raise IsADirectoryError(21, "Is a directory", str(tmp_path / "scenario_requests.png"))

    with pytest.raises(IsADirectoryError, match=r"scenario_requests\.png"):
        side_by_side(drawing(tmp_path, "here.png"), fails, 2)
    assert (tmp_path / "here.png").exists()


@forks
def test_an_error_here_wins_and_the_other_process_is_waited_for(tmp_path):
    def fails() -> list[Path]:
        raise PermissionError("here")

    with pytest.raises(PermissionError, match="here"):
        side_by_side(fails, drawing(tmp_path, "there.png"), 2)
    assert (tmp_path / "there.png").exists()  # finished before side_by_side returned
