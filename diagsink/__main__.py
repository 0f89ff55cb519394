"""``python -m diagsink`` is the same as the ``diagsink`` command."""

from .cli import main

raise SystemExit(main())
