"""The fresh-machine install (.ci/pip_install_lock.sh): torch's +cpu build from PyTorch's index when pip lacks it.

Real pip against local file indexes (nothing leaves the machine), resolving
only (``--dry-run``) a tiny stand-in ``torch`` wheel built here.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / ".ci" / "pip_install_lock.sh"


def _wheel(folder: Path, name: str, version: str) -> Path:
    """A minimal valid pure-Python wheel named ``name`` at ``version``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-py3-none-any.whl"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}_stub/__init__.py": "",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    records = []
    with zipfile.ZipFile(path, "w") as zf:
        for arc, text in files.items():
            zf.writestr(arc, text)
            digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
            records.append(f"{arc},sha256={digest},{len(text.encode())}")
        zf.writestr(f"{info}/RECORD", "\n".join([*records, f"{info}/RECORD,,"]) + "\n")
    return path


def _index(root: Path, wheel: Path | None) -> str:
    """A PEP 503 index at ``root`` (PyTorch's layout: <root>/torch/) listing ``wheel``."""
    (root / "torch").mkdir(parents=True, exist_ok=True)
    link = f'<a href="{wheel.as_uri()}">{wheel.name}</a>' if wheel else ""
    (root / "torch" / "index.html").write_text(f"<html><body>{link}</body></html>")
    (root / "index.html").write_text("<html><body></body></html>")
    return root.as_uri()


