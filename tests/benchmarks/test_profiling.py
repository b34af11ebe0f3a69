"""benchmarks/profiling.py: kernel names read as families, and the table of a profile."""

import pytest

from benchmarks import profiling


@pytest.mark.parametrize(
    "name, family",
    [
        ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "gemm"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
        ("void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm>", "gemm"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop", "attention"),
        ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>", "attention"),
        ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80", "attention"),
        ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "inductor"),
        ("triton_poi_fused__scaled_dot_product_cudnn_attention__to_copy_cos_mul_1", "inductor"),
        ("_rms_norm_fwd_kernel", "ours"),
        ("_gated_bwd_kernel", "ours"),
        ("void at::native::elementwise_kernel<128, 2, ...>", "elementwise (aten)"),
        ("void at::native::vectorized_elementwise_kernel<4, ...>", "elementwise (aten)"),
        ("Memcpy DtoD (Device -> Device)", "copy / fill"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8>", "other"),
    ],
)
def test_kernel_families(name, family):
    assert profiling.kernel_family(name) == family


def test_family_table_has_a_column_per_family_largest_first():
    summaries = {
        "a": {
            "device_ms_per_step": 3.0,
            "wall_ms_per_step": 4.0,
            "host_ms_per_step": 1.5,
            "device_idle_share": 0.25,
            "launches_per_step": 10,
            "families_ms_per_step": {"gemm": 2.0, "inductor": 1.0},
        },
        "b": {
            "device_ms_per_step": 5.0,
            "launches_per_step": 7,
            "families_ms_per_step": {"ours": 4.0, "gemm": 1.0},
        },
    }
    lines = profiling.family_table(summaries)
    assert (
        lines[0]
        == "| contender | wall ms | host ms | device ms | idle | launches | ours | gemm | inductor |"
    )
    assert lines[2] == "| a | 4.00 | 1.50 | 3.00 | 25% | 10 | 0.00 | 2.00 | 1.00 |"
    assert lines[3] == "| b |  |  | 5.00 |  | 7 | 4.00 | 1.00 | 0.00 |"


def test_device_gaps_are_the_idle_stretches_between_kernels_largest_first():
    spans = [(0, 10, "a"), (5, 12, "b"), (20, 30, "c"), (31, 40, "d"), (100, 110, "e")]
    assert profiling.device_gaps(spans) == [
        {"us": 60, "after": "d", "before": "e"},
        {"us": 8, "after": "b", "before": "c"},
        {"us": 1, "after": "c", "before": "d"},
    ]
    assert profiling.device_gaps(spans, largest=1) == [{"us": 60, "after": "d", "before": "e"}]
    assert profiling.device_gaps([]) == []
