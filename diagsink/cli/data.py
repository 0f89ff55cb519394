"""``diagsink data download | info | verify``: the commands of :mod:`diagsink.data`."""

from __future__ import annotations

from ..data.download import EXPECTED_SHA256, download_metr_la, read_manifest
from ..data.files import (
    GRAPH_FILES,
    SPEED_FILES,
    missing_files,
    missing_files_message,
    resolve_root,
)
from ..data.metr_la import load_metr_la
from ..errors import DataError

__all__ = ["add_commands"]


def _cmd_download(args) -> int:
    folder = download_metr_la(args.root, progress=not args.no_progress, force=args.force)
    print(load_metr_la(folder, download=False).describe())
    print(f"stored in {folder} (checksums in {folder / 'manifest.json'})")
    return 0


def _cmd_info(args) -> int:
    folder = resolve_root(args.root)
    print(f"data folder: {folder}")
    manifest = read_manifest(folder).get("files", {})
    for name in (*SPEED_FILES, *GRAPH_FILES, "adj_mx.npy", "distances_la_2012.csv"):
        path = folder / name
        if path.is_file():
            sha = manifest.get(name, {}).get("sha256")
            print(
                f"  {name:32s} {path.stat().st_size:>12,d} bytes"
                + (f"  sha256 {sha[:16]}... (manifest)" if sha else "")
            )
    missing = missing_files(folder, args.file)
    if missing:
        raise DataError(missing_files_message(folder, missing))
    names = [args.file] if args.file else [n for n in SPEED_FILES if (folder / n).is_file()]
    for name in names:  # each speed file: which sensors and steps it holds
        print(load_metr_la(folder, download=False, speed_file=name).describe())
    return 0


def _cmd_verify(args) -> int:
    folder = resolve_root(args.root)
    data = load_metr_la(
        folder, download=False, speed_file=args.file
    )  # raises on any structural problem
    print(data.describe())
    recorded = read_manifest(folder).get("files", {}).get(data.path.name, {}).get("sha256")
    print(f"sha256 {data.sha256}")
    if recorded:
        if recorded != data.sha256:
            raise DataError(
                f"{data.path} changed since it was downloaded (manifest sha256 {recorded}). "
                "Fix: run `diagsink data download --force`."
            )
        print("matches manifest.json")
    if data.is_full:
        note = "matches" if data.sha256 == EXPECTED_SHA256 else "differs from"
        print(
            f"{note} the third-party reference sha256 (unverified; the structural check above is what counts)"
        )
    else:
        print(
            "PARTIAL data: results computed on it are not comparable with published METR-LA numbers"
        )
    return 0


def add_commands(subparsers) -> None:
    """Register ``diagsink data download|info|verify`` (see :mod:`diagsink.cli`)."""
    parser = subparsers.add_parser("data", help="download, inspect and verify METR-LA")
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True
    dl = sub.add_parser("download", help="fetch METR-LA from public mirrors into the data folder")
    info = sub.add_parser("info", help="show which METR-LA files are present and what they hold")
    verify = sub.add_parser("verify", help="check the METR-LA files (structure, checksums)")
    for p in (dl, info, verify):
        p.add_argument(
            "--root",
            default=None,
            help="data folder (default: DIAGSINK_DATA, else ~/.cache/diagsink/metr-la)",
        )
    for p in (info, verify):
        p.add_argument(
            "--file",
            default=None,
            help="the speed file to read (e.g. metr-la_29sensors_allsteps.h5; default: every one "
            "present for info, the first of metr-la.h5, metr-la_first1026steps.h5, "
            "metr-la_29sensors_allsteps.h5 for verify)",
        )
    dl.add_argument("--force", action="store_true", help="download again even if the files exist")
    dl.add_argument("--no-progress", action="store_true", help="no progress bar")
    dl.set_defaults(func=_cmd_download)
    info.set_defaults(func=_cmd_info)
    verify.set_defaults(func=_cmd_verify)
