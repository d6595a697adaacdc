"""The engine all-reduce rule (`--allreduce auto`) against the numbers in vLLM's and SGLang's sources, and the merged
curve the budget composes from."""

from __future__ import annotations

import pytest

from decodetop.budget.engine_paths import (
    CUSTOM_AR_MAX_BYTES,
    AllreduceTopology,
    choose_allreduce,
    custom_algorithm,
    engine_allreduce_curve,
    nvlink_all_pairs,
)

KiB = 1024
MiB = 1024 * 1024

H200_NVLINK = {"compute_capability": "9.0", "p2p_all_pairs": True, "nvlink_all_pairs": True}
PCIE_P2P = {"compute_capability": "12.0", "p2p_all_pairs": True, "nvlink_all_pairs": False}


def _topo(n: int, **kw: object) -> AllreduceTopology:
    return AllreduceTopology(world_size=n, **kw)  # type: ignore[arg-type]


# (engine, TP, topology, bytes, expected path, expected algorithm, source quote)
CASES = [
    # custom_all_reduce.py (both engines): `max_size=8192 * 1024` and `return inp_size < self.max_size`.
    ("vllm", 2, H200_NVLINK, 16 * KiB, "custom", "one_shot", "world_size_ == 2 → cross_device_reduce_1stage"),
    ("vllm", 2, H200_NVLINK, 8 * MiB - 16, "custom", "one_shot", "inp_size < self.max_size (8192 * 1024)"),
    ("vllm", 2, H200_NVLINK, 8 * MiB, "nccl", "", "inp_size < self.max_size is false at 8 MiB"),
    ("sglang", 2, H200_NVLINK, 8 * MiB - 16, "custom", "one_shot", "_MAX_CAR_SIZE = 8192 * 1024"),
    ("sglang", 2, H200_NVLINK, 8 * MiB, "nccl", "", "_MAX_CAR_SIZE = 8192 * 1024"),
    # custom_all_reduce.cuh: (world_size_ <= 4 && bytes < 512 * 1024) || (world_size_ <= 8 && bytes < 256 * 1024).
    ("vllm", 4, H200_NVLINK, 512 * KiB - 16, "custom", "one_shot", "world_size_ <= 4 && bytes < 512 * 1024"),
    ("vllm", 4, H200_NVLINK, 512 * KiB, "custom", "two_shot", "else cross_device_reduce_2stage"),
    ("vllm", 8, H200_NVLINK, 256 * KiB - 16, "custom", "one_shot", "world_size_ <= 8 && bytes < 256 * 1024"),
    ("vllm", 8, H200_NVLINK, 256 * KiB, "custom", "two_shot", "else cross_device_reduce_2stage"),
    ("sglang", 8, H200_NVLINK, 1 * MiB, "custom", "two_shot", "same REDUCE_CASE in sgl-kernel"),
    # _SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]
    ("vllm", 3, H200_NVLINK, 16 * KiB, "nccl", "", "unsupported world size 3"),
    ("sglang", 16, H200_NVLINK, 16 * KiB, "nccl", "", "unsupported world size 16"),
    # "not supported on more than two PCIe-only GPUs"
    ("vllm", 4, PCIE_P2P, 16 * KiB, "nccl", "", "more than two PCIe-only GPUs"),
    ("sglang", 8, PCIE_P2P, 16 * KiB, "nccl", "", "more than two PCIe-only GPUs"),
    ("vllm", 2, PCIE_P2P, 16 * KiB, "custom", "one_shot", "world_size == 2 needs no NVLink"),
    # "lacks GPU P2P capability or P2P test failed"
    ("vllm", 2, {**PCIE_P2P, "p2p_all_pairs": False}, 16 * KiB, "nccl", "", "P2P test failed"),
    # "custom allreduce requires input byte size to be multiples of 16"
    ("vllm", 2, H200_NVLINK, 1000, "nccl", "", "inp_size % 16 != 0"),
    # "Custom allreduce is disabled because this process group spans across nodes."
    ("vllm", 2, {**H200_NVLINK, "same_node": False}, 16 * KiB, "nccl", "", "spans across nodes"),
    # all_reduce_utils.py with symm mem on (multicast): CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][8] = MiB // 4, then
    # SYMM_MEM_ALL_REDUCE_MAX_SIZES["9.0"][8] = 64 MiB with multimem (_WORLD_SIZES_MULTIMEM["9.0"] = [4, 6, 8]).
    ("vllm", 8, {**H200_NVLINK, "multicast": True}, 128 * KiB, "custom", "one_shot", "8: MiB // 4 (256 KB)"),
    ("vllm", 8, {**H200_NVLINK, "multicast": True}, 1 * MiB, "custom", "multimem", "9.0: [4, 6, 8] multimem"),
    ("vllm", 8, {**H200_NVLINK, "multicast": True}, 128 * MiB, "nccl", "", "8: 64 * MiB symm-mem limit"),
    # CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][2] = 64 MiB keeps the 8 MiB default; symm mem two-shot above (2 ∉ multimem).
    ("vllm", 2, {**H200_NVLINK, "multicast": True}, 16 * MiB, "custom", "two_shot", "two_shot_all_reduce_"),
    # "10.0": CUSTOM_ALL_REDUCE_MAX_SIZES 2: 2 MiB; SYMM_MEM_ALL_REDUCE_MAX_SIZES 2: 8 MiB.
    ("vllm", 2, {**H200_NVLINK, "compute_capability": "10.0", "multicast": True}, 2 * MiB, "custom", "two_shot", ""),
    ("vllm", 2, {**H200_NVLINK, "compute_capability": "10.0", "multicast": True}, 16 * MiB, "nccl", "", "8 MiB"),
    # SGLang's torch symm-mem all-reduce is opt-in (--enable-torch-symm-mem): multicast changes nothing by default.
    ("sglang", 2, {**H200_NVLINK, "multicast": True}, 16 * MiB, "nccl", "", "_MAX_CAR_SIZE"),
]


