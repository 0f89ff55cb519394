"""The training engine, configs and the train/reproduce commands (on small synthetic data)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from diagsink.cli import main
from diagsink.data import toy_data
from diagsink.engine.config import PROTOCOLS, config_hash, load_config, override
from diagsink.engine.prepare import batch, prepare
from diagsink.engine.runs import reproduce, run_paths
from diagsink.engine.train import lr_at, predict, train_model, train_run
from diagsink.errors import ConfigError
from diagsink.metrics import masked_mae

from conftest import ROOT

TINY = {
    "model.d_model": 8,
    "model.n_heads": 2,
    "model.depth": 1,
    "model.node_embed_dim": 3,
    "train.epochs": 4,
    "train.batch_size": 16,
    "train.eval_batch_size": 64,
    "train.max_train_windows": 48,
    "train.warmup_epochs": 1,
    "train.lr": 5e-3,
}


def tiny(**extra):
    return override(load_config("quick"), {**TINY, **extra})


def test_packaged_protocols_load_and_differ():
    cfgs = {p: load_config(p) for p in PROTOCOLS}
    assert cfgs["paper"]["model"]["depth"] == 12 and cfgs["paper"]["model"]["d_model"] == 72
    assert cfgs["paper"]["train"]["epochs"] == 150 and cfgs["paper"]["train"]["lr"] == 2e-4
    assert cfgs["paper"]["regularizers"] == {"diag_p": 0.2, "diag_penalty": -0.1}
    for fair in ("slice", "book"):  # a fixed epoch budget, the same for every variant
        assert cfgs[fair]["train"]["time_limit_s"] is None
    assert cfgs["slice"]["train"]["patience"] < cfgs["slice"]["train"]["epochs"]
    assert len({config_hash(c) for c in cfgs.values()}) == len(PROTOCOLS) == 6
    assert cfgs["paper"]["model"]["graph_layer"] == "released"  # the paper's model
    for full in ("full29", "full29-released"):  # the schedule runs down: no early stop
        t = cfgs[full]["train"]
        assert t["patience"] >= t["epochs"] and t["min_lr"] < t["lr"] / 50
        assert cfgs[full]["data"]["speed_file"] == "metr-la_29sensors_allsteps.h5"


def test_the_twice_as_long_checks_differ_from_their_protocol_only_in_length():
    """``custom-full29-x2`` and ``custom-full29-released-x2``: twice the epochs (and patience)."""
    for base in ("full29", "full29-released"):
        long = load_config(ROOT / "diagsink" / "configs" / f"custom-{base}-x2.yaml")
        short = load_config(base)
        assert long["train"]["epochs"] == long["train"]["patience"] == 2 * short["train"]["epochs"]
        same = override(
            long,
            {
                "train.epochs": short["train"]["epochs"],
                "train.patience": short["train"]["patience"],
            },
        )
        assert {k: v for k, v in same.items() if k not in ("protocol", "description")} == {
            k: v for k, v in short.items() if k not in ("protocol", "description")
        }


def test_a_config_file_extends_a_shipped_protocol_section_by_section(tmp_path):
    """``extends: quick`` plus ``train: {epochs: 3}``: quick with one key of ``train`` changed."""
    path = tmp_path / "short.yaml"
    path.write_text("extends: quick\nprotocol: custom-short\ntrain:\n  epochs: 3\n")
    expected = override(load_config("quick"), {"train.epochs": 3})
    expected["protocol"] = "custom-short"
    assert load_config(path) == expected
    path.write_text("extends: quick\ntrain:\n  epochs: 3\n")  # still named quick: refused
    with pytest.raises(ConfigError, match="custom-quick"):
        load_config(path)
    path.write_text("extends: quick\nprotocol: custom-short\ntrain:\n  epoch: 3\n")
    with pytest.raises(ConfigError, match="train.epoch"):
        load_config(path)


def test_epoch_parts_use_every_window_once_per_pass():
    """``train.epoch_parts = k``: k consecutive epochs cover the training windows exactly once."""
    from types import SimpleNamespace

    from diagsink.engine.epoch import epoch_windows

    prepared = SimpleNamespace(train=torch.arange(100, 201))  # 101 window starts
    one = tiny()
    three = override(one, {"train.epoch_parts": 3, "train.max_train_windows": None})
    for p in range(2):  # two passes
        seen = torch.cat([epoch_windows(prepared, three, 0, 3 * p + k) for k in range(3)])
        assert sorted(seen.tolist()) == list(range(100, 201))
    whole = override(one, {"train.max_train_windows": None})
    assert sorted(epoch_windows(prepared, whole, 0, 4).tolist()) == list(range(100, 201))
    # k = 1 draws exactly what the engine drew before the key existed (same generator seed)
    g = torch.Generator().manual_seed(0 * 100_003 + 4)
    assert torch.equal(
        epoch_windows(prepared, whole, 0, 4), prepared.train[torch.randperm(101, generator=g)]
    )


def test_misspelt_key_names_key_and_allowed_ones(tmp_path):
    text = (load_config.__module__ and None) or None  # noqa: F841
    import yaml

    cfg = load_config("quick")
    cfg["train"]["epoch"] = cfg["train"].pop("epochs")
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(ConfigError, match=r"train\.epoch.*allowed keys.*epochs"):
        load_config(path)
    with pytest.raises(ConfigError, match="paper, book, quick, slice"):
        load_config("papr")
    with pytest.raises(ConfigError, match="allowed here"):
        override(load_config("quick"), {"train.lr_max": 1.0})


def test_lr_schedule_warms_up_then_decays_to_min():
    cfg = load_config("paper")
    lrs = [lr_at(e, cfg) for e in range(cfg["train"]["epochs"] + 1)]
    assert lrs[0] == pytest.approx(2e-4 / 5) and lrs[4] == pytest.approx(2e-4)
    assert all(a >= b for a, b in zip(lrs[4:], lrs[5:]))
    assert lrs[-1] == pytest.approx(1e-6)


def test_best_validation_weights_are_restored_before_testing(tmp_path):
    data = toy_data()
    cfg = tiny(**{"train.epochs": 5, "train.lr": 3e-2})
    model, art = train_model(cfg, "none", 0, data=data, device="cpu", write=False, progress=False)
    vals = [h["val_mae"] for h in art["history"]]
    assert art["best_epoch"] == min(range(len(vals)), key=vals.__getitem__)
    assert art["best_epoch"] < len(vals) - 1  # else restoring would change nothing
    prepared = prepare(data, cfg)
    again = float(masked_mae(*predict(model, prepared, prepared.val, cfg)))
    assert again == pytest.approx(vals[art["best_epoch"]], rel=1e-5)


def test_the_run_stops_and_restores_as_its_early_stopping_rule_decides():
    """The run's best epoch and its stop are those of EarlyStopping replayed on its validation MAEs."""
    from diagsink.engine.early_stopping import EarlyStopping

    cfg = tiny(**{"train.epochs": 6, "train.lr": 3e-2, "train.patience": 2})
    art = train_run(cfg, "none", 1, data=toy_data(), device="cpu", write=False, progress=False)
    rule = EarlyStopping(patience=2, min_delta=cfg["train"]["min_delta"])
    for entry in art["history"]:
        assert not rule.should_stop  # the run went on only while the rule allowed it
        rule.step(entry["val_mae"], entry["epoch"])
    assert art["stopped"] == "early_stopping" and rule.should_stop
    assert art["best_epoch"] == rule.best_epoch and art["epochs_run"] == rule.best_epoch + 3


