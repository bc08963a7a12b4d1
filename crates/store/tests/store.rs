//! The store against real SQLite: on disk (WAL) and in memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use airlock_store::{
    hash_secret, new_sandbox_id, new_secret, Entity, ListQuery, NewEvent, NewSandbox, NewTemplate,
    Page, SandboxRow, State, Store, StoreError, Stream, SCHEMA_VERSION,
};
use serde_json::json;

fn sandbox(id: &str, owner: &str, created_at: i64) -> NewSandbox {
    NewSandbox {
        id: id.to_owned(),
        tier: "process".to_owned(),
        template: "base".to_owned(),
        spec_json: r#"{"template":"base","tier":"process"}"#.to_owned(),
        metadata: BTreeMap::new(),
        owner_key_id: owner.to_owned(),
        access_token_hash: hash_secret("token"),
        created_at,
        expires_at: created_at + 300_000,
        resources_json: None,
        layers: Vec::new(),
    }
}

fn meta(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// An in-memory store with one (non-admin) key; returns the key id.
fn store_with_key() -> (Store, String) {
    let store = Store::open_in_memory().unwrap();
    let (key, _) = store.create_key("test", false).unwrap();
    (store, key.id)
}

fn ids(rows: &[SandboxRow]) -> Vec<&str> {
    rows.iter().map(|r| r.id.as_str()).collect()
}

/// Every page of `query`, following cursors; checks no page is oversized.
fn all_pages(store: &Store, mut query: ListQuery) -> Vec<Page<SandboxRow>> {
    let mut pages = Vec::new();
    loop {
        let page = store.list_sandboxes(&query).unwrap();
        assert!(page.items.len() <= query.limit.unwrap_or(100) as usize);
        let next = page.next_cursor.clone();
        pages.push(page);
        match next {
            Some(cursor) => query.cursor = Some(cursor),
            None => return pages,
        }
        assert!(pages.len() < 1000, "pagination does not terminate");
    }
}

fn pragma(store_path: &Path, name: &str) -> String {
    let conn = rusqlite::Connection::open(store_path).unwrap();
    conn.pragma_query_value(None, name, |r| {
        Ok(match r.get_ref(0)? {
            rusqlite::types::ValueRef::Text(t) => String::from_utf8_lossy(t).into_owned(),
            rusqlite::types::ValueRef::Integer(i) => i.to_string(),
            other => format!("{other:?}"),
        })
    })
    .unwrap()
}

// ---------------------------------------------------------------- opening

#[test]
fn a_file_store_uses_wal_and_is_private() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    // journal_mode=WAL is persistent in the file.
    assert_eq!(pragma(&path, "journal_mode"), "wal");
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600);
}

#[test]
fn reopening_keeps_data_and_does_not_migrate_again() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let key_id = {
        let store = Store::open(&path).unwrap();
        let (key, _) = store.create_key("first", true).unwrap();
        store
            .insert_sandbox(&sandbox("sbx-1", &key.id, 10))
            .unwrap();
        key.id
    };
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    assert_eq!(store.count_keys().unwrap(), 1);
    assert_eq!(store.get_key(&key_id).unwrap().unwrap().name, "first");
    assert!(store.get_sandbox("sbx-1").unwrap().is_some());
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
}

#[test]
fn a_database_from_the_future_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Store::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    drop(conn);
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::SchemaVersion { .. }), "{err:?}");
    assert!(err.to_string().contains("schema version"));
}

#[test]
fn opening_in_a_missing_directory_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("state.db");
    let err = Store::open(&path).unwrap_err();
    assert!(matches!(err, StoreError::Open { .. }), "{err:?}");
    assert!(err.to_string().contains("missing/state.db"), "{err}");
}