@pytest.mark.parametrize(("engine", "tp", "topo", "nbytes", "path", "algo", "quote"), CASES)
def test_auto_rule_matches_the_engines_sources(
    engine: str, tp: int, topo: dict[str, object], nbytes: int, path: str, algo: str, quote: str
) -> None:
    chosen = choose_allreduce("auto", nbytes, _topo(tp, **topo), engine=engine)
    assert (chosen.path, chosen.algorithm) == (path, algo), f"{quote}: {chosen.reason}"
    assert chosen.reason  # the budget row shows it
    assert chosen.source.startswith("https://github.com/")


def test_custom_max_is_the_engines_default() -> None:
    assert CUSTOM_AR_MAX_BYTES == 8192 * 1024


def test_reasons_name_the_engine_and_limit() -> None:
    topo = _topo(2, **H200_NVLINK)
    assert "vLLM" in choose_allreduce("auto", 16 * KiB, topo).reason
    assert "8 MiB" in choose_allreduce("auto", 16 * KiB, topo).reason
    assert "SGLang" in choose_allreduce("auto", 16 * KiB, topo, engine="sglang").reason
    assert "PCIe-only" not in choose_allreduce("auto", 16 * KiB, _topo(4, **PCIE_P2P)).reason
    assert "NVLink" in choose_allreduce("auto", 16 * KiB, _topo(4, **PCIE_P2P)).reason


def test_unknown_nvlink_on_four_gpus_stays_nccl_and_says_so() -> None:
    chosen = choose_allreduce("auto", 16 * KiB, _topo(4, compute_capability="9.0", p2p_all_pairs=True))
    assert chosen.path == "nccl"
    assert "not known" in chosen.reason


def test_probe_unsupported_custom_forces_nccl_in_auto_and_custom() -> None:
    topo = _topo(2, **H200_NVLINK, custom_unsupported="NCCL_P2P_DISABLE=1 is set")
    for choice in ("auto", "custom"):
        chosen = choose_allreduce(choice, 16 * KiB, topo)
        assert chosen.path == "nccl"
        assert "NCCL_P2P_DISABLE" in chosen.reason


def test_explicit_choices() -> None:
    topo = _topo(2, **H200_NVLINK)
    assert choose_allreduce("nccl", 16 * KiB, topo).path == "nccl"
    custom = choose_allreduce("custom", 64 * MiB, topo)
    assert (custom.path, custom.algorithm) == ("custom", "one_shot")
    assert choose_allreduce("custom", 1 * MiB, _topo(8, **H200_NVLINK)).algorithm == "two_shot"


@pytest.mark.parametrize(
    ("choice", "nbytes", "engine"), [("fast", 16, "vllm"), ("auto", 0, "vllm"), ("auto", 16, "trt")]
)
def test_bad_arguments(choice: str, nbytes: int, engine: str) -> None:
    with pytest.raises(ValueError):
        choose_allreduce(choice, nbytes, _topo(2, **H200_NVLINK), engine=engine)


def test_custom_algorithm_on_pcie_groups_is_two_shot() -> None:
    assert custom_algorithm(2, 4 * MiB, False) == "one_shot"
    assert custom_algorithm(4, 16 * KiB, False) == "two_shot"
    assert custom_algorithm(4, 16 * KiB, True) == "one_shot"


