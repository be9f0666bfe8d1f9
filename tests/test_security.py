"""TLS and bearer-token auth: a self-signed certificate made here (cryptography), a real
in-process server, real channels. Health and reflection are exempt unless configured not to be.
"""

from __future__ import annotations

import datetime
import io
import ipaddress
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import soundfile as sf
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from grpc_health.v1 import health_pb2, health_pb2_grpc

from xattn.model.pipeline import Pipeline, load_pipeline
from xattn.service.__main__ import config_from_args, parse_args
from xattn.service.background import BackgroundServer
from xattn.service.engine.tokens import AuthPolicy, SecurityConfigError, read_tokens
from xattn.service.server import ServerConfig
from xattn.v1 import transcriber_pb2 as pb
from xattn.v1 import transcriber_pb2_grpc

TOKEN = "s3cret-token-for-tests"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED


def self_signed(folder: Path) -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    san = x509.SubjectAlternativeName(
        [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(san, critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "server.pem", folder / "server.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return load_pipeline("tiny.en")


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(pipeline: Pipeline, tls_files: tuple[Path, Path]) -> Iterator[BackgroundServer]:
    cert, key = tls_files
    config = ServerConfig(
        port=0, tls_cert=str(cert), tls_key=str(key), auth_tokens=("old-token", TOKEN)
    )
    with BackgroundServer(config, pipeline) as running:
        yield running


@pytest.fixture(scope="module")
def channel(server: BackgroundServer, tls_files: tuple[Path, Path]) -> Iterator[grpc.Channel]:
    credentials = grpc.ssl_channel_credentials(tls_files[0].read_bytes())
    with grpc.secure_channel(f"localhost:{server.server.port}", credentials) as ch:
        yield ch


def short_pcm() -> pb.Audio:
    tone = (0.1 * np.sin(np.arange(8000) / 5.0) * 32767).astype("<i2").tobytes()
    return pb.Audio(pcm=pb.Pcm(data=tone, sample_rate=16000, encoding=pb.PCM_ENCODING_INT16))


def bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),)


def test_token_admits_and_anything_else_is_unauthenticated(
    channel: grpc.Channel, server: BackgroundServer, caplog: pytest.LogCaptureFixture
) -> None:
    stub = transcriber_pb2_grpc.TranscriberStub(channel)
    info = stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=bearer(TOKEN), timeout=10)
    assert info.model_name == "tiny.en"
    assert stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=bearer("old-token"), timeout=10)
    caplog.set_level(logging.DEBUG)
    for metadata in (
        (),
        bearer("wrong"),
        bearer(TOKEN + "x"),
        (("authorization", f"Basic {TOKEN}"),),
        (("authorization", TOKEN),),
    ):
        with pytest.raises(grpc.RpcError) as err:
            stub.GetModelInfo(pb.GetModelInfoRequest(), metadata=metadata, timeout=10)
        assert err.value.code() == UNAUTHENTICATED
        request = pb.StreamTranscribeRequest(audio=short_pcm())
        with pytest.raises(grpc.RpcError) as err:
            list(stub.StreamTranscribe(request, metadata=metadata, timeout=10))
        assert err.value.code() == UNAUTHENTICATED
    assert server.engine.counters().admitted == 0  # refused before the engine saw them
    assert TOKEN not in caplog.text and "old-token" not in caplog.text


def test_health_and_reflection_exempt(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    reply = health.Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    replies = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
    )
    names = [s.name for r in replies for s in r.list_services_response.service]
    assert "xattn.v1.Transcriber" in names


def test_plaintext_client_cannot_talk_to_tls(server: BackgroundServer) -> None:
    with grpc.insecure_channel(f"127.0.0.1:{server.server.port}") as ch:
        with pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


def test_client_library_with_ca_and_token(
    server: BackgroundServer, tls_files: tuple[Path, Path]
) -> None:
    from xattn.clients.api import ServerError, connect

    address = f"localhost:{server.server.port}"
    with connect(address, ca_file=tls_files[0], token=TOKEN, timeout=10) as client:
        result = client.transcribe(_wav(), alignment="none", temperatures=[0.0])
        assert result is not None
    with connect(address, ca_file=tls_files[0], token="nope", timeout=10) as client:
        with pytest.raises(ServerError) as err:
            client.info()
        assert err.value.code == "UNAUTHENTICATED"


def _wav() -> bytes:
    buffer = io.BytesIO()
    sf.write(buffer, (0.1 * np.sin(np.arange(8000) / 5.0)).astype(np.float32), 16000, format="WAV")
    return buffer.getvalue()


