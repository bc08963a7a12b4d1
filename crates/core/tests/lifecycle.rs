//! The state machine against a written-out table of every (state, action)
//! pair, plus the string and serde forms.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use airlock_core::{next, Action, DeadReason, IllegalTransition, ParseStateError, State};

/// Every state. The `match` has no wildcard, so a new state variant breaks
/// the build here until it is listed (and then the table test fails until
/// its rows are written).
fn all_states() -> Vec<State> {
    let witness = |s: State| match s {
        State::Creating | State::Running | State::Paused | State::Stopping(_) | State::Dead(_) => {}
    };
    let mut all = vec![State::Creating, State::Running, State::Paused];
    all.extend(DeadReason::ALL.map(State::Stopping));
    all.extend(DeadReason::ALL.map(State::Dead));
    all.iter().copied().for_each(witness);
    all
}

/// Every action; same trick as [`all_states`].
fn all_actions() -> Vec<Action> {
    let witness = |a: Action| match a {
        Action::Started
        | Action::Pause
        | Action::Resume
        | Action::Stop(_)
        | Action::Exited(_)
        | Action::Failed => {}
    };
    let mut all = vec![
        Action::Started,
        Action::Pause,
        Action::Resume,
        Action::Failed,
    ];
    all.extend(DeadReason::ALL.map(Action::Stop));
    all.extend(DeadReason::ALL.map(Action::Exited));
    all.iter().copied().for_each(witness);
    all
}

/// The transition table, one row per (state, action) with `s` standing for
/// every reason of the state and `r` for every reason of the action; the
/// result may use either. `-` means illegal.
const TABLE: &[(&str, &str, &str)] = &[
    ("creating", "started", "running"),
    ("creating", "pause", "-"),
    ("creating", "resume", "-"),
    ("creating", "stop(r)", "stopping(r)"),
    ("creating", "exited(deleted)", "-"),
    ("creating", "exited(timeout)", "-"),
    ("creating", "exited(oom)", "dead(oom)"),
    ("creating", "exited(crashed)", "dead(crashed)"),
    ("creating", "exited(create_failed)", "-"),
    ("creating", "exited(daemon_restart)", "dead(daemon_restart)"),
    ("creating", "failed", "dead(create_failed)"),
    //
    ("running", "started", "-"),
    ("running", "pause", "paused"),
    ("running", "resume", "-"),
    ("running", "stop(r)", "stopping(r)"),
    ("running", "exited(deleted)", "-"),
    ("running", "exited(timeout)", "-"),
    ("running", "exited(oom)", "dead(oom)"),
    ("running", "exited(crashed)", "dead(crashed)"),
    ("running", "exited(create_failed)", "-"),
    ("running", "exited(daemon_restart)", "dead(daemon_restart)"),
    ("running", "failed", "-"),
    //
    ("paused", "started", "-"),
    ("paused", "pause", "-"),
    ("paused", "resume", "running"),
    ("paused", "stop(r)", "stopping(r)"),
    ("paused", "exited(deleted)", "-"),
    ("paused", "exited(timeout)", "-"),
    ("paused", "exited(oom)", "dead(oom)"),
    ("paused", "exited(crashed)", "dead(crashed)"),
    ("paused", "exited(create_failed)", "-"),
    ("paused", "exited(daemon_restart)", "dead(daemon_restart)"),
    ("paused", "failed", "-"),
    //
    ("stopping(s)", "started", "-"),
    ("stopping(s)", "pause", "-"),
    ("stopping(s)", "resume", "-"),
    ("stopping(s)", "stop(r)", "stopping(s)"),
    ("stopping(s)", "exited(deleted)", "dead(s)"),
    ("stopping(s)", "exited(timeout)", "dead(s)"),
    ("stopping(s)", "exited(oom)", "dead(oom)"),
    ("stopping(s)", "exited(crashed)", "dead(crashed)"),
    ("stopping(s)", "exited(create_failed)", "dead(s)"),
    ("stopping(s)", "exited(daemon_restart)", "dead(s)"),
    ("stopping(s)", "failed", "-"),
    //
    ("dead(s)", "started", "-"),
    ("dead(s)", "pause", "-"),
    ("dead(s)", "resume", "-"),
    ("dead(s)", "stop(r)", "dead(s)"),
    ("dead(s)", "exited(r)", "dead(s)"),
    ("dead(s)", "failed", "dead(s)"),
];

