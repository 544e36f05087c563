# SPDX-License-Identifier: BSD-3-Clause
"""In-tree PEP 517/660 build backend for the kvproxy binding.

Why: pip builds in an isolated environment and would download setuptools
for it, so a plain ``pip install ./python`` fails on a machine without
network access. This backend needs nothing to be downloaded:

* where setuptools (>= 61, with ``[project]`` support) is importable, which
  is the case with ``pip install --no-build-isolation``, every hook is
  setuptools' own (``setuptools.build_meta``);
* otherwise (the usual isolated build) it builds the pure-Python wheel with
  the standard library, from the same ``[project]`` table in pyproject.toml.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os
import zipfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parent.parent  # the python/ folder
PACKAGE = "kvproxy"

try:  # pragma: no cover - depends on the build environment
    import setuptools
    from setuptools import build_meta as _st

    if int(setuptools.__version__.split(".")[0]) < 61:
        _st = None
except Exception:  # noqa: BLE001 - any failure means: build without it
    _st = None


def _project() -> Dict:
    try:
        import tomllib
    except ImportError as e:  # Python < 3.11 and no setuptools
        raise RuntimeError(
            "building kvproxy needs Python >= 3.11 or setuptools >= 61: "
            "install setuptools and run pip with --no-build-isolation"
        ) from e
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]


def _dist_name(p: Dict) -> Tuple[str, str]:
    return p["name"].replace("-", "_"), p["version"]


def _metadata(p: Dict) -> str:
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {p['name']}",
        f"Version: {p['version']}",
    ]
    if "description" in p:
        lines.append(f"Summary: {p['description']}")
    lic = p.get("license")
    if isinstance(lic, dict) and "text" in lic:
        lines.append(f"License: {lic['text']}")
    if "requires-python" in p:
        lines.append(f"Requires-Python: {p['requires-python']}")
    for c in p.get("classifiers", []):
        lines.append(f"Classifier: {c}")
    for d in p.get("dependencies", []):
        lines.append(f"Requires-Dist: {d}")
    body = ""
    if isinstance(p.get("readme"), str):
        lines.append("Description-Content-Type: text/markdown")
        body = (ROOT / p["readme"]).read_text(encoding="utf-8")
    return "\n".join(lines) + "\n\n" + body


def _entry_points(p: Dict) -> str:
    """entry_points.txt (the packaging spec's INI format) from ``[project.scripts]``,
    ``[project.gui-scripts]`` and ``[project.entry-points.<group>]``; "" if none.
    Plugin hosts (sglang's ``sglang.srt.plugins``) find the package through it."""
    groups: List[Tuple[str, Dict[str, str]]] = []
    if p.get("scripts"):
        groups.append(("console_scripts", p["scripts"]))
    if p.get("gui-scripts"):
        groups.append(("gui_scripts", p["gui-scripts"]))
    for group, eps in sorted((p.get("entry-points") or {}).items()):
        if group in ("console_scripts", "gui_scripts"):
            raise RuntimeError(f"[project.entry-points.{group}] is not allowed: use [project.scripts]/[project.gui-scripts]")
        groups.append((group, eps))
    out = []
    for group, eps in groups:
        out.append(f"[{group}]")
        out.extend(f"{name} = {value}" for name, value in sorted(eps.items()))
        out.append("")
    return "\n".join(out)


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _write_wheel(wheel_directory: str, files: List[Tuple[str, bytes]]) -> str:
    p = _project()
    name, version = _dist_name(p)
    info = f"{name}-{version}.dist-info"
    files = list(files) + [
        (f"{info}/METADATA", _metadata(p).encode()),
        (
            f"{info}/WHEEL",
            b"Wheel-Version: 1.0\nGenerator: kvproxy_build\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        ),
        (f"{info}/top_level.txt", f"{PACKAGE}\n".encode()),
    ]
    eps = _entry_points(p)
    if eps:
        files.append((f"{info}/entry_points.txt", eps.encode()))
    record = [_record_line(n, d) for n, d in files] + [f"{info}/RECORD,,"]
    files.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    whl = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, whl), "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files:
            zi = zipfile.ZipInfo(n, date_time=(2020, 1, 1, 0, 0, 0))
            zi.compress_type = zipfile.ZIP_DEFLATED
            zi.external_attr = 0o644 << 16
            z.writestr(zi, d)
    return whl


def _package_files() -> List[Tuple[str, bytes]]:
    out = []
    pkg = ROOT / PACKAGE
    for path in sorted(pkg.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix in (".py", ".typed"):
            out.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    return out


# ---- PEP 517 ----


def get_requires_for_build_wheel(config_settings: Optional[Dict] = None) -> List[str]:
    return _st.get_requires_for_build_wheel(config_settings) if _st else []


def get_requires_for_build_sdist(config_settings: Optional[Dict] = None) -> List[str]:
    return _st.get_requires_for_build_sdist(config_settings) if _st else []


def build_wheel(
    wheel_directory: str, config_settings: Optional[Dict] = None, metadata_directory: Optional[str] = None
) -> str:
    if _st:
        return _st.build_wheel(wheel_directory, config_settings, metadata_directory)
    return _write_wheel(wheel_directory, _package_files())


def build_sdist(sdist_directory: str, config_settings: Optional[Dict] = None) -> str:
    if _st:
        return _st.build_sdist(sdist_directory, config_settings)
    import tarfile

    p = _project()
    name, version = _dist_name(p)
    base = f"{name}-{version}"
    out = f"{base}.tar.gz"
    members = [("pyproject.toml", (ROOT / "pyproject.toml").read_bytes())]
    if isinstance(p.get("readme"), str):
        members.append((p["readme"], (ROOT / p["readme"]).read_bytes()))
    members.append(("PKG-INFO", _metadata(p).encode()))
    for path in sorted((ROOT / "_build_backend").glob("*.py")):
        members.append((path.relative_to(ROOT).as_posix(), path.read_bytes()))
    members += _package_files()
    with tarfile.open(os.path.join(sdist_directory, out), "w:gz", format=tarfile.PAX_FORMAT) as t:
        for n, d in members:
            ti = tarfile.TarInfo(f"{base}/{n}")
            ti.size = len(d)
            ti.mode = 0o644
            t.addfile(ti, io.BytesIO(d))
    return out


# ---- PEP 660 (pip install -e) ----


def get_requires_for_build_editable(config_settings: Optional[Dict] = None) -> List[str]:
    if _st and hasattr(_st, "get_requires_for_build_editable"):
        return _st.get_requires_for_build_editable(config_settings)
    return []


def build_editable(
    wheel_directory: str, config_settings: Optional[Dict] = None, metadata_directory: Optional[str] = None
) -> str:
    if _st and hasattr(_st, "build_editable"):
        return _st.build_editable(wheel_directory, config_settings, metadata_directory)
    # A .pth file that puts this folder on sys.path.
    return _write_wheel(wheel_directory, [(f"__editable__.{PACKAGE}.pth", f"{ROOT}\n".encode())])
