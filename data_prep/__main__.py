"""``python -m data_prep``."""
import sys

from .cli import main

sys.exit(main())
