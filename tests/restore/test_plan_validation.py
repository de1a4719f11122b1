"""A restore plan is data from a file: the validator refuses every index or offset outside its
table (naming it), and the C graph builder, given such a plan without validation, returns an
error instead of crashing. Fuzzed plans raise nothing but ArtifactError."""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from medusa.artifact import ArtifactError, load_artifact
from medusa.artifact.layout import ATTR, EDGE, NODE, RELOC
from medusa.child import python_code
from medusa.restore.validate import validate_plan
from tests.processes import GENERAL, clean_env, materialize_general

# Starts processes (see pyproject.toml's e2e marker): not in the fast subset.
pytestmark = pytest.mark.e2e

PROGRAMS = Path(__file__).parent / "programs"
RUN_BUILD = (
    f"import runpy; sys.argv[0] = {str(PROGRAMS / 'build_graphs.py')!r}; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
BLOBS = {"nodes": NODE, "relocs": RELOC, "edges": EDGE, "rows": NODE, "attrs": ATTR}


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The general program's plan: kernel, memset and memcpy nodes; device, global and VMM
    relocations; saved contents with pointers in them."""
    out = tmp_path_factory.mktemp("general") / "art"
    materialize_general(GENERAL, out)
    return load_artifact(out).plan


def edit(part: dict, blob: str, row: int, **fields: int) -> None:
    """Sets fields of one record of a packed array (values wrap to the field's width)."""
    a = np.frombuffer(part[blob], BLOBS[blob]).copy()
    for k, v in fields.items():
        bits = a.dtype[k].itemsize * 8
        wrapped = v % (1 << bits)
        if a.dtype[k].kind == "i" and wrapped >= 1 << (bits - 1):
            wrapped -= 1 << bits
        a[row][k] = wrapped
    part[blob] = a.tobytes()


def _attr(node: int) -> bytes:
    a = np.zeros(1, ATTR)
    a["node"], a["attr"] = node, 1
    return a.tobytes()


def _kernel_row(p: dict) -> int:
    return int(np.flatnonzero(np.frombuffer(p["templates"][0]["nodes"], NODE)["type"] == 0)[0])


def _content_key(p: dict) -> int:
    return next(k for k, c in p["contents"].items() if c["relocs"])


def _set_content_reloc(p: dict, field: int, value: int) -> None:
    p["contents"][_content_key(p)]["relocs"][0][field] = value


# name: (what it changes, what the validator says, whether the C builder catches it alone)
CRAFTED: dict[str, tuple[Callable[[dict], None], str, bool]] = {
    "func": (
        lambda p: edit(p["templates"][0], "nodes", _kernel_row(p), func=1000),
        "func is not in the kernel table",
        True,
    ),
    "param_off wraps": (
        lambda p: edit(p["templates"][0], "nodes", _kernel_row(p), param_off=-8, param_len=16),
        "param_off/param_len lie outside the parameters",
        True,
    ),
    "reloc_off wraps": (
        lambda p: edit(p["templates"][0], "nodes", _kernel_row(p), reloc_off=-1, reloc_len=2),
        "reloc_off/reloc_len lie outside the relocations",
        True,
    ),
    "reloc word wraps": (
        lambda p: edit(p["templates"][0], "relocs", 1, offset=-4),
        "a relocated word lies outside the node",
        True,
    ),
    "attribute node": (
        lambda p: p["graphs"][0].update(attrs=_attr(1 << 31)),
        "attribute of node 2147483648: no such node",
        True,
    ),
    "node type": (
        lambda p: edit(p["templates"][0], "nodes", _kernel_row(p), type=3),
        "type is not one restore builds",
        True,
    ),
    "reloc kind": (
        lambda p: edit(p["templates"][0], "relocs", 1, kind=7),
        "a relocation points outside its allocation",
        True,
    ),
    "contents reloc wraps": (
        lambda p: _set_content_reloc(p, 0, (1 << 32) - 4),
        "a relocated word lies outside the saved bytes",
        True,
    ),
    "contents into the engine's memory": (
        lambda p: p["contents"].update({0: p["contents"].pop(_content_key(p))}),
        "saved contents may only fill an allocation the restorer replays",
        False,
    ),
    "relocation of another kind": (
        lambda p: edit(p["templates"][0], "relocs", 0, kind=1),  # host-mapped, at a device alloc
        "a relocation points outside its allocation",
        False,
    ),
    "relocation past its allocation": (
        lambda p: _set_content_reloc(p, 3, 1 << 20),
        "is not inside an allocation of that kind",
        False,
    ),
    "memset past its allocation": (
        lambda p: edit(p["templates"][0], "nodes", 0, width=1 << 40),
        "a copy or fill runs past its allocation",
        False,
    ),
    "graph template beyond 64 bits": (
        lambda p: p["graphs"][0].update(template=(1 << 64) - 1),
        "graphs[0].template: expected int",
        False,
    ),
    "template node count beyond 64 bits": (
        lambda p: p["templates"][0].update(num_nodes=-(1 << 70)),
        "templates[0].num_nodes: expected int",
        False,
    ),
    "replay frees the engine's memory": (
        lambda p: p["replay"].append(["f", 0]),
        "replay: allocation #0 belongs to a phase the engine runs itself",
        False,
    ),
}


def crafted(plan: dict, name: str) -> dict:
    p = copy.deepcopy(plan)
    CRAFTED[name][0](p)
    return p


def build_in_subprocess(plans: list[dict], tmp: Path, *flags: str) -> list[dict]:
    path = tmp / "plans.msgpack"
    path.write_bytes(msgpack.packb(plans))
    res = subprocess.run(
        python_code(RUN_BUILD, str(path), *flags),
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    last = lines[-1]["plan"] if lines else None
    assert res.returncode == 0, f"exit {res.returncode} at plan {last}\n{res.stderr[-3000:]}"
    return [x for x in lines if "started" not in x]


def test_the_real_plan_is_accepted_and_builds(plan, tmp_path):
    validate_plan(plan, "general")
    (out,) = build_in_subprocess([plan], tmp_path)
    assert all(code == 0 for code, _ in out["graphs"]) and all(out["contents"])
    assert out["plan_build"] == [0, "", len(plan["graphs"])]


@pytest.mark.parametrize("name", list(CRAFTED))
def test_a_crafted_plan_is_refused_naming_what_is_wrong(plan, name):
    with pytest.raises(ArtifactError) as e:
        validate_plan(crafted(plan, name), "ART")
    assert str(e.value).startswith("ART: restore plan: ") and CRAFTED[name][1] in str(e.value)


def test_the_C_builder_refuses_crafted_plans_without_the_validator(plan, tmp_path):
    names = [n for n, (_, _, c_refuses) in CRAFTED.items() if c_refuses]
    results = build_in_subprocess([crafted(plan, n) for n in names], tmp_path, "--no-validate")
    for name, out in zip(names, results, strict=True):
        failed = [err for code, err in out["graphs"] if code] + [
            "contents" for ok in out["contents"] if not ok
        ]
        assert failed, f"{name}: the C builder accepted it"
        if any(code for code, _ in out["graphs"]):  # all graphs in one call: refused the same
            code, err, built = out["plan_build"]
            assert code and err and built < len(out["graphs"]), f"{name}: mr_build_plan accepted it"


VALUES = [0, 1, 7, 8, 255, 1 << 16, (1 << 31) - 1, 1 << 31, (1 << 32) - 8, (1 << 32) - 1,
          1 << 40, 1 << 63, (1 << 64) - 1, -1, -8]  # fmt: skip
ODD = [None, "x", 1.5, True, [], {}, b"\0", 1 << 64, -(1 << 70)]


@st.composite
def mutations(draw: st.DrawFn) -> tuple:
    """One change to a plan: a field of a packed record, a length, or an item of a table."""
    kind = draw(st.sampled_from(["record", "truncate", "item"]))
    if kind == "record":
        where = draw(st.sampled_from(["templates", "graphs"]))
        blob = draw(st.sampled_from(["nodes", "relocs", "edges"] if where == "templates"
                                    else ["attrs", "rows", "relocs"]))  # fmt: skip
        names = [n for n in BLOBS[blob].names if BLOBS[blob][n].shape == ()]
        return kind, where, blob, draw(st.sampled_from(names)), draw(st.sampled_from(VALUES))
    if kind == "truncate":
        blob = draw(st.sampled_from(["nodes", "relocs", "edges", "params"]))
        return kind, "templates", blob, draw(st.integers(1, 100)), None
    table = draw(
        st.sampled_from(
            ["allocs", "replay", "contents", "globals", "vmm", "funcs", "graphs", "templates"]
        )
    )
    value = draw(st.sampled_from(VALUES + ODD))
    return kind, table, draw(st.integers(0, 4)), draw(st.integers(0, 4)), value


def mutate(plan: dict, m: tuple) -> dict:
    p = copy.deepcopy(plan)
    kind, where, a, b, value = m
    if kind == "record":
        part = p[where][0]
        if where == "graphs" and not part[a]:  # give the graph a row, attribute or relocation
            part["idx"], part["rows"] = b"\0\0\0\0", p["templates"][0]["nodes"][: NODE.itemsize]
            part["attrs"], part["relocs"] = _attr(1), p["templates"][0]["relocs"][: RELOC.itemsize]
        n = len(part[a]) // BLOBS[a].itemsize
        if n:
            edit(part, a, value % n if value > 0 else 0, **{b: value})
    elif kind == "truncate":
        p[where][0][a] = p[where][0][a][:-b]
    else:
        table = p[where]
        items = list(table.values()) if isinstance(table, dict) else table
        if items:
            item = items[a % len(items)]
            if isinstance(item, list) and item:
                item[b % len(item)] = value
            elif isinstance(item, dict):
                key = sorted(item)[b % len(item)]
                item[key] = value if key != "relocs" or not item[key] else [[value, 0, 0, 0]]
    return p


def test_fuzzed_plans_raise_only_artifact_errors_and_accepted_ones_build(plan, tmp_path):
    accepted: list[dict] = []

    @settings(max_examples=200, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])  # fmt: skip
    @given(mutations())
    def check(m: tuple) -> None:
        p = mutate(plan, m)
        try:
            validate_plan(p, "fuzz")
        except ArtifactError:
            return
        if len(accepted) < 40:
            accepted.append(p)

    check()
    assert accepted  # some changes are harmless (a launch size, a value): those must build
    build_in_subprocess(accepted, tmp_path)
