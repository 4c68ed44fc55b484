"""The store's schema, as forward-only migrations.

``PRAGMA user_version`` holds how many migrations a store has had. ``serve`` and ``init`` apply the
missing ones in one transaction each; a store whose version is higher than ``len(MIGRATIONS)`` was
written by a newer inboxd and is refused (CONTRACT section 9).

Conventions:
- Every table has an integer ``pk`` (the rowid, used in joins and as the pagination tie-breaker) and,
  where the API names rows, a public opaque ``id``.
- Every row carries ``account_pk`` directly or through its channel, so a query always starts from
  the caller's account and never sees another account's rows.
- Instants are integer microseconds since the Unix epoch, UTC.
"""

from __future__ import annotations

from typing import Final

_V1: Final = """
CREATE TABLE accounts (
    pk          INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    name        TEXT NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE users (
    pk          INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    account_pk  INTEGER NOT NULL REFERENCES accounts(pk),
    -- Operators are account members; the owner has no member id.
    member_id   TEXT UNIQUE,
    email       TEXT NOT NULL,
    name        TEXT NOT NULL,
    avatar      TEXT,
    role        TEXT NOT NULL CHECK (role IN ('OWNER', 'OPERATOR')),
    created_at  INTEGER NOT NULL,
    -- A removed member keeps its row so that old SYSTEM messages still name their author.
    removed_at  INTEGER
);
CREATE UNIQUE INDEX users_email ON users(account_pk, email COLLATE NOCASE) WHERE removed_at IS NULL;

CREATE TABLE channels (
    pk          INTEGER PRIMARY KEY,
    id          TEXT NOT NULL UNIQUE,
    account_pk  INTEGER NOT NULL REFERENCES accounts(pk),
    name        TEXT NOT NULL,
    type        TEXT NOT NULL,
    status      TEXT NOT NULL DEFAULT 'ACTIVE',
    created_at  INTEGER NOT NULL
);
CREATE INDEX channels_account ON channels(account_pk, pk);

-- Which channels an operator can open. The owner opens every channel and has no rows here.
CREATE TABLE channel_access (
    user_pk     INTEGER NOT NULL REFERENCES users(pk),
    channel_pk  INTEGER NOT NULL REFERENCES channels(pk),
    PRIMARY KEY (user_pk, channel_pk)
) WITHOUT ROWID;
CREATE INDEX channel_access_channel ON channel_access(channel_pk, user_pk);

CREATE TABLE api_keys (
    pk            INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    account_pk    INTEGER NOT NULL REFERENCES accounts(pk),
    user_pk       INTEGER NOT NULL REFERENCES users(pk),
    -- SHA-256 of the key; the key itself is never stored.
    hash          BLOB NOT NULL UNIQUE,
    prefix        TEXT NOT NULL,
    created_at    INTEGER NOT NULL,
    last_used_at  INTEGER,
    revoked_at    INTEGER
);
CREATE INDEX api_keys_user ON api_keys(user_pk, pk);

CREATE TABLE contacts (
    pk            INTEGER PRIMARY KEY,
    id            TEXT NOT NULL UNIQUE,
    account_pk    INTEGER NOT NULL REFERENCES accounts(pk),
    channel_pk    INTEGER NOT NULL REFERENCES channels(pk),
    phone_number  TEXT NOT NULL,
    name          TEXT NOT NULL,
    avatar        TEXT NOT NULL DEFAULT '',
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    UNIQUE (channel_pk, phone_number)
);

CREATE TABLE conversations (
    pk                        INTEGER PRIMARY KEY,
    id                        TEXT NOT NULL UNIQUE,
    account_pk                INTEGER NOT NULL REFERENCES accounts(pk),
    channel_pk                INTEGER NOT NULL REFERENCES channels(pk),
    contact_pk                INTEGER NOT NULL UNIQUE REFERENCES contacts(pk),
    status                    TEXT NOT NULL
        CHECK (status IN ('OPEN', 'CLOSED', 'ASSIGNED', 'RESOLVED', 'BLOCKED')),
    assigned_to_pk            INTEGER REFERENCES users(pk),
    is_blocked                INTEGER NOT NULL DEFAULT 0,
    title                     TEXT,
    tags                      TEXT NOT NULL DEFAULT '[]',
    unread_count              INTEGER NOT NULL DEFAULT 0,
    last_message_pk           INTEGER,
    last_message_at           INTEGER,
    last_message_preview      TEXT,
    last_message_type         TEXT,
    last_message_direction    TEXT,
    last_message_status       TEXT,
    last_customer_message_at  INTEGER,
    -- The list order: lastMessageAt, or createdAt for a conversation with no message yet.
    sort_at                   INTEGER NOT NULL,
    created_at                INTEGER NOT NULL,
    updated_at                INTEGER NOT NULL
);
CREATE INDEX conversations_account_sort ON conversations(account_pk, sort_at, pk);
CREATE INDEX conversations_channel_sort ON conversations(channel_pk, sort_at, pk);
CREATE INDEX conversations_channel_status_sort ON conversations(channel_pk, status, sort_at, pk);
CREATE INDEX conversations_assignee_sort
    ON conversations(assigned_to_pk, status, sort_at, pk) WHERE assigned_to_pk IS NOT NULL;
CREATE INDEX conversations_unread_sort
    ON conversations(channel_pk, sort_at, pk) WHERE unread_count > 0;

-- Counters kept by triggers, so /conversations/counts reads a handful of rows however large the
-- store is. assignee_pk is 0 for "nobody".
CREATE TABLE conversation_counts (
    channel_pk   INTEGER NOT NULL,
    status       TEXT NOT NULL,
    assignee_pk  INTEGER NOT NULL,
    n            INTEGER NOT NULL,
    PRIMARY KEY (channel_pk, status, assignee_pk)
) WITHOUT ROWID;

CREATE TRIGGER conversations_count_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO conversation_counts VALUES
        (new.channel_pk, new.status, coalesce(new.assigned_to_pk, 0), 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conversations_count_update
AFTER UPDATE OF channel_pk, status, assigned_to_pk ON conversations
WHEN old.channel_pk IS NOT new.channel_pk OR old.status IS NOT new.status
    OR old.assigned_to_pk IS NOT new.assigned_to_pk
BEGIN
    UPDATE conversation_counts SET n = n - 1
        WHERE channel_pk = old.channel_pk AND status = old.status
          AND assignee_pk = coalesce(old.assigned_to_pk, 0);
    INSERT INTO conversation_counts VALUES
        (new.channel_pk, new.status, coalesce(new.assigned_to_pk, 0), 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conversations_count_delete AFTER DELETE ON conversations BEGIN
    UPDATE conversation_counts SET n = n - 1
        WHERE channel_pk = old.channel_pk AND status = old.status
          AND assignee_pk = coalesce(old.assigned_to_pk, 0);
END;

CREATE TABLE messages (
    pk                            INTEGER PRIMARY KEY,
    id                            TEXT NOT NULL UNIQUE,
    account_pk                    INTEGER NOT NULL REFERENCES accounts(pk),
    conversation_pk               INTEGER NOT NULL REFERENCES conversations(pk),
    channel_pk                    INTEGER NOT NULL REFERENCES channels(pk),
    direction                     TEXT NOT NULL CHECK (direction IN ('INBOUND', 'OUTBOUND')),
    type                          TEXT NOT NULL,
    is_system                     INTEGER NOT NULL,
    content                       TEXT,
    media_url                     TEXT,
    media_type                    TEXT,
    file_name                     TEXT,
    file_size                     INTEGER,
    media_duration                REAL,
    thumbnail_url                 TEXT,
    template_name                 TEXT,
    template_language             TEXT,
    status                        TEXT,
    external_id                   TEXT,
    sent_at                       INTEGER,
    delivered_at                  INTEGER,
    read_at                       INTEGER,
    created_at                    INTEGER NOT NULL,
    system_event_source           TEXT,
    system_event_operator_name    TEXT,
    system_event_operator_email   TEXT,
    -- JSON {kind, actor, target} with user references as they were when the row was written.
    assignment_event              TEXT,
    author_user_pk                INTEGER REFERENCES users(pk),
    quoted_message_pk             INTEGER REFERENCES messages(pk),
    latitude                      REAL,
    longitude                     REAL
);
CREATE INDEX messages_history ON messages(conversation_pk, created_at, pk);
CREATE INDEX messages_history_kind ON messages(conversation_pk, is_system, created_at, pk);
CREATE UNIQUE INDEX messages_external_id
    ON messages(channel_pk, external_id) WHERE external_id IS NOT NULL;

-- Message-text search: a trigram index (substring match, case-insensitive) over the text of
-- non-SYSTEM messages. Contentless: the text lives once, in messages; the index gives rowids.
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='', tokenize='trigram');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN new.is_system = 0 AND new.content IS NOT NULL AND new.content <> '' BEGIN
    INSERT INTO messages_fts(rowid, content) VALUES (new.pk, new.content);
END;

-- Contact search by name and phone digits: trigram index kept in step with contacts.
CREATE VIRTUAL TABLE contacts_fts USING fts5(
    name, phone_number, content='contacts', content_rowid='pk', tokenize='trigram'
);
CREATE TRIGGER contacts_fts_insert AFTER INSERT ON contacts BEGIN
    INSERT INTO contacts_fts(rowid, name, phone_number)
        VALUES (new.pk, new.name, new.phone_number);
END;
CREATE TRIGGER contacts_fts_update AFTER UPDATE OF name, phone_number ON contacts BEGIN
    INSERT INTO contacts_fts(contacts_fts, rowid, name, phone_number)
        VALUES ('delete', old.pk, old.name, old.phone_number);
    INSERT INTO contacts_fts(rowid, name, phone_number)
        VALUES (new.pk, new.name, new.phone_number);
END;

-- The event journal: every change appends here in the transaction that makes it. seq is the
-- commit order; body is the webhook envelope serialised once, and those exact bytes are what
-- every later delivery sends (CONTRACT section 6).
CREATE TABLE events (
    seq          INTEGER PRIMARY KEY AUTOINCREMENT,
    id           TEXT NOT NULL UNIQUE,
    account_pk   INTEGER NOT NULL REFERENCES accounts(pk),
    channel_pk   INTEGER REFERENCES channels(pk),
    type         TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    body         BLOB NOT NULL
);
CREATE INDEX events_account ON events(account_pk, seq);
CREATE INDEX events_created ON events(created_at);
"""

