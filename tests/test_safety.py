"""Safety: no code runs from data files, no shell, no writes outside the chosen folder.

Static checks read the source of ``diagsink/``, ``tools/``, ``benchmarks/`` and the code cells
of the chapters; dynamic checks feed crafted files to the loaders. Related tests elsewhere:
the adjacency pickle's restricted unpickler (``test_data.py::test_unexpected_pickle_global_is_refused``),
downloads verified before they get their final name (``test_download.py``: wrong size and shape,
corrupt file, interrupted transfer, graph file with wrong content), ``run_paths`` refusing escaping
names (``test_train.py::test_output_paths_cannot_escape``), the course export writing only inside
``--out`` (``test_course.py``).
"""

from __future__ import annotations

import ast
import json
import os
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tables
import torch
import yaml

from diagsink import data as D
from diagsink.data import toy_data
from diagsink.engine.config import PROTOCOLS, load_config, validate_config
from diagsink.engine.runs import run_paths
from diagsink.engine.train import train_run
from diagsink.errors import ConfigError, DataError

from conftest import ROOT

SOURCES = sorted(p for d in ("diagsink", "tools", "benchmarks") for p in (ROOT / d).rglob("*.py"))
SCRIPTS = sorted(p for p in (ROOT / "tools").iterdir() if p.is_file() and p.suffix != ".py")
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))


def _python_units() -> list[tuple[str, ast.AST]]:
    """(name, parsed tree) for every package/tool/benchmark module and every chapter code cell."""
    units = [(str(p.relative_to(ROOT)), ast.parse(p.read_text(encoding="utf-8"))) for p in SOURCES]
    for nb in CHAPTERS:
        for i, cell in enumerate(json.loads(nb.read_text(encoding="utf-8"))["cells"]):
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            src = "\n".join(
                "" if line.lstrip().startswith(("%", "!")) else line for line in src.splitlines()
            )
            units.append((f"{nb.relative_to(ROOT)} cell {i}", ast.parse(src)))
    return units


UNITS = _python_units()


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def _calls():
    for name, tree in UNITS:
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                yield name, node, _dotted(node.func)


def test_sources_were_found():
    assert len(SOURCES) > 20 and any(p.name == "data.py" for p in SOURCES) and CHAPTERS


def test_no_shell():
    bad = [
        f"{name}:{node.lineno} {func}"
        for name, node, func in _calls()
        if any(
            k.arg == "shell" and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in node.keywords
        )
        or func in ("os.system", "os.popen", "subprocess.getoutput", "subprocess.getstatusoutput")
    ]
    bad += [
        f"{p.relative_to(ROOT)}: shell=True"
        for p in SCRIPTS
        if "shell=True" in p.read_text(encoding="utf-8")
    ]
    assert not bad, f"commands must be argument lists, never a shell: {bad}"


UNSAFE_LOADERS = {
    "pickle.load",
    "pickle.loads",
    "marshal.load",
    "marshal.loads",
    "pd.read_pickle",
    "pandas.read_pickle",
    "yaml.load",
    "yaml.unsafe_load",
    "yaml.full_load",
    "dill.load",
    "joblib.load",
    "eval",
    "exec",
}


def test_no_unrestricted_unpickling_or_eval():
    bad = [
        f"{name}:{node.lineno} {func}" for name, node, func in _calls() if func in UNSAFE_LOADERS
    ]
    # ``from pickle import load`` would hide the call from the check above
    for name, tree in UNITS:
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in (
                "pickle",
                "marshal",
                "dill",
                "joblib",
            ):
                bad += [
                    f"{name}:{node.lineno} from {node.module} import {a.name}"
                    for a in node.names
                    if a.name in ("load", "loads", "Unpickler")
                ]
    for p in SCRIPTS:
        bad += [
            f"{p.relative_to(ROOT)}: {m}"
            for m in re.findall(r"pickle\.loads?\(", p.read_text(encoding="utf-8"))
        ]
    assert not bad, f"unrestricted loaders: {bad}"


def test_every_unpickler_restricts_globals():
    found = []
    for name, tree in UNITS:
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and any(
                _dotted(b).endswith("Unpickler") for b in node.bases
            ):
                methods = {n.name for n in node.body if isinstance(n, ast.FunctionDef)}
                assert "find_class" in methods, (
                    f"{name}: {node.name} subclasses an Unpickler without find_class"
                )
                found.append(node.name)
    # the adjacency pickle's and the HDF attributes' unpicklers
    assert {"RestrictedUnpickler", "_HDFAttributeUnpickler"} <= set(found)
    bare = [
        f"{name}:{node.lineno}"
        for name, node, func in _calls()
        if func in ("pickle.Unpickler", "Unpickler")
    ]
    assert not bare, f"a bare pickle.Unpickler admits every global: {bare}"


