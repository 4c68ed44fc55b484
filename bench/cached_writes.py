"""``inboxd`` whose renames cost the store nothing: for ``bench bound`` only.

Run as ``python -m bench.cached_writes serve ...``: the daemon as usual, except that a rename
(``Store.write`` of ``actions.RENAME_ANSWERED``, as the title route calls it) returns what a
conversation's first rename returned, without touching the store. Everything else a title write does (HTTP, the body, the key, the
answer) is unchanged, so this daemon shows what a write would cost with its store work gone.
"""

from __future__ import annotations

import sys
from typing import Any

import trio

from inboxd.cli import main
from inboxd.store import actions
from inboxd.store.db import Store

_real_write = Store.write
_rows: dict[str, Any] = {}


async def _write(self: Store, fn: Any, *args: Any) -> Any:
    if fn is not actions.RENAME_ANSWERED:
        return await _real_write(self, fn, *args)
    conversation = args[1]  # rename(conn, principal, conversation_id, title, now)
    row = _rows.get(conversation)
    if row is None:
        row = _rows[conversation] = await _real_write(self, fn, *args)
    else:
        await trio.lowlevel.checkpoint()  # a write always yields to the loop
    return row


Store.write = _write  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
