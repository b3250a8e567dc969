"""The krew archive of ``kubectl rollback`` (``deploy/krew/rollback.yaml`` carries its sha256):
``python deploy/krew/archive.py DIR`` writes ``kubectl-rollback-v<version>.tar.gz`` there and
prints its sha256. Reproducible, so a test rebuilds it and compares: fixed times, owners and
modes, and a gzip header without a time or a name."""

from __future__ import annotations

import gzip
import hashlib
import io
import sys
import tarfile
import tomllib
from pathlib import Path

HERE = Path(__file__).resolve().parent
FILES = ("kubectl-rollback",)  # what krew installs; ``bin`` in the manifest


def version() -> str:
    pyproject = tomllib.loads((HERE.parent.parent / "pyproject.toml").read_text())
    return str(pyproject["project"]["version"])


def build(out: Path) -> tuple[Path, str]:
    """The archive in ``out`` and its sha256."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name in FILES:
            data = (HERE / name).read_bytes()
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o755, 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            tar.addfile(info, io.BytesIO(data))
    packed = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=packed, mtime=0) as gz:
        gz.write(raw.getvalue())
    archive = out / f"kubectl-rollback-v{version()}.tar.gz"
    out.mkdir(parents=True, exist_ok=True)
    archive.write_bytes(packed.getvalue())
    return archive, hashlib.sha256(packed.getvalue()).hexdigest()


if __name__ == "__main__":
    path, digest = build(Path(sys.argv[1] if len(sys.argv) > 1 else "dist"))
    print(f"{digest}  {path}")