def test_every_torch_load_is_weights_only():
    loads = [(name, node) for name, node, func in _calls() if func == "torch.load"]
    bad = [
        f"{name}:{node.lineno}"
        for name, node in loads
        if not any(
            k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in node.keywords
        )
    ]
    assert not bad, f"torch.load without weights_only=True: {bad}"
    np_loads = [
        f"{name}:{node.lineno}"
        for name, node, func in _calls()
        if func in ("np.load", "numpy.load")
        and any(
            k.arg == "allow_pickle"
            and not (isinstance(k.value, ast.Constant) and k.value.value is False)
            for k in node.keywords
        )
    ]
    assert not np_loads, f"np.load with allow_pickle: {np_loads}"


# ---------------------------------------------------------------- dynamic: crafted files run no code
class _Evil:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


IDS = ["301", "302", "303", "304"]


def _folder(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "graph_sensor_ids.txt").write_text(",".join(IDS))
    pd.DataFrame(
        {"index": range(4), "sensor_id": IDS, "latitude": 34.0, "longitude": -118.3}
    ).to_csv(root / "graph_sensor_locations.csv", index=False)
    (root / "adj_mx.pkl").write_bytes(
        pickle.dumps(
            (IDS, {s: i for i, s in enumerate(IDS)}, np.eye(4, dtype=np.float32)), protocol=4
        )
    )
    index = pd.date_range("2012-03-01", periods=60, freq="5min")
    pd.DataFrame(np.full((60, 4), 55.0), index=index, columns=IDS).to_hdf(
        root / "metr-la.h5", key="df"
    )
    return root


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "where", ["group attribute", "index attribute", "object array", "table format"]
)
def test_crafted_hdf_file_runs_no_code(tmp_path, where):
    """PyTables unpickles HDF attributes and object arrays on access; the loader admits only pandas' date offsets."""
    root = _folder(tmp_path / "data")
    marker = tmp_path / "code-ran"
    h5path = root / "metr-la.h5"
    if where == "table format":
        frame = pd.read_hdf(h5path, "df")
        h5path.unlink()
        frame.to_hdf(h5path, key="df", format="table")
    with warnings.catch_warnings(), tables.open_file(h5path, "a") as h5:
        warnings.simplefilter("ignore")
        if where in ("group attribute", "table format"):
            h5.root.df._v_attrs.note = _Evil(str(marker))
        elif where == "index attribute":
            h5.root.df.axis1._v_attrs.note = _Evil(str(marker))
        else:  # replace the column names by a pickled-object array (what pandas writes for object columns)
            h5.remove_node("/df/axis0")
            vl = h5.create_vlarray("/df", "axis0", tables.ObjectAtom())
            vl.append(_Evil(str(marker)))
    with pytest.raises(DataError) as info:
        D.load_metr_la(root)
    assert not marker.exists(), "a pickled object in the HDF file ran code"
    message = str(info.value)
    assert (
        "mkdir" in message and "refused" in message and "diagsink data download --force" in message
    )


@pytest.mark.bad_input
def test_object_dtype_speed_file_is_refused_with_the_fix(tmp_path):
    """pandas stores an object-dtype frame as pickled objects: refused too, and the message says how to save numbers."""
    root = _folder(tmp_path / "data")
    index = pd.date_range("2012-03-01", periods=60, freq="5min")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pd.DataFrame([["55"] * 4] * 60, index=index, columns=IDS).to_hdf(
            root / "metr-la.h5", key="df"
        )
    with pytest.raises(
        DataError, match=r"pickled Python objects.*object-dtype.*Fix: save the speeds as float64"
    ):
        D.load_metr_la(root)


def test_plain_hdf_files_still_load(tmp_path):
    """The restriction admits what pandas really writes: fixed and table format, with the index frequency."""
    root = _folder(tmp_path / "data")
    assert D.load_metr_la(root).speed.shape == (60, 4)
    frame = pd.read_hdf(root / "metr-la.h5", "df")
    assert frame.index.freq is not None  # a pickled pandas offset was admitted
    (root / "metr-la.h5").unlink()
    frame.to_hdf(root / "metr-la.h5", key="df", format="table")
    assert D.load_metr_la(root).speed.shape == (60, 4)
    import tables.atom
    import tables.attributeset

    # restored afterwards
    assert tables.atom.pickle is pickle and tables.attributeset.pickle is pickle


