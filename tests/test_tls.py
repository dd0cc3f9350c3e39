"""TLS to Postgres with full verification (``sslmode=verify-full``): a real server started by the harness with a
certificate made here, unilog's processes connecting through it, and a wrong CA or hostname refused in one line.
Redis TLS needs a server built with TLS (Debian's; the embedded ones are not): skipped with the reason without one."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("cryptography")

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from unilog import Settings, emit, store
from unilog.cli import ExitCode
from unilog.harness.embedded import EmbeddedPostgres, ServerNotFound

TESTS = Path(__file__).parent


def _name(common: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])


def make_ca(folder: Path, name: str) -> tuple[Path, Any, Any]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(_name(name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    path = folder / f"{name}.pem"
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path, cert, key


def make_server_cert(folder: Path, ca_cert: Any, ca_key: Any) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, signed by the CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = folder / "server.crt", folder / "server.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


@pytest.fixture(scope="module")
def tls_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmbeddedPostgres, Path, Path]]:
    """A Postgres of its own with TLS on; (server, the right CA file, another CA's file)."""
    folder = tmp_path_factory.mktemp("tls")
    ca_path, ca_cert, ca_key = make_ca(folder, "unilog-test-ca")
    other_ca, _, _ = make_ca(folder, "another-ca")
    try:
        server = EmbeddedPostgres(tls=make_server_cert(folder, ca_cert, ca_key)).start()
    except ServerNotFound as exc:
        pytest.skip(f"no Postgres to start: {exc}")
    yield server, ca_path, other_ca
    server.stop(mode="immediate", cleanup=True)


def verified(server: EmbeddedPostgres, ca: Path, host: str = "127.0.0.1") -> str:
    """The server's URL with sslmode=verify-full against ``ca``; ``host`` is what the certificate must name."""
    base = server.url.split("?", 1)[0].replace("127.0.0.1", host, 1)
    extra = "" if host == "127.0.0.1" else "&hostaddr=127.0.0.1"
    return f"{base}?sslmode=verify-full&sslrootcert={ca}{extra}"


def unilog(database_url: str, redis_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DATABASE_URL": database_url, "REDIS_URL": redis_url, "UNILOG_STREAM": "tls-stream"}
    return subprocess.run(
        [sys.executable, "-m", "unilog", "--log-json", *args],
        env=env,
        cwd=TESTS,
        capture_output=True,
        text=True,
        timeout=90,
    )


def test_every_process_connects_with_full_verification(
    tls_postgres: tuple[EmbeddedPostgres, Path, Path], settings: Settings, rds: Any
) -> None:
    server, ca, _ = tls_postgres
    url = verified(server, ca)
    assert unilog(url, settings.redis_url, "migrate").returncode == 0
    with store.connect(url) as conn:
        assert conn.pgconn.ssl_in_use, "the session is encrypted"
        conn.execute(
            "CREATE TABLE IF NOT EXISTS applied (consumer TEXT, producer TEXT, seq BIGINT, entry_id TEXT, "
            "n BIGINT, data JSONB)"
        )
        for n in range(3):
            emit(conn, action="create", object="ride", data={"n": n}, stream="tls-stream")
        conn.commit()
    streamed = unilog(url, settings.redis_url, "streamer", "--once")
    assert streamed.returncode == 0 and "streamed 3 records" in streamed.stdout, streamed.stderr
    consumed = unilog(url, settings.redis_url, "consume", "handlers:cli_handler", "--name", "tls", "--once")
    assert consumed.returncode == 0 and "handled 3 records" in consumed.stdout, consumed.stderr
    assert unilog(url, settings.redis_url, "status").returncode == 0


@pytest.mark.parametrize("wrong", ["ca", "hostname"])
def test_a_wrong_ca_or_hostname_is_refused_in_one_line(
    tls_postgres: tuple[EmbeddedPostgres, Path, Path], settings: Settings, wrong: str
) -> None:
    server, ca, other_ca = tls_postgres
    url = verified(server, other_ca) if wrong == "ca" else verified(server, ca, host="db.example.invalid")
    result = unilog(url, settings.redis_url, "status")
    assert result.returncode == ExitCode.UNREACHABLE, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot connect to Postgres" in lines[0], lines
    expected = "certificate verify failed" if wrong == "ca" else "does not match host name"
    assert expected in lines[0], lines


def tls_redis(folder: Path) -> Any:
    """A redis-server built with TLS: Debian's (package redis-tools, which .ci/run installs where it may, ships it
    as redis-check-rdb; it runs as a server when called redis-server), else whatever the harness finds."""
    from unilog.harness.embedded.binaries import find_redis, probe_redis

    debian = Path("/usr/bin/redis-check-rdb")
    if not debian.exists():
        return find_redis()
    server = folder / "redis-server"
    server.symlink_to(debian)
    return probe_redis(server, "path")


def start_tls_redis(folder: Path) -> tuple[Any, str, Path]:
    """A Redis of its own with a TLS port (certificates made here): (server, its verifying rediss:// URL, the CA
    file). Raises the harness's error where this machine's redis-server has no TLS."""
    from unilog.harness.embedded import EmbeddedRedis, free_port

    ca_path, ca_cert, ca_key = make_ca(folder, "redis-ca")
    cert, key = make_server_cert(folder, ca_cert, ca_key)
    port = free_port()
    tls = {
        "tls-port": str(port),
        "tls-cert-file": str(cert),
        "tls-key-file": str(key),
        "tls-ca-cert-file": str(ca_path),
        "tls-auth-clients": "no",
    }
    server = EmbeddedRedis(folder / "redis", settings=tls, binary=tls_redis(folder)).start()
    return server, f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca_path}&ssl_cert_reqs=required", ca_path


def test_redis_over_tls_with_verification(settings: Settings, pg: Any, tmp_path: Path) -> None:
    """A Redis of its own with a TLS port; skipped only if this machine's redis-server was built without TLS."""
    from unilog.harness.embedded import EmbeddedServerError

    other_ca, _, _ = make_ca(tmp_path, "other-redis-ca")
    try:
        server, good, ca_path = start_tls_redis(tmp_path)
    except (ServerNotFound, EmbeddedServerError) as exc:
        pytest.skip(
            f"this machine's redis-server cannot serve TLS (the embedded servers are built without it): {str(exc)[:200]}"
        )
    try:
        with store.connect(settings.conninfo) as conn:
            emit(conn, action="create", object="ride", data={"n": 1}, stream="tls-stream")
            conn.commit()
        streamed = unilog(settings.database_url, good, "streamer", "--once")
        assert streamed.returncode == 0 and "streamed 1 records" in streamed.stdout, streamed.stderr
        bad = good.replace(str(ca_path), str(other_ca))
        refused = unilog(settings.database_url, bad, "status")
        assert refused.returncode == ExitCode.UNREACHABLE and "certificate verify failed" in refused.stderr
    finally:
        server.stop(cleanup=True)
