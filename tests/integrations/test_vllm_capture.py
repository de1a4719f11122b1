"""What the plugin writes about a capture: output tensors (real torch tensors) as address, dtype,
shape, stride and byte span; captures numbered in process order. (No vLLM needed.)"""

from __future__ import annotations

import pytest

from medusa.integrations.vllm import capture, recording

torch = pytest.importorskip("torch")


def test_output_tensors_are_described_with_their_layout_and_span():
    base = torch.zeros(8, 16, dtype=torch.bfloat16)
    view = base[2:6, ::2]  # 4 x 8, strides (16, 2), starting 32 elements in
    spec = capture.tensor_spec((view, [base], None))
    assert spec["t"] == "tuple" and spec["items"][2] == {"t": "none"}
    leaf = spec["items"][0]
    assert leaf == {
        "t": "tensor",
        "addr": base.data_ptr() + 2 * 16 * 2,
        "dtype": "bfloat16",
        "shape": [4, 8],
        "stride": [16, 2],
        "bytes": (1 + 3 * 16 + 7 * 2) * 2,  # first to last element, inclusive
    }
    assert [x["shape"] for x in capture.spec_tensors(spec)] == [[4, 8], [8, 16]]
    empty = capture.tensor_spec(torch.zeros(0, 4))
    assert empty["bytes"] == 0
    with pytest.raises(capture.CaptureOrderError, match="of type str is not supported"):
        capture.tensor_spec("logits")


def test_captures_are_numbered_in_process_order_once():
    class Graph:  # the shape of torch.cuda.CUDAGraph: capture_end ends a capture
        def capture_end(self):
            return "ended"

    capture.count_captures(Graph)
    capture.count_captures(Graph)  # installed once
    first = capture.captures_so_far()
    graphs = [Graph(), Graph(), Graph()]
    assert [g.capture_end() for g in graphs] == ["ended"] * 3
    assert [capture.capture_index(g) for g in graphs] == [first, first + 1, first + 2]
    with pytest.raises(capture.CaptureOrderError, match="before the medusa plugin counted"):
        capture.capture_index(object())


def test_blocks_no_python_tensor_holds_are_told_apart_from_held_ones():
    # what the recording writes for each block made during the capture: held by a Python object
    # (its owner remakes it in a restored process) or by native code only (a cuBLAS workspace)
    held = torch.arange(64, dtype=torch.float32)
    view = held[8:16]  # a view keeps its whole storage alive
    storages = recording.python_storages("cpu")
    assert (held.data_ptr(), 256) in storages
    base = held.data_ptr()
    blocks = [(base + 32, 32), (base + 256, 512), (base - 512, 512), (base - 8, 16)]
    assert recording.python_held(blocks, storages)[0] is True
    assert recording.python_held([(base + 32, 32)], [(base, 256)]) == [True]
    assert recording.python_held(blocks[1:3], [(base, 256)]) == [False, False]  # just outside
    assert recording.python_held([(base - 8, 16)], [(base, 256)]) == [True]  # overlaps the start
    del view


def test_the_sidecar_is_never_written_or_read_through_a_planted_link(tmp_path, monkeypatch):
    """MEDUSA_VLLM_SIDECAR may name a file in /tmp: a link planted there is refused, and the
    file is written under a fresh name (O_EXCL, mode 0600) and renamed into place."""
    side, victim = tmp_path / "side.json", tmp_path / "victim"
    victim.write_text('{"theirs": 1}')
    side.symlink_to(victim)
    monkeypatch.setenv("MEDUSA_VLLM_SIDECAR", str(side))
    with pytest.raises(OSError):
        recording.write_sidecar({"captures": 1})
    assert victim.read_text() == '{"theirs": 1}'
    side.unlink()
    recording.write_sidecar({"captures": 1})
    recording.write_sidecar({"graphs": []})
    assert side.read_text() == '{"captures": 1, "graphs": []}'
    assert side.stat().st_mode & 0o777 == 0o600 and sorted(tmp_path.iterdir()) == [side, victim]
