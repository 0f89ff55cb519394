"""Data-parallel training (2 gloo processes on the CPU) and the sparse graph convolution.

The 2-process run must reproduce a 1-process run with the same global batch and seed:
dropout 0 (so no random draws differ between the two), the same optimiser steps, the same
global masked-MAE gradient; only the order of floating-point sums differs. Tolerance: the
test metrics agree to a relative 1e-3 (observed: about 1e-5 after 3 epochs) and the best
epoch is the same.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from diagsink.cli.launch import launch_command
from diagsink.data import toy_data
from diagsink.engine.config import load_config, override
from diagsink.engine.distributed import env_info, rank_loss, shard_batch
from diagsink.engine.epoch import SingleProcess
from diagsink.engine.runs import run_paths
from diagsink.engine.train import train_run
from diagsink.errors import ConfigError
from diagsink.metrics import masked_mae

DATA = Path(os.environ.get("DIAGSINK_DATA", "/work/shared/data/metr-la"))

# 49 windows in global batches of 16: the last batch has 1 window, so rank 1 gets an empty shard.
TINY = {
    "model.d_model": 8,
    "model.n_heads": 2,
    "model.depth": 1,
    "model.node_embed_dim": 3,
    "model.dropout": 0.0,
    "train.epochs": 3,
    "train.batch_size": 16,
    "train.eval_batch_size": 64,
    "train.max_train_windows": 49,
    "train.warmup_epochs": 1,
    "train.lr": 1e-2,
}

WORKER = textwrap.dedent(
    """
    import json, os, sys, torch
    torch.set_num_threads(1)
    import diagsink.engine.runs as R, diagsink.engine.train as T
    from diagsink.data import toy_data
    from diagsink.engine import distributed as D
    from diagsink.engine.config import load_config, override
    writes = []
    save, write_run = R.save_checkpoint, T._write_run
    R.save_checkpoint = lambda *a, **k: (writes.append("checkpoint"), save(*a, **k))[1]
    T._write_run = lambda *a, **k: (writes.append("artifact"), write_run(*a, **k))[1]
    cfg = override(load_config("quick"), TINY)
    out = sys.argv[1]

    class Interrupt(Exception):
        pass

    def interrupt(entry):  # like a kill after the first epoch's checkpoint
        raise Interrupt

    with D.session("cpu") as ddp:
        rank = ddp.rank
        try:
            D.data_parallel(T.train_run, ddp, cfg, "penalty", 0, data=toy_data(), device="cpu", out_dir=out,
                            progress=False, on_epoch=interrupt)
            first = "finished"
        except Interrupt:
            first = "interrupted"
        art = D.data_parallel(T.train_run, ddp, cfg, "penalty", 0, data=toy_data(), device="cpu", out_dir=out,
                              progress=False)
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"first": first, "metrics": art["metrics"], "best_epoch": art["best_epoch"],
                   "resumed_from": art["resumed_from_epoch"], "history": art["history"], "writes": writes,
                   "processes": art["provenance"]["processes"]}, f)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "DIAGSINK_QUICK": "1"}


@pytest.mark.slow
def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER.replace("TINY", repr(TINY)))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]

    ref = train_run(
        override(load_config("quick"), TINY),
        "penalty",
        0,
        data=toy_data(),
        device="cpu",
        write=False,
        progress=False,
    )
    for got in ranks:
        # interrupted after 1 epoch, then resumed
        assert got["first"] == "interrupted" and got["resumed_from"] == 1
        assert got["best_epoch"] == ref["best_epoch"]
        assert got["processes"].startswith("DistributedDataParallel, 2 processes (gloo)")
        for key, value in ref["metrics"].items():
            assert math.isclose(got["metrics"][key], value, rel_tol=1e-3), (
                key,
                got["metrics"][key],
                value,
            )
        for a, b in zip(got["history"], ref["history"], strict=True):
            assert math.isclose(a["val_mae"], b["val_mae"], rel_tol=1e-3)
    # the runs are not trivially equal: training moved the validation error
    assert abs(ref["history"][-1]["val_mae"] - ref["history"][0]["val_mae"]) > 1e-2
    # rank 0 alone wrote: one checkpoint per epoch (3) and one artifact; rank 1 wrote nothing
    assert ranks[0]["writes"] == ["checkpoint"] * 3 + ["artifact"] and ranks[1]["writes"] == []
    art = json.loads(run_paths(tmp_path, "quick", "penalty", 0)["json"].read_text())
    assert art["metrics"] == ranks[0]["metrics"]
    assert not run_paths(tmp_path, "quick", "penalty", 0)["checkpoint"].exists()