#[test]
fn two_handles_on_one_file_see_each_other_and_write_concurrently() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let a = Store::open(&path).unwrap();
    let b = Store::open(&path).unwrap();

    // Writes through one handle are visible through the other.
    let (key, secret) = a.create_key("shared", false).unwrap();
    assert_eq!(b.verify_key(&secret).unwrap().unwrap().id, key.id);
    b.insert_sandbox(&sandbox("sbx-b", &key.id, 1)).unwrap();
    assert!(a
        .set_state("sbx-b", Some(State::Creating), State::Running, None)
        .unwrap());
    assert_eq!(
        b.get_sandbox("sbx-b").unwrap().unwrap().state,
        State::Running
    );

    // Both handles write at once from two threads, plus a third handle
    // opened while they run; nothing is lost and seqs are unique.
    let per_thread = 200;
    std::thread::scope(|s| {
        for (n, store) in [a, b].into_iter().enumerate() {
            s.spawn(move || {
                for i in 0..per_thread {
                    store
                        .append_event(&NewEvent {
                            sandbox_id: Some("sbx-b".to_owned()),
                            request_id: Some(format!("req-{n}-{i}")),
                            stream: Stream::Runtime,
                            kind: "tick".to_owned(),
                            at: i,
                            detail: json!({ "thread": n }),
                        })
                        .unwrap();
                }
            });
        }
        s.spawn(|| {
            let c = Store::open(&path).unwrap();
            for i in 0..50 {
                c.set_expiry("sbx-b", i).unwrap();
            }
        });
    });

    let c = Store::open(&path).unwrap();
    let mut seen = Vec::new();
    let mut after = 0;
    loop {
        let page = c.events_for_sandbox("sbx-b", after, 1000).unwrap();
        let Some(last) = page.last() else { break };
        after = last.seq;
        seen.extend(page);
    }
    assert_eq!(seen.len(), 2 * per_thread as usize);
    let seqs: BTreeSet<i64> = seen.iter().map(|e| e.seq).collect();
    assert_eq!(seqs.len(), seen.len());
    assert_eq!(c.get_sandbox("sbx-b").unwrap().unwrap().expires_at, 49);
}

// ---------------------------------------------------------------- sandboxes

#[test]
fn a_sandbox_round_trips() {
    let (store, key) = store_with_key();
    let mut new = sandbox(&new_sandbox_id().unwrap(), &key, 1_000);
    new.metadata = meta(&[("user", "ada"), ("weird.key\"[0]", "v")]);
    new.resources_json = Some(r#"{"cgroup":"/sys/fs/cgroup/airlock/x","slot":3}"#.to_owned());
    store.insert_sandbox(&new).unwrap();

    let row = store.get_sandbox(&new.id).unwrap().unwrap();
    assert_eq!(row.id, new.id);
    assert_eq!(row.state, State::Creating);
    assert_eq!(row.state_reason, None);
    assert_eq!(row.tier, "process");
    assert_eq!(row.template, "base");
    assert_eq!(row.spec_json, new.spec_json);
    assert_eq!(row.metadata, new.metadata);
    assert_eq!(row.owner_key_id, key);
    assert_eq!((row.created_at, row.updated_at), (1_000, 1_000));
    assert_eq!(row.expires_at, 301_000);
    assert_eq!(row.resources_json, new.resources_json);
    assert_eq!(store.get_sandbox("sbx-nope").unwrap(), None);

    // The access token hash is not part of the row, even serialised.
    let as_json = serde_json::to_string(&row).unwrap();
    assert!(!as_json.contains("token"), "{as_json}");
    assert!(store.verify_access_token(&new.id, "token").unwrap());
    assert!(!store.verify_access_token(&new.id, "tokem").unwrap());
    assert!(!store.verify_access_token(&new.id, "").unwrap());
    assert!(matches!(
        store.verify_access_token("sbx-nope", "token"),
        Err(StoreError::NotFound {
            kind: Entity::Sandbox,
            ..
        })
    ));
}

#[test]
fn inserting_twice_or_for_an_unknown_owner_fails_cleanly() {
    let (store, key) = store_with_key();
    store.insert_sandbox(&sandbox("sbx-1", &key, 1)).unwrap();
    let err = store
        .insert_sandbox(&sandbox("sbx-1", &key, 2))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::AlreadyExists { kind: Entity::Sandbox, id } if id == "sbx-1"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "sandbox sbx-1 already exists");

    let err = store
        .insert_sandbox(&sandbox("sbx-2", "key-000000000000", 1))
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::UnknownOwner(k) if k == "key-000000000000"),
        "{err:?}"
    );
    assert_eq!(store.get_sandbox("sbx-2").unwrap(), None);
}

#[test]
fn json_columns_are_checked() {
    let (store, key) = store_with_key();
    for spec in ["", "{", "[1]", "\"text\"", "null"] {
        let mut new = sandbox("sbx-1", &key, 1);
        new.spec_json = spec.to_owned();
        assert!(
            matches!(
                store.insert_sandbox(&new),
                Err(StoreError::InvalidJson {
                    field: "spec_json",
                    ..
                })
            ),
            "{spec:?}"
        );
    }
    let mut new = sandbox("sbx-1", &key, 1);
    new.resources_json = Some("{oops".to_owned());
    assert!(matches!(
        store.insert_sandbox(&new),
        Err(StoreError::InvalidJson {
            field: "resources_json",
            ..
        })
    ));
    store.insert_sandbox(&sandbox("sbx-1", &key, 1)).unwrap();
    assert!(matches!(
        store.set_resources("sbx-1", Some("not json")),
        Err(StoreError::InvalidJson {
            field: "resources_json",
            ..
        })
    ));
}