_V2: Final = """
-- The inbox webhook: one URL per account (spec endpoints 13-16).
CREATE TABLE inbox_webhooks (
    account_pk            INTEGER PRIMARY KEY REFERENCES accounts(pk),
    url                   TEXT NOT NULL,
    -- Kept for signing; returned only by the response that creates or rotates it.
    secret                TEXT NOT NULL,
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    -- Every webhook event with seq <= delivered_seq is delivered or given up. Set to the journal's
    -- end when the webhook is created: events from before it are never sent.
    delivered_seq         INTEGER NOT NULL,
    last_delivery_at      INTEGER,
    last_delivery_status  INTEGER,
    last_delivery_error   TEXT
);

-- The events the inbox webhook delivers (keep in step with events.WEBHOOK_TYPES_SQL).
CREATE INDEX events_webhook ON events(account_pk, seq)
    WHERE type NOT LIKE 'inbox.message.%' AND type <> 'inbox.conversation.read';

-- Every delivery attempt, for GET /webhook/deliveries.
CREATE TABLE webhook_deliveries (
    pk           INTEGER PRIMARY KEY,
    account_pk   INTEGER NOT NULL REFERENCES accounts(pk),
    event_seq    INTEGER NOT NULL REFERENCES events(seq),
    delivery_id  TEXT NOT NULL,
    attempt      INTEGER NOT NULL,
    -- delivered, failed (will retry) or given_up (the last retry failed)
    outcome      TEXT NOT NULL,
    status       INTEGER,
    error        TEXT,
    duration_ms  REAL NOT NULL,
    at           INTEGER NOT NULL
);
CREATE INDEX webhook_deliveries_account ON webhook_deliveries(account_pk, at, pk);

-- Events queued again by POST /webhook/deliveries/{eventId}/redeliver.
CREATE TABLE webhook_redeliveries (
    pk            INTEGER PRIMARY KEY,
    account_pk    INTEGER NOT NULL REFERENCES accounts(pk),
    event_seq     INTEGER NOT NULL REFERENCES events(seq),
    requested_at  INTEGER NOT NULL
);
CREATE INDEX webhook_redeliveries_account ON webhook_redeliveries(account_pk, pk);
"""

