"""The repository's folders the tests read (from any folder a test module sits in)."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data"
REAL = REPO / "traces" / "real"
"""The real routing traces others recorded (route CSVs)."""
