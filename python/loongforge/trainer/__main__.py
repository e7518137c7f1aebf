"""``python -m loongforge.trainer``: the trainer (as ``python -m loongforge.train``)."""
import sys

from .cli import main

sys.exit(main())