/// Splits `name(arg)` into `("name", Some("arg"))`.
fn split(text: &str) -> (&str, Option<&str>) {
    match text.split_once('(') {
        Some((name, rest)) => (name, Some(rest.strip_suffix(')').unwrap())),
        None => (text, None),
    }
}

/// Replaces the variables `s` and `r` in a reason slot.
fn bind(arg: Option<&str>, s: Option<DeadReason>, r: Option<DeadReason>) -> Option<String> {
    arg.map(|a| match a {
        "s" => s.unwrap().as_str().to_owned(),
        "r" => r.unwrap().as_str().to_owned(),
        other => other.to_owned(),
    })
}

fn parse_state(text: &str, s: Option<DeadReason>, r: Option<DeadReason>) -> State {
    let (name, arg) = split(text);
    State::from_parts(name, bind(arg, s, r).as_deref()).unwrap()
}

fn parse_action(name: &str, reason: Option<&str>) -> Action {
    let reason = || reason.unwrap().parse::<DeadReason>().unwrap();
    match name {
        "started" => Action::Started,
        "pause" => Action::Pause,
        "resume" => Action::Resume,
        "stop" => Action::Stop(reason()),
        "exited" => Action::Exited(reason()),
        "failed" => Action::Failed,
        other => panic!("unknown action {other} in the table"),
    }
}

/// The table expanded to concrete pairs.
fn expanded() -> HashMap<(State, Action), Option<State>> {
    let mut out = HashMap::new();
    for &(state, action, result) in TABLE {
        let (state_name, state_arg) = split(state);
        let (action_name, action_arg) = split(action);
        let state_binds: Vec<Option<DeadReason>> = if state_arg == Some("s") {
            DeadReason::ALL.map(Some).to_vec()
        } else {
            vec![None]
        };
        let action_binds: Vec<Option<DeadReason>> = if action_arg == Some("r") {
            DeadReason::ALL.map(Some).to_vec()
        } else {
            vec![None]
        };
        for &s in &state_binds {
            for &r in &action_binds {
                let from = State::from_parts(state_name, bind(state_arg, s, r).as_deref()).unwrap();
                let act = parse_action(action_name, bind(action_arg, s, r).as_deref());
                let to = (result != "-").then(|| parse_state(result, s, r));
                let previous = out.insert((from, act), to);
                assert!(
                    previous.is_none(),
                    "the table lists {from:?} + {act:?} twice"
                );
            }
        }
    }
    out
}

#[test]
fn every_state_action_pair_matches_the_table() {
    let table = expanded();
    let states = all_states();
    let actions = all_actions();
    assert_eq!(states.len(), 15);
    assert_eq!(actions.len(), 16);
    let mut checked = 0;
    for &state in &states {
        for &action in &actions {
            let expected = table
                .get(&(state, action))
                .unwrap_or_else(|| panic!("the table does not decide {state:?} + {action:?}"));
            let got = next(state, action);
            match expected {
                Some(to) => assert_eq!(got, Ok(*to), "{state:?} + {action:?}"),
                None => assert_eq!(
                    got,
                    Err(IllegalTransition {
                        from: state,
                        action
                    }),
                    "{state:?} + {action:?} must be illegal"
                ),
            }
            assert_eq!(state.next(action), got, "method and function agree");
            checked += 1;
        }
    }
    assert_eq!(checked, 15 * 16);
    assert_eq!(
        table.len(),
        checked,
        "the table has rows for no other pairs"
    );
}

#[test]
fn illegal_transition_messages_name_state_and_action() {
    let err = next(State::Running, Action::Resume).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a sandbox that is running cannot be resumed"
    );
    let err = next(State::Dead(DeadReason::Timeout), Action::Pause).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a sandbox that is dead (timeout) cannot be paused"
    );
    let err = next(State::Running, Action::Exited(DeadReason::Deleted)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a sandbox that is running cannot exit (deleted)"
    );
    let err = next(State::Stopping(DeadReason::Deleted), Action::Started).unwrap_err();
    assert_eq!(
        err.to_string(),
        "a sandbox that is stopping (deleted) cannot finish starting"
    );
    for state in all_states() {
        for action in all_actions() {
            if let Err(e) = next(state, action) {
                let msg = e.to_string();
                assert!(msg.contains(state.as_str()), "{msg}");
                assert!(msg.starts_with("a sandbox that is "), "{msg}");
            }
        }
    }
}

