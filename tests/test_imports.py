"""`import casmoe` (and the CLI module) must stay light: no torch, transformers, matplotlib or numba."""

import subprocess
import sys


def test_import_casmoe_leaves_heavy_modules_out():
    code = (
        "import sys, casmoe, casmoe.sim, casmoe.backends, casmoe.cli;"
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'sentence_transformers', 'hnswlib', 'numba') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"
