"""The filesystem broker of a fresh machine (taskpilots/fsbroker.py): a message file that does
not decode (its producer was killed mid-write) once stopped every worker that read it; and a
message being written is never visible to a reader."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kombu import Connection

from taskpilots import devenv
from taskpilots.fsbroker import PARTIAL_PREFIX

TRANSPORT = "taskpilots.fsbroker:Transport"
BASE_DIR = Path(__file__).resolve().parents[2]


def _options(root: Path) -> dict:
    folders = devenv.broker_folders(root)
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["queue"]),
        "data_folder_out": str(folders["queue"]),
        "processed_folder": str(folders["processed"]),
        "control_folder": str(folders["control"]),
        "polling_interval": 0.05,
    }


APP = """
from celery import Celery
app = Celery("fsbroker_probe", broker="filesystem://")
app.conf.broker_transport = {transport!r}
app.conf.broker_transport_options = {options!r}
app.conf.task_default_queue = "probe"

@app.task(name="probe.touch")
def touch(path):
    open(path, "w").close()
"""


@pytest.mark.timeout(60)
def test_a_worker_reads_past_a_message_that_does_not_decode(tmp_path):
    options = _options(tmp_path)
    (tmp_path / "probe_app.py").write_text(APP.format(transport=TRANSPORT, options=options))
    queue = Path(options["data_folder_in"])
    # What a producer killed mid-write leaves: a file under a message's name, cut short.
    stamp = round(time.monotonic() * 1000) - 1000
    (queue / f"{stamp}_cut.probe.msg").write_bytes(b'{"body": "eyJh')
    (queue / f"{stamp + 1}_empty.probe.msg").write_bytes(b"")

    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{BASE_DIR}"}
    env.pop("DJANGO_SETTINGS_MODULE", None)  # a bare Celery app: no Django fixup
    send = "from probe_app import touch; touch.delay(%r)"
    marker = tmp_path / "touched"
    subprocess.run([sys.executable, "-c", send % str(marker)], env=env, cwd=tmp_path, check=True)
    argv = ["-m", "celery", "-A", "probe_app", "worker", "-P", "solo", "-l", "warning"]
    worker = subprocess.Popen(
        [sys.executable, *argv],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        alive = worker.poll() is None
    finally:
        worker.terminate()
        output = worker.communicate(timeout=20)[0]
    assert alive, f"the worker stopped:\n{output}"
    assert marker.exists(), f"the message after the bad ones was not run:\n{output}"
    assert output.count("does not decode") == 2, output
    assert not list(queue.glob("*.probe.msg"))


def test_a_message_being_written_is_never_seen_by_a_reader(tmp_path):
    options = _options(tmp_path)
    queue = Path(options["data_folder_in"])
    body = "x" * 4_000_000  # a write long enough for the reader to look in the middle of it
    seen, bad, writing = [], [], threading.Event()

    def read_what_is_visible():
        while writing.is_set():
            for name in os.listdir(queue):
                if name.partition(".")[2] != "big.msg" or name in seen:
                    continue
                try:
                    json.loads((queue / name).read_bytes())
                    seen.append(name)
                except (ValueError, FileNotFoundError) as exc:
                    bad.append(f"{name}: {exc}")

    with Connection("filesystem://", transport=TRANSPORT, transport_options=options) as conn:
        messages = conn.SimpleQueue("big")
        writing.set()
        reader = threading.Thread(target=read_what_is_visible)
        reader.start()
        try:
            for n in range(12):
                messages.put({"n": n, "body": body})
        finally:
            writing.clear()
            reader.join()
        assert not bad, bad[:3]
        assert not [n for n in os.listdir(queue) if n.startswith(PARTIAL_PREFIX)]
        got = [messages.get(timeout=5) for _ in range(12)]
        assert [m.payload["n"] for m in got] == list(range(12))
        messages.close()