#[test]
fn a_full_life_and_a_double_delete() {
    let mut s = State::Creating;
    for a in [
        Action::Started,
        Action::Pause,
        Action::Resume,
        Action::Stop(DeadReason::Deleted),
        Action::Stop(DeadReason::Timeout),
        Action::Exited(DeadReason::DaemonRestart),
        Action::Stop(DeadReason::Deleted),
        Action::Exited(DeadReason::Oom),
    ] {
        s = next(s, a).unwrap();
    }
    assert_eq!(s, State::Dead(DeadReason::Deleted));
}

#[test]
fn an_oom_during_teardown_wins_over_the_stop_reason() {
    let s = next(State::Running, Action::Stop(DeadReason::Timeout)).unwrap();
    assert_eq!(s, State::Stopping(DeadReason::Timeout));
    assert_eq!(
        next(s, Action::Exited(DeadReason::Oom)),
        Ok(State::Dead(DeadReason::Oom))
    );
    assert_eq!(
        next(s, Action::Exited(DeadReason::Deleted)),
        Ok(State::Dead(DeadReason::Timeout))
    );
}

#[test]
fn delete_during_creation_refuses_the_creators_outcome() {
    let s = next(State::Creating, Action::Stop(DeadReason::Deleted)).unwrap();
    assert!(next(s, Action::Started).is_err());
    assert!(next(s, Action::Failed).is_err());
    assert_eq!(
        next(s, Action::Exited(DeadReason::Deleted)),
        Ok(State::Dead(DeadReason::Deleted))
    );
}

#[test]
fn store_strings() {
    let states: Vec<&str> = all_states().iter().map(|s| s.as_str()).collect();
    for name in ["creating", "running", "paused", "stopping", "dead"] {
        assert!(states.contains(&name));
    }
    let reasons: Vec<&str> = DeadReason::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        reasons,
        [
            "deleted",
            "timeout",
            "oom",
            "crashed",
            "create_failed",
            "daemon_restart"
        ]
    );
    for state in all_states() {
        let reason = state.reason().map(DeadReason::as_str);
        assert_eq!(State::from_parts(state.as_str(), reason), Ok(state));
    }
    for r in DeadReason::ALL {
        assert_eq!(r.as_str().parse::<DeadReason>(), Ok(r));
        assert_eq!(r.to_string(), r.as_str());
    }
}

#[test]
fn bad_store_strings_are_refused() {
    assert_eq!(
        State::from_parts("zombie", None),
        Err(ParseStateError::UnknownState("zombie".into()))
    );
    assert_eq!(
        State::from_parts("dead", None),
        Err(ParseStateError::MissingReason("dead".into()))
    );
    assert_eq!(
        State::from_parts("running", Some("oom")),
        Err(ParseStateError::UnexpectedReason {
            state: "running".into(),
            reason: DeadReason::Oom
        })
    );
    assert_eq!(
        State::from_parts("dead", Some("melted")),
        Err(ParseStateError::UnknownReason("melted".into()))
    );
    let msg = ParseStateError::MissingReason("dead".into()).to_string();
    assert_eq!(msg, "the sandbox state `dead` needs a reason");
}

#[test]
fn serde_forms() {
    assert_eq!(json(&State::Running), r#"{"state":"running"}"#);
    assert_eq!(
        json(&State::Dead(DeadReason::CreateFailed)),
        r#"{"state":"dead","reason":"create_failed"}"#
    );
    assert_eq!(
        json(&Action::Stop(DeadReason::DaemonRestart)),
        r#"{"action":"stop","reason":"daemon_restart"}"#
    );
    assert_eq!(json(&Action::Pause), r#"{"action":"pause"}"#);
    assert_eq!(json(&DeadReason::Oom), r#""oom""#);
    for state in all_states() {
        let text = serde_json::to_string(&state).unwrap();
        assert_eq!(serde_json::from_str::<State>(&text).unwrap(), state);
    }
    for action in all_actions() {
        let text = serde_json::to_string(&action).unwrap();
        assert_eq!(serde_json::from_str::<Action>(&text).unwrap(), action);
    }
    assert!(serde_json::from_str::<State>(r#"{"state":"dead"}"#).is_err());
}

fn json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap()
}