#[test]
fn set_state_compares_and_sets() {
    let (store, key) = store_with_key();
    store.insert_sandbox(&sandbox("sbx-1", &key, 1)).unwrap();

    // Matching `from`: changes.
    assert!(store
        .set_state("sbx-1", Some(State::Creating), State::Running, None)
        .unwrap());
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert_eq!(row.state, State::Running);
    assert!(row.updated_at > row.created_at);

    // Stale `from`: no change, false.
    assert!(!store
        .set_state("sbx-1", Some(State::Creating), State::Dead, Some("crashed"))
        .unwrap());
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert_eq!((row.state, row.state_reason), (State::Running, None));

    // Two racers from the same observed state: exactly one wins.
    let first = store
        .set_state(
            "sbx-1",
            Some(State::Running),
            State::Stopping,
            Some("deleted"),
        )
        .unwrap();
    let second = store
        .set_state(
            "sbx-1",
            Some(State::Running),
            State::Stopping,
            Some("timeout"),
        )
        .unwrap();
    assert!(first && !second);
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert_eq!(row.state_reason.as_deref(), Some("deleted"));

    // No `from`: unconditional; the reason is replaced (here cleared, then set).
    assert!(store.set_state("sbx-1", None, State::Paused, None).unwrap());
    assert_eq!(
        store.get_sandbox("sbx-1").unwrap().unwrap().state_reason,
        None
    );
    assert!(store
        .set_state("sbx-1", None, State::Dead, Some("oom"))
        .unwrap());
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert_eq!(
        (row.state, row.state_reason.as_deref()),
        (State::Dead, Some("oom"))
    );

    // Unknown sandbox: NotFound, with or without `from`.
    for from in [None, Some(State::Running)] {
        let err = store
            .set_state("sbx-x", from, State::Dead, None)
            .unwrap_err();
        assert!(matches!(
            err,
            StoreError::NotFound {
                kind: Entity::Sandbox,
                ..
            }
        ));
        assert_eq!(err.to_string(), "sandbox sbx-x does not exist");
    }
}

