"""A publisher that stops in the middle of its upload, for the claim tests to kill (``kill -9``).

``python -m tests.storage.publish_worker SRC URI READY``: runs ``g2rpo storage put SRC URI`` with the
real store, except that after its first file is uploaded it writes READY and waits forever before the
next one — the one fault point, here rather than in the library.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from g2rpo.artifacts import storage
from g2rpo.cli import main


def _stop_after_the_first_file(ready: Path) -> None:
    for cls in (storage.S3Store, storage.FileStore):
        real = cls.put_file

        def put_file(self, key, path, *, callback=None, real=real):
            real(self, key, path, callback=callback)
            ready.write_text(key)
            while True:
                time.sleep(60)

        cls.put_file = put_file


if __name__ == "__main__":
    source, dest, ready = sys.argv[1:]
    _stop_after_the_first_file(Path(ready))
    sys.exit(main(["storage", "put", source, dest]))
