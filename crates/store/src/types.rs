//! The records the store reads and writes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::str::FromStr;

use rusqlite::types::{FromSql, FromSqlError, FromSqlResult, ToSqlOutput, ValueRef};
use rusqlite::ToSql;
use serde::Serialize;

/// A text value that is not one of an enum's names.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{value:?} is not a known {what}")]
pub struct ParseEnumError {
    what: &'static str,
    value: String,
}

/// Defines a text-valued enum with `as_str`, `Display`, `FromStr` and the
/// SQLite conversions, from one list of `Variant => "name"` pairs.
macro_rules! text_enum {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(rename_all = "snake_case")]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The name stored in the database and used on the wire.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $text, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ParseEnumError;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                match s {
                    $( $text => Ok($name::$variant), )+
                    _ => Err(ParseEnumError { what: $what, value: s.to_owned() }),
                }
            }
        }

        impl ToSql for $name {
            fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
                Ok(ToSqlOutput::from(self.as_str()))
            }
        }

        impl FromSql for $name {
            fn column_result(value: ValueRef<'_>) -> FromSqlResult<Self> {
                value
                    .as_str()?
                    .parse()
                    .map_err(|e| FromSqlError::Other(Box::new(e)))
            }
        }
    };
}

text_enum! {
    /// Where a sandbox is in its life: creating → running ⇄ paused →
    /// stopping → dead. The transitions themselves are the core's business;
    /// the store records the state and offers compare-and-set.
    State, "sandbox state" {
        /// Resources are being set up.
        Creating => "creating",
        /// The sandbox runs and accepts work.
        Running => "running",
        /// Frozen; resumable.
        Paused => "paused",
        /// Teardown is under way.
        Stopping => "stopping",
        /// Gone; the row stays for its history (`state_reason` says why).
        Dead => "dead",
    }
}

text_enum! {
    /// Which audit stream an event belongs to.
    Stream, "event stream" {
        /// API calls and file reads/writes.
        Access => "access",
        /// Policy denials, limit hits, timeout kills.
        Security => "security",
        /// Lifecycle and exec start/exit.
        Runtime => "runtime",
    }
}

/// A sandbox as the store records it.
///
/// The access token's hash is deliberately not part of the row, so a row
/// serialised into an API answer or a log cannot carry it; check a token
/// with [`crate::Store::verify_access_token`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SandboxRow {
    /// `sbx-` and 16 hex digits.
    pub id: String,
    /// Current state.
    pub state: State,
    /// Why the sandbox reached its state, e.g. `deleted`, `timeout`, `oom`,
    /// `crashed`, `daemon_restart`.
    pub state_reason: Option<String>,
    /// Isolation tier name.
    pub tier: String,
    /// Template name.
    pub template: String,
    /// The full validated spec, as JSON text.
    pub spec_json: String,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
    /// The API key that created it.
    pub owner_key_id: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds of the last change to the row.
    pub updated_at: i64,
    /// Unix milliseconds after which the reaper kills it.
    pub expires_at: i64,
    /// What teardown must release, as JSON text. `None` for one being
    /// created, and for one paused keeping only its files (see
    /// [`SandboxRow::is_paused_files_only`]): nothing of it runs.
    pub resources_json: Option<String>,
}

impl SandboxRow {
    /// Whether it is paused keeping only its files
    /// ([`crate::Store::pause_files_only`]): paused, with nothing on the
    /// host, so a resume boots it again on its files.
    pub fn is_paused_files_only(&self) -> bool {
        self.state == State::Paused && self.resources_json.is_none()
    }
}

/// A sandbox to insert. It starts in [`State::Creating`] with no reason and
/// no resources recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewSandbox {
    /// `sbx-` and 16 hex digits; see [`crate::new_sandbox_id`].
    pub id: String,
    /// Isolation tier name.
    pub tier: String,
    /// Template name.
    pub template: String,
    /// The full validated spec; must be a JSON object.
    pub spec_json: String,
    /// User metadata.
    pub metadata: BTreeMap<String, String>,
    /// An existing API key id.
    pub owner_key_id: String,
    /// [`crate::hash_secret`] of the access token handed to the client.
    pub access_token_hash: [u8; 32],
    /// Unix milliseconds; also the first `updated_at`.
    pub created_at: i64,
    /// Unix milliseconds.
    pub expires_at: i64,
    /// What teardown must release, if already planned; must be JSON.
    pub resources_json: Option<String>,
    /// The layers it runs on (by diff_id; each must be recorded), kept
    /// while it is not dead.
    pub layers: Vec<String>,
}

/// Which sandboxes [`crate::Store::list_sandboxes`] returns, and which page.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListQuery {
    /// Only sandboxes in one of these states; `None` means any state. (An
    /// empty set matches nothing.)
    pub states: Option<BTreeSet<State>>,
    /// Only sandboxes whose metadata has every one of these key=value pairs.
    pub metadata: BTreeMap<String, String>,
    /// Only sandboxes created by this API key.
    pub owner_key_id: Option<String>,
    /// None owned by this API key (an admin's listing leaves out the warm
    /// pools' members).
    pub except_owner_key_id: Option<String>,
    /// Page size, 1..=1000; `None` means [`ListQuery::DEFAULT_LIMIT`].
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page; `None` starts at the oldest.
    pub cursor: Option<String>,
}

impl ListQuery {
    /// Page size when none is given.
    pub const DEFAULT_LIMIT: u32 = 100;
    /// Largest page size.
    pub const MAX_LIMIT: u32 = 1000;
}

/// One page of a listing, oldest first (by creation time, then id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Page<T> {
    /// The rows of this page.
    pub items: Vec<T>,
    /// Opaque cursor for the next page; `None` on the last page.
    pub next_cursor: Option<String>,
}

/// An API key as the store records it (without its hash).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRow {
    /// `key-` and 12 hex digits; safe to show and log.
    pub id: String,
    /// A human label.
    pub name: String,
    /// Unix milliseconds.
    pub created_at: i64,
    /// Unix milliseconds, once revoked. A revoked key never verifies.
    pub revoked_at: Option<i64>,
    /// Whether the key may manage keys and see every sandbox.
    pub is_admin: bool,
}

/// An audit event to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    /// The sandbox it concerns, if any.
    pub sandbox_id: Option<String>,
    /// The API request that caused it, if any.
    pub request_id: Option<String>,
    /// Its audit stream.
    pub stream: Stream,
    /// What happened, e.g. `exec.exited`, `net.denied`.
    pub kind: String,
    /// Unix milliseconds.
    pub at: i64,
    /// Free-form details.
    pub detail: serde_json::Value,
}

/// A stored audit event.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EventRow {
    /// Position in the store-wide event order; strictly increasing and never
    /// reused.
    pub seq: i64,
    /// The sandbox it concerns, if any.
    pub sandbox_id: Option<String>,
    /// The API request that caused it, if any.
    pub request_id: Option<String>,
    /// Its audit stream.
    pub stream: Stream,
    /// What happened.
    pub kind: String,
    /// Unix milliseconds.
    pub at: i64,
    /// Free-form details.
    pub detail: serde_json::Value,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>().unwrap(), *s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        for s in Stream::ALL {
            assert_eq!(s.to_string().parse::<Stream>().unwrap(), *s);
            assert_eq!(serde_json::to_value(s).unwrap(), s.as_str());
        }
        let err = "zombie".parse::<State>().unwrap_err();
        assert_eq!(err.to_string(), "\"zombie\" is not a known sandbox state");
        assert!("Running".parse::<State>().is_err());
    }
}
