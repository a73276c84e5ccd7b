"""`import casmoe` (and the CLI module) must stay light: no torch, transformers, matplotlib or numba."""

import subprocess
import sys


def test_import_casmoe_leaves_heavy_modules_out():
    code = (
        "import sys, casmoe, casmoe.sim, casmoe.backends, casmoe.cli;"
        "heavy = [m for m in ('torch', 'transformers', 'matplotlib', 'sentence_transformers', 'hnswlib', 'numba', 'gguf', 'huggingface_hub') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"heavy modules imported: {out.stdout}"


def test_help_starts_without_numpy_or_rich():
    """`casmoe --help` (and every subcommand's help) is built from modules that leave the
    library's heavy parts for the command bodies (bench/bench_startup.py times it)."""
    code = (
        "import sys\n"
        "from casmoe.cli import main\n"
        "for argv in (['--help'], ['replay', '--help'], ['planner', 'fit', '--help'], ['trace', 'info', '--help']):\n"
        "    sys.argv = ['casmoe', *argv]\n"
        "    try:\n"
        "        main()\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in ('numpy', 'rich', 'tqdm', 'numba', 'torch') if m in sys.modules]\n"
        "print(','.join(heavy), file=sys.stderr)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "Usage: casmoe" in out.stdout
    assert out.stderr.strip() == "", f"imported for --help: {out.stderr}"
