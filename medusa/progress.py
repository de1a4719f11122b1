"""Progress of the steps that take longer than a couple of seconds: a rich progress display on a
terminal; elsewhere (a log, a pipe) one plain line as each step starts, with no carriage return
and no ANSI code.

    with Progress(steps=2) as p:
        with p.step("recording the start-up"):
            record()
        for graph in p.track(graphs, "placing the decode graphs"):
            place(graph)

prints, to a log, `[1/2] recording the start-up ...` and `[2/2] placing the decode graphs ...`."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING, TextIO, TypeVar

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress
    from rich.progress import TaskID

T = TypeVar("T")


def on_terminal(stream: TextIO) -> bool:
    """Whether STREAM is a terminal that redraws (not a file, a pipe or TERM=dumb)."""
    import os

    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty()) and os.environ.get("TERM", "") != "dumb"


class Step:
    """One step under way; advance() moves its count (drawn on a terminal only)."""

    def __init__(self, bar: RichProgress | None = None, task: TaskID | None = None) -> None:
        self._bar, self._task = bar, task

    def advance(self, n: float = 1) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task, n)


class Progress:
    """The steps of one command, numbered `[i/N]` when `steps` (N) is given. quiet: print
    nothing (a library call whose caller shows no progress)."""

    def __init__(
        self, stream: TextIO | None = None, *, steps: int = 0, quiet: bool = False
    ) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.num_steps, self.num_started = steps, 0
        self.mode = "off" if quiet else "rich" if on_terminal(self.stream) else "plain"
        self._bar: RichProgress | None = None

    def __enter__(self) -> Progress:
        if self.mode == "rich":
            self._started()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

    def _started(self) -> RichProgress:
        if self._bar is None:
            self._bar = _rich_bar(self.stream)
            self._bar.start()
        return self._bar

    @contextmanager
    def step(self, name: str, total: float | None = None) -> Iterator[Step]:
        """A step named NAME; total: the count its advance() calls reach, if known."""
        self.num_started += 1
        label = f"[{self.num_started}/{self.num_steps}] {name}" if self.num_steps else name
        if self.mode == "plain":
            print(f"{label} ...", file=self.stream, flush=True)
        if self.mode != "rich":
            yield Step()
            return
        started_here = self._bar is None  # a step outside `with Progress()`
        bar = self._started()
        task = bar.add_task(label, total=total, counted=total is not None)
        try:
            yield Step(bar, task)
            bar.update(task, total=total or 1, completed=total or 1)
        finally:
            bar.stop_task(task)
            if started_here:
                self.__exit__()

    def track(self, items: Iterable[T], name: str, total: int | None = None) -> Iterator[T]:
        """ITEMS, as a step named NAME that advances by one per item."""
        if total is None and hasattr(items, "__len__"):
            total = len(items)  # type: ignore[arg-type]
        with self.step(name, total) as s:
            for item in items:
                yield item
                s.advance()


def step(
    name: str, total: float | None = None, stream: TextIO | None = None
) -> AbstractContextManager[Step]:
    """One step on its own: `with step("loading"):`."""
    return Progress(stream).step(name, total)


def _rich_bar(stream: TextIO) -> RichProgress:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        ProgressColumn,
        SpinnerColumn,
        Task,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as RichProgress
    from rich.text import Text

    class Count(ProgressColumn):
        """`3/12` for a step with a total, nothing for one without."""

        def render(self, task: Task) -> Text:
            if task.total is None or not task.fields.get("counted", True):
                return Text("")
            return Text(f"{task.completed:g}/{task.total:g}", style="progress.download")

    return RichProgress(
        SpinnerColumn(finished_text="[green]done"),
        TextColumn("{task.description}"),
        BarColumn(),
        Count(),
        TimeElapsedColumn(),
        console=Console(file=stream, force_terminal=True),
    )
