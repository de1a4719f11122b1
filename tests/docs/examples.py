"""The documented examples: the `$ command` lines of the README's and docs/'s fenced blocks, the
output written under each, and how a run's output is compared with it.

A block is an example when a line of it (after its indentation) starts with `$ `. A command
continues on the next line after a trailing backslash, and through a here-document's end
(`<<'EOF'` … `EOF`); the lines after it, up to the next `$ ` line, are its documented output.
A command ending in `&` runs in the background. The last non-blank line before a block may be
`<!-- not run: REASON -->` (the block needs what this machine lacks: a GPU, a Ray cluster, vLLM,
a network): such blocks are counted and reported, not run.

Masking, applied alike to the documented and the printed output before they are compared (see
`mask`): times (a number with s, ms, µs or min) become `T`; sizes (a number with B, KiB, MiB,
GiB, KB, MB, GB or bytes) `SIZE`; addresses (`0x…`) `0xADDR`; hex strings of 8 or more digits
holding a digit and a letter (hashes, digests, request ids) `HASH`; the digits after `pid`
and after `"created":` `N`; step counters such as `[2/6]` `[n/N]`. Lines of progress (a bar or
spinner character, `<n> of <size> (<time>)`, or a line ending in ` ...`, as `medusa.progress`
writes a step to a log) are dropped from both. Then `…` in a
documented line matches any text, and a documented line that is only `…` any number of lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).parents[2]
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
FENCE = re.compile(r"^(\s*)(```+)")
HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?")


@dataclass
class Command:
    text: str  # as bash reads it (continuations and here-documents included)
    output: list[str] = field(default_factory=list)

    @property
    def background(self) -> bool:
        return bool(re.search(r"(?<!&)&\s*(#.*)?$", self.text.splitlines()[0]))


@dataclass
class Block:
    page: str
    line: int  # 1-based line of the opening fence
    commands: list[Command]
    not_run: str | None = None  # the reason, when the page marks the block so

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The example blocks of one page, in order."""
    lines = path.read_text().splitlines()
    found, i = [], 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, start = len(m.group(1)), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and lines[i].strip() != fence:
            line = lines[i]
            body.append(line[indent:] if not line[:indent].strip() else line.lstrip())
            i += 1
        i += 1
        commands = parse(body)
        if commands:
            before = [x for x in lines[:start] if x.strip()]
            reason = NOT_RUN.search(before[-1]) if before else None
            rel = str(path.relative_to(REPO))
            found.append(Block(rel, start + 1, commands, reason.group(1) if reason else None))
    return found


def parse(body: list[str]) -> list[Command]:
    commands: list[Command] = []
    i = 0
    while i < len(body):
        line = body[i]
        if not line.startswith("$ "):
            if commands:
                commands[-1].output.append(line)
            i += 1
            continue
        text = [line[2:]]
        while text[-1].endswith("\\") and i + 1 < len(body):
            i += 1
            text.append(body[i])
        doc = HEREDOC.search(text[0])
        if doc:
            while i + 1 < len(body) and body[i].strip() != doc.group(1):
                i += 1
                text.append(body[i])
        commands.append(Command("\n".join(text)))
        i += 1
    return commands


BARS = re.compile(r"[⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏━█▏▎▍▌▋▊▉]")
MASKS = [
    (re.compile(r"0x[0-9a-fA-F]+"), "0xADDR"),
    (re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:KiB|MiB|GiB|KB|MB|GB|B|bytes)\b"), "SIZE"),
    (re.compile(r"(?<![\w.])\d+(?:\.\d+)?\s?(?:s|ms|µs|us|min)\b"), "T"),
    (re.compile(r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b"), "HASH"),
    (re.compile(r"(\bpid\W{0,3}|\"created\":\s?)\d+"), r"\1N"),
    (re.compile(r"\[\d+/\d+\]"), "[n/N]"),
]
# medusa.progress in a log: "[2/3] placing the decode graphs ..."; a size counted up as it goes
PROGRESS = re.compile(r"^\s*[\d.]+ of SIZE \(T\)$|^.* \.\.\.$")


def mask(text: str) -> list[str]:
    """The lines of `text` with times, sizes, addresses, hashes and pids masked and progress
    lines dropped (the module's docstring has the rules)."""
    out = []
    for line in text.splitlines():
        if BARS.search(line):
            continue
        for pattern, repl in MASKS:
            line = pattern.sub(repl, line)
        if not PROGRESS.match(line):
            out.append(line.rstrip())
    return out


def matches(documented: list[str], printed: list[str], prefix: bool = False) -> bool:
    """Whether the masked printed lines are what the masked documented lines say (all of them;
    with `prefix`, the documented lines may be followed by more)."""
    pats = [None if d.strip() == "…" else _line_pattern(d) for d in documented]
    memo: dict[tuple[int, int], bool] = {}

    def go(i: int, j: int) -> bool:
        if (i, j) not in memo:
            if i == len(pats):
                memo[i, j] = prefix or j == len(printed)
            elif pats[i] is None:
                memo[i, j] = go(i + 1, j) or (j < len(printed) and go(i, j + 1))
            else:
                memo[i, j] = (
                    j < len(printed) and bool(pats[i].fullmatch(printed[j])) and go(i + 1, j + 1)
                )
        return memo[i, j]

    return go(0, 0)


def _line_pattern(documented: str) -> re.Pattern[str]:
    return re.compile(".*".join(re.escape(part) for part in documented.split("…")))


FILE = re.compile(r"<!--\s*file:\s*(\S+)\s*-->")


def file_blocks(path: Path) -> list[tuple[str, str, str]]:
    """(where, file, text) of each block a page marks `<!-- file: PATH -->`: a copy of that
    repository file, which must stay equal to it."""
    lines = path.read_text().splitlines()
    found = []
    for i, line in enumerate(lines[:-1]):
        m = FILE.fullmatch(line.strip())
        if m and lines[i + 1].startswith("```"):
            end = next(j for j in range(i + 2, len(lines)) if lines[j].startswith("```"))
            where = f"{path.relative_to(REPO)}:{i + 2}"
            found.append((where, m.group(1), "\n".join(lines[i + 2 : end]) + "\n"))
    return found