#[test]
fn expiry_and_resources_are_updated() {
    let (store, key) = store_with_key();
    store.insert_sandbox(&sandbox("sbx-1", &key, 1)).unwrap();

    store.set_expiry("sbx-1", 42).unwrap();
    store
        .set_resources("sbx-1", Some(r#"{"cgroup":"a/b","slot":7}"#))
        .unwrap();
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert_eq!(row.expires_at, 42);
    assert_eq!(
        row.resources_json.as_deref(),
        Some(r#"{"cgroup":"a/b","slot":7}"#)
    );
    assert!(row.updated_at > 1);

    store.set_resources("sbx-1", None).unwrap();
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert_eq!(row.resources_json, None);

    for result in [
        store.set_expiry("sbx-x", 1),
        store.set_resources("sbx-x", Some("{}")),
        store.delete_sandbox("sbx-x"),
    ] {
        assert!(matches!(
            result,
            Err(StoreError::NotFound {
                kind: Entity::Sandbox,
                ..
            })
        ));
    }
}

#[test]
fn a_files_only_pause_swaps_spec_and_layers_in_one_step() {
    let (store, key) = store_with_key();
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    store.record_layer(&digest('a'), 10, 1).unwrap();
    store.record_layer(&digest('b'), 10, 1).unwrap();
    let mut new = sandbox("sbx-1", &key, 1);
    new.layers = vec![digest('a')];
    new.resources_json = Some(r#"{"slot":1}"#.to_owned());
    store.insert_sandbox(&new).unwrap();
    store
        .set_state("sbx-1", None, State::Running, None)
        .unwrap();
    let row = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert!(!row.is_paused_files_only());
    // From a state it is not in: nothing changes.
    let spec = r#"{"template":"frozen"}"#;
    assert!(!store
        .pause_files_only("sbx-1", State::Paused, spec, &[digest('b')])
        .unwrap());
    assert_eq!(store.get_sandbox("sbx-1").unwrap().unwrap(), row);
    assert!(store
        .pause_files_only("sbx-1", State::Running, spec, &[digest('b')])
        .unwrap());
    let paused = store.get_sandbox("sbx-1").unwrap().unwrap();
    assert!(paused.is_paused_files_only());
    assert_eq!(store.count_files_only_paused(&key).unwrap(), 1);
    assert_eq!(store.count_files_only_paused("key-other").unwrap(), 0);
    assert_eq!(paused.spec_json, spec);
    assert_eq!(paused.resources_json, None);
    // Both layers are held while it is not dead.
    assert_eq!(store.unreferenced_layers().unwrap(), Vec::<String>::new());
    // An unknown layer or a bad spec changes nothing.
    assert!(store
        .pause_files_only("sbx-1", State::Paused, spec, &[digest('c')])
        .is_err());
    assert!(store
        .pause_files_only("sbx-1", State::Paused, "[]", &[])
        .is_err());
    assert!(store
        .get_sandbox("sbx-1")
        .unwrap()
        .unwrap()
        .is_paused_files_only());
    assert!(matches!(
        store.pause_files_only("sbx-x", State::Running, spec, &[]),
        Err(StoreError::NotFound { .. })
    ));
    store
        .set_state("sbx-1", None, State::Dead, Some("deleted"))
        .unwrap();
    assert_eq!(
        store.unreferenced_layers().unwrap(),
        vec![digest('a'), digest('b')]
    );
}

#[test]
fn list_filters_by_state_metadata_and_owner() {
    let store = Store::open_in_memory().unwrap();
    let (alice, _) = store.create_key("alice", false).unwrap();
    let (bob, _) = store.create_key("bob", false).unwrap();
    let rows = [
        (
            "sbx-1",
            &alice.id,
            meta(&[("env", "prod"), ("team", "a")]),
            State::Running,
        ),
        (
            "sbx-2",
            &alice.id,
            meta(&[("env", "dev"), ("team", "a")]),
            State::Paused,
        ),
        (
            "sbx-3",
            &bob.id,
            meta(&[("env", "prod"), ("team", "b")]),
            State::Running,
        ),
        ("sbx-4", &bob.id, meta(&[("env", "prod")]), State::Dead),
        (
            "sbx-5",
            &bob.id,
            meta(&[("a.b", "1"), ("q\"k", "x y")]),
            State::Creating,
        ),
    ];
    for (i, (id, owner, metadata, state)) in rows.iter().enumerate() {
        let mut new = sandbox(id, owner, i as i64);
        new.metadata = metadata.clone();
        store.insert_sandbox(&new).unwrap();
        store.set_state(id, None, *state, None).unwrap();
    }
    let list = |query: ListQuery| {
        let page = store.list_sandboxes(&query).unwrap();
        assert_eq!(page.next_cursor, None);
        ids(&page.items)
            .into_iter()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let states = |s: &[State]| Some(s.iter().copied().collect::<BTreeSet<_>>());

    assert_eq!(
        list(ListQuery::default()),
        ["sbx-1", "sbx-2", "sbx-3", "sbx-4", "sbx-5"]
    );
    assert_eq!(
        list(ListQuery {
            states: states(&[State::Running]),
            ..Default::default()
        }),
        ["sbx-1", "sbx-3"]
    );
    assert_eq!(
        list(ListQuery {
            states: states(&[State::Running, State::Paused, State::Creating]),
            ..Default::default()
        }),
        ["sbx-1", "sbx-2", "sbx-3", "sbx-5"]
    );
    assert!(list(ListQuery {
        states: states(&[]),
        ..Default::default()
    })
    .is_empty());
    assert_eq!(
        list(ListQuery {
            metadata: meta(&[("env", "prod")]),
            ..Default::default()
        }),
        ["sbx-1", "sbx-3", "sbx-4"]
    );
    // Every pair must match.
    assert_eq!(
        list(ListQuery {
            metadata: meta(&[("env", "prod"), ("team", "a")]),
            ..Default::default()
        }),
        ["sbx-1"]
    );
    assert!(list(ListQuery {
        metadata: meta(&[("env", "prod"), ("team", "c")]),
        ..Default::default()
    })
    .is_empty());
    // Keys are data, not JSON paths.
    assert_eq!(
        list(ListQuery {
            metadata: meta(&[("a.b", "1"), ("q\"k", "x y")]),
            ..Default::default()
        }),
        ["sbx-5"]
    );
    assert!(list(ListQuery {
        metadata: meta(&[("a", "1")]),
        ..Default::default()
    })
    .is_empty());
    assert_eq!(
        list(ListQuery {
            owner_key_id: Some(alice.id.clone()),
            ..Default::default()
        }),
        ["sbx-1", "sbx-2"]
    );
    assert_eq!(
        list(ListQuery {
            owner_key_id: Some(bob.id.clone()),
            states: states(&[State::Running, State::Dead]),
            metadata: meta(&[("env", "prod")]),
            ..Default::default()
        }),
        ["sbx-3", "sbx-4"]
    );
    assert!(list(ListQuery {
        owner_key_id: Some("key-none".into()),
        ..Default::default()
    })
    .is_empty());
}

#[test]
fn pagination_walks_every_row_once_across_created_at_ties() {
    let (store, key) = store_with_key();
    // 23 sandboxes, created_at in runs of 5 equal values, inserted in an
    // order that is neither id nor time order.
    let mut expected = Vec::new();
    for i in (0..23).rev() {
        let id = format!("sbx-{:02}", (i * 7) % 23);
        let mut new = sandbox(&id, &key, 1_000 + i / 5);
        if i % 2 == 0 {
            new.metadata = meta(&[("even", "yes")]);
        }
        store.insert_sandbox(&new).unwrap();
        expected.push((new.created_at, id, i % 2 == 0));
    }
    expected.sort();

    for limit in [1, 2, 4, 5, 22, 23, 24, 1000] {
        let pages = all_pages(
            &store,
            ListQuery {
                limit: Some(limit),
                ..Default::default()
            },
        );
        let got: Vec<(i64, String)> = pages
            .iter()
            .flat_map(|p| p.items.iter().map(|r| (r.created_at, r.id.clone())))
            .collect();
        let want: Vec<(i64, String)> = expected.iter().map(|(t, id, _)| (*t, id.clone())).collect();
        assert_eq!(got, want, "limit {limit}");
        // Full pages until the last; no empty trailing page.
        assert_eq!(
            pages.len(),
            23_usize.div_ceil(limit as usize),
            "limit {limit}"
        );
        assert!(pages.iter().all(|p| !p.items.is_empty()));
    }

    // With a filter, pages stay full: filtering happens before the limit.
    let pages = all_pages(
        &store,
        ListQuery {
            limit: Some(3),
            metadata: meta(&[("even", "yes")]),
            ..Default::default()
        },
    );
    let got: Vec<String> = pages
        .iter()
        .flat_map(|p| ids(&p.items))
        .map(str::to_owned)
        .collect();
    let want: Vec<String> = expected
        .iter()
        .filter(|e| e.2)
        .map(|(_, id, _)| id.clone())
        .collect();
    assert_eq!(got, want);
    assert_eq!(pages.len(), 4);
    assert!(pages[..3].iter().all(|p| p.items.len() == 3));
}

#[test]
fn pagination_is_stable_while_rows_come_and_go() {
    let (store, key) = store_with_key();
    for i in 0..6 {
        store
            .insert_sandbox(&sandbox(&format!("sbx-{i}"), &key, i))
            .unwrap();
    }
    let query = ListQuery {
        limit: Some(3),
        ..Default::default()
    };
    let first = store.list_sandboxes(&query).unwrap();
    assert_eq!(ids(&first.items), ["sbx-0", "sbx-1", "sbx-2"]);
    // A row before the cursor disappears and a new one appears at the end.
    store.delete_sandbox("sbx-1").unwrap();
    store.insert_sandbox(&sandbox("sbx-6", &key, 6)).unwrap();
    let second = store
        .list_sandboxes(&ListQuery {
            cursor: first.next_cursor,
            ..query.clone()
        })
        .unwrap();
    assert_eq!(ids(&second.items), ["sbx-3", "sbx-4", "sbx-5"]);
    let third = store
        .list_sandboxes(&ListQuery {
            cursor: second.next_cursor,
            ..query
        })
        .unwrap();
    assert_eq!(ids(&third.items), ["sbx-6"]);
    assert_eq!(third.next_cursor, None);
}

#[test]
fn malformed_cursors_and_limits_are_errors() {
    let (store, key) = store_with_key();
    store.insert_sandbox(&sandbox("sbx-1", &key, 1)).unwrap();
    for cursor in [
        "",
        "xyz",
        "0",
        "00000000000000",
        "0000000000000001",
        "ffffffffffffffffff",
    ] {
        let err = store
            .list_sandboxes(&ListQuery {
                cursor: Some(cursor.to_owned()),
                ..Default::default()
            })
            .unwrap_err();
        assert!(
            matches!(err, StoreError::InvalidCursor),
            "{cursor:?}: {err:?}"
        );
        assert_eq!(err.to_string(), "the pagination cursor is malformed");
    }
    for limit in [0, 1001, u32::MAX] {
        let err = store
            .list_sandboxes(&ListQuery {
                limit: Some(limit),
                ..Default::default()
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::InvalidLimit(l) if l == limit));
    }
    // Exactly `limit` rows: a last page, not a cursor to an empty one.
    let page = store
        .list_sandboxes(&ListQuery {
            limit: Some(1),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(page.next_cursor, None);
}

#[test]
fn expired_lists_live_sandboxes_past_their_expiry() {
    let (store, key) = store_with_key();
    let cases = [
        ("sbx-a", 100, State::Running),
        ("sbx-b", 50, State::Paused),
        ("sbx-c", 100, State::Creating),
        ("sbx-d", 10, State::Dead),
        ("sbx-e", 101, State::Running),
        ("sbx-f", 99, State::Stopping),
    ];
    for (id, expires_at, state) in cases {
        store.insert_sandbox(&sandbox(id, &key, 0)).unwrap();
        store.set_expiry(id, expires_at).unwrap();
        store.set_state(id, None, state, None).unwrap();
    }
    assert_eq!(
        store.expired(100).unwrap(),
        ["sbx-b", "sbx-f", "sbx-a", "sbx-c"]
    );
    assert_eq!(store.expired(49).unwrap(), Vec::<String>::new());
    assert_eq!(store.expired(i64::MAX).unwrap().len(), 5);

    let live: Vec<String> = store
        .live_sandboxes()
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(live, ["sbx-a", "sbx-b", "sbx-c", "sbx-e", "sbx-f"]);
}

#[test]
fn the_expiry_query_uses_its_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    drop(Store::open(&path).unwrap());
    let conn = rusqlite::Connection::open(&path).unwrap();
    let plan: Vec<String> = conn
        .prepare(
            "EXPLAIN QUERY PLAN SELECT id FROM sandboxes WHERE state <> 'dead' \
             AND expires_at <= ?1 ORDER BY expires_at, id",
        )
        .unwrap()
        .query_map([0], |r| r.get(3))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert!(
        plan.iter().any(|p| p.contains("sandboxes_by_expiry")),
        "{plan:?}"
    );
}

#[test]
fn deleting_a_sandbox_keeps_its_events() {
    let (store, key) = store_with_key();
    store.insert_sandbox(&sandbox("sbx-1", &key, 1)).unwrap();
    store
        .append_event(&NewEvent {
            sandbox_id: Some("sbx-1".into()),
            request_id: None,
            stream: Stream::Runtime,
            kind: "created".into(),
            at: 1,
            detail: json!({}),
        })
        .unwrap();
    store.delete_sandbox("sbx-1").unwrap();
    assert_eq!(store.get_sandbox("sbx-1").unwrap(), None);
    assert!(matches!(
        store.delete_sandbox("sbx-1"),
        Err(StoreError::NotFound { .. })
    ));
    assert_eq!(store.events_for_sandbox("sbx-1", 0, 10).unwrap().len(), 1);
}

// ---------------------------------------------------------------- keys

#[test]
fn keys_made_before_the_e2b_shape_stay_valid() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("airlock.db");
    drop(Store::open(&path).unwrap());
    // A key as older builds made it: `al_` and 64 hex digits, only its
    // hash stored.
    let legacy = format!("al_{}", "5a".repeat(32));
    let conn = rusqlite::Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO api_keys (id, name, hash, is_admin, created_at) VALUES ('key-0123456789ab', 'old', ?1, 1, 0)",
        [hash_secret(&legacy).as_slice()],
    )
    .unwrap();
    drop(conn);
    let store = Store::open(&path).unwrap();
    let row = store
        .verify_key(&legacy)
        .unwrap()
        .expect("the old key opens");
    assert_eq!((row.id.as_str(), row.is_admin), ("key-0123456789ab", true));
    assert!(airlock_store::is_key_secret(&legacy));
    let (_, new) = store.create_key("new", false).unwrap();
    assert!(new.starts_with("e2b_"), "{new}");
}

#[test]
fn keys_are_created_verified_and_revoked() {
    let store = Store::open_in_memory().unwrap();
    assert_eq!(store.count_keys().unwrap(), 0);
    let (admin, admin_secret) = store.create_key("admin", true).unwrap();
    let (user, user_secret) = store.create_key("ci", false).unwrap();

    assert!(admin.id.starts_with("key-") && admin.id.len() == 16);
    assert!(admin.id[4..].bytes().all(|b| b.is_ascii_hexdigit()));
    assert!(admin_secret.starts_with("e2b_") && admin_secret.len() == 68);
    assert_ne!(admin_secret, user_secret);
    assert!(admin.is_admin && !user.is_admin);
    assert_eq!(store.count_keys().unwrap(), 2);

    assert_eq!(
        store.verify_key(&admin_secret).unwrap(),
        Some(admin.clone())
    );
    assert_eq!(store.verify_key(&user_secret).unwrap(), Some(user.clone()));

    // Wrong secrets: unknown, empty, one character off (same prefix, so the
    // lookup and the constant-time comparison both run on a near miss),
    // the hash itself presented as a secret, and the key id.
    let mut near = user_secret.clone();
    let last = near.pop().unwrap();
    near.push(if last == '0' { '1' } else { '0' });
    let hash_hex: String = hash_secret(&user_secret)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for wrong in [
        new_secret("e2b_").unwrap(),
        new_secret("al_").unwrap(),
        String::new(),
        near,
        user_secret.to_uppercase(),
        format!("{user_secret} "),
        hash_hex,
        user.id.clone(),
    ] {
        assert_eq!(store.verify_key(&wrong).unwrap(), None, "{wrong:?}");
    }

    // Revocation: immediate, idempotent (first time kept), only that key.
    store.revoke_key(&user.id).unwrap();
    assert_eq!(store.verify_key(&user_secret).unwrap(), None);
    let revoked = store.get_key(&user.id).unwrap().unwrap();
    let at = revoked.revoked_at.expect("revoked_at set");
    std::thread::sleep(std::time::Duration::from_millis(3));
    store.revoke_key(&user.id).unwrap();
    assert_eq!(
        store.get_key(&user.id).unwrap().unwrap().revoked_at,
        Some(at)
    );
    assert_eq!(store.verify_key(&user_secret).unwrap(), None);
    assert!(store.verify_key(&admin_secret).unwrap().is_some());

    let err = store.revoke_key("key-000000000000").unwrap_err();
    assert!(matches!(
        err,
        StoreError::NotFound {
            kind: Entity::ApiKey,
            ..
        }
    ));
    assert_eq!(err.to_string(), "API key key-000000000000 does not exist");

    // Revoked keys still count and are still listed.
    assert_eq!(store.count_keys().unwrap(), 2);
    let listed = store.list_keys().unwrap();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&admin));
    assert!(listed.contains(&revoked));
    assert_eq!(store.get_key("key-nope").unwrap(), None);
}

#[test]
fn plaintext_secrets_never_reach_the_database_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let access_token = new_secret("at_").unwrap();
    let (key_secret, hashes) = {
        let store = Store::open(&path).unwrap();
        let (key, key_secret) = store.create_key("admin", true).unwrap();
        let mut new = sandbox("sbx-1", &key.id, 1);
        new.access_token_hash = hash_secret(&access_token);
        store.insert_sandbox(&new).unwrap();
        assert!(store.verify_key(&key_secret).unwrap().is_some());
        assert!(store.verify_access_token("sbx-1", &access_token).unwrap());
        let hashes = [hash_secret(&key_secret), hash_secret(&access_token)];
        (key_secret, hashes)
    };
    // Also before any checkpoint: read the main file and the WAL while a
    // second handle keeps the WAL from being folded back and removed.
    let store = Store::open(&path).unwrap();
    store.create_key("another", false).unwrap();

    let mut everything = Vec::new();
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        everything.extend(std::fs::read(entry.unwrap().path()).unwrap());
    }
    let contains = |needle: &[u8]| everything.windows(needle.len()).any(|w| w == needle);
    for secret in [&key_secret, &access_token] {
        assert!(
            !contains(secret.as_bytes()),
            "a secret is in the database files"
        );
        // Not even its random part, in any case.
        let random_part = &secret[3..];
        assert!(!contains(random_part.as_bytes()));
        assert!(!contains(random_part.to_uppercase().as_bytes()));
    }
    // The check would notice: the hashes are there.
    for hash in hashes {
        assert!(
            contains(&hash),
            "the stored hash was not found; test reads the wrong files"
        );
    }
}

