"""Token hygiene, as ssh keeps its keys (memserver/protocol.py's read_token, check_token; launch/job_secret.py): a
token or secret file that group or others can read or write is refused with its mode and the
chmod that fixes it, and so is a token shorter than 16 bytes, from a file or HBMCOLL_TOKEN.
"""
import os
import signal
import subprocess
import sys

import pytest

import hbmcoll
from hbmcoll.memserver import protocol as ms
from test_memserver import ENV, TOKEN, _free_port, write_token


NO_SERVER = ("import hbmcoll\ntry:\n hbmcoll.RemoteBuffer('t', (4,), servers='127.0.0.1:1')\n"
             "except PermissionError as e:\n print(e)")  # the token is refused before any server is asked


def _server(token_file):
    """A server on token_file: (return code, its stderr); one that starts is stopped again."""
    p = subprocess.Popen([sys.executable, "-m", "hbmcoll.memserver", "--listen", f"127.0.0.1:{_free_port()}",
                          "--token-file", str(token_file), "--capacity", "4M"],
                         stderr=subprocess.PIPE, text=True, env=ENV)
    line = p.stderr.readline()
    if " bytes for buffers at " in line:
        p.send_signal(signal.SIGTERM)
    err = line + p.stderr.read()
    return p.wait(timeout=30), err


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o666])
def test_a_token_file_others_can_read_or_write_is_refused(tmp_path, mode):
    path = write_token(tmp_path / "token")
    os.chmod(path, mode)
    with pytest.raises(PermissionError) as e:
        ms.read_token(path)
    text = str(e.value)
    assert f"{mode:04o}" in text and f"chmod 600 {path}" in text, text
    rc, err = _server(path)  # the server refuses to start, in one line
    assert rc != 0 and err.count("\n") == 1 and f"chmod 600 {path}" in err, err
    env = dict({k: v for k, v in ENV.items() if k != "HBMCOLL_TOKEN"}, HBMCOLL_TOKEN_FILE=str(path))
    out = subprocess.run([sys.executable, "-c", NO_SERVER], env=env, capture_output=True, text=True, timeout=60)
    assert "HBMCOLL_TOKEN_FILE" in out.stdout and f"chmod 600 {path}" in out.stdout, (out.stdout, out.stderr)
    os.chmod(path, 0o600)
    assert ms.read_token(path) == TOKEN


@pytest.mark.parametrize("token", ["x", "fifteen-bytes.."])
def test_a_short_token_is_refused(tmp_path, token):
    path = write_token(tmp_path / "token", token)
    with pytest.raises(PermissionError, match="at least 16 bytes"):
        ms.read_token(path)
    rc, err = _server(path)
    assert rc != 0 and err.count("\n") == 1 and "at least 16 bytes" in err, err
    with pytest.raises(PermissionError, match="at least 16 bytes"):
        hbmcoll.RemoteBuffer("t", (4,), servers="127.0.0.1:1", token=token)
    out = subprocess.run([sys.executable, "-c", NO_SERVER], env=dict(ENV, HBMCOLL_TOKEN=token), capture_output=True,
                         text=True, timeout=60)
    assert "HBMCOLL_TOKEN" in out.stdout and "at least 16 bytes" in out.stdout, (out.stdout, out.stderr)


def test_a_rendezvous_file_others_can_read_is_refused(tmp_path, monkeypatch):
    """job_secret.Exchange: the file that hands rank 0's nonce to the other local ranks."""
    from hbmcoll import errors
    from hbmcoll.launch import job_secret
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    rank0, rank1 = job_secret.Exchange("test-key", 0), job_secret.Exchange("test-key", 1)
    nonce = rank0.publish()
    assert rank1.fetch(timeout=5) == nonce
    os.chmod(rank0.path, 0o644)
    with pytest.raises(errors.BootstrapError) as e:
        rank1.fetch(timeout=5)
    assert "0644" in str(e.value) and f"chmod 600 {rank0.path}" in str(e.value), str(e.value)
    os.chmod(rank0.path, 0o600)
    rank0.done()
    assert not os.path.exists(rank0.path)
