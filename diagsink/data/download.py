"""Download METR-LA from public mirrors, check it, and store it in the standard layout.

Explained in the chapter ``book/metr_la.ipynb`` ("METR-LA", section "Getting the data");
run it with ``diagsink data download [--root DIR]``.

* The DCRNN graph files come from DCRNN's GitHub repository (:data:`GRAPH_URL`) and are checked
  against their git blob ids (:data:`GRAPH_BLOBS`, the ``git hash-object`` of each file).
* The speed matrix ``metr-la.h5`` is tried from :data:`SPEED_MIRRORS` in order: first mirrors
  of the file itself, then zip archives (torch-spatiotemporal's) from which ``metr_la.h5`` is
  extracted. Google Drive and Baidu Yun (DCRNN's own links) cannot be fetched without a
  browser; the offline error names them.
* Every file is written to ``<name>.part``, checked, and only then renamed (``os.replace``)
  to its final name, so an interrupted or bad transfer never leaves a half file behind.
* The check that decides is *structural*: shape 34272 x 207, a contiguous 5-minute index from
  2012-03-01 00:00 to 2012-06-27 23:55, columns in ``graph_sensor_ids.txt`` order, no NaN or
  negative speeds. The expected size and sha256 (:data:`EXPECTED_SIZE`, :data:`EXPECTED_SHA256`)
  come from ONE third-party upload (a Git LFS pointer in wmmxk/MTGNNData) and are unverified,
  so a mismatch is only a warning when the structure is right.
* The sha256 of what was stored is recorded in ``<root>/manifest.json``.

All URLs and expected values are module-level constants (tests point them at a local server).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import urllib.error
import urllib.request
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from tqdm import tqdm

from .._io import atomic_write_text, sha256_file
from ..errors import DataError
from . import files as D

__all__ = [
    "Mirror",
    "download_metr_la",
    "download_graph_files",
    "download_speed",
    "fetch",
    "git_blob_sha1",
    "read_manifest",
    "offline_instructions",
    "GRAPH_URL",
    "GRAPH_BLOBS",
    "SPEED_MIRRORS",
    "EXPECTED_SIZE",
    "EXPECTED_SHA256",
    "MANIFEST",
    "TIMEOUT",
]


@dataclass(frozen=True)
class Mirror:
    """One place the speed file can be fetched from.

    Attributes:
        url: the address.
        kind: ``"h5"`` (the file itself) or ``"zip"`` (an archive holding ``member``).
        member: for zips, the base name of the h5 inside (``metr_la.h5`` in tsl's archive).
        note: where the mirror is used (for messages).
    """

    url: str
    kind: str = "h5"
    member: str = ""
    note: str = ""


#: DCRNN's graph files; ``{name}`` is replaced by the file name.
GRAPH_URL = "https://raw.githubusercontent.com/liyaguang/DCRNN/master/data/sensor_graph/{name}"
#: git blob ids (``git hash-object``) of DCRNN's graph files; ``distances_la_2012.csv`` is optional.
GRAPH_BLOBS: dict[str, str] = {
    "graph_sensor_ids.txt": "e2df0228c6ae79e5016b0dbbce52f7e7879bf2f7",
    "graph_sensor_locations.csv": "d0bb95872860d274678d2dff4ab52ce51f74b706",
    "adj_mx.pkl": "a15a5904a83e7f13fe94d32fcd45c00f163ffd97",
}
OPTIONAL_GRAPH_BLOBS: dict[str, str] = {
    "distances_la_2012.csv": "759d2bc751c89b91fd63dc1fc8ceba904a85b1c2",
}
#: Mirrors of the speed matrix, tried in this order.
SPEED_MIRRORS: list[Mirror] = [
    Mirror(
        "https://huggingface.co/datasets/MintBruce/SkyTraffic/resolve/main/metr-la.h5",
        note="Hugging Face MintBruce/SkyTraffic",
    ),
    Mirror(
        "https://zenodo.org/records/5724362/files/metr-la.h5?download=1",
        note="Zenodo record 5724362",
    ),
    Mirror(
        "https://drive.switch.ch/index.php/s/Z8cKHAVyiDqkzaG/download",
        kind="zip",
        member="metr_la.h5",
        note="torch-spatiotemporal (tsl) MetrLA.url",
    ),
    Mirror(
        "https://huggingface.co/datasets/TorchSpatiotemporal/ProcessedDatasets/resolve/v1.0.0/traffic/metr_la.zip",
        kind="zip",
        member="metr_la.h5",
        note="Hugging Face TorchSpatiotemporal",
    ),
]
#: Size in bytes of metr-la.h5 according to ONE third-party Git LFS pointer (unverified, so a mismatch only warns).
EXPECTED_SIZE = 57_038_056
#: sha256 of metr-la.h5 according to the same pointer (unverified, so a mismatch only warns).
EXPECTED_SHA256 = "64784b76d6fb8ec9bff4b6decafb354da2bb37840468fdccee5044e511277c05"
MANIFEST = "manifest.json"
TIMEOUT = 60.0  # seconds without data before a mirror counts as dead
USER_AGENT = "diagsink (https://github.com/diagsink/diagsink)"
CHUNK = 1 << 20


def git_blob_sha1(data: bytes) -> str:
    """``git hash-object`` of ``data``: sha1 of ``b"blob <size>\\0" + data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def offline_instructions(root: Path) -> str:
    """Which files to place where when nothing can be downloaded."""
    return (
        f"Place these files in {root} by hand: metr-la.h5 (57 MB; DCRNN's Google Drive folder "
        "https://drive.google.com/open?id=10FOTa6HXPqX8Pf5WRoRwcFnW9BrNZEIX or Baidu Yun "
        "https://pan.baidu.com/s/14Yy9isAIZYdU__OYEQGa_g, which need a browser), and "
        + ", ".join(GRAPH_BLOBS)
        + " from https://github.com/liyaguang/DCRNN/tree/master/data/sensor_graph; "
        "or set DIAGSINK_DATA to a folder that holds them. Then run `diagsink data verify`."
    )


# --------------------------------------------------------------------------------------------
# Transfer
# --------------------------------------------------------------------------------------------
def fetch(url: str, dest: Path, *, progress: bool = True, desc: str | None = None) -> int:
    """Stream ``url`` into ``dest`` (the caller's ``.part`` file); return the number of bytes.

    Raises:
        DataError: HTTP errors, dead servers, and transfers that end before the announced
            ``Content-Length`` (an interrupted download). ``dest`` is removed on failure.
    """
    request = urllib.request.Request(url, headers={"User-Agent": USER_AGENT})
    received = 0
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with (
                open(dest, "wb") as out,
                tqdm(
                    total=total,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=desc or dest.name,
                    disable=not progress,
                    leave=False,
                ) as bar,
            ):
                while True:
                    block = response.read(CHUNK)
                    if not block:
                        break
                    out.write(block)
                    received += len(block)
                    bar.update(len(block))
                out.flush()
                os.fsync(out.fileno())
        if total is not None and received != total:
            raise DataError(
                f"the transfer from {url} stopped after {received} of {total} bytes (interrupted)"
            )
    except DataError:
        dest.unlink(missing_ok=True)
        raise
    except Exception as exc:  # URLError, HTTPError, IncompleteRead, timeouts, resets
        dest.unlink(missing_ok=True)
        reason = getattr(exc, "reason", None) or exc
        raise DataError(f"{url}: {type(exc).__name__}: {reason} (after {received} bytes)") from exc
    return received


# --------------------------------------------------------------------------------------------
# Manifest
# --------------------------------------------------------------------------------------------
def read_manifest(root: str | Path) -> dict:
    """The ``manifest.json`` of a data folder (``{"files": {}}`` when there is none)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        return {"files": {}}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"files": {}}
    return data if isinstance(data.get("files"), dict) else {"files": {}}


def _record(root: Path, name: str, entry: dict) -> None:
    manifest = read_manifest(root)
    manifest["files"][name] = entry
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")


def _entry(path: Path, url: str, checks: str, warns: list[str]) -> dict:
    return {
        "sha256": sha256_file(path),
        "size": path.stat().st_size,
        "source": url,
        "checks": checks,
        "warnings": warns,
        "downloaded_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# --------------------------------------------------------------------------------------------
# Graph files
# --------------------------------------------------------------------------------------------
def _check_graph_file(path: Path, name: str) -> None:
    try:
        _check_graph_structure(path, name)
    except DataError:
        raise
    except Exception as exc:  # unreadable CSV, binary garbage, ...
        raise DataError(f"{name} is malformed ({type(exc).__name__}: {exc})") from exc


def _check_graph_structure(path: Path, name: str) -> None:
    if name == "graph_sensor_ids.txt":
        ids = D.read_sensor_ids(path)
        if len(ids) != D.N_SENSORS:
            raise DataError(f"{name} lists {len(ids)} sensors, expected {D.N_SENSORS}")
    elif name == "graph_sensor_locations.csv":
        df = pd.read_csv(path)
        if not {"sensor_id", "latitude", "longitude"} <= set(df.columns):
            raise DataError(f"{name} lacks the columns sensor_id, latitude, longitude")
    elif name == "adj_mx.pkl":
        D.load_adj_pickle(path)


def download_graph_files(
    root: str | Path, *, progress: bool = True, force: bool = False, optional: bool = True
) -> list[str]:
    """Fetch DCRNN's graph files into ``root``; return the warnings (empty when all is as expected).

    A file whose git blob id differs from :data:`GRAPH_BLOBS` is kept only if it passes the
    structural check (and a warning says so). ``optional`` also tries ``distances_la_2012.csv``
    (needed only to rebuild the adjacency); failing to get it is a warning.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    warns: list[str] = []
    wanted = dict(GRAPH_BLOBS)
    if optional:
        wanted.update(OPTIONAL_GRAPH_BLOBS)
    for name, blob in wanted.items():
        final = root / name
        if final.is_file() and not force:
            continue
        part = root / f"{name}.part"
        url = GRAPH_URL.format(name=name)
        try:
            fetch(url, part, progress=progress, desc=name)
            got = git_blob_sha1(part.read_bytes())
            file_warns = []
            if got != blob:
                _check_graph_file(part, name)  # raises if the content is not usable
                file_warns.append(
                    f"{name}: git blob {got} differs from DCRNN's {blob}, but the file is well-formed"
                )
            os.replace(part, final)
        except DataError as exc:
            if name in OPTIONAL_GRAPH_BLOBS:
                warns.append(
                    f"optional {name} not downloaded ({exc}); only needed to rebuild the adjacency"
                )
                continue
            raise DataError(
                f"could not download {name}: {exc}. {offline_instructions(root)}"
            ) from exc
        finally:
            part.unlink(missing_ok=True)
        warns.extend(file_warns)
        _record(
            root,
            name,
            _entry(final, url, "git blob id" if not file_warns else "structure", file_warns),
        )
    return warns


# --------------------------------------------------------------------------------------------
# Speed matrix
# --------------------------------------------------------------------------------------------
def _extract(zip_path: Path, member: str, dest: Path) -> None:
    try:
        with zipfile.ZipFile(zip_path) as archive:
            names = [n for n in archive.namelist() if Path(n).name == member]
            if not names:
                raise DataError(f"the archive holds no {member} (it has {archive.namelist()[:6]})")
            with archive.open(names[0]) as src, open(dest, "wb") as out:
                shutil.copyfileobj(src, out, CHUNK)
    except zipfile.BadZipFile as exc:
        raise DataError(f"not a valid zip archive ({exc})") from exc


def _check_speed(path: Path, root: Path) -> list[str]:
    """Structural check (authoritative), then size and sha256 (warnings only)."""
    ids = D.read_sensor_ids(root / "graph_sensor_ids.txt")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        values, index, columns = D.read_speed_arrays(path)
    D.validate_speed(values, index, columns, ids, path=path.name, require_full=True)
    del values
    warns = []
    size = path.stat().st_size
    if EXPECTED_SIZE and size != EXPECTED_SIZE:
        warns.append(
            f"metr-la.h5 is {size} bytes, not the {EXPECTED_SIZE} of the (unverified) reference; "
            "its structure is right, so it is kept"
        )
    digest = sha256_file(path)
    if EXPECTED_SHA256 and digest != EXPECTED_SHA256:
        warns.append(
            f"metr-la.h5 has sha256 {digest}, not the (unverified) reference {EXPECTED_SHA256[:12]}...; "
            "its structure is right, so it is kept"
        )
    return warns


def download_speed(root: str | Path, *, progress: bool = True, force: bool = False) -> list[str]:
    """Fetch ``metr-la.h5`` into ``root`` from the first mirror that delivers a good file.

    Returns the warnings (size or sha256 differing from the unverified reference).

    Raises:
        DataError: no mirror worked; the message lists each mirror's failure and what to place where.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = root / "metr-la.h5"
    if final.is_file() and not force:
        return []
    if not (root / "graph_sensor_ids.txt").is_file():
        download_graph_files(root, progress=progress, optional=False)
    failures = []
    for mirror in SPEED_MIRRORS:
        part = root / "metr-la.h5.part"
        zpart = root / "metr-la.zip.part"
        try:
            if mirror.kind == "zip":
                fetch(
                    mirror.url, zpart, progress=progress, desc=f"metr-la ({mirror.note or 'zip'})"
                )
                _extract(zpart, mirror.member, part)
                zpart.unlink(missing_ok=True)
            else:
                fetch(
                    mirror.url,
                    part,
                    progress=progress,
                    desc=f"metr-la.h5 ({mirror.note or 'mirror'})",
                )
            warns = _check_speed(part, root)
            os.replace(part, final)
        except Exception as exc:  # a bad mirror: note why, try the next one
            failures.append(f"{mirror.url}: {exc}")
            continue
        finally:
            part.unlink(missing_ok=True)
            zpart.unlink(missing_ok=True)
        for w in warns:
            warnings.warn(w, stacklevel=2)
        _record(
            root,
            "metr-la.h5",
            _entry(final, mirror.url, "structure: 34272 x 207, 5-min index, column order", warns),
        )
        return warns
    raise DataError(
        "could not download metr-la.h5 from any mirror:\n  "
        + "\n  ".join(failures)
        + "\n"
        + offline_instructions(root)
    )


def download_metr_la(
    root: str | Path | None = None, *, progress: bool = True, force: bool = False
) -> Path:
    """Download the graph files and the full speed matrix into ``root`` (default: the data folder).

    Files already present are kept unless ``force``. Returns the folder.
    """
    folder = D.resolve_root(root)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(
            f"cannot create the data folder {folder} ({exc.strerror}). Fix: pass --root with a "
            "writable folder or set DIAGSINK_DATA."
        ) from exc
    if not os.access(folder, os.W_OK):
        raise DataError(
            f"the data folder {folder} is not writable. Fix: pass --root with a writable folder "
            "or set DIAGSINK_DATA to one."
        )
    download_graph_files(folder, progress=progress, force=force)
    download_speed(folder, progress=progress, force=force)
    return folder