// ---------------------------------------------------------------- events

#[test]
fn a_batch_of_events_is_appended_whole_and_in_order() {
    let store = Store::open_in_memory().unwrap();
    let batch: Vec<NewEvent> = (0..5)
        .map(|i| NewEvent {
            sandbox_id: Some("sbx-1".into()),
            request_id: None,
            stream: Stream::Runtime,
            kind: format!("k{i}"),
            at: 1_700_000_000_000 + i,
            detail: json!({ "i": i }),
        })
        .collect();
    assert_eq!(store.append_events(&batch).unwrap(), 5);
    assert_eq!(store.append_events(&[]).unwrap(), 0);
    let kinds: Vec<String> = store
        .events_for_sandbox("sbx-1", 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| e.kind)
        .collect();
    assert_eq!(kinds, ["k0", "k1", "k2", "k3", "k4"]);
}

#[test]
fn events_come_back_in_order_and_page_by_seq() {
    let store = Store::open_in_memory().unwrap();
    let event = |sandbox: Option<&str>, kind: &str, stream: Stream| NewEvent {
        sandbox_id: sandbox.map(str::to_owned),
        request_id: Some(format!("req-{kind}")),
        stream,
        kind: kind.to_owned(),
        at: 1_700_000_000_000,
        detail: json!({ "kind": kind, "n": [1, 2, 3] }),
    };
    let mut mine = Vec::new();
    let mut last_seq = 0;
    for i in 0..25 {
        let stream = Stream::ALL[i % 3];
        let seq = store
            .append_event(&event(Some("sbx-1"), &format!("e{i}"), stream))
            .unwrap();
        assert!(seq > last_seq, "seqs increase");
        last_seq = seq;
        mine.push(seq);
        // Interleave other sandboxes' and sandbox-less events.
        store
            .append_event(&event(Some("sbx-2"), "other", Stream::Access))
            .unwrap();
        store
            .append_event(&event(None, "global", Stream::Security))
            .unwrap();
    }

    let all = store.events_for_sandbox("sbx-1", 0, 1000).unwrap();
    assert_eq!(all.iter().map(|e| e.seq).collect::<Vec<_>>(), mine);
    let e = &all[4];
    assert_eq!(e.sandbox_id.as_deref(), Some("sbx-1"));
    assert_eq!(e.request_id.as_deref(), Some("req-e4"));
    assert_eq!(e.stream, Stream::Security);
    assert_eq!(e.kind, "e4");
    assert_eq!(e.at, 1_700_000_000_000);
    assert_eq!(e.detail, json!({ "kind": "e4", "n": [1, 2, 3] }));

    // Paging by the last seq seen.
    let mut paged = Vec::new();
    let mut after = 0;
    loop {
        let page = store.events_for_sandbox("sbx-1", after, 7).unwrap();
        assert!(page.len() <= 7);
        let Some(last) = page.last() else { break };
        after = last.seq;
        paged.extend(page.iter().map(|e| e.kind.clone()));
    }
    assert_eq!(paged, (0..25).map(|i| format!("e{i}")).collect::<Vec<_>>());

    assert!(store
        .events_for_sandbox("sbx-1", last_seq, 10)
        .unwrap()
        .is_empty());
    assert!(store
        .events_for_sandbox("sbx-none", 0, 10)
        .unwrap()
        .is_empty());
    assert_eq!(
        store.events_for_sandbox("sbx-2", 0, 1000).unwrap().len(),
        25
    );
    for limit in [0, 1001] {
        assert!(matches!(
            store.events_for_sandbox("sbx-1", 0, limit),
            Err(StoreError::InvalidLimit(_))
        ));
    }
}

