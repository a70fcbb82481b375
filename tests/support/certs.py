"""Test certificates made with the ``openssl`` command line, in a temporary folder.

``CertificateAuthority(folder, "ca")`` makes a CA; ``ca.issue("server", ...)``
a certificate signed by it (EC P-256 keys: quick to make).  Each is a pair of
PEM files, ``<name>.crt`` and ``<name>.key``.
"""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import pytest


def require_openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        pytest.skip("the openssl command is not installed")
    return found


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [require_openssl(), *args], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {result.stderr}")


class CertificateAuthority:
    def __init__(self, folder: Path, name: str = "ca") -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.cert = self.folder / f"{name}.crt"
        self.key = self.folder / f"{name}.key"
        _openssl(
            "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-keyout", str(self.key), "-out", str(self.cert), "-days", "2",
            "-subj", f"/CN=kestreld test {name}",
            cwd=self.folder,
        )  # fmt: skip

    def issue(self, name: str, common_name: str = "localhost", client: bool = False) -> Path:
        """``<name>.crt`` and ``<name>.key`` signed by this CA; returns the .crt path."""
        crt, key, csr = (self.folder / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
        ext = self.folder / f"{name}.ext"
        if client:
            ext.write_text("extendedKeyUsage=clientAuth\n")
        else:
            ext.write_text(
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n"
            )
        _openssl(
            "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={common_name}",
            cwd=self.folder,
        )  # fmt: skip
        _openssl(
            "x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key),
            "-CAcreateserial", "-out", str(crt), "-days", "2", "-extfile", str(ext),
            cwd=self.folder,
        )  # fmt: skip
        return crt

    def client_context(self, cert: Path | None = None) -> ssl.SSLContext:
        """A client context trusting this CA (with a client certificate when given)."""
        context = ssl.create_default_context(cafile=str(self.cert))
        if cert is not None:
            context.load_cert_chain(str(cert), str(cert.with_suffix(".key")))
        return context
