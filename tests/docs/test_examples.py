"""Every `$ command` example of the README and of docs/ is run, and what it prints is compared
with what the page says it prints (tests/docs/examples.py has the parsing and masking rules,
tests/docs/session.py how a page runs). The examples start processes, so they are e2e; the
fast subset checks that every example is run or says why not, that the rules mask what they
promise, and that a file a page quotes (`<!-- file: PATH -->` before the block) is the file.
The count of examples run and not run is printed at the end of the session."""

from __future__ import annotations

import pytest

from tests.docs.examples import REPO, blocks, file_blocks, mask, matches, pages
from tests.docs.materialized import reusable_out
from tests.docs.session import Session

ALL = {str(p.relative_to(REPO)): blocks(p) for p in pages()}
RUN = {page: [b for b in bs if b.not_run is None] for page, bs in ALL.items()}
MOST_NOT_RUN = 8  # the blocks that need a GPU, a Ray cluster or vLLM; keep it small


def test_every_example_runs_or_says_why_not_and_few_do_not():
    not_run = [b for bs in ALL.values() for b in bs if b.not_run is not None]
    assert sum(len(b.commands) for bs in RUN.values() for b in bs) > 0
    assert all(b.not_run.strip() for b in not_run)
    assert len(not_run) <= MOST_NOT_RUN, [f"{b.where}: {b.not_run}" for b in not_run]


def test_a_file_a_page_quotes_is_the_file_as_it_is():
    quoted = [q for p in pages() for q in file_blocks(p)]
    assert quoted, "docs/gateway.md quotes runtime/models.yaml"
    for where, name, text in quoted:
        assert text == (REPO / name).read_text(), f"{where}: not {name} as it is; copy it again"


def test_masking_hides_what_changes_from_run_to_run_and_nothing_else():
    printed = (
        "ready in 1.54 s: runtime_init 0.06s, graph_restore 0.03s\n"
        "  digest    sha256:e37f30579944968d27a45c4e73ea1f106fc6c60f2746d8653988e10e941a0209\n"
        "  arena     base 0x4e2d57c00000, 32 GiB of address space\n"
        '[{"pid":16881,"slice":"slice0"}]\n'
        "[3/6] recording the engine's start-up\n"
        "  132 of 513 MiB (0.5 s)\n"
        "  ━━━━━━━━━━ 40%\n"
        "[2/3] placing the decode graphs ...\n"
        "  9530 KV blocks (5.1 s)"
    )
    documented = [
        "ready in 2.55 s: runtime_init 0.07s, graph_restore 0.20s",
        "  digest    sha256:3192813c3aeceea010eaeb18e7f76addb8c51f435de69945cad84d1ba9381858",
        "  arena     base 0x5f0085e00000, 32 GiB of address space",
        '[{"pid":2,"slice":"slice0"}]',
        "[3/7] recording the engine's start-up",
        "  9530 KV blocks (2.6 s)",
    ]
    assert matches(mask("\n".join(documented)), mask(printed))
    assert not matches(mask("  9531 KV blocks (5.1 s)"), mask("  9530 KV blocks (5.1 s)"))
    assert not matches(mask("ready in 1 s: kv_profile 1s"), mask("ready in 1 s: kv_restore 1s"))


def test_an_ellipsis_stands_for_any_text_and_a_line_of_one_for_any_lines():
    assert matches(["a", "…", "d"], ["a", "b", "c", "d"])
    assert matches(["a …", "d"], ["a b c", "d"])
    assert not matches(["a", "d"], ["a", "b", "d"])
    assert matches(["a"], ["a", "b"], prefix=True)


def test_a_materialize_is_reused_only_where_it_reads_nothing_a_page_made(tmp_path):
    (tmp_path / "release.key").write_text("")
    (tmp_path / "art").mkdir()
    run = "medusa materialize --weights host --max-num-seqs 4 --out a"
    assert reusable_out(run, tmp_path) == "a"
    assert reusable_out("medusa materialize --no-weights --out x/art", tmp_path) == "x/art"
    for line in (
        "medusa materialize --sign release.key --out a",  # a file of the scratch directory
        "medusa materialize --out art",  # already there
        "medusa materialize /models/m.gguf --out a",
        "medusa materialize --out /tmp/a",
        "medusa materialize --command --out a -- python p.py",
        "medusa materialize --out a; rm -r a",
        "medusa materialize --out a > log",
        "medusa materialize --out $HOME/a",
        "medusa materialize --out",
        "medusa run --out a",
    ):
        assert reusable_out(line, tmp_path) is None, line


@pytest.mark.e2e
@pytest.mark.parametrize("page", [p for p, bs in RUN.items() if bs])
def test_the_page_s_examples_print_what_it_says(page, tmp_path, materialized):
    session = Session(tmp_path, RUN[page], materialized)
    problems = []
    try:
        for block in RUN[page]:
            problems += session.run(block)
    finally:
        session.close()
    assert not problems, "\n\n".join(problems)
