"""Make the float64 reference module importable from the ASAP tests."""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).parent))