def test_forecasts_are_float32_even_under_autocast():
    """Metrics must not depend on the training precision: bf16 autocast moved a test MAE 3 %."""
    data = toy_data()
    cfg = tiny()
    model, _ = train_model(cfg, "none", 0, data=data, device="cpu", write=False, progress=False)
    prepared = prepare(data, cfg)
    plain, _ = predict(model, prepared, prepared.val, cfg)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside, _ = predict(model, prepared, prepared.val, cfg)
        x, _ = batch(
            prepared, prepared.val[: len(plain)], cfg["model"]["t_in"], cfg["model"]["t_out"]
        )
        bf16 = model(x).float()
    assert inside.dtype == torch.float32
    torch.testing.assert_close(inside, plain, rtol=0, atol=0)
    assert (bf16 - plain).abs().max() > 1e-3  # the precision predict() shields against


def test_runs_are_deterministic_per_seed():
    data = toy_data()
    cfg = tiny(**{"train.epochs": 2})
    a = train_run(cfg, "dropout", 3, data=data, device="cpu", write=False, progress=False)
    b = train_run(cfg, "dropout", 3, data=data, device="cpu", write=False, progress=False)
    c = train_run(cfg, "dropout", 4, data=data, device="cpu", write=False, progress=False)
    assert a["metrics"] == b["metrics"]
    assert a["metrics"] != c["metrics"]