_V3: Final = """
-- Team invites (CONTRACT section 6). The token is mailed to the invitee and stored as a hash.
CREATE TABLE invites (
    pk             INTEGER PRIMARY KEY,
    id             TEXT NOT NULL UNIQUE,
    account_pk     INTEGER NOT NULL REFERENCES accounts(pk),
    email          TEXT NOT NULL,
    channel_ids    TEXT NOT NULL,  -- JSON array of channel ids
    token_hash     BLOB NOT NULL UNIQUE,
    invited_by_pk  INTEGER NOT NULL REFERENCES users(pk),
    created_at     INTEGER NOT NULL,
    expires_at     INTEGER NOT NULL,
    accepted_at    INTEGER,
    revoked_at     INTEGER,
    user_pk        INTEGER REFERENCES users(pk)
);
CREATE INDEX invites_account ON invites(account_pk, pk);

-- Mail waiting to be sent: queued in the transaction that decides to send it, sent after commit,
-- marked sent afterwards (exactly one mail per decision, also across a crash).
CREATE TABLE mail_outbox (
    pk           INTEGER PRIMARY KEY,
    account_pk   INTEGER NOT NULL REFERENCES accounts(pk),
    to_addr      TEXT NOT NULL,
    subject      TEXT NOT NULL,
    body         TEXT NOT NULL,
    headers      TEXT NOT NULL DEFAULT '{}',  -- JSON object of extra headers
    created_at   INTEGER NOT NULL,
    sent_at      INTEGER,
    attempts     INTEGER NOT NULL DEFAULT 0,
    last_error   TEXT
);
CREATE INDEX mail_outbox_pending ON mail_outbox(pk) WHERE sent_at IS NULL;

-- Idempotency-Key records (CONTRACT section 6): the first response to a key, for 24 h.
CREATE TABLE idempotency_keys (
    user_pk      INTEGER NOT NULL REFERENCES users(pk),
    key          TEXT NOT NULL,
    fingerprint  BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    status       INTEGER,           -- NULL while the first request is still running
    body         BLOB,
    PRIMARY KEY (user_pk, key)
) WITHOUT ROWID;
CREATE INDEX idempotency_keys_created ON idempotency_keys(created_at);
"""

_V4: Final = """
-- Channel webhooks (CONTRACT section 7). Messaging events are marked for them when journaled.
ALTER TABLE events ADD COLUMN for_channel_webhooks INTEGER NOT NULL DEFAULT 0;
CREATE INDEX events_channel_webhooks ON events(channel_pk, seq) WHERE for_channel_webhooks = 1;

CREATE TABLE channel_webhook_settings (
    channel_pk         INTEGER PRIMARY KEY REFERENCES channels(pk),
    -- Signs every delivery of the channel; returned only by the response that creates it.
    secret             TEXT NOT NULL,
    notify_email       INTEGER NOT NULL DEFAULT 1,
    unsubscribe_token  TEXT NOT NULL,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL
);

-- One row per URL: its place in the list, its delivery state, and its cursor into the journal.
-- Every deadline is a wall-clock time, so a restart resumes each URL where it was.
CREATE TABLE channel_webhook_urls (
    pk                INTEGER PRIMARY KEY,
    channel_pk        INTEGER NOT NULL REFERENCES channels(pk),
    url               TEXT NOT NULL,
    position          INTEGER NOT NULL,
    -- Bumped when the URL is saved again (re-enabled): a supervisor's stale writes are dropped.
    generation        INTEGER NOT NULL DEFAULT 0,
    state             TEXT NOT NULL CHECK (state IN ('delivering', 'paused', 'disabled')),
    failure_count     INTEGER NOT NULL DEFAULT 0,
    first_failure_at  INTEGER,
    last_failure_at   INTEGER,
    last_status       INTEGER,
    last_error        TEXT,
    last_success_at   INTEGER,
    warned            INTEGER NOT NULL DEFAULT 0,
    paused_at         INTEGER,
    next_probe_at     INTEGER,
    probes_done       INTEGER NOT NULL DEFAULT 0,
    disabled_at       INTEGER,
    next_attempt_at   INTEGER,
    -- Every channel webhook event with seq <= delivered_seq is done for this URL.
    delivered_seq     INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    UNIQUE (channel_pk, url)
);
"""

_V5: Final = """
-- Account-wide filters (no channelId) walk an index that holds only matching rows, instead of
-- filtering the whole account's list row by row.
CREATE INDEX conversations_account_status_sort ON conversations(account_pk, status, sort_at, pk);
CREATE INDEX conversations_account_unassigned_sort
    ON conversations(account_pk, status, sort_at, pk) WHERE assigned_to_pk IS NULL;
CREATE INDEX conversations_account_unread_sort
    ON conversations(account_pk, sort_at, pk) WHERE unread_count > 0;
CREATE INDEX conversations_channel_unassigned_sort
    ON conversations(channel_pk, status, sort_at, pk) WHERE assigned_to_pk IS NULL;
"""

_V6: Final = """
-- A counter that moves whenever anything a key's principal is made of changes (a key revoked, a
-- user's role or membership, channel access). The daemon caches principals per key and asks this
-- one row, not every key, when something has committed (api/app.py KeyCache).
CREATE TABLE auth_epoch (only INTEGER PRIMARY KEY CHECK (only = 1), n INTEGER NOT NULL);
INSERT INTO auth_epoch VALUES (1, 0);
CREATE TRIGGER auth_epoch_key_update AFTER UPDATE OF revoked_at, user_pk, hash, account_pk
    ON api_keys BEGIN UPDATE auth_epoch SET n = n + 1; END;
CREATE TRIGGER auth_epoch_key_delete AFTER DELETE ON api_keys
    BEGIN UPDATE auth_epoch SET n = n + 1; END;
CREATE TRIGGER auth_epoch_user_update AFTER UPDATE OF id, role, removed_at, account_pk ON users
    BEGIN UPDATE auth_epoch SET n = n + 1; END;
CREATE TRIGGER auth_epoch_user_delete AFTER DELETE ON users
    BEGIN UPDATE auth_epoch SET n = n + 1; END;
CREATE TRIGGER auth_epoch_access_insert AFTER INSERT ON channel_access
    BEGIN UPDATE auth_epoch SET n = n + 1; END;
CREATE TRIGGER auth_epoch_access_update AFTER UPDATE ON channel_access
    BEGIN UPDATE auth_epoch SET n = n + 1; END;
CREATE TRIGGER auth_epoch_access_delete AFTER DELETE ON channel_access
    BEGIN UPDATE auth_epoch SET n = n + 1; END;
"""

