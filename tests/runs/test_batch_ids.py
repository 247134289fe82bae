"""Ids taken ahead from a table's sequence (runs.batch.Ids) are never handed out twice, however
many threads of a worker take them at once."""

from __future__ import annotations

import sys
import threading

import pytest
from django.db import connection

from runs.batch import Ids

pytestmark = pytest.mark.django_db(transaction=True)


def test_threads_taking_ids_at_once_never_get_the_same_one():
    ids = Ids("runs_step")
    ids.BLOCK = 3  # small blocks: refills race often
    taken: list[int] = []
    start = threading.Barrier(8)

    def take() -> None:
        try:
            start.wait()
            for _ in range(150):
                taken.append(ids.next())
        finally:
            connection.close()

    threads = [threading.Thread(target=take) for _ in range(8)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads switch between any two bytecodes, nearly
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert len(taken) == 8 * 150
    assert len(set(taken)) == len(taken), "an id was handed out twice"