SCRIPT = textwrap.dedent(
    """
    import sys, time, torch
    torch.set_num_threads(1)
    from diagsink.engine.config import load_config, override
    from diagsink.data import toy_data
    from diagsink.engine.train import train_run
    import diagsink.engine.train as T
    cfg = override(load_config("quick"), {tiny!r})
    slow = float(sys.argv[2])
    if slow:  # make each epoch take a while so the parent can kill us mid-run
        orig = T.predict
        def predict(*a, **k):
            time.sleep(slow)
            return orig(*a, **k)
        T.predict = predict
    art = train_run(cfg, "penalty", 0, data=toy_data(), device="cpu", out_dir=sys.argv[1], progress=False)
    print("MAE@mean", repr(art["metrics"]["MAE@mean"]))
    """
)


@pytest.mark.slow
def test_kill_minus_9_then_resume_gives_the_same_metrics(tmp_path):
    cfg_changes = {**TINY, "train.epochs": 6}
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.replace("{tiny!r}", repr(cfg_changes)))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # reference: uninterrupted
    ref = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ref"), "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert ref.returncode == 0, ref.stderr
    # interrupted: kill -9 once a checkpoint of epoch >= 2 exists
    out = tmp_path / "crash"
    ckpt = run_paths(out, "quick", "penalty", 0)["checkpoint"]
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out), "0.4"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.time() + 60
    epoch = 0
    while time.time() < deadline and proc.poll() is None:
        if ckpt.exists():
            try:
                epoch = torch.load(ckpt, weights_only=True)["epoch"]
            except Exception:  # noqa: BLE001 - file replaced while reading
                epoch = 0
            if epoch >= 2:
                break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed; make it slower"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not run_paths(out, "quick", "penalty", 0)["json"].exists()
    resumed = subprocess.run(
        [sys.executable, str(script), str(out), "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert resumed.returncode == 0, resumed.stderr
    art = json.loads(run_paths(out, "quick", "penalty", 0)["json"].read_text())
    assert art["resumed_from_epoch"] is not None and art["resumed_from_epoch"] >= 2
    assert art["epochs_run"] == 6
    ref_art = json.loads(run_paths(tmp_path / "ref", "quick", "penalty", 0)["json"].read_text())
    for key, value in ref_art["metrics"].items():
        assert math.isclose(art["metrics"][key], value, rel_tol=1e-4), key
    assert not ckpt.exists()  # the checkpoint is removed once the artifact is written


def test_reproduce_skips_finished_runs(tmp_path):
    data = toy_data()
    cfg = tiny(**{"train.epochs": 2})
    paths = reproduce(
        cfg, 1, variants=("none", "mask"), device="cpu", out_dir=tmp_path, data=data, progress=False
    )
    assert [p.name for p in paths] == ["none_seed0.json", "mask_seed0.json"]
    stamps = [p.stat().st_mtime_ns for p in paths]
    again = reproduce(
        cfg, 1, variants=("none", "mask"), device="cpu", out_dir=tmp_path, data=data, progress=False
    )
    assert again == paths and [p.stat().st_mtime_ns for p in paths] == stamps


def test_a_finished_run_removes_temporaries_left_by_a_killed_writer(tmp_path):
    """kill -9 during an atomic write leaves ``.<name>.<random>.tmp``; the run that finishes the job removes it."""
    cfg = tiny(**{"train.epochs": 2})
    paths = run_paths(tmp_path, cfg["protocol"], "none", 0)
    stale = [
        paths["checkpoint"].parent / f".{paths['checkpoint'].name}.k9x2.tmp",
        paths["json"].parent / f".{paths['json'].name}.a1b2.tmp",
    ]
    other = paths["json"].parent / ".mask_seed0.json.c3d4.tmp"  # another run's: not ours to delete
    for p in [*stale, other]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"half a checkpoint")
    reproduce(
        cfg, 1, variants=("none",), device="cpu", out_dir=tmp_path, data=toy_data(), progress=False
    )
    assert paths["json"].exists()
    assert not any(p.exists() for p in stale)
    assert not paths["checkpoint"].parent.exists()  # the empty .checkpoints folder is gone as well
    assert other.exists()
    # killed after writing the artifact but before deleting the checkpoint: the skip tidies up
    paths["checkpoint"].parent.mkdir()
    paths["checkpoint"].write_bytes(b"the last epoch")
    reproduce(
        cfg, 1, variants=("none",), device="cpu", out_dir=tmp_path, data=toy_data(), progress=False
    )
    assert not paths["checkpoint"].parent.exists()


def test_reproduce_with_another_config_keeps_the_old_result(tmp_path):
    data = toy_data()
    first = reproduce(
        tiny(**{"train.epochs": 2}),
        1,
        variants=("none",),
        device="cpu",
        out_dir=tmp_path,
        data=data,
        progress=False,
    )[0]
    old_text = first.read_text()
    reproduce(
        tiny(**{"train.epochs": 3}),
        1,
        variants=("none",),
        device="cpu",
        out_dir=tmp_path,
        data=data,
        progress=False,
    )
    kept = sorted((first.parent / "superseded").glob("none_seed0.*.json"))
    assert len(kept) == 1 and kept[0].read_text() == old_text  # the finished run is not lost
    assert first.read_text() != old_text  # and the new configuration's run replaced it


def test_output_paths_cannot_escape(tmp_path):
    with pytest.raises(ConfigError, match="outside"):
        run_paths(tmp_path, "../elsewhere", "none", 0)
    with pytest.raises(ConfigError):
        run_paths(tmp_path, "quick", "../../none", 0)
    p = run_paths(tmp_path, "quick", "none", 2)
    assert all(v.resolve().is_relative_to(tmp_path.resolve()) for v in p.values())


def test_cli_reports_bad_input(capsys):
    assert main(["reproduce", "--protocol", "nope", "--seeds", "1"]) == 2
    assert "paper, book, quick" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["train", "--variant", "diag-mask"])
    assert (
        main(["reproduce", "--protocol", "quick", "--seeds", "1", "--variants", "none,masked"]) == 2
    )
    assert "masked" in capsys.readouterr().err