@pytest.mark.slow
@pytest.mark.skipif(
    not (DATA / "adj_mx.npy").exists(), reason="METR-LA not available (DIAGSINK_DATA)"
)
def test_cli_distributed_flag_runs_torchrun_and_writes_one_artifact(tmp_path):
    import yaml

    cfg = override(load_config("quick"), {**TINY, "train.epochs": 2, "train.max_train_windows": 32})
    cfg["protocol"] = "custom-ddp"
    (tmp_path / "ddp.yaml").write_text(yaml.safe_dump(cfg))
    cmd = [
        sys.executable,
        "-m",
        "diagsink",
        "train",
        "--variant",
        "none",
        "--protocol",
        str(tmp_path / "ddp.yaml"),
        "--device",
        "cpu",
        "--data",
        str(DATA),
        "--out",
        str(tmp_path / "out"),
        "--no-progress",
        "--distributed",
        "2",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the summary line comes from rank 0 only
    assert proc.stdout.count("none seed 0: MAE@3") == 1, proc.stdout
    art = json.loads(run_paths(tmp_path / "out", "custom-ddp", "none", 0)["json"].read_text())
    assert art["provenance"]["processes"].startswith("DistributedDataParallel, 2 processes (gloo)")
    assert art["epochs_run"] == 2


@given(st.integers(0, 40), st.integers(1, 6))
@settings(max_examples=60, deadline=None)
def test_shards_partition_the_global_batch(b, world):
    starts = torch.arange(100, 100 + b)
    shards = [shard_batch(starts, r, world) for r in range(world)]
    assert torch.equal(torch.cat(shards), starts)
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1 and sizes == sorted(sizes, reverse=True)


def test_average_of_rank_gradients_is_the_global_masked_mae_gradient():
    g = torch.Generator().manual_seed(5)
    target = 40 + 30 * torch.rand(10, 3, 7, generator=g, dtype=torch.float64)
    target[torch.rand(target.shape, generator=g) < 0.3] = 0.0  # missing readings, unevenly spread
    pred = (target + torch.randn(target.shape, generator=g, dtype=torch.float64)).requires_grad_()
    (ref,) = torch.autograd.grad(masked_mae(pred, target), pred)
    for world in (1, 2, 3):
        count = (target != 0).sum()
        grads = [
            torch.autograd.grad(rank_loss(pred[i], target[i], count, world), pred)[0]
            for i in torch.tensor_split(torch.arange(10), world)
        ]
        torch.testing.assert_close(sum(grads) / world, ref)
    # the naive per-rank mean is NOT the global loss when ranks hold different numbers of observed targets
    halves = torch.tensor_split(torch.arange(10), 2)
    naive = [torch.autograd.grad(masked_mae(pred[i], target[i]), pred)[0] for i in halves]
    assert not torch.allclose(sum(naive) / 2, ref)


def test_single_process_hooks_leave_the_engine_unchanged():
    ctx = SingleProcess()
    model = torch.nn.Linear(2, 2)
    starts = torch.arange(7)
    assert ctx.wrap(model) is model and ctx.shard(starts) is starts and ctx.is_main
    pred, target = torch.rand(4, 3) + 1, torch.rand(4, 3) + 1
    assert torch.equal(ctx.loss(pred, target), masked_mae(pred, target))
    assert ctx.agree(True, "time_limit") == (True, "time_limit")


def test_launch_command_rebuilds_the_options_without_distributed():
    from diagsink.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(
        [
            "train",
            "--variant",
            "mask",
            "--seed",
            "3",
            "--device",
            "cpu",
            "--no-progress",
            "--distributed",
            "4",
        ]
    )
    train = parser._subparsers._group_actions[0].choices["train"]
    cmd = launch_command(train, args, args.distributed)
    assert cmd[:6] == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=4",
        "-m",
    ]
    rest = cmd[7:]
    assert rest[0] == "train" and "--distributed" not in rest and "--no-progress" in rest
    assert rest[rest.index("--variant") + 1] == "mask" and rest[rest.index("--seed") + 1] == "3"
    # parse the rebuilt command line again: the same options
    again = parser.parse_args(rest)
    assert (again.variant, again.seed, again.device, again.no_progress, again.distributed) == (
        "mask",
        3,
        "cpu",
        True,
        None,
    )
    # a bare --distributed means one process per GPU, or 2 on the CPU
    from diagsink.cli.launch import _default_nproc

    assert parser.parse_args(["train", "--variant", "none", "--distributed"]).distributed == "auto"
    assert _default_nproc("cpu") == 2


