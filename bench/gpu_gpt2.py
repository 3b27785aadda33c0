"""GPT-2-124M training throughput and MFU on one GPU: ``python -m bench.gpu_gpt2``.

The shape of GPT-2 small (12 layers, 12 heads, 768 wide, 1024 context, vocabulary padded to 50304) built
from the trainer's own model (:class:`kubetrain_trainer.models.GPT`: SDPA attention, tied embeddings),
trained on synthetic tokens as nanoGPT's benchmark does: bf16 autocast, ``torch.compile``, fused AdamW,
gradient clipping; a few warm-up steps (compilation happens in the first), then timed steps between two
CUDA synchronisations.

MFU = tokens/s x FLOPs per token / 989e12 (H100/H200 SXM dense BF16 peak, ANCHORS.md), with FLOPs per
token = 6N + 12·L·H·Q·T (PaLM appendix B, nanoGPT's ``estimate_mfu``): N the parameters without the
position embeddings (nanoGPT's ``get_num_params``; the tied token embedding counts once, as the output
head's matmul), L layers, H heads, Q head size, T context. Goal: at least 45% on one H200.

Without a CUDA device it prints ``no CUDA device: skipped`` and exits 0. ``--cpu-smoke`` runs the same code
on a tiny shape on the CPU (fp32, no compile, 1 warm-up + 2 timed steps) and prints the same line, to check
the model and the arithmetic anywhere; its MFU against the GPU peak means nothing.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from bench.registry import FigureSpec
from bench.report import Goal, format_figure

__all__ = ["GPT2_124M", "PEAK_BF16_FLOPS", "TINY", "Result", "Shape", "flops_per_token", "main", "mfu",
           "non_embedding_params", "train_steps"]

PEAK_BF16_FLOPS: Final = 989e12
SKIP_LINE: Final = "no CUDA device: skipped (gpu.gpt2_124m_mfu needs a GPU; --cpu-smoke checks the math on CPU)"

MFU_FIGURE = FigureSpec(
    "gpu.gpt2_124m_mfu", "%",
    Goal(">=", 45.0, "GPT-2-124M with bf16, torch.compile and fused AdamW on one H200, against the 989 TFLOP/s "
                     "dense BF16 peak; llm.c reaches about 40% on H100s (ANCHORS.md), the realistic matmul "
                     "ceiling is about 80%"))


@dataclass(frozen=True)
class Shape:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int
    vocab_size: int

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


GPT2_124M: Final = Shape(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50304)
TINY: Final = Shape(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=512)


def flops_per_token(n_params: int, n_layer: int, n_head: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weight matmuls (forward 2N, backward 4N) plus 12·L·H·Q·T for the
    attention scores and their weighted sum (forward and backward), as in PaLM and nanoGPT."""
    return 6.0 * n_params + 12.0 * n_layer * n_head * head_dim * seq_len


def mfu(tokens_per_s: float, flops_per_tok: float, peak: float = PEAK_BF16_FLOPS) -> float:
    """Model FLOPs utilisation as a fraction of ``peak``."""
    return tokens_per_s * flops_per_tok / peak


def non_embedding_params(model: Any) -> int:
    """Parameters without the position embedding (shared tensors counted once, as ``parameters()`` does)."""
    total = sum(p.numel() for p in model.parameters())
    return int(total - model.wpe.weight.numel())


@dataclass(frozen=True)
class Result:
    shape: Shape
    batch: int
    steps: int
    warmup: int
    seconds: float
    n_params: int
    flops_per_token: float
    device: str
    precision: str
    compiled: bool
    loss: float
    peak_memory_gib: float

    @property
    def tokens_per_s(self) -> float:
        return self.batch * self.shape.block_size * self.steps / self.seconds

    @property
    def step_ms(self) -> float:
        return 1e3 * self.seconds / self.steps

    @property
    def mfu(self) -> float:
        return mfu(self.tokens_per_s, self.flops_per_token)


def loss_function(model: Any, *, compile_model: bool, compile_loss: bool, mode: str | None) -> Any:
    """``(x, y) -> loss``: with ``compile_loss`` the model and the cross-entropy compile as one graph, so the
    bf16 logits are never materialised in fp32 (an eager loss under autocast upcasts all batch x T x V)."""
    import torch
    import torch.nn.functional as F  # noqa: N812 - the conventional alias

    runner: Any = torch.compile(model, mode=mode) if compile_model and not compile_loss else model

    def forward_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = runner(x)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))

    return torch.compile(forward_loss, mode=mode) if compile_model and compile_loss else forward_loss


