"""The pure parts of bench/trainer_overhead.py and bench/gpu_gpt2.py: FLOP counts, ratios and shares, the
exposition reading, and the GPU script's CPU behaviour. No timing is asserted here."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from bench.gpu_gpt2 import (
    GPT2_124M,
    PEAK_BF16_FLOPS,
    SKIP_LINE,
    TINY,
    Result,
    Shape,
    figure_line,
    flops_per_token,
    main,
    mfu,
    non_embedding_params,
)
from bench.trainer_overhead import (
    BENCHMARKS,
    TARGET_SERIES,
    PhaseTotals,
    count_series,
    data_wait_share,
    padding_collector,
    parse_exposition,
    phases_from_exposition,
    ratio,
)
from kubetrain_trainer.metrics import TrainerMetrics
from kubetrain_trainer.models import GPT, GPTConfig

REPO = Path(__file__).resolve().parent.parent


def _hand_count_params(layers: int, embd: int, vocab: int) -> int:
    """GPT-2 parameters without the position embedding, counted by hand: per block two LayerNorms (2C each),
    qkv (3C x C + 3C), attention projection (C x C + C), MLP (C x 4C + 4C and 4C x C + C); then the final
    LayerNorm (2C) and the token embedding, tied to the output head (no bias)."""
    block = 2 * embd + (3 * embd * embd + 3 * embd) + (embd * embd + embd) + 2 * embd \
        + (embd * 4 * embd + 4 * embd) + (4 * embd * embd + embd)
    return vocab * embd + layers * block + 2 * embd


def _model(shape: Shape, meta: bool = False) -> GPT:
    cfg = GPTConfig(vocab_size=shape.vocab_size, block_size=shape.block_size, n_layer=shape.n_layer,
                    n_head=shape.n_head, n_embd=shape.n_embd)
    if meta:
        with torch.device("meta"):
            return GPT(cfg)
    return GPT(cfg)


def test_tiny_flops_per_token_match_a_hand_count() -> None:
    model = _model(TINY)
    n = non_embedding_params(model)
    assert n == _hand_count_params(2, 64, 512) == 132_864
    # 6N for the matmuls, plus 12 * L * H * Q * T for attention: 12 * 2 * 2 * 32 * 64 = 98,304
    assert flops_per_token(n, TINY.n_layer, TINY.n_head, TINY.head_dim, TINY.block_size) == 6 * 132_864 + 98_304
    # The trainer's own formula counts the position embedding too; otherwise it is the same formula.
    from kubetrain_trainer.models import gpt_flops_per_token

    total = sum(p.numel() for p in model.parameters())
    assert gpt_flops_per_token(model.cfg, total) - flops_per_token(n, 2, 2, 32, 64) == 6 * 64 * 64


def test_gpt2_124m_shape_is_gpt2_small() -> None:
    n = non_embedding_params(_model(GPT2_124M, meta=True))
    assert n == _hand_count_params(12, 768, 50304) == 123_689_472  # nanoGPT: "123.69M" with vocab 50304
    per_token = flops_per_token(n, 12, 12, 64, 1024)
    assert per_token == pytest.approx(6 * 123_689_472 + 12 * 12 * 768 * 1024)
    assert per_token / 1e6 == pytest.approx(855.4, abs=0.1)
    # At 45% of 989 TFLOP/s that is about 520K tokens/s on one H200.
    assert 0.45 * PEAK_BF16_FLOPS / per_token == pytest.approx(520_290, rel=1e-3)


def test_mfu_and_tokens_per_second_arithmetic() -> None:
    assert mfu(1e6, 1e6, peak=1e12) == 1.0
    result = Result(shape=GPT2_124M, batch=32, steps=10, warmup=5, seconds=0.5, n_params=123_689_472,
                    flops_per_token=855.4e6, device="NVIDIA H200", precision="bf16 autocast", compiled=True,
                    loss=10.9, peak_memory_gib=30.0)
    assert result.tokens_per_s == 32 * 1024 * 10 / 0.5
    assert result.step_ms == 50.0
    assert result.mfu == pytest.approx(655_360 * 855.4e6 / 989e12)
    line = figure_line(result, "GPT-2-124M")
    assert line.startswith("gpu.gpt2_124m_mfu  56.7 % (655360 tokens/s, 50.0 ms/step;")
    assert line.endswith("goal >= 45.0  met")


def test_ratio_and_share_arithmetic() -> None:
    assert ratio(10.3, 10.0) == pytest.approx(1.03)
    with pytest.raises(ValueError, match="positive"):
        ratio(1.0, 0.0)
    early = PhaseTotals(step=50, data_wait=0.5, forward_backward=4.0, optimizer=1.0, step_seconds=5.6,
                        steps_observed=50)
    late = PhaseTotals(step=250, data_wait=0.9, forward_backward=20.0, optimizer=5.0, step_seconds=26.6,
                       steps_observed=250)
    delta = late.minus(early)
    assert delta.step == 200
    assert delta.step_seconds == pytest.approx(21.0)
    assert data_wait_share(delta) == pytest.approx(100 * 0.4 / 21.0)
    with pytest.raises(ValueError, match="no step time"):
        data_wait_share(early.minus(early))


def _exposition(metrics: TrainerMetrics) -> str:
    return metrics.render()


def test_phases_are_read_from_the_real_exposition() -> None:
    metrics = TrainerMetrics(rank=0, local_rank=0, world_size=1, started=True, step=120)
    metrics.phase_seconds.update(data_wait=0.25, forward_backward=3.0, optimizer=0.75)
    for _ in range(120):
        metrics.step_duration.observe(0.0335)
    phases = phases_from_exposition(_exposition(metrics))
    assert (phases.step, phases.data_wait, phases.forward_backward, phases.optimizer) == (120, 0.25, 3.0, 0.75)
    assert phases.steps_observed == 120
    assert phases.step_seconds == pytest.approx(120 * 0.0335)
    with pytest.raises(RuntimeError, match="lacks"):
        phases_from_exposition("# nothing\n")


def test_padding_brings_the_real_collector_to_500_series() -> None:
    metrics = TrainerMetrics(rank=0, local_rank=0, world_size=1, started=True)
    own = count_series(_exposition(metrics))
    assert 40 < own < TARGET_SERIES
    metrics.extra_collectors.append(padding_collector(TARGET_SERIES - own))
    text = _exposition(metrics)
    assert count_series(text) == TARGET_SERIES
    assert parse_exposition(text)['trainer_bench_extra{local_rank="0",rank="0",series="3"}'] == 3.0


def test_the_module_exposes_three_figures() -> None:
    names = [spec.name for bench in BENCHMARKS for spec in bench.figures]
    assert names == ["trainer.step_time_vs_bare_loop", "trainer.data_wait_share", "trainer.scrape_p95_500_series"]
    assert all(not bench.needs_lab for bench in BENCHMARKS)


def test_gpu_script_skips_cleanly_without_cuda() -> None:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-m", "bench.gpu_gpt2"], cwd=REPO, capture_output=True, text=True,
                            timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == SKIP_LINE
    assert "no CUDA device: skipped" in result.stdout


def test_gpu_script_cpu_smoke_prints_the_figure_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--cpu-smoke"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("gpu.gpt2_124m_mfu  ")
    assert "tokens/s" in line and "CPU smoke, tiny shape L2 H2 C64 T64 V512, N 0.13M, 0.9 MFLOP/token" in line
    assert line.endswith("goal >= 45.0  missed")  # a CPU is nowhere near the H200 peak
