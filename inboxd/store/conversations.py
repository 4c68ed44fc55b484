"""SQL for reading conversations: one, a filtered page, search, counts; and marking read."""

from __future__ import annotations

import json
import re
import sqlite3
import unicodedata
from collections.abc import Sequence
from typing import Final

import attrs

from inboxd.errors import NotFound
from inboxd.model import OPEN, Contact, Conversation, Counts, Principal, UserRef
from inboxd.store import events, shards
from inboxd.store.accounts import visible_channel
from inboxd.store.schema import (
    MESSAGE_TOKEN_BASE,
    MESSAGE_TOKEN_MARK,
    MESSAGE_TOKEN_STAND_IN,
    SEARCH_CHANNEL_SHIFT,
    SEARCH_PK_MASK,
    message_shard_table,
)

_SELECT: Final = """
SELECT c.pk, c.id, c.channel_pk, ch.id AS channel_id, ch.type AS channel_type,
       ct.id AS contact_id, ct.phone_number, ct.name AS contact_name, ct.avatar AS contact_avatar,
       c.status, u.id AS assignee_id, u.name AS assignee_name, u.avatar AS assignee_avatar,
       c.is_blocked, c.title, c.tags, c.unread_count, c.last_message_at, c.last_message_preview,
       c.last_message_type, c.last_message_direction, c.last_message_status,
       c.last_customer_message_at, c.sort_at, c.created_at, c.updated_at
FROM conversations c
JOIN channels ch ON ch.pk = c.channel_pk
JOIN contacts ct ON ct.pk = c.contact_pk
LEFT JOIN users u ON u.pk = c.assigned_to_pk
"""


# Conversations with their wire JSON: kept by triggers (schema v11, CONVERSATION_JSON_SQL), so a
# page reads stored text instead of building it; a test holds it to wire.py for every field.
# The stored JSON comes back as its UTF-8 bytes (CAST ... AS BLOB), which go into the response as
# they are. Read as text, Python decodes it into a str and the response encodes it again: the
# same for ASCII, but reading and encoding 50 rows with accented names took twice as long, and
# with emoji (common in chat) ten times; a served list page cost the trio thread about a sixth
# more (bench/HISTORY.md, twelfth session; `bench app` prints both ways for a store's first page).
WIRE_JSON: Final = "CAST(w.json AS BLOB)"
_JSON_SELECT: Final = f"""
SELECT c.pk, c.sort_at, c.channel_pk, {WIRE_JSON}
FROM conversations c JOIN conversation_wire w ON w.pk = c.pk
"""


@attrs.frozen
class JsonRows:
    """Conversations (with contact) already encoded as a JSON array (UTF-8), and the last
    one's cursor key (sort_at, pk)."""

    json: bytes
    last: tuple[int, int] | None


def load_json(conn: sqlite3.Connection, pks: Sequence[int]) -> bytes:
    """Conversations by pk as one JSON array (UTF-8), newest first (search's order)."""
    if not pks:
        return b"[]"
    marks = ",".join("?" * len(pks))
    rows = conn.execute(f"{_JSON_SELECT} WHERE c.pk IN ({marks})", list(pks)).fetchall()
    rows.sort(key=lambda r: (r[1], r[0]), reverse=True)
    return b"[" + b",".join(r[3] for r in rows) + b"]"