# The 2 × H200 graph-mode figures (µs): NCCL 11.1 / 12.2 / 12.9 / 19.1 / 77.6, symm-mem one-shot 6.2 / 6.6 / 7.4 /
# 13.1 / 97.1 at 8 B / 16 KiB / 128 KiB / 1 MiB / 16 MiB (docs/benchmarks.md), here in ms.
NCCL = {8.0: 0.0111, 16384.0: 0.0122, 131072.0: 0.0129, 1048576.0: 0.0191, 16777216.0: 0.0776}
ONE_SHOT = {8.0: 0.0062, 16384.0: 0.0066, 131072.0: 0.0074, 1048576.0: 0.0131, 16777216.0: 0.0971}


def test_auto_curve_takes_custom_below_the_limit_and_nccl_above() -> None:
    # 8 B is not a multiple of 16 B: NCCL there, as the engines do.
    curve = engine_allreduce_curve("auto", _topo(2, **H200_NVLINK), NCCL, {"one_shot": ONE_SHOT})
    got = dict(curve.points)
    assert got[8.0] == NCCL[8.0]
    assert got[16384.0] == ONE_SHOT[16384.0]
    assert got[1048576.0] == ONE_SHOT[1048576.0]
    assert got[16777216.0] == NCCL[16777216.0]
    assert curve.summary.startswith("NCCL 8 B, custom one-shot 16 KiB–1 MiB, NCCL 16 MiB (vLLM at TP 2 over NVLink")
    path = curve.path_at(32768)
    assert path is not None and path.label == "custom one-shot"


def test_custom_curve_uses_custom_everywhere_it_was_measured() -> None:
    curve = engine_allreduce_curve("custom", _topo(2, **H200_NVLINK), NCCL, {"one_shot": ONE_SHOT})
    assert dict(curve.points) == ONE_SHOT
    assert curve.summary == "custom one-shot (--allreduce custom)"


def test_nccl_curve_is_the_nccl_points() -> None:
    curve = engine_allreduce_curve("nccl", _topo(2, **H200_NVLINK), NCCL, {"one_shot": ONE_SHOT})
    assert dict(curve.points) == NCCL
    assert curve.summary.startswith("NCCL (")


def test_missing_custom_points_keep_nccl_with_a_note() -> None:
    partial = {16384.0: 0.0066}
    curve = engine_allreduce_curve("auto", _topo(2, **H200_NVLINK), NCCL, {"one_shot": partial})
    got = dict(curve.points)
    assert got[16384.0] == partial[16384.0]
    assert got[1048576.0] == NCCL[1048576.0]  # beyond the measured custom range: never extrapolated
    assert curve.notes == ("custom one-shot not measured at 128 KiB–1 MiB (2 sizes): NCCL times kept there",)
    wide = engine_allreduce_curve("custom", _topo(2, **H200_NVLINK), NCCL, {"one_shot": partial})
    assert wide.notes == ("custom one-shot not measured at 8 B–16 MiB (4 sizes): NCCL times kept there",)


def test_custom_points_between_measured_sizes_are_interpolated() -> None:
    sparse = {16384.0: 0.006, 1048576.0: 0.012}
    curve = engine_allreduce_curve("custom", _topo(2, **H200_NVLINK), NCCL, {"one_shot": sparse})
    assert dict(curve.points)[131072.0] == pytest.approx(0.006 + (131072 - 16384) / (1048576 - 16384) * 0.006)


H200_TOPO = """\
\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\t0-31\t0\t\tN/A
GPU1\tNV18\t X \t0-31\t0\t\tN/A

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""

PCIE_TOPO = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tNODE\tSYS\t0-63\t0
GPU1\tPIX\t X \tNODE\tSYS\t0-63\t0
GPU2\tNODE\tNODE\t X \tSYS\t0-63\t0
GPU3\tSYS\tSYS\tSYS\t X \t64-127\t1
"""


def test_nvlink_all_pairs_from_nvidia_smi_topo() -> None:
    assert nvlink_all_pairs(H200_TOPO, 2) is True
    assert nvlink_all_pairs(PCIE_TOPO, 2) is False
    assert nvlink_all_pairs(PCIE_TOPO, 4) is False
    assert nvlink_all_pairs(H200_TOPO, 4) is None  # fewer GPUs in the matrix than asked
    assert nvlink_all_pairs(None, 2) is None
    assert nvlink_all_pairs("garbage", 2) is None
