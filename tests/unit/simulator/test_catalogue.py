"""Catalogue and engine specs: the numbers are the published ones, names resolve, bad input
fails with a message naming what was wrong."""

from __future__ import annotations

import pytest

from disagg_planner.simulator import catalogue, engine_spec
from disagg_planner.simulator.errors import CatalogueError, EngineSpecError

REQUIRED_GPUS = ["a100_sxm", "h100_sxm", "h200_sxm", "b200", "gb200"]
REQUIRED_MODELS = ["llama-3.1-8b", "llama-3.3-70b", "qwen3-32b", "deepseek-v3"]


@pytest.mark.parametrize("name", REQUIRED_GPUS)
def test_gpu_entries_have_sources_and_sane_numbers(name):
    g = catalogue.gpu(name)
    assert g.source.strip()
    assert g.bf16_flops > 100e12
    assert g.hbm_bytes_per_s > 1e12
    assert g.memory_bytes >= 80e9
    if g.fp8_flops is not None:
        assert g.fp8_flops == pytest.approx(2 * g.bf16_flops, rel=0.01)


def test_gpu_published_values():
    h200 = catalogue.gpu("H200")  # alias, any case
    assert h200.name == "h200_sxm"
    assert h200.memory_bytes == 141e9
    assert h200.hbm_bytes_per_s == 4.8e12
    assert h200.bf16_flops == pytest.approx(989.4e12)
    assert catalogue.gpu("h100_sxm").hbm_bytes_per_s == 3.35e12
    assert catalogue.gpu("a100").peak_flops("fp8") == catalogue.gpu("a100").bf16_flops


@pytest.mark.parametrize(
    ("name", "published_b", "kv_bytes"),
    [
        ("llama-3.1-8b", 8.03, 131072),  # 2*32*8*128*2
        ("llama-3.3-70b", 70.6, 327680),
        ("qwen3-32b", 32.8, 262144),
        ("deepseek-v3", 671.0, 70272),  # MLA (512+64)*61*2
    ],
)
def test_parameter_counts_derived_from_shapes_match_published(name, published_b, kv_bytes):
    m = catalogue.model(name)
    assert m.source.strip()
    assert m.total_params / 1e9 == pytest.approx(published_b, rel=0.02)
    assert m.kv_bytes_per_token == kv_bytes


def test_moe_active_parameters_match_published():
    m = catalogue.model("deepseek-r1")  # alias of the V3 architecture
    assert m.base == "deepseek-v3"
    assert m.is_moe and m.moe_layers == 58
    assert m.active_params / 1e9 == pytest.approx(37.0, rel=0.03)
    assert m.weight_dtype == "fp8"
    assert m.kv_dtype == "bf16"


def test_precision_suffix_sets_weight_and_kv_dtype():
    fp8 = catalogue.model("llama-3.1-8b-fp8")
    assert (fp8.name, fp8.weight_dtype, fp8.kv_dtype) == ("llama-3.1-8b-fp8", "fp8", "fp8")
    assert fp8.kv_bytes_per_token == 65536
    hf = catalogue.model("nvidia/Llama-3.1-8B-Instruct-FP8")
    assert hf.name == "llama-3.1-8b-fp8"
    bf16 = catalogue.model("llama-3.1-8b")
    assert (bf16.weight_dtype, bf16.kv_dtype) == ("bf16", "bf16")


def test_unknown_names_list_the_known_ones():
    with pytest.raises(CatalogueError, match=r"unknown GPU 'tpu-v5'.*h200_sxm"):
        catalogue.gpu("tpu-v5")
    with pytest.raises(CatalogueError, match=r"unknown model 'gpt-9'.*llama-3.1-8b"):
        catalogue.model("gpt-9")


def test_engine_spec_parse_and_round_trip():
    s = engine_spec.parse("sim:llama-3.1-8b-fp8@h200_sxm:tp1")
    assert (s.model.name, s.gpu.name, s.tp, s.dp, s.ep) == ("llama-3.1-8b-fp8", "h200_sxm", 1, 1, 1)
    # vLLM's server defaults on a GPU of >= 70 GiB (test_cluster_vllm_defaults.py)
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.block_size) == (8192, 1024, 16)
    assert str(s) == "sim:llama-3.1-8b-fp8@h200_sxm:tp1"
    t = engine_spec.parse("sim:llama-3.3-70b-fp8@h100:tp4:mnbt=4096:seqs=128:block=32:mem=0.85")
    assert (t.tp, t.max_num_batched_tokens, t.max_num_seqs, t.block_size) == (4, 4096, 128, 32)
    assert engine_spec.parse(str(t)) == t
    moe = engine_spec.parse("sim:deepseek-r1@gb200:tp1:dp16")
    assert (moe.dp, moe.ep, moe.gpus) == (16, 16, 16)  # MoE defaults to wide EP
    assert moe.with_dp(20).ep == 20


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("llama-3.1-8b@h200", "expected 'sim:MODEL@GPU"),
        ("sim:llama-3.1-8b", "expected MODEL@GPU"),
        ("sim:gpt-9@h200", "unknown model 'gpt-9'"),
        ("sim:llama-3.1-8b@h200:tp3", "tp=3 must divide the 32 attention heads"),
        ("sim:llama-3.1-8b@h200:ep2", "ep=2 needs an MoE model"),
        ("sim:llama-3.1-8b@h200:fast", "option 'fast' is neither"),
        ("sim:llama-3.1-8b@h200:turbo=1", "unknown option 'turbo'"),
        ("sim:llama-3.1-8b@h200:mnbt=lots", "max_num_batched_tokens='lots' is not an integer"),
        ("sim:llama-3.1-8b@h200:mem=2", "gpu_memory_utilization=2.0 must be in"),
        ("sim:deepseek-v3@gb200:tp1:dp4:ep2", "ep=2 must be 1 or tp*dp=4"),
    ],
)
def test_engine_spec_errors_name_the_problem(text, message):
    with pytest.raises(EngineSpecError) as info:
        engine_spec.parse(text)
    assert message in str(info.value)
