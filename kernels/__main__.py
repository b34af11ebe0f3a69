"""``python -m kernels``: the ``kernels`` command."""

from .cli import main

raise SystemExit(main())
