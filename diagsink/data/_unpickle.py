"""Safe unpickling for METR-LA's files: numpy arrays from ``adj_mx.pkl``, date offsets in HDF.

Part of the chapter ``book/metr_la.ipynb``: ``adj_mx.pkl`` is a Python-2 pickle and PyTables
unpickles attributes of a speed file; both go through the restricted unpicklers here, so a
tampered file cannot run code.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path

import numpy as np
from pandas.tseries.offsets import BaseOffset

from ..errors import DataError

__all__ = ["RestrictedUnpickler", "restricted_pytables"]


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler that admits only what a pickled numpy array needs.

    Allowed globals (``ALLOWED``): ``numpy.core.multiarray._reconstruct`` (or its numpy-2
    name ``numpy._core.multiarray._reconstruct``), ``numpy.ndarray`` and ``numpy.dtype``.
    Any other global (``os.system``, ``builtins.eval``, ...) raises :class:`DataError`, so a
    tampered ``adj_mx.pkl`` cannot run code.
    """

    ALLOWED: frozenset[tuple[str, str]] = frozenset(
        {
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"),
            ("numpy", "dtype"),
        }
    )

    def find_class(self, module: str, name: str):  # noqa: D102 - see class docstring
        if (module, name) not in self.ALLOWED:
            raise DataError(
                f"adj_mx.pkl asks for the global {module}.{name}, which a plain adjacency pickle never needs; "
                "refusing to load it (it may be tampered with). Fix: replace adj_mx.pkl with DCRNN's original "
                "(`diagsink data download`) or use adj_mx.npy."
            )
        if name == "_reconstruct":
            core = getattr(np, "_core", None)
            multiarray = core.multiarray if core is not None else np.core.multiarray  # numpy < 2
            return multiarray._reconstruct
        return getattr(np, name)


class _HDFAttributeUnpickler(pickle.Unpickler):
    """What PyTables may unpickle from an HDF speed file: pandas' date offsets (the index ``freq``), nothing else."""

    refused: list[str]

    def find_class(self, module: str, name: str):  # noqa: D102
        if module == "pandas._libs.tslibs.offsets" and name.isidentifier() and name[:1].isupper():
            cls = getattr(__import__(module, fromlist=[name]), name, None)
            if isinstance(cls, type) and issubclass(cls, BaseOffset):
                return cls
        self.refused.append(f"{module}.{name}")
        raise pickle.UnpicklingError(f"refused global {module}.{name}")


class _SafePickle:
    """Stands in for the ``pickle`` module inside PyTables while a speed file is read.

    PyTables unpickles every attribute that looks pickled as soon as a node's attributes are
    opened, and object arrays with ``pickle.loads``; a crafted ``.h5`` could run code that way.
    Here only pandas' date offsets are admitted; anything else is refused (PyTables then keeps the
    raw bytes) and recorded in ``refused``.
    """

    def __init__(self) -> None:
        self.refused: list[str] = []

    def __getattr__(self, name: str):  # constants such as HIGHEST_PROTOCOL, dumps for writing
        return getattr(pickle, name)

    def loads(self, data, *, encoding: str = "ASCII", errors: str = "strict", **_ignored):
        unpickler = _HDFAttributeUnpickler(
            io.BytesIO(bytes(data)), encoding=encoding, errors=errors
        )
        unpickler.refused = self.refused
        return unpickler.load()


class restricted_pytables:
    """Context manager: PyTables (attributes and object atoms) unpickles through :class:`_SafePickle`.

    Raises :class:`DataError` on exit if the file asked for any other global.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.safe = _SafePickle()

    def __enter__(self) -> None:
        # reason: PyTables is imported only when an HDF file is read (start-up time)
        import tables.atom
        import tables.attributeset  # reason: as above

        self.modules = (tables.atom, tables.attributeset)
        self.saved = [m.pickle for m in self.modules]
        for m in self.modules:
            m.pickle = self.safe

    def __exit__(self, *exc) -> None:
        for m, saved in zip(self.modules, self.saved):
            m.pickle = saved
        if self.safe.refused:
            raise DataError(
                f"{self.path} holds pickled Python objects (asking for {self.safe.refused[0]}); a METR-LA speed file "
                "holds only numbers, so it is refused (it may be tampered with, or saved from an object-dtype frame). "
                "Fix: save the speeds as float64 (df.astype('float64').to_hdf(path, key='df')), or delete it and run "
                f"`diagsink data download --force --root {self.path.parent}`."
            )
