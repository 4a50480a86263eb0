"""The layers of app/ hold (pyproject.toml, [tool.importlinter]; docs/explanations/architecture.md):
each imports only the layers below it, and nothing imports its way back round to itself, imports
inside functions included."""

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_import_contracts_are_kept():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "lint-imports is not installed: `pip install -e '.[test]'`"
    done = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