_V7: Final = """
-- Conversations per channel, so that the "all" count is one row per channel instead of a sum
-- over every (status, assignee) pair; mine_open and unassigned are point lookups already.
CREATE TABLE channel_conversation_totals (
    channel_pk  INTEGER PRIMARY KEY,
    n           INTEGER NOT NULL
);
INSERT INTO channel_conversation_totals
    SELECT channel_pk, sum(n) FROM conversation_counts GROUP BY channel_pk;
CREATE TRIGGER conversations_total_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO channel_conversation_totals VALUES (new.channel_pk, 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conversations_total_move AFTER UPDATE OF channel_pk ON conversations
WHEN old.channel_pk IS NOT new.channel_pk BEGIN
    UPDATE channel_conversation_totals SET n = n - 1 WHERE channel_pk = old.channel_pk;
    INSERT INTO channel_conversation_totals VALUES (new.channel_pk, 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conversations_total_delete AFTER DELETE ON conversations BEGIN
    UPDATE channel_conversation_totals SET n = n - 1 WHERE channel_pk = old.channel_pk;
END;
"""

# The one-trigram token that named a channel inside the search indexes from v8 (a column of its
# own): three private-use characters (one per 12, 6 and 6 bits of the channel pk), so the
# trigram tokenizer made exactly one token of it. Kept for v8's SQL: v17 and v19 replaced it
# with MESSAGE_TOKEN_SQL (below), which opens each indexed text.
CHANNEL_TOKEN_SQL: Final = (
    "char(57344 + ({pk} / 4096) % 4096, 57344 + ({pk} / 64) % 64, 57344 + {pk} % 64)"
)


def _token(pk: str) -> str:
    return CHANNEL_TOKEN_SQL.format(pk=pk)


_V8: Final = f"""
-- Search within a channel goes through the index alone: each row of the trigram indexes carries
-- its channel as one token, and a search asks for the text AND that token. Before, a search took
-- the text's matches in the whole store newest first and looked up each one's channel, so a
-- common word in a small channel walked thousands of other channels' matches (seconds on 10M
-- messages). Both indexes are rebuilt here, which takes minutes on a store that large.
DROP TRIGGER messages_fts_insert;
DROP TABLE messages_fts;
CREATE VIRTUAL TABLE messages_fts USING fts5(content, channel, content='', tokenize='trigram');
INSERT INTO messages_fts(rowid, content, channel)
    SELECT pk, content, {_token("channel_pk")} FROM messages
    WHERE is_system = 0 AND content IS NOT NULL AND content <> '';
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN new.is_system = 0 AND new.content IS NOT NULL AND new.content <> '' BEGIN
    INSERT INTO messages_fts(rowid, content, channel)
        VALUES (new.pk, new.content, {_token("new.channel_pk")});
END;

DROP TRIGGER contacts_fts_insert;
DROP TRIGGER contacts_fts_update;
DROP TABLE contacts_fts;
CREATE VIRTUAL TABLE contacts_fts USING fts5(
    name, phone_number, channel, content='', tokenize='trigram'
);
INSERT INTO contacts_fts(rowid, name, phone_number, channel)
    SELECT pk, name, phone_number, {_token("channel_pk")} FROM contacts;
CREATE TRIGGER contacts_fts_insert AFTER INSERT ON contacts BEGIN
    INSERT INTO contacts_fts(rowid, name, phone_number, channel)
        VALUES (new.pk, new.name, new.phone_number, {_token("new.channel_pk")});
END;
CREATE TRIGGER contacts_fts_update AFTER UPDATE OF name, phone_number, channel_pk ON contacts
BEGIN
    INSERT INTO contacts_fts(contacts_fts, rowid, name, phone_number, channel)
        VALUES ('delete', old.pk, old.name, old.phone_number, {_token("old.channel_pk")});
    INSERT INTO contacts_fts(rowid, name, phone_number, channel)
        VALUES (new.pk, new.name, new.phone_number, {_token("new.channel_pk")});
END;
"""

_V9: Final = """
-- The journal is pruned past feed.retention (events.prune): what points into it needs an index
-- for the deletes, and the highest seq pruned so far tells a client resuming from before it
-- that it missed events (feed.reset).
CREATE INDEX webhook_deliveries_event ON webhook_deliveries(event_seq);
CREATE INDEX webhook_redeliveries_event ON webhook_redeliveries(event_seq);
CREATE TABLE journal_pruned (only INTEGER PRIMARY KEY CHECK (only = 1), through INTEGER NOT NULL);
INSERT INTO journal_pruned VALUES (1, 0);
"""

_V10: Final = """
-- The same counters per account: an owner's key sees every channel, so its counts are three point
-- lookups here instead of three per channel (150 with 50 channels). A conversation never changes
-- account, so only inserts, deletes and status or assignee changes move these.
CREATE TABLE account_conversation_counts (
    account_pk   INTEGER NOT NULL,
    status       TEXT NOT NULL,
    assignee_pk  INTEGER NOT NULL,
    n            INTEGER NOT NULL,
    PRIMARY KEY (account_pk, status, assignee_pk)
) WITHOUT ROWID;
INSERT INTO account_conversation_counts
    SELECT account_pk, status, coalesce(assigned_to_pk, 0), count(*) FROM conversations
    GROUP BY 1, 2, 3;
CREATE TABLE account_conversation_totals (
    account_pk  INTEGER PRIMARY KEY,
    n           INTEGER NOT NULL
);
INSERT INTO account_conversation_totals
    SELECT account_pk, count(*) FROM conversations GROUP BY account_pk;

CREATE TRIGGER conversations_account_count_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO account_conversation_counts VALUES
        (new.account_pk, new.status, coalesce(new.assigned_to_pk, 0), 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
    INSERT INTO account_conversation_totals VALUES (new.account_pk, 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conversations_account_count_update
AFTER UPDATE OF status, assigned_to_pk ON conversations
WHEN old.status IS NOT new.status OR old.assigned_to_pk IS NOT new.assigned_to_pk
BEGIN
    UPDATE account_conversation_counts SET n = n - 1
        WHERE account_pk = old.account_pk AND status = old.status
          AND assignee_pk = coalesce(old.assigned_to_pk, 0);
    INSERT INTO account_conversation_counts VALUES
        (new.account_pk, new.status, coalesce(new.assigned_to_pk, 0), 1)
        ON CONFLICT DO UPDATE SET n = n + 1;
END;
CREATE TRIGGER conversations_account_count_delete AFTER DELETE ON conversations BEGIN
    UPDATE account_conversation_counts SET n = n - 1
        WHERE account_pk = old.account_pk AND status = old.status
          AND assignee_pk = coalesce(old.assigned_to_pk, 0);
    UPDATE account_conversation_totals SET n = n - 1 WHERE account_pk = old.account_pk;
END;
"""