#[test]
fn errors_read_as_sentences() {
    let errors = [
        StoreError::InvalidLimit(0),
        StoreError::InvalidCursor,
        StoreError::UnknownOwner("key-1".into()),
        StoreError::InvalidJson {
            field: "spec_json",
            expected: "a JSON object",
        },
    ];
    let texts: Vec<String> = errors.iter().map(ToString::to_string).collect();
    assert_eq!(
        texts,
        [
            "the page limit 0 is outside 1 to 1000",
            "the pagination cursor is malformed",
            "the owner API key key-1 does not exist",
            "spec_json is not a JSON object",
        ]
    );
}

#[test]
fn pruning_keeps_recent_events_and_at_most_max_rows() {
    let store = Store::open_in_memory().unwrap();
    let event = |at: i64| NewEvent {
        sandbox_id: Some("sbx-1".into()),
        request_id: None,
        stream: Stream::Security,
        kind: "egress.denied".into(),
        at,
        detail: json!({}),
    };
    for at in 0..100 {
        store.append_event(&event(at)).unwrap();
    }
    // Older than 40 go; of the 60 left, only the newest 25 stay.
    assert_eq!(store.prune_events(40, 25).unwrap(), 75);
    let left = store.events_for_sandbox("sbx-1", 0, 1000).unwrap();
    assert_eq!(
        left.iter().map(|e| e.at).collect::<Vec<_>>(),
        (75..100).collect::<Vec<_>>()
    );
    assert_eq!(
        store.prune_events(0, 1000).unwrap(),
        0,
        "nothing more to do"
    );
}

