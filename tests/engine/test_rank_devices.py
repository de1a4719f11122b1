"""Each rank of a tensor-parallel group gets a device of its own: on a GPU, rank r sees the r-th
entry of the group's CUDA_VISIBLE_DEVICES alone (GPU indices, GPU or MIG UUIDs), or GPU r when the
variable is unset; fewer devices than ranks, or one listed twice, is refused naming the variable
and the fix. On simcuda each rank gets its own board index. (Which device a real rank then uses
is scripts/gpu/tp_two_gpus.sh's to see, on a machine with two GPUs.)"""

from __future__ import annotations

import pytest

from medusa.engine.rank_devices import RankDeviceError, rank_envs


def _no_count() -> int:
    raise AssertionError("the device count is needed only when the variable is unset")


def test_on_a_gpu_rank_r_sees_the_r_th_listed_device_alone():
    migs = "MIG-4f1c0e2a-0000-5a1b-9c3d-111111111111,MIG-4f1c0e2a-0000-5a1b-9c3d-222222222222"
    envs = rank_envs(2, "cuda", {"CUDA_VISIBLE_DEVICES": migs}, _no_count)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == migs.split(",")
    envs = rank_envs(2, "cuda", {"CUDA_VISIBLE_DEVICES": "3, 1, 2"}, _no_count)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["3", "1"]  # a third entry unused
    assert [e["MEDUSA_SIM_DEVICE_INDEX"] for e in envs] == ["0", "1"]


def test_on_a_gpu_without_the_variable_rank_r_gets_gpu_r_if_there_are_enough():
    envs = rank_envs(4, "cuda", {}, lambda: 8)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0", "1", "2", "3"]
    with pytest.raises(RankDeviceError) as e:
        rank_envs(2, "cuda", {}, lambda: 1)
    assert str(e.value) == (
        "a tensor-parallel group of 2 needs 2 GPUs, one per rank; CUDA shows 1 "
        "(CUDA_VISIBLE_DEVICES is unset): run on a machine with 2 GPUs, or with "
        "--tensor-parallel-size 1"
    )


@pytest.mark.parametrize(
    ("listed", "says"),
    [
        ("0", "CUDA_VISIBLE_DEVICES='0' lists 1 device for a tensor-parallel group of 2: each "
              "rank needs a device of its own; list one device per rank (e.g. "
              "CUDA_VISIBLE_DEVICES=0,1, or the GPU or MIG UUIDs `nvidia-smi -L` prints), or "
              "start with --tensor-parallel-size 1"),
        ("GPU-a,GPU-a", "CUDA_VISIBLE_DEVICES='GPU-a,GPU-a' lists GPU-a more than once"),
        ("0,,1", "CUDA_VISIBLE_DEVICES='0,,1' has an empty entry (CUDA stops reading there)"),
    ],
)  # fmt: skip
def test_on_a_gpu_fewer_devices_than_ranks_are_refused_with_the_fix(listed, says):
    with pytest.raises(RankDeviceError, match="--tensor-parallel-size 1$") as e:
        rank_envs(2, "cuda", {"CUDA_VISIBLE_DEVICES": listed}, _no_count)
    assert str(e.value).startswith(says)


def test_on_simcuda_each_rank_gets_its_own_board_and_nothing_is_refused():
    assert rank_envs(2, "sim", {}, _no_count) == [
        {"MEDUSA_SIM_DEVICE_INDEX": "0"},
        {"MEDUSA_SIM_DEVICE_INDEX": "1"},
    ]
    assert rank_envs(2, "sim", {"CUDA_VISIBLE_DEVICES": "0"}, _no_count)[1] == {
        "MEDUSA_SIM_DEVICE_INDEX": "1"
    }
    split = rank_envs(2, "sim", {"CUDA_VISIBLE_DEVICES": "GPU-a,GPU-b"}, _no_count)
    assert [e["CUDA_VISIBLE_DEVICES"] for e in split] == ["GPU-a", "GPU-b"]
