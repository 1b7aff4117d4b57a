"""``python -m torch_phantom``: versions, devices, settings, a self-test and
the ops report (torch_phantom/_diagnose.py). Exits 1 if a check fails."""
import sys

from torch_phantom._diagnose import main

sys.exit(main())