@pytest.mark.bad_input
@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_crafted_checkpoint_runs_no_code(tmp_path):
    """A checkpoint is read with ``weights_only=True``: a pickled object is refused and the run starts over."""
    cfg = load_config("quick")
    for key, value in {"d_model": 8, "n_heads": 2, "depth": 1, "node_embed_dim": 3}.items():
        cfg["model"][key] = value
    cfg["train"].update(epochs=1, warmup_epochs=0, max_train_windows=16)
    marker = tmp_path / "code-ran"
    ckpt = run_paths(tmp_path / "out", "quick", "none", 0)["checkpoint"]
    ckpt.parent.mkdir(parents=True)
    torch.save({"epoch": 0, "model": _Evil(str(marker))}, ckpt)
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        art = train_run(
            cfg,
            "none",
            0,
            data=toy_data(120, 3),
            device="cpu",
            out_dir=tmp_path / "out",
            progress=False,
        )
    assert not marker.exists()
    assert art["resumed_from_epoch"] is None and art["epochs_run"] == 1


# ---------------------------------------------------------------- paths stay inside the output folder
@pytest.mark.bad_input
@pytest.mark.parametrize(
    "protocol",
    [
        "../outside",
        "custom-../../outside",
        "/tmp/custom-abs",
        "custom/sub",
        "custom\\sub",
        "",
        ".hidden",
        "custom-\x00",
    ],
)
def test_config_protocol_names_cannot_leave_the_results_folder(protocol):
    cfg = load_config("quick")
    cfg["protocol"] = protocol
    with pytest.raises(ConfigError, match="plain name"):
        validate_config(cfg)


@pytest.mark.bad_input
@pytest.mark.parametrize(
    "protocol, variant, seed",
    [
        ("/etc", "none", 0),
        ("..", "none", 0),
        ("quick", "/tmp/none", 0),
        ("quick", "none", "../1"),
        ("quick", "none", -1),
    ],
)
def test_run_paths_refuse_absolute_and_parent_names(tmp_path, protocol, variant, seed):
    with pytest.raises(ConfigError) as info:
        run_paths(tmp_path, protocol, variant, seed)
    assert any(w in str(info.value) for w in ("outside", "not known", "must be an integer"))


def test_symlinked_protocol_folder_pointing_outside_is_refused(tmp_path):
    """A results sub-folder that is a link to elsewhere would make writes land outside ``--out``."""
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir(), elsewhere.mkdir()
    (out / "quick").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(ConfigError, match="outside"):
        run_paths(out, "quick", "none", 0)


def _plain(name: str) -> dict:
    """A shipped protocol read with ``yaml.safe_load`` alone (``extends`` merged by hand)."""
    raw = yaml.safe_load((ROOT / "diagsink" / "configs" / f"{name}.yaml").read_text())
    if "extends" not in raw:
        return raw
    out = _plain(raw.pop("extends"))
    for key, value in raw.items():
        out[key] = {**out[key], **value} if isinstance(value, dict) else value
    return out


def test_packaged_configs_load_with_the_safe_yaml_loader():
    for name in PROTOCOLS:
        text = (ROOT / "diagsink" / "configs" / f"{name}.yaml").read_text()
        assert "!!python" not in text
        assert _plain(name) == load_config(name)


# ---------------------------------------------------------------- adjacency files and protocol files
@pytest.mark.bad_input
@pytest.mark.parametrize("content", ["object", "text", "garbage", "npz"])
def test_an_adjacency_npy_that_is_not_numbers_is_one_error_naming_the_file(tmp_path, content):
    """``adj_mx.npy`` holding objects (a pickle), text, random bytes or an archive: one DataError
    naming the file and the fix, and no pickle is ever loaded."""
    from diagsink.data.files import read_adjacency

    path = tmp_path / "adj_mx.npy"
    if content == "object":
        np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    elif content == "text":
        np.save(path, np.array([["1", "2"], ["3", "4"]]))
    elif content == "garbage":
        path.write_bytes(b"\x93NUMPY not really" + bytes(range(200)))
    else:
        with open(path, "wb") as handle:
            np.savez(handle, adj=np.eye(2))
    with pytest.raises(DataError) as info:
        read_adjacency(tmp_path, ["1", "2"])
    message = str(info.value)
    assert str(path) in message and "Fix" in message and "\n" not in message


def test_a_numeric_adjacency_npy_still_loads(tmp_path):
    from diagsink.data.files import read_adjacency

    np.save(tmp_path / "adj_mx.npy", np.eye(3, dtype=np.float64))
    adj = read_adjacency(tmp_path, ["1", "2", "3"])
    assert adj.dtype == np.float32 and np.array_equal(adj, np.eye(3))


@pytest.mark.bad_input
def test_protocol_files_go_through_the_safe_loader_even_with_the_duplicate_key_check(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "evil.yaml"
    path.write_text(f"protocol: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)
    assert not marker.exists()