#[test]
fn a_template_keeps_its_tier_across_a_rebuild_until_it_is_cleared() {
    let store = Store::open_in_memory().unwrap();
    let digest = |c: char| format!("sha256:{}", c.to_string().repeat(64));
    store.record_layer(&digest('a'), 10, 1).unwrap();
    let new = |d: char| NewTemplate {
        name: "base".into(),
        digest: digest(d),
        source: "test".into(),
        config: serde_json::json!({}),
        layers: vec![digest('a')],
    };
    assert_eq!(store.put_template(&new('b')).unwrap().tier, None);
    store.set_template_tier("base", Some("gvisor")).unwrap();
    assert_eq!(
        store.get_template("base").unwrap().unwrap().tier.as_deref(),
        Some("gvisor")
    );
    // A rebuild under the same name keeps the name's tier.
    let rebuilt = store.put_template(&new('c')).unwrap();
    assert_eq!(rebuilt.tier.as_deref(), Some("gvisor"));
    assert_eq!(
        store.templates().unwrap()[0].tier.as_deref(),
        Some("gvisor")
    );
    store.set_template_tier("base", None).unwrap();
    assert_eq!(store.get_template("base").unwrap().unwrap().tier, None);
    // Unknown names and absurd values are refused and change nothing.
    let err = store.set_template_tier("nope", Some("oci")).unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
    assert!(store.set_template_tier("base", Some("")).is_err());
    assert_eq!(store.get_template("base").unwrap().unwrap().tier, None);
}