def train_steps(shape: Shape, *, batch: int, steps: int, warmup: int, device_name: str, compile_model: bool,
                compile_mode: str | None = None, compile_loss: bool = True) -> Result:
    """Build the model, then ``warmup`` untimed and ``steps`` timed optimizer steps on synthetic tokens."""
    import torch

    from kubetrain_trainer.models import GPT, GPTConfig

    device = torch.device(device_name)
    cuda = device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats(device)
    torch.manual_seed(1337)
    model = GPT(GPTConfig(vocab_size=shape.vocab_size, block_size=shape.block_size, n_layer=shape.n_layer,
                          n_head=shape.n_head, n_embd=shape.n_embd)).to(device)
    n_params = non_embedding_params(model)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=cuda)

    loss_of = loss_function(model, compile_model=compile_model, compile_loss=compile_loss, mode=compile_mode)
    # A few distinct batches, generated on the device once: no input pipeline in the measurement.
    tokens = torch.randint(0, shape.vocab_size, (4, batch, shape.block_size + 1), device=device)

    def step(i: int) -> torch.Tensor:
        seq = tokens[i % tokens.shape[0]]
        x, y = seq[:, :-1].contiguous(), seq[:, 1:].contiguous()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=cuda):
            loss: torch.Tensor = loss_of(x, y)
        torch.autograd.backward(loss)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for i in range(warmup):
        step(i)
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    loss = torch.zeros(())
    for i in range(steps):
        loss = step(warmup + i)
    if cuda:
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - started
    return Result(
        shape=shape, batch=batch, steps=steps, warmup=warmup, seconds=seconds, n_params=n_params,
        flops_per_token=flops_per_token(n_params, shape.n_layer, shape.n_head, shape.head_dim, shape.block_size),
        device=torch.cuda.get_device_name(device) if cuda else "cpu", precision="bf16 autocast" if cuda else "fp32",
        compiled=compile_model, loss=float(loss.item()),
        peak_memory_gib=torch.cuda.max_memory_allocated(device) / 2**30 if cuda else 0.0)


def figure_line(result: Result, label: str) -> str:
    s = result.shape
    detail = (f"{result.tokens_per_s:.0f} tokens/s, {result.step_ms:.1f} ms/step; {label} L{s.n_layer} "
              f"H{s.n_head} C{s.n_embd} T{s.block_size} V{s.vocab_size}, N {result.n_params / 1e6:.2f}M, "
              f"{result.flops_per_token / 1e6:.1f} MFLOP/token; batch {result.batch}, {result.precision}, "
              f"{'torch.compile' if result.compiled else 'eager'}, "
              f"{'fused ' if result.device != 'cpu' else ''}AdamW; {result.steps} timed steps after "
              f"{result.warmup} warm-up; loss {result.loss:.3f}; {result.device}"
              + (f", peak memory {result.peak_memory_gib:.1f} GiB" if result.peak_memory_gib else "")
              + f"; peak {PEAK_BF16_FLOPS / 1e12:.0f} TFLOP/s")
    return format_figure(MFU_FIGURE.measured(100 * result.mfu, detail, tokens_per_s=result.tokens_per_s))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_gpt2", description=__doc__.split("\n")[0] if __doc__
                                     else "", formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64, help="sequences per step (default 64, as llm.c's)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps (default 20)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps first, compilation included (5)")
    parser.add_argument("--no-compile", action="store_true", help="run eagerly")
    parser.add_argument("--compile-mode", default=None, help="torch.compile mode (e.g. max-autotune)")
    parser.add_argument("--compile-model-only", action="store_true",
                        help="compile the model alone, leaving the loss eager (the default compiles both together)")
    parser.add_argument("--cpu-smoke", action="store_true",
                        help="a tiny shape on the CPU (fp32, eager, 1 warm-up + 2 timed steps): checks the math")
    args = parser.parse_args(argv)

    import torch

    if args.cpu_smoke:
        result = train_steps(TINY, batch=4, steps=2, warmup=1, device_name="cpu", compile_model=False)
        print(figure_line(result, "CPU smoke, tiny shape"), flush=True)
        return 0
    if not torch.cuda.is_available():
        print(SKIP_LINE, flush=True)
        return 0
    result = train_steps(GPT2_124M, batch=args.batch, steps=args.steps, warmup=args.warmup, device_name="cuda",
                         compile_model=not args.no_compile, compile_mode=args.compile_mode,
                         compile_loss=not args.compile_model_only)
    print(figure_line(result, "GPT-2-124M"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