def iso_sql(column: str) -> str:
    """An integer-microseconds column as the wire's date-time (timeutil.format_us), or NULL."""
    return (
        f"strftime('%Y-%m-%dT%H:%M:%S', {column} / 1000000, 'unixepoch')"
        f" || printf('.%06dZ', {column} % 1000000)"
    )


# A Conversation with its contact, as wire.conversation(..., with_contact=True) writes it, for
# the conversation aliased c (with channels ch, contacts ct and users u joined as below). Schema
# v11 builds its triggers from this text: a later change to the JSON's shape needs a migration
# of its own that replaces those triggers and rebuilds conversation_wire.
CONVERSATION_JSON_SQL: Final = f"""json_object(
    'id', c.id, 'channelId', ch.id, 'contactId', ct.id, 'status', c.status,
    'assignedTo', u.id,
    'assignedUser', CASE WHEN u.id IS NULL THEN NULL
                    ELSE json_object('id', u.id, 'name', u.name, 'avatar', u.avatar) END,
    'lastMessageAt', {iso_sql("c.last_message_at")},
    'isUnread', json(iif(c.unread_count > 0, 'true', 'false')),
    'tags', json(c.tags),
    'lastMessagePreview', c.last_message_preview,
    'lastMessageType', c.last_message_type,
    'lastMessageDirection', c.last_message_direction,
    'lastMessageStatus', c.last_message_status,
    'unreadCount', c.unread_count,
    'isBlocked', json(iif(c.is_blocked, 'true', 'false')),
    'title', c.title,
    'lastCustomerMessageAt', {iso_sql("c.last_customer_message_at")},
    'createdAt', {iso_sql("c.created_at")},
    'updatedAt', {iso_sql("c.updated_at")},
    'channelType', ch.type,
    'customerPhone', ct.phone_number,
    'contact', json_object('id', ct.id, 'phoneNumber', ct.phone_number, 'name', ct.name,
                           'avatar', ct.avatar))"""
_CONVERSATION_JOINS: Final = """FROM conversations c
JOIN channels ch ON ch.pk = c.channel_pk
JOIN contacts ct ON ct.pk = c.contact_pk
LEFT JOIN users u ON u.pk = c.assigned_to_pk"""


def _wire_of(pk: str) -> str:
    return f"(SELECT {CONVERSATION_JSON_SQL} {_CONVERSATION_JOINS} WHERE c.pk = {pk})"


_WIRE_CONTACT_TRIGGER: Final = f"""\
CREATE TRIGGER conversation_wire_contact AFTER UPDATE OF id, name, avatar, phone_number ON contacts
BEGIN
    UPDATE conversation_wire SET json = {_wire_of("conversation_wire.pk")}
        WHERE pk IN (SELECT pk FROM conversations WHERE contact_pk = new.pk);
END;"""

_V11: Final = f"""
-- Each conversation's wire JSON (with its contact), kept by triggers whenever the conversation,
-- its contact, its assignee or its channel changes. List pages, search and read one used to build
-- it on every read, and that was most of a 50-row page's cost (its four date-times alone ~40 %):
-- a page now reads 50 stored texts. The rebuild below takes a while on a large store.
CREATE TABLE conversation_wire (
    pk    INTEGER PRIMARY KEY,
    json  TEXT NOT NULL
);
INSERT INTO conversation_wire SELECT c.pk, {CONVERSATION_JSON_SQL} {_CONVERSATION_JOINS};
CREATE TRIGGER conversation_wire_insert AFTER INSERT ON conversations BEGIN
    INSERT INTO conversation_wire VALUES (new.pk, {_wire_of("new.pk")});
END;
CREATE TRIGGER conversation_wire_update AFTER UPDATE ON conversations BEGIN
    UPDATE conversation_wire SET json = {_wire_of("new.pk")} WHERE pk = new.pk;
END;
CREATE TRIGGER conversation_wire_delete AFTER DELETE ON conversations BEGIN
    DELETE FROM conversation_wire WHERE pk = old.pk;
END;
{_WIRE_CONTACT_TRIGGER}
CREATE TRIGGER conversation_wire_user AFTER UPDATE OF id, name, avatar ON users BEGIN
    UPDATE conversation_wire SET json = {_wire_of("conversation_wire.pk")}
        WHERE pk IN (SELECT pk FROM conversations WHERE assigned_to_pk = new.pk);
END;
CREATE TRIGGER conversation_wire_channel AFTER UPDATE OF id, type ON channels BEGIN
    UPDATE conversation_wire SET json = {_wire_of("conversation_wire.pk")}
        WHERE pk IN (SELECT pk FROM conversations WHERE channel_pk = new.pk);
END;
"""

_V12: Final = """
-- A redelivery goes out after the events that were waiting when it was asked for, not after
-- every event committed since (on an account whose events keep coming it never went out).
-- after_seq is the journal's end at that moment; rows from before this version get today's.
ALTER TABLE webhook_redeliveries ADD COLUMN after_seq INTEGER NOT NULL DEFAULT 0;
UPDATE webhook_redeliveries SET after_seq = (SELECT coalesce(max(seq), 0) FROM events);
"""

_V13: Final = """
-- A channel webhook URL's pk is never given again (AUTOINCREMENT). Without it SQLite gave a URL
-- saved in place of a removed one the removed one's pk, with the same generation (0): the hub
-- kept the removed URL's supervisor running for it (its pause and probe timers), and a delivery
-- to the removed URL still in flight was recorded on the new one (its state and emails).
CREATE TABLE channel_webhook_urls_v13 (
    pk                INTEGER PRIMARY KEY AUTOINCREMENT,
    channel_pk        INTEGER NOT NULL REFERENCES channels(pk),
    url               TEXT NOT NULL,
    position          INTEGER NOT NULL,
    -- Bumped when the URL is saved again (re-enabled): a supervisor's stale writes are dropped.
    generation        INTEGER NOT NULL DEFAULT 0,
    state             TEXT NOT NULL CHECK (state IN ('delivering', 'paused', 'disabled')),
    failure_count     INTEGER NOT NULL DEFAULT 0,
    first_failure_at  INTEGER,
    last_failure_at   INTEGER,
    last_status       INTEGER,
    last_error        TEXT,
    last_success_at   INTEGER,
    warned            INTEGER NOT NULL DEFAULT 0,
    paused_at         INTEGER,
    next_probe_at     INTEGER,
    probes_done       INTEGER NOT NULL DEFAULT 0,
    disabled_at       INTEGER,
    next_attempt_at   INTEGER,
    -- Every channel webhook event with seq <= delivered_seq is done for this URL.
    delivered_seq     INTEGER NOT NULL,
    created_at        INTEGER NOT NULL,
    updated_at        INTEGER NOT NULL,
    UNIQUE (channel_pk, url)
);
INSERT INTO channel_webhook_urls_v13 SELECT * FROM channel_webhook_urls;
DROP TABLE channel_webhook_urls;
ALTER TABLE channel_webhook_urls_v13 RENAME TO channel_webhook_urls;
"""

