"""The filesystem broker a fresh machine uses (no CELERY_BROKER_URL), safe against a process
killed mid-write.

kombu's filesystem transport writes a message file in place: the file exists, empty or half
written, before its bytes do. A reader that lists it in that moment, or after its writer was
SIGKILLed, fails to decode it, and kombu raises that error out of the worker's consumer, which
Celery treats as unrecoverable: every worker that reads the file stops. Here a message is
written under a name no reader matches and renamed into place (a rename is atomic), and a file
that still cannot be decoded (a disk full, a hand-made file) is logged and dropped, as a lost
message: PostgreSQL is the source of truth and the sweeps re-derive lost work
(docs/architecture.md, "Liveness").
"""

from __future__ import annotations

import logging
import os
import uuid
from time import monotonic

from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

logger = logging.getLogger(__name__)

# A message being written: a leading dot, so `_get`, `_size` and `_purge` (which match
# "<stamp>_<id>.<queue>.msg" on the text after the first dot) never see it.
PARTIAL_PREFIX = ".partial-"


class Channel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        name = f"{round(monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        partial = os.path.join(self.data_folder_out, PARTIAL_PREFIX + name)
        try:
            with open(partial, "wb", buffering=0) as f:
                f.write(str_to_bytes(dumps(payload)))
            os.replace(partial, final)
        except OSError as exc:
            raise filesystem.ChannelError(f"Cannot add file {final!r} to directory") from exc

    def _get(self, queue):
        while True:  # each try takes one file off the queue; Empty ends it
            try:
                return super()._get(queue)
            except ValueError as exc:  # JSON or UTF-8 that does not decode: the file is gone
                logger.warning(
                    "dropped a message on queue %s that does not decode (%s); "
                    "the sweeps re-send what it asked for",
                    queue,
                    exc,
                )


class Transport(filesystem.Transport):
    Channel = Channel