def _tuples(conn: sqlite3.Connection) -> sqlite3.Cursor:
    """A cursor whose rows are plain tuples (the connections' ``sqlite3.Row`` costs more)."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return cursor


def _conversation(r: sqlite3.Row) -> Conversation:
    assignee = (
        None
        if r["assignee_id"] is None
        else UserRef(id=r["assignee_id"], name=r["assignee_name"], avatar=r["assignee_avatar"])
    )
    return Conversation(
        pk=r["pk"],
        id=r["id"],
        channel_pk=r["channel_pk"],
        channel_id=r["channel_id"],
        channel_type=r["channel_type"],
        contact=Contact(
            id=r["contact_id"],
            phone_number=r["phone_number"],
            name=r["contact_name"],
            avatar=r["contact_avatar"],
        ),
        status=r["status"],
        assigned_user=assignee,
        is_blocked=bool(r["is_blocked"]),
        title=r["title"],
        tags=tuple(json.loads(r["tags"])),
        unread_count=r["unread_count"],
        last_message_at=r["last_message_at"],
        last_message_preview=r["last_message_preview"],
        last_message_type=r["last_message_type"],
        last_message_direction=r["last_message_direction"],
        last_message_status=r["last_message_status"],
        last_customer_message_at=r["last_customer_message_at"],
        sort_at=r["sort_at"],
        created_at=r["created_at"],
        updated_at=r["updated_at"],
    )


def load(conn: sqlite3.Connection, pks: Sequence[int]) -> list[Conversation]:
    """Conversations by pk, in the order given."""
    if not pks:
        return []
    marks = ",".join("?" * len(pks))
    rows = conn.execute(f"{_SELECT} WHERE c.pk IN ({marks})", list(pks)).fetchall()
    by_pk = {r["pk"]: _conversation(r) for r in rows}
    return [by_pk[pk] for pk in pks if pk in by_pk]


def get(conn: sqlite3.Connection, who: Principal, conversation_id: str) -> Conversation:
    """One conversation the principal can see; NotFound otherwise."""
    row = conn.execute(
        f"{_SELECT} WHERE c.id = ? AND c.account_pk = ?", (conversation_id, who.account_pk)
    ).fetchone()
    if row is None or not who.can_open(row["channel_pk"]):
        raise NotFound(f"conversation {conversation_id} does not exist")
    return _conversation(row)


def locate(conn: sqlite3.Connection, who: Principal, conversation_id: str) -> tuple[int, str, str]:
    """The pk, id and channel id of one conversation the principal can see (what a history page
    needs of it); NotFound otherwise, as ``get``."""
    row = conn.execute(
        "SELECT c.pk, c.channel_pk, c.id, ch.id FROM conversations c"
        " JOIN channels ch ON ch.pk = c.channel_pk WHERE c.id = ? AND c.account_pk = ?",
        (conversation_id, who.account_pk),
    ).fetchone()
    if row is None or not who.can_open(row[1]):
        raise NotFound(f"conversation {conversation_id} does not exist")
    return int(row[0]), str(row[2]), str(row[3])


def get_json(conn: sqlite3.Connection, who: Principal, conversation_id: str) -> bytes:
    """``get``, already encoded for the wire (what the API serves), as UTF-8."""
    row = conn.execute(
        f"{_JSON_SELECT} WHERE c.id = ? AND c.account_pk = ?", (conversation_id, who.account_pk)
    ).fetchone()
    if row is None or not who.can_open(row[2]):
        raise NotFound(f"conversation {conversation_id} does not exist")
    return bytes(row[3])


# -- the list ------------------------------------------------------------------------------------

TABS: Final = ("mine_open", "unassigned", "all")


@attrs.frozen
class ListQuery:
    limit: int
    cursor: tuple[int, int] | None = None
    channel_id: str | None = None
    status: str | None = None
    unread: bool = False
    tab: str = "all"
    assignee_id: str | None = None


def _scope(
    conn: sqlite3.Connection, who: Principal, channel_id: str | None
) -> tuple[list[str], list[object]] | None:
    """WHERE terms limiting conversations to what the principal may see (None: nothing)."""
    if channel_id is not None:
        return ["c.channel_pk = ?"], [visible_channel(conn, who, channel_id).pk]
    if who.channel_pks is None:
        return ["c.account_pk = ?"], [who.account_pk]
    if not who.channel_pks:
        return None
    pks = sorted(who.channel_pks)
    return [f"c.channel_pk IN ({','.join('?' * len(pks))})"], list(pks)


def _page_keys_sql(
    conn: sqlite3.Connection, who: Principal, q: ListQuery
) -> tuple[str, list[object]] | None:
    """The query of a page's keys, up to ``q.limit + 1`` (sort_at, pk) in order (one more tells
    whether more follow), and its parameters; None when the page is empty. It walks a sort
    index: the sort key comes with each pk."""
    scope = _scope(conn, who, q.channel_id)
    if scope is None:
        return None
    where, params = scope
    if q.status is not None:
        where.append("c.status = ?")
        params.append(q.status)
    if q.unread:
        where.append("c.unread_count > 0")
    if q.tab == "mine_open":
        where += ["c.status = ?", "c.assigned_to_pk = ?"]
        params += [OPEN, who.user_pk]
    elif q.tab == "unassigned":
        where += ["c.status = ?", "c.assigned_to_pk IS NULL"]
        params.append(OPEN)
    if q.assignee_id is not None:
        row = conn.execute(
            "SELECT pk FROM users WHERE id = ? AND account_pk = ?", (q.assignee_id, who.account_pk)
        ).fetchone()
        if row is None:
            return None
        where.append("c.assigned_to_pk = ?")
        params.append(row["pk"])
    if q.cursor is not None:
        where.append("(c.sort_at, c.pk) < (?, ?)")
        params += list(q.cursor)
    params.append(q.limit + 1)
    return (
        f"SELECT c.sort_at, c.pk FROM conversations c WHERE {' AND '.join(where)}"
        " ORDER BY c.sort_at DESC, c.pk DESC LIMIT ?",
        params,
    )


@attrs.frozen
class JsonPage:
    rows: JsonRows
    has_more: bool


def list_page_json(conn: sqlite3.Connection, who: Principal, q: ListQuery) -> JsonPage:
    """A page of conversations, newest lastMessageAt (else createdAt) first, encoded for the
    wire."""
    query = _page_keys_sql(conn, who, q)
    if query is None:
        return JsonPage(rows=JsonRows(json=b"[]", last=None), has_more=False)
    keys_sql, params = query
    # One statement: the keys' query runs as a co-routine and each of its rows is joined to its
    # stored JSON as it comes (the LEFT JOIN keeps the keys the outer loop). Against the keys
    # and then one IN (...) lookup of their JSON, mapped back to their order in Python, this
    # saves a statement, the IN list's sorting and the mapping: 100.3 -> 70.4 us for the first
    # page of 50 on the 10M-message store (`bench app` prints both).
    rows: list[tuple[int, int, bytes | None]] = (
        _tuples(conn)
        .execute(
            f"SELECT k.sort_at, k.pk, {WIRE_JSON} FROM ({keys_sql}) k"
            " LEFT JOIN conversation_wire w ON w.pk = k.pk",
            params,
        )
        .fetchall()
    )
    # SQLite returns them in the keys' order (its plan for this shape); the order is the
    # API's contract, so it does not rest on the plan. Already in order, this costs ~3 us.
    rows.sort(reverse=True)
    page = rows[: q.limit]
    return JsonPage(
        rows=JsonRows(
            json=b"[" + b",".join([r[2] for r in page if r[2] is not None]) + b"]",
            last=(page[-1][0], page[-1][1]) if page else None,
        ),
        has_more=len(rows) > q.limit,
    )


# -- search --------------------------------------------------------------------------------------

MIN_QUERY_LEN: Final = 3
_PHONE_LIKE: Final = re.compile(r"^[0-9 +()\-.]+$")


@attrs.frozen
class SearchResult:
    """Both lists encoded for the wire, newest first."""

    contacts: bytes
    messages: bytes


# The trigram indexes drive each search, newest first; CROSS JOIN keeps SQLite from looping over
# the channel's rows and probing the index once per row. The caller stops reading once it has a
# page, so a common word costs what a page costs, in a small channel as in a large one. Each
# indexed text (a message's, a contact's name and phone number) opens with its channel's token,
# and each row's rowid starts with its channel (schema v17 for messages, v19 for contacts): a
# search asks for the text NEAR that token in the channel's range of rowids, so FTS5 walks the
# text's trigrams and the token together inside the channel's part of the index, and a phrase
# that matches nothing costs what the channel holds, not what the store holds. A channel's
# rowids count down from its newest row (schema v18, v19), so FTS5 reads newest first forwards,
# its faster direction (it reads a list backwards by decoding each page forwards first).
CONTACT_MATCHES_SQL: Final = (
    "SELECT c.pk FROM contacts_fts f"
    f" CROSS JOIN contacts ct ON ct.pk = {SEARCH_PK_MASK} - (f.rowid & {SEARCH_PK_MASK})"
    " CROSS JOIN conversations c ON c.contact_pk = ct.pk"
    " WHERE contacts_fts MATCH ? AND f.rowid BETWEEN ? AND ? AND ct.channel_pk = ?"
    " ORDER BY f.rowid"
)
MESSAGE_MATCHES_SQL: Final = (
    "SELECT m.conversation_pk FROM messages_fts f"
    f" CROSS JOIN messages m ON m.pk = {SEARCH_PK_MASK} - (f.rowid & {SEARCH_PK_MASK})"
    " WHERE messages_fts MATCH ? AND f.rowid BETWEEN ? AND ? AND m.channel_pk = ?"
    " ORDER BY f.rowid"
)


def shard_matches_sql(channel_pk: int) -> str:
    """MESSAGE_MATCHES_SQL for a channel with a message index of its own (store/shards.py):
    the text alone, no token, no range (the index holds the channel's messages alone)."""
    table = message_shard_table(channel_pk)
    return (
        f"SELECT m.conversation_pk FROM {table} f"
        f" CROSS JOIN messages m ON m.pk = {SEARCH_PK_MASK} - (f.rowid & {SEARCH_PK_MASK})"
        f" WHERE {table} MATCH ? AND m.channel_pk = ?"
        " ORDER BY f.rowid"
    )


# NEAR's reach, in trigrams: any distance between the token and the text's match.
_ANYWHERE: Final = 2**31 - 1


def search_range(channel_pk: int) -> tuple[int, int]:
    """The first and last rowid of a channel's rows in messages_fts and contacts_fts."""
    first = channel_pk << SEARCH_CHANNEL_SHIFT
    return first, first | SEARCH_PK_MASK


def search_token(channel_pk: int) -> str:
    """The channel's token opening each of its texts in the search indexes
    (schema.MESSAGE_TOKEN_SQL, in Python)."""
    return (
        chr(MESSAGE_TOKEN_MARK)
        + chr(MESSAGE_TOKEN_BASE + (channel_pk >> 12))
        + chr(MESSAGE_TOKEN_BASE + (channel_pk & 4095))
    )


def _holds_token_characters(text: str) -> bool:
    """Whether ``text`` has the tokens' mark or its stand-in (schema.MESSAGE_TOKEN_MARK)."""
    return chr(MESSAGE_TOKEN_MARK) in text or chr(MESSAGE_TOKEN_STAND_IN) in text


def _near_token(phrases: list[str], token: str, column: str = "") -> str:
    """Any of ``phrases`` NEAR the channel's token, in ``column`` if given (FTS5's syntax)."""
    where = f"{column} : " if column else ""
    return " OR ".join(f"{where}NEAR({phrase} {token}, {_ANYWHERE})" for phrase in phrases)


# The fewest rows asked of SQLite at once (Python's per-call cost).
_MIN_FETCH: Final = 16


def _first_distinct(
    conn: sqlite3.Connection, sql: str, params: tuple[object, ...], limit: int, skip: set[int]
) -> list[int]:
    """The first ``limit`` distinct conversation pks the query yields, leaving out ``skip``;
    reads only as many rows as that takes.

    Each fetch asks for as many rows as pks are still missing: SQLite makes every row it is
    asked for, and in a small channel a row of a common phrase can cost ~100 us of seeking
    through the trigram index. Fetching 256 at a time made five times the rows a page needed
    (the smallest channel's p99 was 45-53 ms)."""
    found: dict[int, None] = {}
    cursor = conn.execute(sql, params)
    while len(found) < limit:
        rows = cursor.fetchmany(max(limit - len(found), _MIN_FETCH))
        if not rows:
            break
        for (pk,) in rows:
            if pk not in skip:
                found[pk] = None
                if len(found) == limit:
                    break
    cursor.close()
    return list(found)


def _phrase(text: str) -> str:
    """An FTS5 phrase: with the trigram tokenizer, a case-insensitive substring match."""
    return '"' + text.replace('"', '""') + '"'


def _any_form(typed: str) -> tuple[int, list[str]]:
    """The query's forms to search for: as typed, composed (NFC) and decomposed (NFD), each
    once; and its length in characters (composed). An "é" may be stored as one code point (what
    most keyboards send) or as "e" and a combining accent (what some systems send), and the
    trigram index compares code points: text in either form is found by a query typed in
    either. Only text mixing the two forms inside the matched part is not. The form as typed
    stays: some text is in neither (characters NFC replaces, such as U+095B in Hindi, or CJK
    compatibility ideographs) and must still find itself. The index holds the text as it came
    (messages are stored exactly as sent), so the query carries the normalisation: nothing to
    rebuild, nothing added to a write."""
    composed = unicodedata.normalize("NFC", typed)
    forms = [
        form
        for form in dict.fromkeys([typed, composed, unicodedata.normalize("NFD", typed)])
        if len(form) >= MIN_QUERY_LEN  # (a shorter phrase would match nothing)
    ]
    return len(composed), forms


def search(
    conn: sqlite3.Connection, who: Principal, channel_id: str, query: str, limit: int
) -> SearchResult:
    """Conversations of one channel whose contact (name, phone digits) or message text matches.

    Each list holds up to ``limit`` conversations with the most recent matches (newest contacts,
    newest matching messages), ordered newest first by lastMessageAt. A conversation in the
    contacts list is not repeated among the message matches. Both go through trigram indexes and
    stop reading once they have their page, never a scan of the channel's rows.
    """
    channel = visible_channel(conn, who, channel_id)
    text = query.strip()
    length, forms = _any_form(text)
    # (A query holding the tokens' mark or its stand-in could match what opens a text.)
    if length < MIN_QUERY_LEN or not forms or _holds_token_characters(text):
        return SearchResult(contacts=load_json(conn, []), messages=load_json(conn, []))
    token = _phrase(search_token(channel.pk))
    in_channel = (*search_range(channel.pk), channel.pk)
    phrases = [_phrase(form) for form in forms]
    contact_match = _near_token(phrases, token, "name")
    digits = re.sub(r"[^0-9]", "", text)
    if _PHONE_LIKE.match(text) and len(digits) >= MIN_QUERY_LEN:
        contact_match += " OR " + _near_token([_phrase(digits)], token, "phone_number")
    contact_pks = _first_distinct(
        conn, CONTACT_MATCHES_SQL, (contact_match, *in_channel), limit, set()
    )
    if shards.has_ready_shard(conn, channel.pk):
        message_sql = shard_matches_sql(channel.pk)
        message_params: tuple[object, ...] = (" OR ".join(phrases), channel.pk)
    else:
        message_sql = MESSAGE_MATCHES_SQL
        message_params = (_near_token(phrases, token), *in_channel)
    message_pks = _first_distinct(conn, message_sql, message_params, limit, set(contact_pks))
    return SearchResult(
        contacts=load_json(conn, contact_pks),
        messages=load_json(conn, message_pks),
    )


# -- counts --------------------------------------------------------------------------------------


def counts(conn: sqlite3.Connection, who: Principal, channel_id: str | None) -> Counts:
    """mine_open, unassigned and all, read from the trigger-maintained counters: per account for
    a key that sees the whole account (schema v10), else per channel it can open."""
    if channel_id is None and who.channel_pks is None:
        row = conn.execute(
            "SELECT"
            " (SELECT n FROM account_conversation_counts"
            "   WHERE account_pk = ?1 AND status = ?2 AND assignee_pk = ?3),"
            " (SELECT n FROM account_conversation_counts"
            "   WHERE account_pk = ?1 AND status = ?2 AND assignee_pk = 0),"
            " (SELECT n FROM account_conversation_totals WHERE account_pk = ?1)",
            (who.account_pk, OPEN, who.user_pk),
        ).fetchone()
        return Counts(mine_open=row[0] or 0, unassigned=row[1] or 0, all=row[2] or 0)
    if channel_id is not None:
        channel_pks = [visible_channel(conn, who, channel_id).pk]
    else:
        channel_pks = sorted(who.channel_pks or ())
    if not channel_pks:
        return Counts(mine_open=0, unassigned=0, all=0)
    marks = ",".join("?" * len(channel_pks))
    # One point lookup per channel for each figure (see schema v7 for the totals).
    row = conn.execute(
        "SELECT"
        " (SELECT coalesce(sum(n), 0) FROM conversation_counts"
        f"   WHERE channel_pk IN ({marks}) AND status = ? AND assignee_pk = ?),"
        " (SELECT coalesce(sum(n), 0) FROM conversation_counts"
        f"   WHERE channel_pk IN ({marks}) AND status = ? AND assignee_pk = 0),"
        " (SELECT coalesce(sum(n), 0) FROM channel_conversation_totals"
        f"   WHERE channel_pk IN ({marks}))",
        [*channel_pks, OPEN, who.user_pk, *channel_pks, OPEN, *channel_pks],
    ).fetchone()
    return Counts(mine_open=row[0], unassigned=row[1], all=row[2])


# -- writes --------------------------------------------------------------------------------------


def mark_read(
    conn: sqlite3.Connection, who: Principal, conversation_id: str, now: int
) -> Conversation:
    """Clear the unread counter; journal ``inbox.conversation.read`` when it changed anything."""
    conversation = get(conn, who, conversation_id)
    if conversation.unread_count == 0:
        return conversation
    conn.execute(
        "UPDATE conversations SET unread_count = 0, updated_at = ? WHERE pk = ?",
        (now, conversation.pk),
    )
    events.append(
        conn,
        who.account_pk,
        conversation.channel_pk,
        events.CONVERSATION_READ,
        {
            "conversationId": conversation.id,
            "channelId": conversation.channel_id,
            "actorUserId": who.user_id,
        },
        now,
    )
    return attrs.evolve(conversation, unread_count=0, updated_at=now)
