"""What a user who ``pip install``s skewtrace gets: the demo runs outside a checkout.

The wheel is built from this checkout and installed into a fresh virtual environment in a
temporary directory; it runs from there, with a working directory that is not the checkout.
The dependencies come from the test's own environment (a ``.pth`` line, so nothing is
downloaded and torch is not installed twice), never skewtrace itself. tests/test_demo.py runs
the demo end to end; this test checks what only an installed package can get wrong: the
packaged config, example and collector sources, and ``skewtrace demo`` finding them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent

CHECK = """
import json, pathlib, skewtrace
from skewtrace import _resources
root = _resources.source_root()
print(json.dumps({
    "package": skewtrace.__file__,
    "source_root": str(root),
    "checkout": str(_resources.checkout()),
    "files": sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()),
    "config": str(_resources.shipped("collector-config/otelcol.yaml")),
    "example": str(_resources.shipped("examples/train_ddp.py")),
}))
"""


@pytest.mark.slow
def test_installed_wheel_ships_what_the_demo_needs(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist), str(REPO_ROOT)],
        check=True,
        timeout=600,
    )
    (wheel,) = dist.glob("skewtrace-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
    assert not [n for n in names if n.endswith("_test.go") or "/testdata/" in n], names

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True,
        timeout=300,
    )
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    # Appended after the venv's own site-packages: skewtrace resolves to the installed wheel.
    (site / "zz_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = {"cwd": elsewhere, "capture_output": True, "text": True, "timeout": 120}
    demo_help = subprocess.run([str(venv / "bin" / "skewtrace"), "demo", "--help"], **run)
    assert demo_help.returncode == 0, demo_help.stderr
    assert "--otelcol PATH" in demo_help.stdout

    checked = subprocess.run([str(python), "-c", CHECK], **run)
    assert checked.returncode == 0, checked.stderr
    found = json.loads(checked.stdout)
    assert found["package"].startswith(str(site)), found["package"]
    assert found["source_root"] == str(site / "skewtrace" / "_data")
    assert found["checkout"] == "None"
    assert found["config"] == str(site / "skewtrace/_data/collector-config/otelcol.yaml")
    assert found["example"] == str(site / "skewtrace/_data/examples/train_ddp.py")
    files = set(found["files"])
    for needed in (
        "collector-config/build.sh",
        "collector-config/builder-config.yaml",
        "collector-config/file-export.yaml",
        "examples/train_2d.py",
        "examples/_faults.py",
        "src/collector/go.mod",
        "src/collector/go.sum",
        "src/collector/processor/barrierskewprocessor/processor.go",
        "src/collector/connector/barrierskewconnector/connector.go",
    ):
        assert needed in files, needed
    go_sources = {
        str(p.relative_to(REPO_ROOT))
        for p in (REPO_ROOT / "src" / "collector").rglob("*.go")
        if not p.name.endswith("_test.go") and "testdata" not in p.parts
    }
    assert go_sources <= files, sorted(go_sources - files)