_V14: Final = """
-- A queued redelivery's pk is never given again (AUTOINCREMENT), as v13 did for channel webhook
-- URLs. Without it, a redelivery queued after the webhook was deleted (dropping the queue) and
-- saved again could get the pk of one whose attempt was still in flight: that attempt's record
-- then dropped the new redelivery unsent. The table is a queue: rebuilding it takes nothing.
CREATE TABLE webhook_redeliveries_v14 (
    pk            INTEGER PRIMARY KEY AUTOINCREMENT,
    account_pk    INTEGER NOT NULL REFERENCES accounts(pk),
    event_seq     INTEGER NOT NULL REFERENCES events(seq),
    requested_at  INTEGER NOT NULL,
    after_seq     INTEGER NOT NULL DEFAULT 0
);
INSERT INTO webhook_redeliveries_v14 (pk, account_pk, event_seq, requested_at, after_seq)
    SELECT pk, account_pk, event_seq, requested_at, after_seq FROM webhook_redeliveries;
DROP TABLE webhook_redeliveries;
ALTER TABLE webhook_redeliveries_v14 RENAME TO webhook_redeliveries;
CREATE INDEX webhook_redeliveries_account ON webhook_redeliveries(account_pk, pk);
CREATE INDEX webhook_redeliveries_event ON webhook_redeliveries(event_seq);
"""

_V15: Final = """
-- Which channel a channel webhook notice is about: when its owner unsubscribes, the notices
-- still waiting to be sent (the mail server down, say) are withdrawn with it (CONTRACT section
-- 7: not sent once the owner has unsubscribed). NULL for every other mail.
ALTER TABLE mail_outbox ADD COLUMN channel_pk INTEGER;
"""

_V16: Final = """
-- The seconds a failed attempt's 429/503 asked for in Retry-After (NULL: none, or unreadable):
-- a series that a stop cut short resumes after it, not after the schedule alone (CONTRACT
-- section 6: a retry waits at least Retry-After).
ALTER TABLE webhook_deliveries ADD COLUMN retry_after REAL;
"""

# Search keys: each row of messages_fts (schema v18; v17 had the pk as it is) and of
# contacts_fts (v19) has the rowid ``channel_pk << SEARCH_CHANNEL_SHIFT | (SEARCH_PK_MASK - pk)``
# of its message or contact, so one channel's rows are one range of rowids, newest first
# (store/conversations.py). Room for message and contact pks under 2^40 (about 1.1 trillion)
# and channel pks under 2^23 (about 8.4 million): accounts.create_channel refuses a channel
# past that, and the triggers a message or contact, rather than index it where no search would
# find it.
SEARCH_CHANNEL_SHIFT: Final = 40
SEARCH_PK_MASK: Final = (1 << SEARCH_CHANNEL_SHIFT) - 1
SEARCH_MAX_CHANNEL_PK: Final = (1 << (63 - SEARCH_CHANNEL_SHIFT)) - 1

# The token that opens each message's text in messages_fts (schema v17) and each contact's name
# and phone number in contacts_fts (v19), naming its channel:
# a mark (U+10FFFD) and two characters that hold 12 bits of the channel pk each (U+F0100 on),
# then a stand-in (U+10FFFC); all private-use characters. The text's own marks are indexed as
# the stand-in, so the mark opens no trigram but a token's own: no text can carry a token
# (another channel's searches would walk past their own rows to each). A query that holds the
# mark or the stand-in finds nothing (conversations.search): it could match what opens a
# text. They are the last two characters of plane 16's private use area (U+F0001, at the start
# of plane 15's, is an icon in Nerd Fonts). Every other query matches the indexed text exactly
# where it matches the text itself.
# conversations.search_token is the same in Python; a test holds the two equal.
MESSAGE_TOKEN_MARK: Final = 0x10FFFD
MESSAGE_TOKEN_STAND_IN: Final = 0x10FFFC
MESSAGE_TOKEN_BASE: Final = 0xF0100
MESSAGE_TOKEN_SQL: Final = (
    f"char({MESSAGE_TOKEN_MARK}, {MESSAGE_TOKEN_BASE} + ({{pk}} >> 12),"
    f" {MESSAGE_TOKEN_BASE} + ({{pk}} & 4095))"
)


def _indexed(pk: str, text: str) -> str:
    """SQL for what the search indexes hold of a text: its channel's token, then the text."""
    stand_in = f"char({MESSAGE_TOKEN_STAND_IN})"
    return (
        f"{MESSAGE_TOKEN_SQL.format(pk=pk)} || {stand_in}"
        f" || replace({text}, char({MESSAGE_TOKEN_MARK}), {stand_in})"
    )


def _search_key(row: str) -> str:
    """SQL for a row's rowid in a search index since v18: its channel, then newest first."""
    return f"({row}channel_pk << {SEARCH_CHANNEL_SHIFT}) | ({SEARCH_PK_MASK} - {row}pk)"


def _keys_fit(what: str) -> str:
    """A trigger's guard: a new row that no search key has room for is refused."""
    return f"""SELECT RAISE(ABORT, '{what} key past the search index''s range')
        WHERE new.pk NOT BETWEEN 0 AND {SEARCH_PK_MASK}
           OR new.channel_pk NOT BETWEEN 0 AND {SEARCH_MAX_CHANNEL_PK};"""


def _indexable(row: str) -> str:
    """SQL: whether a message is one the search indexes hold (SYSTEM rows and empty text are
    not)."""
    return f"{row}is_system = 0 AND {row}content IS NOT NULL AND {row}content <> ''"