def test_health_not_exempt_when_configured(pipeline: Pipeline) -> None:
    config = ServerConfig(port=0, auth_tokens=(TOKEN,), auth_exempt_health=False)
    with BackgroundServer(config, pipeline) as running:
        with grpc.insecure_channel(running.address) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            with pytest.raises(grpc.RpcError) as err:
                health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            assert err.value.code() == UNAUTHENTICATED
            reply = health.Check(health_pb2.HealthCheckRequest(), metadata=bearer(TOKEN))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_policy_and_token_sources(tmp_path: Path) -> None:
    policy = AuthPolicy(("a-token", "b-token"))
    assert policy.accepts([("authorization", "Bearer b-token")])
    assert policy.accepts([("Authorization", "bearer a-token ")])
    assert not policy.accepts([("authorization", "Bearer c-token")])
    assert not policy.accepts([("authorization", "Bearer")])
    assert not policy.accepts(None)
    assert policy.exempt("/grpc.health.v1.Health/Check")
    assert not policy.exempt("/xattn.v1.Transcriber/Transcribe")
    tokens = tmp_path / "tokens"
    tokens.write_text("# rotated weekly\nnew-token\n\nold-token\n")
    assert read_tokens("flag-token", tokens) == ("flag-token", "new-token", "old-token")
    tokens.write_text("# nothing\n")
    for bad in ((None, tokens), ("  ", None), ("two words", None), (None, tmp_path / "none")):
        with pytest.raises(SecurityConfigError):
            read_tokens(*bad)


def test_flags_and_environment(
    tmp_path: Path, tls_files: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cert, key = tls_files
    monkeypatch.setenv("XATTN_AUTH_TOKEN", TOKEN)
    monkeypatch.setenv("XATTN_AUTH_EXEMPT_HEALTH", "0")
    args = parse_args(["--tls-cert", str(cert), "--tls-key", str(key)])
    config = config_from_args(args)
    assert config.auth_tokens == (TOKEN,) and not config.auth_exempt_health
    assert config.auth_exempt_reflection and config.tls_cert == str(cert)
    assert config.host == "127.0.0.1"  # loopback unless told otherwise
    assert parse_args(["--auth-exempt-health"]).auth_exempt_health
    with pytest.raises(SystemExit):
        parse_args(["--tls-cert", str(cert)])
    with pytest.raises(SystemExit):
        parse_args(["--auth-token-file", str(tmp_path / "missing")])


def test_bad_tls_files_refuse_to_start(pipeline: Pipeline, tmp_path: Path) -> None:
    (tmp_path / "empty.pem").write_text("")
    config = ServerConfig(port=0, tls_cert=str(tmp_path / "empty.pem"), tls_key=str(tmp_path))
    with pytest.raises(SecurityConfigError):
        BackgroundServer(config, pipeline)


def test_tls_and_token_against_a_server_process(
    tmp_path: Path,
    tls_files: tuple[Path, Path],
    jfk_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`python -m xattn.service` with the cert by flag and the token file by environment (as the
    compose override does), the `xattn` CLI with --ca/--token, SIGTERM: exit 0, no secrets
    and no transcript in the server's log."""
    import json
    import subprocess
    import sys

    from test_reliability import ServerProcess

    cert, key = tls_files
    tokens = tmp_path / "tokens"
    tokens.write_text(f"# accepted tokens\n{TOKEN}\n")
    monkeypatch.setenv("XATTN_AUTH_TOKEN_FILE", str(tokens))
    credentials = grpc.ssl_channel_credentials(cert.read_bytes())
    flags = ("--tls-cert", str(cert), "--tls-key", str(key), "--log-level", "DEBUG")
    with ServerProcess(tmp_path, *flags, credentials=credentials) as server:
        with server.channel() as channel:  # health is exempt: _wait_serving sent no token
            stub = transcriber_pb2_grpc.TranscriberStub(channel)
            request = pb.TranscribeRequest(audio=short_pcm())
            with pytest.raises(grpc.RpcError) as err:
                stub.Transcribe(request, timeout=30)
            assert err.value.code() == UNAUTHENTICATED
            assert stub.Transcribe(request, metadata=bearer(TOKEN), timeout=60) is not None
        with grpc.insecure_channel(server.address) as plain:
            with pytest.raises(grpc.RpcError) as err:
                pb_stub = transcriber_pb2_grpc.TranscriberStub(plain)
                pb_stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=5)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        cli = Path(sys.executable).with_name("xattn")
        command = [str(cli), "transcribe", str(jfk_path), "--json", "--ca", str(cert)]
        command += ["--server", f"localhost:{server.address.rsplit(':', 1)[1]}"]
        env = {**os.environ, "XATTN_AUTH_TOKEN": TOKEN}
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        assert "ask not what your country" in json.loads(done.stdout)["text"]
        refused = subprocess.run(
            command[:-2] + ["--server", server.address],
            env={**os.environ, "XATTN_AUTH_TOKEN": "wrong"},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode != 0 and "UNAUTHENTICATED" in refused.stderr
        server.signal()
        assert server.proc.wait(60) == 0
        log = server.output()
    assert "serving" in log.lower()  # the log is there, at DEBUG
    for secret in (TOKEN, "ask not", "Americans"):
        assert secret not in log, f"{secret!r} in the server log"