@pytest.mark.bad_input
def test_outside_torchrun_the_error_names_torchrun(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ConfigError, match="torchrun"):
        env_info()


# -- sparse graphs ------------------------------------------------------------------------------------------
@pytest.mark.skipif(
    not (DATA / "adj_mx.npy").exists(), reason="METR-LA not available (DIAGSINK_DATA)"
)
@pytest.mark.parametrize("adaptive", [True, False])
def test_sparse_graph_conv_equals_dense_on_metr_la(adaptive):
    import numpy as np

    from diagsink.data.adjacency import diffusion_supports
    from diagsink.model import TSModel
    from diagsink.sparse import SparseDiffusionGraphConv, density, sparsify, use_sparse

    supports = diffusion_supports(np.load(DATA / "adj_mx.npy"))
    assert not use_sparse(supports)  # 207 sensors: the dense path stays the default
    assert use_sparse(supports, min_nodes=100) and density(supports[0]) < 0.05
    torch.manual_seed(0)
    dense = TSModel(207, supports, d_model=8, n_heads=2, depth=2, adaptive=adaptive, dropout=0.0)
    torch.manual_seed(0)
    sparse = sparsify(
        TSModel(207, supports, d_model=8, n_heads=2, depth=2, adaptive=adaptive, dropout=0.0),
        force=True,
    )
    assert all(isinstance(b.gconv, SparseDiffusionGraphConv) for b in sparse.blocks)
    assert all(b.gconv.support_0.is_sparse for b in sparse.blocks)
    x = torch.randn(2, 12, 207, 2)
    x[..., 1] = torch.rand(2, 12, 207)
    y_dense, y_sparse = dense(x), sparse(x)
    torch.testing.assert_close(y_sparse, y_dense, rtol=1e-5, atol=1e-4)
    y_dense.square().mean().backward()
    y_sparse.square().mean().backward()
    for (name, p), q in zip(dense.named_parameters(), sparse.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(sparse.blocks[0].gconv.powers(), dense.blocks[0].gconv.powers())


def test_large_graphs_take_the_sparse_path_in_build_model():
    from diagsink.engine.prepare import prepare
    from diagsink.engine.train import build_model
    from diagsink.sparse import SparseDiffusionGraphConv

    cfg = override(load_config("quick"), {**TINY, "model.adaptive_adjacency": False})
    small = prepare(toy_data(n_steps=120, n_nodes=6), cfg)
    assert not isinstance(build_model(cfg, "none", small).blocks[0].gconv, SparseDiffusionGraphConv)
    large = prepare(toy_data(n_steps=60, n_nodes=1001), cfg)  # a ring: 2 links per sensor
    model = build_model(cfg, "none", large)
    assert isinstance(model.blocks[0].gconv, SparseDiffusionGraphConv)
    assert model(torch.zeros(1, 12, 1001, 2)).shape == (1, 12, 1001)


# -- exercises of book/scaling.ipynb ---------------------------------------------------------------------------
def test_scaling_exercise_checks_pass_the_reference_and_hint_at_typical_mistakes():
    from diagsink.exercises import check

    def rank_loss_ok(pred, target, count, world_size):
        return rank_loss(pred, target, count, world_size)

    def rank_loss_local(pred, target, count, world_size):  # the shard's own mean
        return masked_mae(pred, target)

    def rank_loss_no_w(pred, target, count, world_size):
        return rank_loss(pred, target, count, 1)

    assert check("ex-scaling-rank-loss", rank_loss_ok).passed
    local = check("ex-scaling-rank-loss", rank_loss_local)
    assert not local.passed and "global batch" in local.message
    no_w = check("ex-scaling-rank-loss", rank_loss_no_w)
    assert not no_w.passed and "world_size" in no_w.message

    def apply_ok(index, weight, x):
        return torch.zeros_like(x).index_add_(0, index[0], weight[:, None] * x[index[1]])

    def apply_transposed(index, weight, x):
        return torch.zeros_like(x).index_add_(0, index[1], weight[:, None] * x[index[0]])

    def apply_unweighted(index, weight, x):
        return torch.zeros_like(x).index_add_(0, index[0], x[index[1]])

    assert check("ex-scaling-sparse-apply", apply_ok).passed
    transposed = check("ex-scaling-sparse-apply", apply_transposed)
    assert not transposed.passed and "P^T x" in transposed.message
    unweighted = check("ex-scaling-sparse-apply", apply_unweighted)
    assert not unweighted.passed and "weight" in unweighted.message