def test_time_limit_stops_before_an_epoch_that_would_overrun():
    cfg = tiny(**{"train.epochs": 4, "train.time_limit_s": 1e-6})
    art = train_run(cfg, "none", 0, data=toy_data(), device="cpu", write=False, progress=False)
    assert art["stopped"] == "time_limit" and art["epochs_run"] == 1


def test_git_commit_outside_a_checkout_uses_the_recorded_commit(monkeypatch):
    """A copy of the tree without .git (a remote GPU machine) records the commit its copier passed, marked as such."""
    import diagsink.engine.provenance as tr

    def no_git(*args, **kwargs):
        raise FileNotFoundError("git")

    monkeypatch.setattr(tr.subprocess, "run", no_git)
    tr.git_commit.cache_clear()
    try:
        monkeypatch.delenv("DIAGSINK_GIT_COMMIT", raising=False)
        assert tr.git_commit() == "unknown"
        tr.git_commit.cache_clear()
        monkeypatch.setenv("DIAGSINK_GIT_COMMIT", "0123abc")
        assert (
            tr.git_commit()
            == "0123abc" + tr.COPIED_TREE_SUFFIX
            == "0123abc (DIAGSINK_GIT_COMMIT, no .git)"
        )
    finally:
        tr.git_commit.cache_clear()
    monkeypatch.undo()
    assert tr.git_commit() != "unknown"  # in this checkout git answers again


def test_missing_inputs_enter_as_a_reading_or_as_the_mean():
    data = toy_data()
    cfg = tiny()
    raw = prepare(data, cfg)
    mean = prepare(data, override(cfg, {"data.missing_inputs": "mean"}))
    missing = raw.speed == 0
    assert missing.any() and (raw.series[..., 0][missing] < -3).all()  # 0 mph: far below the mean
    assert (mean.series[..., 0][missing] == 0).all()  # the training mean after scaling
    assert torch.equal(mean.series[..., 0][~missing], raw.series[..., 0][~missing])
    assert torch.equal(mean.speed, raw.speed)  # the targets (and their mask) do not change
    assert config_hash(override(cfg, {"data.missing_inputs": "as_reading"})) == config_hash(cfg)
    with pytest.raises(ConfigError, match="missing_inputs.*as_reading, mean"):
        override(cfg, {"data.missing_inputs": "zero"})