def message_fts_trigger(own_index: tuple[int, ...] = ()) -> str:
    """The trigger that puts each new message into messages_fts (v18), leaving out the channels
    in ``own_index``, whose messages go to an index of their own (v20, store/shards.py)."""
    elsewhere = (
        f" AND new.channel_pk NOT IN ({', '.join(map(str, own_index))})" if own_index else ""
    )
    return f"""CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN {_indexable("new.")}{elsewhere} BEGIN
    {_keys_fit("message")}
    INSERT INTO messages_fts(rowid, content) VALUES (
        {_search_key("new.")}, {_indexed("new.channel_pk", "new.content")}
    );
END;"""


_V17: Final = f"""
-- A message search reads its channel's part of the index alone. Since v8 a search asked for the
-- text AND the channel's token in a column of its own. FTS5 finds a phrase's rows by walking its
-- trigrams' lists together, and only then meets the other side of the AND: a phrase whose
-- trigrams are common but which is rare ("order refund", both words frequent, seldom side by
-- side) walked the lists of the whole index, 120-200 ms on 10M messages, in the smallest channel
-- as in the largest. Now the channel's token opens the indexed text itself (MESSAGE_TOKEN_MARK
-- above: no text can carry one), and a search asks for the text NEAR that token: one walk over
-- the text's trigrams and the token, which ends where the token's list does. And each row's
-- rowid starts with its channel (SEARCH_CHANNEL_SHIFT above), so that list is one range of
-- rowids: the walk stays inside the channel's part of the index. The rebuild inserts in rowid
-- order (FTS5 writes out a segment each time the rowid goes down), then merges what it wrote
-- into one segment: the fourteen it leaves otherwise made a common word's first page 5-15 times
-- slower to find (4 against 1 ms, 17 against 1 on 10M messages).
DROP TRIGGER messages_fts_insert;
DROP TABLE messages_fts;
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='', tokenize='trigram');
INSERT INTO messages_fts(rowid, content)
    SELECT (channel_pk << {SEARCH_CHANNEL_SHIFT}) | pk, {_indexed("channel_pk", "content")}
    FROM messages
    WHERE is_system = 0 AND content IS NOT NULL AND content <> ''
    ORDER BY channel_pk, pk;
INSERT INTO messages_fts(messages_fts) VALUES ('optimize');
CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages
WHEN new.is_system = 0 AND new.content IS NOT NULL AND new.content <> '' BEGIN
    {_keys_fit("message")}
    INSERT INTO messages_fts(rowid, content) VALUES (
        (new.channel_pk << {SEARCH_CHANNEL_SHIFT}) | new.pk,
        {_indexed("new.channel_pk", "new.content")}
    );
END;
"""

_V18: Final = f"""
-- A message search walks the index forwards. FTS5 reads a list backwards by decoding each page
-- forwards first, and a search wants the newest messages first: with rowids rising with the
-- message pk (v17) it walked every list backwards. Now a channel's rows count down from its
-- newest message (SEARCH_PK_MASK above), so newest first is rowid order. A phrase that matches
-- nothing in the largest channel of 10M messages (1.54M of them) walked its part of the index in
-- 42-47 ms (p99 of bench http's ten queries 66 ms); now 28-37 ms in a quiet phase of the
-- machine (p99 31-55 ms with its phase). FTS5 writes out what it holds each time the rowid goes
-- down, now at each message of a channel after the first in one transaction: for the index alone
-- that is 70 against 30 us a message in batches of 50, lost in the rest of a write (timed by
-- hand: an ingest in such batches took 315 against 308 us a message, one alone 950 us either
-- way).
DROP TRIGGER messages_fts_insert;
DROP TABLE messages_fts;
CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='', tokenize='trigram');
INSERT INTO messages_fts(rowid, content)
    SELECT {_search_key("")}, {_indexed("channel_pk", "content")}
    FROM messages
    WHERE is_system = 0 AND content IS NOT NULL AND content <> ''
    ORDER BY channel_pk, pk DESC;
INSERT INTO messages_fts(messages_fts) VALUES ('optimize');
{message_fts_trigger()}
"""

_V19: Final = f"""
-- Contacts are searched like messages (v17, v18): each row of contacts_fts is keyed by its
-- channel, then newest contact first (SEARCH_CHANNEL_SHIFT, SEARCH_PK_MASK above), and each
-- column's text is opened by the channel's token (MESSAGE_TOKEN_MARK above), so a search asks
-- for the query NEAR that token in the column and walks the channel's part of the index alone,
-- forwards. Since v8 it asked for the query AND the token in a column of its own, whose walk
-- went through the whole index for a rare pair of frequent names ("alan sato": 5.5-6.8 ms in
-- every channel on 1M contacts, growing with the store; now 0.3-1.6 ms).
DROP TRIGGER contacts_fts_insert;
DROP TRIGGER contacts_fts_update;
DROP TABLE contacts_fts;
CREATE VIRTUAL TABLE contacts_fts USING fts5(
    name, phone_number, content='', tokenize='trigram'
);
INSERT INTO contacts_fts(rowid, name, phone_number)
    SELECT {_search_key("")},
        {_indexed("channel_pk", "name")}, {_indexed("channel_pk", "phone_number")}
    FROM contacts
    ORDER BY channel_pk, pk DESC;
INSERT INTO contacts_fts(contacts_fts) VALUES ('optimize');
CREATE TRIGGER contacts_fts_insert AFTER INSERT ON contacts BEGIN
    {_keys_fit("contact")}
    INSERT INTO contacts_fts(rowid, name, phone_number) VALUES (
        {_search_key("new.")},
        {_indexed("new.channel_pk", "new.name")}, {_indexed("new.channel_pk", "new.phone_number")}
    );
END;
CREATE TRIGGER contacts_fts_update AFTER UPDATE OF pk, name, phone_number, channel_pk ON contacts
BEGIN
    {_keys_fit("contact")}
    INSERT INTO contacts_fts(contacts_fts, rowid, name, phone_number) VALUES (
        'delete', {_search_key("old.")},
        {_indexed("old.channel_pk", "old.name")}, {_indexed("old.channel_pk", "old.phone_number")}
    );
    INSERT INTO contacts_fts(rowid, name, phone_number) VALUES (
        {_search_key("new.")},
        {_indexed("new.channel_pk", "new.name")}, {_indexed("new.channel_pk", "new.phone_number")}
    );
END;
-- The index's trigger stays older than conversation_wire_contact, as since v8. SQLite (3.40.1
-- and 3.51.1, the two tried) compiles a table's triggers newest first; where the newest inserts
-- into an FTS5 table, the first UPDATE of a connection whose schema another connection has just
-- changed failed with "no such table: contacts" in the next trigger's subquery.
DROP TRIGGER conversation_wire_contact;
{_WIRE_CONTACT_TRIGGER}
"""

