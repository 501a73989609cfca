"""Where each calibration point's reference comes from (``CalibrationPoint.source`` names a key),
as ``CALIBRATION.md`` lists them."""

from __future__ import annotations

SOURCES: dict[str, str] = {
    "dynamo": (
        "Dynamo profiler test data for nvidia/Llama-3.1-8B-Instruct-FP8, H200 TP1 prefill and "
        "TP1 decode, ISL/OSL 3000/150: '40k tokens/s/gpu prefill with 80ms TTFT and 10k "
        "tokens/s/gpu decode with 10ms ITL' (ai-dynamo/dynamo tests/planner/README.md)"
    ),
    "dynamo-raw": (
        "the raw data of the same Dynamo profile (its prefill interpolator's example in "
        "ai-dynamo/dynamo tests/planner): ISL 3000 -> TTFT 0.027 s, 110,893 tok/s/GPU, a lone "
        "request"
    ),
    "aic-vllm": (
        "AIConfigurator's measured vLLM 0.24.0 kernel tables (aiconfigurator-core 0.12.0, "
        "h100_sxm/h200_sxm) composed by simulator/aic_engine.py into one lone request's "
        "prefill (plus the simulated frontend's 6 ms) or one decode step: the aic column of "
        "the same point, recorded by python -m disagg_planner.simulator.calibration "
        "--aic-references"
    ),
    "vllm-latency": (
        "vLLM nightly performance benchmark, latency test (input 32, output 128, batch 8), "
        "buildkite vllm/performance-benchmark build 9515: mean latency / 128 steps "
        "(8B TP1: 997.5 ms H100, 833.4 ms H200; 70B TP4: 2,444.5 ms H100, 2,077.5 ms H200)"
    ),
    "aic-queueing": (
        "AIConfigurator queueing-model validation (docs/design/queueing_model.md), vLLM 0.24.0, "
        "Llama-3.1-8B on H200, ISL/OSL 4096/256, concurrency 32: itl_p50 9.3 ms "
        "(precision not stated; BF16 assumed)"
    ),
    "trtllm": (
        "TensorRT-LLM docs/source/performance/perf-overview.md (trtllm-bench max throughput, "
        "PyTorch backend, fixed ISL/OSL, CUDA graphs padded up to batch 8192; request counts "
        "per shape as the page lists them, 128/128 run with 10,000 of its 30,000): total "
        "output tokens/s of the TP group, divided here by its GPUs (H200 8B and 70B TP1; "
        "H100 8B TP1 and 70B TP2)"
    ),
    "inferencex": (
        "SemiAnalysis InferenceX blog table, nvidia/Llama-3.3-70B-Instruct-FP8 on H100 with "
        "vLLM, runs of 2025-10-29, conc 64: 1k/1k 2,123.1 tok/s/GPU (input+output), median "
        "TTFT 135.7 ms, median TPOT 29.1 ms; 8k/1k 2,568.0 tok/s/GPU, 466.2 ms, 55.0 ms "
        "(SemiAnalysisAI/InferenceX-app packages/app/content/blog/"
        "best-gpu-for-llama70b-inference.mdx @ 2d1d3d65df4d6cb7773de89d548becc15dafab44); image "
        "vllm/vllm-openai:v0.10.2 (SemiAnalysisAI/InferenceX .github/configs/master.yaml @ "
        "78f6b8d2, entry 70b-fp8-h100-vllm); server flags kv-cache-dtype fp8, async scheduling, "
        "no prefix caching, max-num-batched-tokens 8192, max-model-len 10240, max-num-seqs = "
        "concurrency (benchmarks/70b_fp8_h100_slurm.sh @ 2a205bb3); client kimbochen/"
        "bench_serving (a fork of vLLM's benchmark_serving.py): --dataset-name random "
        "--random-range-ratio 0.8 --num-prompts 640 --max-concurrency 64 --request-rate inf "
        "--ignore-eos"
    ),
}

__all__ = ["SOURCES"]
