"""Builds real OpenCode databases with OpenCode's own table definitions (era C plus the
event journal), for the OpenCode adapter's tests."""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import orjson

DDL = """
CREATE TABLE `project` (`id` text PRIMARY KEY, `worktree` text NOT NULL, `vcs` text,
  `name` text, `icon_url` text, `icon_color` text, `time_created` integer NOT NULL,
  `time_updated` integer NOT NULL, `time_initialized` integer, `sandboxes` text NOT NULL);
CREATE TABLE `session` (`id` text PRIMARY KEY, `project_id` text NOT NULL, `parent_id` text,
  `slug` text NOT NULL, `directory` text NOT NULL, `title` text NOT NULL,
  `version` text NOT NULL, `share_url` text, `summary_additions` integer,
  `summary_deletions` integer, `summary_files` integer, `summary_diffs` text, `revert` text,
  `permission` text, `time_created` integer NOT NULL, `time_updated` integer NOT NULL,
  `time_compacting` integer, `time_archived` integer,
  CONSTRAINT `fk_session_project_id_project_id_fk` FOREIGN KEY (`project_id`)
  REFERENCES `project`(`id`) ON DELETE CASCADE);
CREATE TABLE `message` (`id` text PRIMARY KEY, `session_id` text NOT NULL,
  `time_created` integer NOT NULL, `time_updated` integer NOT NULL, `data` text NOT NULL,
  CONSTRAINT `fk_message_session_id_session_id_fk` FOREIGN KEY (`session_id`)
  REFERENCES `session`(`id`) ON DELETE CASCADE);
CREATE TABLE `part` (`id` text PRIMARY KEY, `message_id` text NOT NULL,
  `session_id` text NOT NULL, `time_created` integer NOT NULL,
  `time_updated` integer NOT NULL, `data` text NOT NULL,
  CONSTRAINT `fk_part_message_id_message_id_fk` FOREIGN KEY (`message_id`)
  REFERENCES `message`(`id`) ON DELETE CASCADE);
CREATE INDEX `message_session_time_created_id_idx` ON `message` (`session_id`,`time_created`,`id`);
CREATE INDEX `part_message_id_id_idx` ON `part` (`message_id`,`id`);
"""
EVENTS_DDL = """
CREATE TABLE `event_sequence` (`aggregate_id` text PRIMARY KEY, `seq` integer NOT NULL,
  `owner_id` text);
CREATE TABLE `event` (`id` text PRIMARY KEY, `aggregate_id` text NOT NULL,
  `seq` integer NOT NULL, `type` text NOT NULL, `data` text NOT NULL,
  CONSTRAINT `fk_event_aggregate_id_event_sequence_aggregate_id_fk` FOREIGN KEY
  (`aggregate_id`) REFERENCES `event_sequence`(`aggregate_id`) ON DELETE CASCADE);
"""


class OpenCodeDB:
    """Writes rows the way OpenCode does: message rows and part rows in separate
    transactions, each bumping the session's event sequence."""

    def __init__(self, path: Path, *, events: bool = True) -> None:
        self.path = path
        self.events = events
        self._ids = itertools.count(1)
        self.clock = 1_755_000_000_000
        with self.connect() as conn:
            conn.executescript(DDL + (EVENTS_DDL if events else ""))
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute(
                "INSERT INTO project VALUES ('prj', '/p', 'git', 'p', NULL, NULL, 1, 1, NULL, '[]')"
            )

    def connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path)

    def _tick(self) -> int:
        self.clock += 1000
        return self.clock

    def session(self, sid: str, *, parent: str | None = None, title: str = "t") -> None:
        now = self._tick()
        with self.connect() as conn:
            conn.execute(
                "INSERT INTO session (id, project_id, parent_id, slug, directory, title, version,"
                " time_created, time_updated) VALUES (?, 'prj', ?, ?, '/p', ?, '1.2.0', ?, ?)",
                (sid, parent, sid, title, now, now),
            )
            if self.events:
                conn.execute("INSERT INTO event_sequence (aggregate_id, seq) VALUES (?, 0)", (sid,))

    def bump(self, conn: sqlite3.Connection, sid: str, kind: str) -> None:
        now = self._tick()
        conn.execute("UPDATE session SET time_updated = ? WHERE id = ?", (now, sid))
        if self.events:
            conn.execute("UPDATE event_sequence SET seq = seq + 1 WHERE aggregate_id = ?", (sid,))
            seq = conn.execute(
                "SELECT seq FROM event_sequence WHERE aggregate_id = ?", (sid,)
            ).fetchone()[0]
            conn.execute(
                "INSERT INTO event (id, aggregate_id, seq, type, data) VALUES (?, ?, ?, ?, '{}')",
                (f"evt_{next(self._ids):06d}", sid, seq, kind),
            )

    def message(self, sid: str, role: str = "user") -> str:
        mid = f"msg_{next(self._ids):06d}"
        now = self._tick()
        data = {"role": role, "time": {"created": now}}
        with self.connect() as conn:
            conn.execute(
                "INSERT INTO message (id, session_id, time_created, time_updated, data)"
                " VALUES (?, ?, ?, ?, ?)",
                (mid, sid, now, now, orjson.dumps(data).decode()),
            )
            self.bump(conn, sid, "message.updated.1")
        return mid

    def part(self, sid: str, mid: str, **data: Any) -> None:
        now = self._tick()
        with self.connect() as conn:
            conn.execute(
                "INSERT INTO part (id, message_id, session_id, time_created, time_updated, data)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (f"prt_{next(self._ids):06d}", mid, sid, now, now, orjson.dumps(data).decode()),
            )
            self.bump(conn, sid, "message.part.updated.1")

    def prompt(self, sid: str, text: str, **extra: Any) -> str:
        mid = self.message(sid)
        self.part(sid, mid, type="text", text=text, **extra)
        return mid

    def reply(self, sid: str, text: str = "ok") -> str:
        mid = self.message(sid, "assistant")
        self.part(sid, mid, type="text", text=text)
        return mid

    def row(self, sid: str, table: str, row_id: str, data: dict[str, Any]) -> None:
        """A row as OpenCode wrote it (a capture's, tests/fixtures/states): a message, or
        a part of the message written last."""
        now = self._tick()
        with self.connect() as conn:
            if table == "message":
                created = (data.get("time") or {}).get("created", now)
                conn.execute(
                    "INSERT INTO message (id, session_id, time_created, time_updated, data)"
                    " VALUES (?, ?, ?, ?, ?)",
                    (row_id, sid, created, now, orjson.dumps(data).decode()),
                )
            else:
                (mid,) = conn.execute(
                    "SELECT id FROM message WHERE session_id = ? ORDER BY time_created DESC,"
                    " id DESC LIMIT 1",
                    (sid,),
                ).fetchone()
                conn.execute(
                    "INSERT INTO part (id, message_id, session_id, time_created, time_updated,"
                    " data) VALUES (?, ?, ?, ?, ?, ?)",
                    (row_id, mid, sid, now, now, orjson.dumps(data).decode()),
                )
            self.bump(conn, sid, f"{table}.updated.1")