_V20: Final = """
-- A channel past some size gets a message search index of its own (store/shards.py): its
-- searches then walk their text's trigrams alone, not with the channel's token as well, whose
-- list (a row each) made up about 40 % of a walk through messages_fts. A row for each such
-- channel: its index (message_shard_<channel pk>) and that index's trigger take the channel's
-- messages from ``indexed_from`` on; the messages before it go in by steps, newest first, down to
-- ``filled_below``. Once they are all in (``ready_at``), searches read it and messages_fts takes
-- no more of the channel's messages (its trigger leaves them out). This migration adds the table
-- alone: the daemon fills an index in the background, a step at a time.
CREATE TABLE message_shards (
    channel_pk    INTEGER PRIMARY KEY REFERENCES channels(pk),
    indexed_from  INTEGER NOT NULL,
    filled_below  INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    ready_at      INTEGER
);
"""


def message_shard_table(channel_pk: int) -> str:
    """The name of a channel's own message search index (v20)."""
    return f"message_shard_{int(channel_pk)}"


def _shard_text(text: str) -> str:
    """SQL for what a channel's own index holds of a text: the text, its marks as the stand-in
    (as in messages_fts, so that every query finds there what it found there), no token."""
    return f"replace({text}, char({MESSAGE_TOKEN_MARK}), char({MESSAGE_TOKEN_STAND_IN}))"


def message_shard_sql(channel_pk: int, indexed_from: int) -> tuple[str, str]:
    """The statements that make a channel's own message search index (v20): the FTS5 table, and
    the trigger that puts the channel's new messages into it, from the pk ``indexed_from`` on.
    Its rowids are messages_fts's (SEARCH_CHANNEL_SHIFT above), so a search reads it newest
    first, forwards, as it reads messages_fts.

    This trigger, and messages_fts_insert made anew when the index is ready, are then the newest
    triggers on ``messages``: the order v19 had to undo for contacts (a newer FTS5-inserting
    trigger made an older trigger's subquery fail with "no such table" on a connection that had
    not used the index yet). No trigger on ``messages`` has a subquery that reads a table, so it
    cannot happen here; a trigger that would must be made anew after these (as v19 did)."""
    table = message_shard_table(channel_pk)
    pk = int(channel_pk)
    return (
        f"CREATE VIRTUAL TABLE {table} USING fts5(content, content='', tokenize='trigram')",
        f"""CREATE TRIGGER {table}_insert AFTER INSERT ON messages
WHEN new.channel_pk = {pk} AND new.pk >= {int(indexed_from)} AND {_indexable("new.")} BEGIN
    {_keys_fit("message")}
    INSERT INTO {table}(rowid, content) VALUES ({_search_key("new.")}, {_shard_text("new.content")});
END""",
    )


def message_shard_fill_sql(channel_pk: int) -> str:
    """SQL putting the channel's messages with a pk in [?2, ?1) into its own index, newest
    first (its rowid order: FTS5 writes out what it holds each time the rowid goes down)."""
    return (
        f"INSERT INTO {message_shard_table(channel_pk)}(rowid, content)"
        f" SELECT {_search_key('')}, {_shard_text('content')} FROM messages"
        f" WHERE pk < ?1 AND pk >= ?2 AND channel_pk = {int(channel_pk)} AND {_indexable('')}"
        " ORDER BY pk DESC"
    )


def message_shard_step_sql(channel_pk: int) -> str:
    """SQL: the pk of the channel's ?3-th indexable message below the pk ?1 and at or above ?2,
    counting down (NULL: fewer than that)."""
    return (
        f"SELECT pk FROM messages WHERE pk < ?1 AND pk >= ?2 AND channel_pk = {int(channel_pk)}"
        f" AND {_indexable('')} ORDER BY pk DESC LIMIT 1 OFFSET ?3 - 1"
    )


MIGRATIONS: Final[tuple[str, ...]] = (
    _V1,
    _V2,
    _V3,
    _V4,
    _V5,
    _V6,
    _V7,
    _V8,
    _V9,
    _V10,
    _V11,
    _V12,
    _V13,
    _V14,
    _V15,
    _V16,
    _V17,
    _V18,
    _V19,
    _V20,
)

# What a store must hold for a migration to apply: SQL giving NULL when it may, else why not.
_SEARCH_KEYS_FIT: Final = f"""SELECT CASE
    WHEN (SELECT max(pk) FROM messages) > {SEARCH_PK_MASK}
        THEN 'a message pk past the search index''s range (2^40)'
    WHEN (SELECT max(pk) FROM channels) > {SEARCH_MAX_CHANNEL_PK}
        THEN 'a channel pk past the search index''s range ({SEARCH_MAX_CHANNEL_PK:,})'
    WHEN (SELECT min(pk) FROM messages) < 0 OR (SELECT min(pk) FROM contacts) < 0
        THEN 'a negative message or contact pk'
    WHEN (SELECT max(pk) FROM contacts) > {SEARCH_PK_MASK}
        THEN 'a contact pk past the search index''s range (2^40)'
END"""
MIGRATION_CHECKS: Final[dict[int, str]] = {
    17: _SEARCH_KEYS_FIT,
    18: _SEARCH_KEYS_FIT,
    19: _SEARCH_KEYS_FIT,
}

# Migrations whose every change a later one makes again: a store that takes both skips the
# first (its check still runs) and goes past its version in the later one's transaction. v18
# rebuilds the message search index whole, as v17 did with other keys: a store of v16 rebuilds
# it once, not twice.
REDONE_BY: Final[dict[int, int]] = {17: 18}

# What the migrations that rebuild something large say while they run (the log of ``serve`` and
# ``init``): they run in one transaction each, with nothing to show until they are done.
SLOW_MIGRATIONS: Final[dict[int, str]] = {
    8: "rebuilds both search indexes: minutes on a store of millions of messages",
    11: "stores each conversation's JSON: about 20 s per million conversations",
    18: "rebuilds the message search index: about 35 s per million messages",
    19: "rebuilds the contact search index: about 20 s per million contacts",
}