def _install(tmp_path: Path, lock: str, *, find_links: Path | None = None, **env: str):
    (tmp_path / "lock.txt").write_text(lock)
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    empty = _index(tmp_path / "empty", None)
    run_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PIP_")},
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": empty, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "TORCH_INDEX_BASE": (tmp_path / "pytorch").as_uri(), **env,
    }
    extra = ["--find-links", str(find_links)] if find_links else []
    proc = subprocess.run(
        ["bash", str(SCRIPT), sys.executable, str(tmp_path / "lock.txt"), "--dry-run", "--no-deps",
         "--ignore-installed", "--report", str(report), *extra],
        env=run_env, capture_output=True, text=True, timeout=120,
    )
    versions = {}
    if report.exists():
        versions = {i["metadata"]["name"]: i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    return proc, versions


@pytest.fixture()
def pytorch_index(tmp_path):
    for variant in ("cpu", "cu128"):
        _index(tmp_path / "pytorch" / variant, _wheel(tmp_path / "wheels" / variant, "torch", f"2.13.0+{variant}"))
    return tmp_path


def test_plain_install_first_when_the_configured_indexes_have_the_cpu_build(pytorch_index):
    proc, versions = _install(pytorch_index, "torch==2.13.0+cpu\n", find_links=pytorch_index / "wheels" / "cpu")
    assert proc.returncode == 0, proc.stderr
    assert versions == {"torch": "2.13.0+cpu"}
    assert "trying --extra-index-url" not in proc.stderr  # PyTorch's index was never asked
    assert "torch: would install from the configured package indexes" in proc.stderr


def test_falls_back_to_pytorchs_cpu_index_when_pip_lacks_the_build(pytorch_index):
    proc, versions = _install(pytorch_index, "torch==2.13.0+cpu\n")
    assert proc.returncode == 0, proc.stderr
    assert versions == {"torch": "2.13.0+cpu"}
    assert f"trying --extra-index-url {(pytorch_index / 'pytorch' / 'cpu').as_uri()}" in proc.stderr
    assert "torch: would install from PyTorch's CPU index" in proc.stderr


def test_other_failures_are_not_retried(pytorch_index):
    proc, versions = _install(pytorch_index, "no-such-package-sbi==1.0\n")
    assert proc.returncode == 1 and versions == {}
    assert "No matching distribution found for no-such-package-sbi" in proc.stderr
    assert "trying --extra-index-url" not in proc.stderr


def test_cuda_variant_swaps_the_torch_pin_for_the_same_version(pytorch_index):
    proc, versions = _install(pytorch_index, "torch==2.13.0+cpu\n", TORCH_VARIANT="cu128")
    assert proc.returncode == 0, proc.stderr
    assert versions == {"torch": "2.13.0+cu128"}


def test_falls_back_to_the_default_build_of_the_same_version_when_no_cpu_build_is_served(tmp_path):
    """This machine's case: PyPI only (PyTorch's index unreachable or empty), whose torch 2.13.0 is the CUDA build."""
    pypi = tmp_path / "pypi"
    _wheel(pypi, "torch", "2.13.0")
    _wheel(pypi, "torch", "2.14.0")  # a newer torch there must not be taken: the same version as the lock
    _index(tmp_path / "pytorch" / "cpu", None)  # PyTorch's CPU index answers without the build
    proc, versions = _install(tmp_path, "torch==2.13.0+cpu\n", find_links=pypi)
    assert proc.returncode == 0, proc.stderr
    assert versions == {"torch": "2.13.0"}
    assert "PyTorch's CPU index cannot serve torch==2.13.0+cpu here either; installing torch==2.13.0" in proc.stderr
    assert "torch: would install from the package indexes' default build (torch==2.13.0;" in proc.stderr


def test_no_torch_anywhere_fails_and_says_so(tmp_path):
    _index(tmp_path / "pytorch" / "cpu", None)
    proc, versions = _install(tmp_path, "torch==2.13.0+cpu\n")
    assert proc.returncode == 1 and versions == {}
    assert "No matching distribution found for torch==2.13.0" in proc.stderr


def _real_install(tmp_path: Path, lock: str, *, uv: Path, **env: str):
    """The script as make venv runs it (no --dry-run), into a fresh venv of its own with ``uv`` beside its Python:
    ``(process, .torch-source, the venv's site-packages)``."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    # the venv's pip is this interpreter's, seen through a folder that holds it alone (ensurepip took seconds a venv)
    import pip

    (tmp_path / "host-pip").mkdir()
    (tmp_path / "host-pip" / "pip").symlink_to(Path(pip.__file__).parent)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "host-pip.pth").write_text(str(tmp_path / "host-pip") + "\n")
    (venv / "bin" / "uv").symlink_to(uv)
    (tmp_path / "lock.txt").write_text(lock)
    run_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "UV_"))},
        "PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": _index(tmp_path / "empty", None),
        "PIP_DISABLE_PIP_VERSION_CHECK": "1", "UV_CACHE_DIR": str(tmp_path / "uv-cache"), "UV_OFFLINE": "1",
        "TORCH_INDEX_BASE": (tmp_path / "pytorch").as_uri(), **env,
    }
    proc = subprocess.run(["bash", str(SCRIPT), str(venv / "bin" / "python"), str(tmp_path / "lock.txt")],
                          env=run_env, capture_output=True, text=True, timeout=120)
    source = venv / ".torch-source"
    return proc, source.read_text() if source.exists() else "", site


UV = Path(sys.executable).parent / "uv"


@pytest.mark.beside  # no Spark: evens the two runs of make test
@pytest.mark.skipif(not UV.exists(), reason="no uv beside this interpreter (make venv installs it)")
def test_the_lock_goes_in_with_uv_from_the_indexes_pip_is_configured_with(pytorch_index):
    """pip's find-links (here from PIP_FIND_LINKS) reach uv, which installs the lock; pip would have found the same."""
    proc, source, site = _real_install(pytorch_index, "torch==2.13.0+cpu\n", uv=UV,
                                       PIP_FIND_LINKS=str(pytorch_index / "wheels" / "cpu"))
    assert proc.returncode == 0, proc.stderr
    assert "(with uv)" in source and "the configured package indexes (torch==2.13.0+cpu)" in source, source
    assert list(site.glob("torch-2.13.0+cpu.dist-info"))


@pytest.mark.beside
@pytest.mark.skipif(not UV.exists(), reason="no uv beside this interpreter (make venv installs it)")
def test_a_pip_setting_uv_cannot_honour_keeps_pip(pytorch_index):
    proc, source, _ = _real_install(pytorch_index, "torch==2.13.0+cpu\n", uv=UV,
                                    PIP_FIND_LINKS=str(pytorch_index / "wheels" / "cpu"), PIP_TRUSTED_HOST="example.org")
    assert proc.returncode == 0, proc.stderr
    assert "installing with pip: pip setting :env:.trusted-host has no uv equivalent here" in proc.stderr
    assert "(with pip)" in source, source


@pytest.mark.beside
def test_a_failed_uv_install_is_tried_again_with_pip(pytorch_index, tmp_path):
    broken = tmp_path / "broken-uv"
    broken.write_text("#!/bin/sh\necho 'uv: broken on purpose' >&2\nexit 2\n")
    broken.chmod(0o755)
    proc, source, _ = _real_install(pytorch_index, "torch==2.13.0+cpu\n", uv=broken,
                                    PIP_FIND_LINKS=str(pytorch_index / "wheels" / "cpu"))
    assert proc.returncode == 0, proc.stderr
    assert "uv could not install" in proc.stderr and "installing it with pip instead" in proc.stderr
    assert "(with pip)" in source, source
