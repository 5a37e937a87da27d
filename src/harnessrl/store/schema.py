"""The trace store's SQLite schema: its tables and indexes, the steps that bring an older
file up to date, and how a connection is opened (WAL, crash-safe commits)."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

DB_NAME = "trace.db"
SCHEMA_VERSION = 6
_TABLES = (
    """CREATE TABLE IF NOT EXISTS rollouts (
    key TEXT PRIMARY KEY,
    created REAL NOT NULL,
    closed REAL,
    sampling BLOB,
    unset_sampling TEXT NOT NULL DEFAULT '[]',
    metadata BLOB NOT NULL DEFAULT '{}',
    harness,
    task,
    max_model_calls INTEGER
)""",
    """CREATE TABLE IF NOT EXISTS turns (
    id INTEGER PRIMARY KEY,
    rollout TEXT NOT NULL REFERENCES rollouts(key),
    idx INTEGER NOT NULL,
    dialect TEXT NOT NULL,
    status TEXT NOT NULL,
    received REAL NOT NULL,
    first_token REAL,
    done REAL,
    engine TEXT,
    model TEXT,
    weight_version TEXT,
    error TEXT,
    flags TEXT NOT NULL DEFAULT '[]',
    requested_sampling BLOB,
    used_sampling BLOB,
    request BLOB,
    completion BLOB,
    prompt_ids BLOB,
    completion_ids BLOB,
    logprobs BLOB,
    raw_request BLOB NOT NULL,
    raw_response BLOB NOT NULL,
    reply_id TEXT,
    error_kind TEXT,
    layout INTEGER,
    prompt_parent INTEGER,
    prompt_keep INTEGER,
    prompt_len INTEGER,
    body_base INTEGER,
    content_encoding TEXT,
    retry_count INTEGER,
    retry_of INTEGER,
    UNIQUE (rollout, idx)
)""",
    """CREATE TABLE IF NOT EXISTS outcomes (
    harness TEXT NOT NULL,
    task TEXT NOT NULL,
    sample INTEGER NOT NULL,
    rollout TEXT NOT NULL,
    status TEXT NOT NULL,
    reward REAL,
    outcome BLOB NOT NULL,
    harness_version TEXT,
    verifier_reward REAL,
    tool_calls INTEGER,
    completion_tokens INTEGER,
    PRIMARY KEY (harness, task, sample)
)""",
)
# The rollouts' `harness` and `task` are copied from their metadata (what the runner puts
# there), declared without a type so that they hold the value as given, as json_extract
# would return it; the outcomes' columns are the fields of the outcome the viewer filters,
# sorts and averages on. Both are written with the row, so no page parses JSON to filter.
_INDEXES = {
    "turns_by_reply": "CREATE INDEX IF NOT EXISTS turns_by_reply ON turns (rollout, reply_id)",
    # What the trace viewer's pages look up (harnessrl.ui.queries): models of a run without
    # a scan of the turns, outcomes by rollout, rollouts by age. Small, cheap on insert.
    "turns_by_model": "CREATE INDEX IF NOT EXISTS turns_by_model ON turns (model)",
    "outcomes_by_rollout": "CREATE INDEX IF NOT EXISTS outcomes_by_rollout ON outcomes (rollout)",
    "rollouts_by_created": "CREATE INDEX IF NOT EXISTS rollouts_by_created ON rollouts (created)",
}
_OUTCOME_JSON = "CAST(outcome AS TEXT)"
_METADATA_JSON = "CAST(metadata AS TEXT)"


@dataclass(frozen=True, slots=True)
class _Step:
    """Brings a file from one schema version to the next: columns to add (when missing: a
    table created by this version's `_TABLES` has them already), then statements that fill
    them for the rows already there."""

    columns: tuple[tuple[str, str, str], ...]  # (table, column, declaration)
    fill: tuple[str, ...] = ()


# Steps that bring an older file up to SCHEMA_VERSION, by the version they start from.
_MIGRATIONS = {
    1: _Step((("turns", "reply_id", "TEXT"),)),
    2: _Step(
        (("turns", "error_kind", "TEXT"), ("rollouts", "harness", ""), ("rollouts", "task", ""),
         ("outcomes", "harness_version", "TEXT"), ("outcomes", "verifier_reward", "REAL"),
         ("outcomes", "tool_calls", "INTEGER"), ("outcomes", "completion_tokens", "INTEGER")),
        (  # errors were recorded as "kind: message"
            "UPDATE turns SET error_kind = CASE WHEN instr(error, ':') > 0"
            " THEN substr(error, 1, instr(error, ':') - 1) ELSE error END"
            " WHERE error IS NOT NULL AND error_kind IS NULL",
            f"UPDATE rollouts SET harness = json_extract({_METADATA_JSON}, '$.harness'),"
            f" task = json_extract({_METADATA_JSON}, '$.task')",
            # An outcome's JSON omits its defaults: no tool calls or tokens is 0.
            f"UPDATE outcomes SET harness_version = json_extract({_OUTCOME_JSON},"
            f" '$.harness_version'), verifier_reward = json_extract({_OUTCOME_JSON},"
            f" '$.verifier_reward'), tool_calls = COALESCE(json_extract({_OUTCOME_JSON},"
            f" '$.tool_calls'), 0), completion_tokens = COALESCE(json_extract({_OUTCOME_JSON},"
            " '$.completion_tokens'), 0)",
        )),
    3: _Step((("rollouts", "max_model_calls", "INTEGER"),)),
    # v5 keeps what is new against an earlier turn (store.layout); a v4 row keeps NULL
    # in these columns and is read as it is, whole: nothing is rewritten.
    4: _Step(tuple(("turns", column, "INTEGER") for column in
                   ("layout", "prompt_parent", "prompt_keep", "prompt_len", "body_base"))),
    # v6: the request body's content coding, and the client's retry count (proxy/wire/codings.py,
    # docs/concepts/retries.md); NULL in older rows: sent uncoded, no count seen.
    5: _Step((("turns", "content_encoding", "TEXT"), ("turns", "retry_count", "INTEGER"),
              ("turns", "retry_of", "INTEGER"))),
}


def connect(path: Path) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    # NORMAL in WAL mode: a committed transaction survives a crash of the process (the
    # case we must cover); only a power loss can drop the last commits.
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("PRAGMA busy_timeout=10000")
    return db


def migrate(path: Path) -> None:
    """Bring the store at `path` up to SCHEMA_VERSION (creating it if missing), in one
    transaction; a file that is up to date and has every index is only read."""
    db = connect(path)
    try:
        if not _outdated(db):
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            version = db.execute("PRAGMA user_version").fetchone()[0]  # another may have won
            for table in _TABLES:
                db.execute(table)
            # A file from before versioning (0) gets every step: each adds only what lacks.
            for step in range(max(version, 1), SCHEMA_VERSION):
                _apply(db, _MIGRATIONS[step])
            for index in _INDEXES.values():
                db.execute(index)
            db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
            db.execute("COMMIT")
        except BaseException:
            db.execute("ROLLBACK")
            raise
    finally:
        db.close()


def _outdated(db: sqlite3.Connection) -> bool:
    if db.execute("PRAGMA user_version").fetchone()[0] != SCHEMA_VERSION:
        return True
    indexes = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    return not indexes.issuperset(_INDEXES)


def _apply(db: sqlite3.Connection, step: _Step) -> None:
    for table, column, declaration in step.columns:
        if column not in {r[1] for r in db.execute(f"PRAGMA table_info({table})")}:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}".rstrip())
    for statement in step.fill:
        db.execute(statement)
