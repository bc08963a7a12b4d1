//! The `events` table: the queryable copy of the audit trail.

use rusqlite::{params, Row};

use crate::{check_limit, json_column, EventRow, ListQuery, NewEvent, Store, StoreError};

fn event_from_row(row: &Row<'_>) -> rusqlite::Result<EventRow> {
    let detail = json_column(row, 6)?;
    Ok(EventRow {
        seq: row.get(0)?,
        sandbox_id: row.get(1)?,
        request_id: row.get(2)?,
        stream: row.get(3)?,
        kind: row.get(4)?,
        at: row.get(5)?,
        detail,
    })
}

impl Store {
    /// Appends an event and returns its sequence number, which is larger
    /// than that of every event appended before it.
    pub fn append_event(&self, event: &NewEvent) -> Result<i64, StoreError> {
        let mut stmt = self.conn.prepare_cached(
            "INSERT INTO events (sandbox_id, request_id, stream, kind, at, detail_json) \
             VALUES (?1, ?2, ?3, ?4, ?5, ?6) RETURNING seq",
        )?;
        Ok(stmt.query_row(
            params![
                event.sandbox_id,
                event.request_id,
                event.stream,
                event.kind,
                event.at,
                event.detail.to_string(),
            ],
            |row| row.get(0),
        )?)
    }

    /// Appends events in one transaction (one commit, so a batch costs one
    /// write of the pages it touches, not one per event) and returns how
    /// many were appended. All or none: on an error nothing is appended.
    pub fn append_events<'a>(
        &self,
        events: impl IntoIterator<Item = &'a NewEvent>,
    ) -> Result<usize, StoreError> {
        let transaction = self.conn.unchecked_transaction()?;
        let mut appended = 0;
        for event in events {
            self.append_event(event)?;
            appended += 1;
        }
        transaction.commit()?;
        Ok(appended)
    }

    /// Removes the events older than `before_ms` and, past `max_rows`, the
    /// oldest of the rest; returns how many went.
    pub fn prune_events(&self, before_ms: i64, max_rows: u64) -> Result<usize, StoreError> {
        let old = self
            .conn
            .prepare_cached("DELETE FROM events WHERE at < ?1")?
            .execute(params![before_ms])?;
        let max_rows = i64::try_from(max_rows).unwrap_or(i64::MAX);
        let over = self
            .conn
            .prepare_cached("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?1")?
            .execute(params![max_rows])?;
        Ok(old + over)
    }

    /// Up to `limit` (1..=1000) events of one sandbox with a sequence number
    /// above `after_seq`, in order. Page on with the last `seq` returned;
    /// start with 0.
    pub fn events_for_sandbox(
        &self,
        sandbox_id: &str,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<EventRow>, StoreError> {
        let limit = check_limit(Some(limit), ListQuery::DEFAULT_LIMIT)?;
        Ok(self
            .conn
            .prepare_cached(
                "SELECT seq, sandbox_id, request_id, stream, kind, at, detail_json FROM events \
                 WHERE sandbox_id = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?
            .query_map(params![sandbox_id, after_seq, limit], event_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?)
    }
}
