# Test setup: the package path and torch's thread count. Helpers live in helpers.py.
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python"))

# Torch defaults to one thread here; the tests are small but the reference loop is not free.
torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
