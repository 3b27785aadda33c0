"""The trainer's pure parts, in-process and fast: configuration, LR schedule, sharding, metrics, checkpoints."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from kubetrain.cli.ports import free_port_range
from kubetrain_trainer import checkpoint as checkpoint_module
from kubetrain_trainer.checkpoint import Checkpointer, TrainState, list_checkpoints
from kubetrain_trainer.config import ConfigError, RunEnv, load_config, parse_config
from kubetrain_trainer.data import (
    ResumableDistributedSampler,
    ShardedFileDataset,
    assign_files,
    epoch_permutation,
    rank_positions,
)
from kubetrain_trainer.distributed import PreflightError, check_devices, context_from_env
from kubetrain_trainer.gpu import gpu_collector, peak_flops
from kubetrain_trainer.loop import plan_total_steps
from kubetrain_trainer.metrics import Histogram, TrainerMetrics, serve
from kubetrain_trainer.parallel import lr_at
from kubetrain_trainer.tasks import TaskContext, build_task
from tests.trainer_helpers import scrape

# --- configuration -------------------------------------------------------------------------------------


def test_an_empty_config_gets_the_operators_defaults() -> None:
    cfg = parse_config({}, env={})
    t = cfg.trainer
    assert (t.task, t.strategy, t.max_steps, t.epochs, t.batch_size, t.precision) == ("digits", "ddp", 100, None,
                                                                                     32, "bf16")
    assert (t.optimizer.name, t.optimizer.lr, t.optimizer.momentum, t.grad_clip, t.min_lr_ratio) == (
        "adamw", 1e-3, 0.9, 1.0, 0.1)
    assert (cfg.data.path, cfg.data.workers, cfg.data.prefetch_factor, cfg.data.drop_last) == ("/data", 2, 2, True)
    assert (cfg.checkpoint.path, cfg.checkpoint.every_steps, cfg.checkpoint.keep, cfg.checkpoint.resume) == (
        "/checkpoints", 100, 3, True)


@pytest.mark.parametrize(("raw", "message"), [
    ({"trainer": {"maxStep": 5}}, "trainer: unknown key(s) maxStep"),
    ({"trainer": {"optimizer": {"beta": 1}}}, "trainer.optimizer: unknown key(s) beta"),
    ({"data": {"worker": 1}}, "data: unknown key(s) worker"),
    ({"checkpoint": {"every": 1}}, "checkpoint: unknown key(s) every"),
    ({"command": ["x"]}, "config: unknown key(s) command"),
    ({"trainer": {"task": "digits", "entrypoint": "a.b:c"}}, "either task or entrypoint"),
    ({"trainer": {"maxSteps": 5, "epochs": 1}}, "either maxSteps or epochs"),
    ({"trainer": {"task": "mnist"}}, "trainer.task: 'mnist' is not one of"),
    ({"trainer": {"batchSize": True}}, "trainer.batchSize: expected int, got a boolean"),
    ({"trainer": {"batchSize": "32"}}, "trainer.batchSize: expected int, got str"),
    ({"trainer": {"entrypoint": "no_colon"}}, "package.module:function"),
    ({"trainer": {"options": {"layers": 2}}}, "trainer.options.layers: expected str, got int"),
    ({"trainer": ["digits"]}, "trainer: expected object, got list"),
    ({"checkpoint": {"keep": 0}}, "checkpoint.keep: must be >= 1"),
    ({"checkpoint": {"everySteps": -1}}, "checkpoint.everySteps: must be >= 0"),
    ({"trainer": {"optimizer": {"lr": 0}}}, "trainer.optimizer.lr: must be > 0"),
    ({"data": {"workers": 65}}, "data.workers: must be <= 64"),
    ({"data": {"path": "data"}}, "data.path: 'data' does not match the pattern"),
])
def test_invalid_configs_are_rejected_with_the_key_path(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(raw, env={})


def test_epochs_replace_the_default_step_count_and_an_entrypoint_replaces_the_default_task() -> None:
    cfg = parse_config({"trainer": {"epochs": 3, "entrypoint": "pkg.mod:build"}}, env={})
    assert (cfg.trainer.epochs, cfg.trainer.max_steps, cfg.trainer.task) == (3, None, None)


def test_env_overrides_the_paths_and_reads_the_json_config() -> None:
    env = {"KUBETRAIN_CONFIG": json.dumps({"data": {"workers": 0}}),
           "KUBETRAIN_CHECKPOINT_DIR": "/ck", "KUBETRAIN_DATA_DIR": "/dd"}
    cfg = load_config(env)
    assert (cfg.checkpoint.path, cfg.data.path, cfg.data.workers) == ("/ck", "/dd", 0)
    with pytest.raises(ConfigError, match="not valid JSON"):
        load_config({"KUBETRAIN_CONFIG": "{"})
    run_env = RunEnv.from_env({"KUBETRAIN_METRICS_PORT": "0", "KUBETRAIN_ATTEMPT": "2"})
    assert (run_env.metrics_port, run_env.attempt) == (0, 2)
    assert RunEnv.from_env({}).metrics_port == 9400


# --- schedule and plan ----------------------------------------------------------------------------------


def test_lr_warms_up_linearly_then_decays_by_cosine_to_the_floor() -> None:
    lrs = [lr_at(s, 1.0, warmup=10, total=110, min_ratio=0.1) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1)
    assert lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in itertools.pairwise(lrs[9:]))  # non-increasing after the warmup
    assert lrs[60] == pytest.approx(0.55)  # half-way through the decay: (1 + 0.1) / 2
    assert lrs[110] == pytest.approx(0.1)
    assert lr_at(500, 1.0, 10, 110, 0.1) == pytest.approx(0.1)  # past the end: stays at the floor
    assert lr_at(0, 1.0, 0, 100, 0.0) == pytest.approx(1.0)


def test_planned_steps_come_from_max_steps_or_from_epochs() -> None:
    assert plan_total_steps(50, None, 22, 1) == 50
    assert plan_total_steps(None, 3, 22, 2) == 33


# --- sharding -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ranks_get_disjoint_shards_that_cover_the_dataset(world: int) -> None:
    n = 103
    order = epoch_permutation(n, seed=1, epoch=0, shuffle=True)
    shards = [rank_positions(order, 0, world, r, drop_last=True) for r in range(world)]
    flat = [i for s in shards for i in s]
    assert len(flat) == len(set(flat))  # disjoint
    assert len({len(s) for s in shards}) == 1  # equal step counts: no rank waits for a peer
    assert len(flat) == n - n % world  # complete but for the documented tail (< world samples)
    padded = [rank_positions(order, 0, world, r, drop_last=False) for r in range(world)]
    assert set().union(*map(set, padded)) == set(range(n))  # drop_last false: every sample, some twice
    assert len({len(s) for s in padded}) == 1


def test_the_order_changes_between_epochs_and_is_the_same_for_every_world_size() -> None:
    a, b = epoch_permutation(100, 5, 0, True), epoch_permutation(100, 5, 1, True)
    assert a != b and sorted(a) == sorted(b) == list(range(100))
    assert epoch_permutation(100, 5, 0, True) == a


def test_resuming_with_another_world_size_skips_exactly_the_consumed_samples() -> None:
    n, consumed = 97, 40  # 2 ranks x 20 samples consumed before the checkpoint; 57 left divide by 3
    order = epoch_permutation(n, 9, 2, True)
    before = {i for r in range(2) for i in rank_positions(order, 0, 2, r, True)[:20]}
    after = [i for r in range(3) for i in rank_positions(order, consumed, 3, r, True)]
    assert before == set(order[:consumed])
    assert set(after) == set(order[consumed:])  # nothing repeated, nothing skipped


def test_the_sampler_through_a_dataloader_with_two_workers_shards_disjointly() -> None:
    n, world = 64, 2
    dataset = TensorDataset(torch.arange(n))
    seen: list[list[int]] = []
    for rank in range(world):
        sampler = ResumableDistributedSampler(dataset, world, rank, seed=3)
        sampler.set_position(epoch=1, skip=0)
        loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2)
        seen.append([int(i) for (batch,) in loader for i in batch])
    assert set(seen[0]).isdisjoint(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(n))
    sampler = ResumableDistributedSampler(dataset, world, 0, seed=3)
    sampler.set_position(epoch=1, skip=16)
    assert list(sampler) == seen[0][8:] and len(sampler) == 24


def test_files_are_split_across_ranks_and_workers_without_overlap() -> None:
    files = [f"shard-{i:03d}" for i in range(23)]
    parts = [assign_files(files, r, 2, w, 3) for r in range(2) for w in range(3)]
    flat = [f for p in parts for f in p]
    assert sorted(flat) == files and len(flat) == len(set(flat))


def test_file_shards_are_read_once_per_epoch_across_ranks_and_dataloader_workers(tmp_path: Path) -> None:
    files = []
    for i in range(7):  # file i holds only byte i, so every window names its file
        path = tmp_path / f"part-{i}.bin"
        path.write_bytes(bytes([i]) * (17 * (i + 1) + 1))
        files.append(path)
    readers: dict[int, set[int]] = {}
    windows = 0
    for rank in range(2):
        loader = DataLoader(ShardedFileDataset(files, window=16, rank=rank, world=2), batch_size=None, num_workers=2)
        for x, y in loader:
            assert x.shape == y.shape == (16,) and torch.equal(x, y)
            readers.setdefault(int(x[0]), set()).add(rank)
            windows += 1
    assert sorted(readers) == list(range(7))  # every file read
    assert all(len(ranks) == 1 for ranks in readers.values())  # by one rank only
    assert windows == sum(i + 1 for i in range(7))  # and once: file i has i + 1 whole windows


def _per_sample_batches(loader: DataLoader[Any]) -> list[list[torch.Tensor]]:
    return [[t.clone() for t in batch] for batch in loader]


@pytest.mark.parametrize("drop_last", [True, False])
def test_batched_gathering_yields_exactly_the_per_sample_batches(drop_last: bool) -> None:
    from kubetrain_trainer.data import build_loader
    from kubetrain_trainer.tasks import ByteWindows

    datasets = [TensorDataset(torch.arange(103 * 3).view(103, 3).float(), torch.arange(103)),
                ByteWindows(torch.arange(250, dtype=torch.uint8), block=4)]
    for dataset in datasets:
        sampler = ResumableDistributedSampler(dataset, 2, 1, seed=5, drop_last=drop_last)
        sampler.set_position(epoch=2, skip=6)
        reference = _per_sample_batches(DataLoader(dataset, batch_size=8, sampler=sampler, drop_last=drop_last))
        loader = build_loader(dataset, sampler, batch_size=8, workers=2, prefetch_factor=2, drop_last=drop_last,
                              pin_memory=False)
        assert loader.num_workers == 0  # in-memory: gathered in the training process
        batched = _per_sample_batches(loader)  # type: ignore[arg-type]
        assert len(batched) == len(reference) == len(loader)
        for got, want in zip(batched, reference, strict=True):
            assert all(torch.equal(g, w) and g.is_contiguous() for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(("workers", "drop_last"), [(0, True), (2, True), (2, False)])
def test_file_shards_cut_the_same_batches_the_dataloader_would(tmp_path: Path, workers: int,
                                                               drop_last: bool) -> None:
    from kubetrain_trainer.data import build_loader

    files = []
    for i in range(5):
        path = tmp_path / f"part-{i}.bin"
        path.write_bytes(bytes(range(i, i + 200)) * (i + 1))
        files.append(path)
    dataset = ShardedFileDataset(files, window=16, rank=0, world=1, epoch=3)
    reference = _per_sample_batches(DataLoader(dataset, batch_size=7, num_workers=workers, drop_last=drop_last))
    loader = build_loader(dataset, None, batch_size=7, workers=workers, prefetch_factor=2, drop_last=drop_last,
                          pin_memory=False)
    batched = _per_sample_batches(loader)  # type: ignore[arg-type]
    key = [[tuple(t.flatten().tolist()) for t in batch] for batch in batched]
    # Workers interleave their batches in turn, as with per-sample loading: same batches, same order.
    assert key == [[tuple(t.flatten().tolist()) for t in batch] for batch in reference]


# --- devices, metrics -----------------------------------------------------------------------------------


def test_preflight_names_the_missing_gpus() -> None:
    ctx = context_from_env({"LOCAL_WORLD_SIZE": "4", "RANK": "5"}, cuda_available=False)
    check_devices(ctx, visible=0, cuda_available=False)  # CPU: nothing to check
    with pytest.raises(PreflightError, match=r"4 processes per node expect as many GPUs.*device_count\(\) is 2"):
        check_devices(ctx, visible=2, cuda_available=True)


def test_gpu_metrics_are_absent_without_a_gpu_and_mfu_knows_the_h200_peak() -> None:
    assert gpu_collector(torch.device("cpu")) is None
    assert peak_flops("NVIDIA H200") == 989e12
    assert peak_flops("Some CPU") is None


def test_histogram_buckets_are_cumulative() -> None:
    h = Histogram((0.1, 1.0))
    for v in (0.05, 0.5, 0.7, 5.0):
        h.observe(v)
    assert h.cumulative() == [("0.1", 1.0), ("1.0", 3.0), ("+Inf", 4.0)]
    assert h.total == pytest.approx(6.25)


def test_the_endpoint_serves_the_values_the_loop_set() -> None:
    m = TrainerMetrics(rank=0, local_rank=0, world_size=4)
    m.step, m.total_steps, m.loss_last, m.checkpoint_last_step = 42, 100, 0.25, 40
    port = free_port_range(1)
    server = serve(m, port)
    try:
        assert "trainer_steps_total" not in scrape(port), "no progress before the run restored its checkpoint"
        m.started = True
        samples = scrape(port)
    finally:
        server.close()
    assert samples["trainer_steps_total"] == [({"rank": "0", "local_rank": "0"}, 42.0)]
    assert samples["trainer_total_steps"][0][1] == 100
    assert samples["trainer_loss_last"][0][1] == 0.25
    assert samples["trainer_checkpoint_last_step"][0][1] == 40
    assert samples["trainer_resumed_from_step"][0][1] == -1
    assert "trainer_eval_loss" not in samples  # no evaluation yet: absent rather than a made-up value
    assert not math.isnan(samples["trainer_world_size"][0][1])


def test_other_ranks_serve_their_own_series_and_leave_the_job_wide_ones_to_rank_0() -> None:
    m = TrainerMetrics(rank=3, local_rank=1, world_size=4, started=True, step=42, eval_loss=1.0,
                       eval_metrics={"accuracy": 0.5})
    m.step_duration.observe(0.2)
    served = {line.split("{")[0] for line in m.render().splitlines() if not line.startswith("#")}
    assert {"trainer_step", "trainer_world_size", "trainer_last_step_timestamp_seconds",
            "trainer_step_phase_seconds_total", "trainer_step_duration_seconds_count",
            "trainer_checkpoint_duration_seconds_count"} <= served
    assert not served & {"trainer_steps_total", "trainer_loss_last", "trainer_loss_sum", "trainer_samples_total",
                         "trainer_learning_rate", "trainer_eval_loss", "trainer_eval_metric", "trainer_total_steps"}
    m.job_wide = True  # what report() asks for: a user program's ranks serve what they are told
    assert "trainer_loss_last{" in m.render()


def test_the_exposition_is_written_as_prometheus_client_writes_it() -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, InfoMetricFamily

    from kubetrain_trainer.exposition import number, render_families

    for v in (0, -1, 42, 0.1, 1e-9, 123456.0, 1234567.0, 1.2e6, 1e18, -1e18, math.inf, -math.inf, math.nan):
        assert number(v) == __import__("prometheus_client.utils").utils.floatToGoString(v), v
    gauge = GaugeMetricFamily("g", 'doc with \\ and\nnewline', labels=["b", "a"])
    gauge.add_metric(["x", 'quote " back \\ nl \n'], 2.5)
    gauge.add_metric(["y", "plain"], math.inf)  # same label names, nothing to escape: the family's one template
    gauge.add_metric(["z", "back \\"], 1e-9)
    counter = CounterMetricFamily("c", "a counter", labels=["a"])
    counter.add_metric(["1"], 3.0)
    # Samples of one family with two sets of label names (buckets carry le, the sum and count do not)
    histogram = HistogramMetricFamily("h", "a histogram", labels=["rank"])
    histogram.add_metric(["0"], [("0.5", 1.0), ("+Inf", 3.0)], 2.5)
    info = InfoMetricFamily("i", "info (written by the reference writer)", value={"k": "v"})
    families: list[object] = [gauge, counter, histogram, info]

    class Collector:
        def collect(self) -> list[object]:
            return families

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collector())  # type: ignore[arg-type]
    assert render_families(families) == generate_latest(registry).decode()


# --- checkpoints (one process, no process group) --------------------------------------------------------


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(4, 2)
    return model, torch.optim.AdamW(model.parameters(), lr=0.1)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # one process, no group: intended
def test_checkpoints_are_atomic_keep_the_newest_and_restore_weights_and_position(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2, rank=0, world_size=1)
    (tmp_path / ".tmp-step_000000007").mkdir(parents=True)  # a save that a crash interrupted
    (tmp_path / "step_000000099").mkdir()  # a directory without trainer_state.json is not a checkpoint
    ckpt.prepare()
    assert not (tmp_path / ".tmp-step_000000007").exists()
    model, opt = _model_and_optimizer()
    for step in (10, 20, 30):
        model(torch.randn(3, 4)).sum().backward()
        opt.step()
        ckpt.save(model, opt, TrainState(step=step, epoch=1, epoch_samples=step * 8, world_size=1))
    assert [s for s, _ in list_checkpoints(tmp_path)] == [20, 30]
    assert not list(tmp_path.glob(".tmp-*"))
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    fresh, fresh_opt = _model_and_optimizer()
    latest = ckpt.latest()
    assert latest is not None and latest[0] == 30
    state = ckpt.load(latest[1], fresh, fresh_opt)
    assert (state.step, state.epoch, state.epoch_samples) == (30, 1, 240)
    for key, tensor in fresh.state_dict().items():
        assert torch.equal(tensor, saved[key]), key
    assert fresh_opt.state_dict()["state"][0]["step"] == 3  # AdamW's moments came back too


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_resave_of_the_same_step_keeps_the_complete_one_with_no_window(tmp_path: Path) -> None:
    """A resumed attempt saving the step it resumed from: the existing checkpoint is never removed first."""
    ckpt = Checkpointer(tmp_path, keep=1, rank=0, world_size=1)
    ckpt.prepare()
    model, opt = _model_and_optimizer()
    ckpt.save(model, opt, TrainState(step=5, world_size=1, seed=1))
    (_, first), = list_checkpoints(tmp_path)
    marker = (first / "trainer_state.json").stat().st_ino
    removed: list[str] = []
    real_rmtree = shutil.rmtree
    def watching_rmtree(path: Any, *args: Any, **kwargs: Any) -> None:
        removed.append(Path(path).name)
        real_rmtree(path, *args, **kwargs)
    with mock.patch("kubetrain_trainer.checkpoint.shutil.rmtree", watching_rmtree):
        ckpt.save(model, opt, TrainState(step=5, world_size=1, seed=2))
    assert "step_000000005" not in removed and removed and removed[0].startswith(".tmp-step_000000005-")
    (_, kept), = list_checkpoints(tmp_path)
    assert (kept / "trainer_state.json").stat().st_ino == marker, "the first save of step 5 stays in place"
    assert not list(tmp_path.glob(".tmp-*"))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_every_save_writes_into_a_directory_of_its_own(tmp_path: Path) -> None:
    """A straggler of an older attempt that still writes `.tmp-step_N...` cannot mix into this save."""
    ckpt = Checkpointer(tmp_path, keep=3, rank=0, world_size=1)
    ckpt.prepare()
    straggler = tmp_path / ".tmp-step_000000010"
    model, opt = _model_and_optimizer()
    scratch: list[Path] = []
    real_save = checkpoint_module.dcp_save  # type: ignore[attr-defined]
    def recording_save(state: Any, checkpoint_id: Path) -> Any:
        scratch.append(Path(checkpoint_id))
        straggler.mkdir(exist_ok=True)  # the straggler's own writes, under the old fixed name
        (straggler / "junk.distcp").write_text("old attempt")
        return real_save(state, checkpoint_id=checkpoint_id)
    with mock.patch("kubetrain_trainer.checkpoint.dcp_save", recording_save):
        ckpt.save(model, opt, TrainState(step=10, world_size=1))
        ckpt.save(model, opt, TrainState(step=20, world_size=1))
    assert len({p.name for p in scratch}) == 2 and all(p != straggler for p in scratch)
    assert not (tmp_path / "step_000000010" / "junk.distcp").exists()


# --- built-in tasks -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("task", "options"), [
    ("digits", {}),
    ("synthetic", {"samples": "512", "features": "8", "hidden": "16", "classes": "4"}),
    ("gpt", {"layers": "1", "embd": "16", "heads": "2", "blockSize": "32", "corpusBytes": "50000"}),
])
def test_each_builtin_task_yields_a_model_data_and_a_finite_loss(task: str, options: dict[str, str]) -> None:
    cfg = parse_config({"trainer": {"task": task, "options": options}}, env={})
    built = build_task(TaskContext(trainer=cfg.trainer, options=cfg.trainer.options, data_dir=Path("/nonexistent"),
                                   rank=0, world_size=1, device=torch.device("cpu")))
    batch = next(iter(DataLoader(built.train_dataset, batch_size=4)))
    loss = built.loss_fn(built.model, batch)
    assert loss.dim() == 0 and torch.isfinite(loss)
    assert built.eval_dataset is not None and built.eval_fn is not None
    assert built.flops_per_sample > 0


def test_unknown_task_options_are_rejected() -> None:
    cfg = parse_config({"trainer": {"task": "gpt", "options": {"layer": "2"}}}, env={})
    with pytest.raises(ConfigError, match="unknown key"):
        build_task(TaskContext(trainer=cfg.trainer, options=cfg.trainer.options, data_dir=Path("/x"), rank=0,
                               world_size=1, device=torch.device("cpu")))


def test_trainer_answers_help_and_refuses_arguments_instead_of_training(tmp_path: Path) -> None:
    import subprocess
    import sys

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "kubetrain_trainer", *args], capture_output=True, text=True,
                              check=False, timeout=120, cwd=tmp_path, env={"PATH": "/usr/bin:/bin",
                                                              "KUBETRAIN_CHECKPOINT_DIR": str(tmp_path / "c")})
    helped = run("--help")
    assert helped.returncode == 0 and "KUBETRAIN_CONFIG" in helped.stdout
    refused = run("--steps", "10")
    assert refused.returncode == 2 and "unexpected arguments" in refused.stderr
    assert not (tmp_path / "c").exists(), "nothing trained, no checkpoint written"


# --- DDP carries each step's votes ------------------------------------------------------------------------


def _votes_rank(rank: int, store_path: str, out: str) -> None:
    """One of two gloo ranks: a step of a DDP model with StepVotes; what it saw, written to ``out``."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from kubetrain_trainer.parallel import StepVotes

    dist.init_process_group("gloo", store=dist.FileStore(store_path, 2), rank=rank, world_size=2)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
    votes = StepVotes(ddp, world_size=2)
    x = torch.full((3, 4), float(rank + 1))
    loss = ddp(x).square().mean()
    votes.send(torch.stack([loss.detach(), torch.tensor(float(rank == 1))]))  # only rank 1 votes to stop
    loss.backward()
    assert votes.summed is not None
    Path(out.format(rank)).write_text(json.dumps({"loss": loss.item(), "summed": votes.summed.tolist(),
                                     "grad": model.weight.grad.flatten().tolist()}))
    dist.destroy_process_group()


def test_ddp_carries_the_losses_and_stop_votes_in_its_gradient_all_reduce(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    mp.spawn(_votes_rank, args=(str(tmp_path / "store"), str(tmp_path / "rank{}.json")), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    losses = [r["loss"] for r in ranks]
    for seen in ranks:
        assert seen["summed"] == pytest.approx([sum(losses), 1.0])  # summed, not averaged: one rank's vote counts
    # The gradients are still DDP's mean over the ranks: each rank's own, computed here without DDP.
    own = []
    for rank in range(2):
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 2)
        model(torch.full((3, 4), float(rank + 1))).square().mean().backward()
        own.append(model.weight.grad.flatten())
    assert ranks[0]["grad"] == ranks[1]["grad"] == pytest.approx(((own[0] + own[1]) / 2).tolist())
