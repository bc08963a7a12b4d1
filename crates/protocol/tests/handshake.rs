//! The greeting settles on a version both sides speak: agents of version 1
//! (which know no ranges) stay usable, a newer agent that still speaks ours
//! gets ours, and ranges that do not meet fail with a typed error.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use airlock_protocol::*;
use serde::Deserialize;
use tokio::net::UnixStream;

/// The requests an agent of version 1 could read: its `hello` had only
/// `version`, and unknown fields were refused (as in every request type).
#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum V1Request {
    Hello { version: u32 },
}

/// Answers greetings as the agent of version 1 did (crates/agent/src/session.rs
/// at version 1): a request it cannot read gets `invalid_argument`, a
/// version other than 1 gets `unsupported_version`, and the session goes on.
/// Returns the greetings it saw.
async fn v1_agent(mut stream: UnixStream) -> Vec<serde_json::Value> {
    let mut seen = Vec::new();
    while let Ok(frame) = read_frame::<_, serde_json::Value>(&mut stream).await {
        seen.push(frame.msg.clone());
        let answer = match serde_json::from_value::<V1Request>(frame.msg) {
            Ok(V1Request::Hello { version: 1 }) => Event::Hello {
                version: 1,
                agent_version: "v1".into(),
            },
            Ok(V1Request::Hello { version }) => Event::Error {
                kind: ErrorKind::UnsupportedVersion,
                message: format!(
                    "protocol version {version} is not supported; this agent speaks version 1"
                ),
            },
            Err(e) => Event::Error {
                kind: ErrorKind::InvalidArgument,
                message: format!("the request is not valid: {e}"),
            },
        };
        if write_frame(&mut stream, &Frame::new(frame.id, answer))
            .await
            .is_err()
        {
            break;
        }
    }
    seen
}

/// An agent that speaks `agent` and answers as the current one does.
async fn ranged_agent(mut stream: UnixStream, agent: Versions) {
    while let Ok(frame) = read_frame::<_, Request>(&mut stream).await {
        let Request::Hello { version, oldest } = frame.msg else {
            continue;
        };
        let answer = match agent.highest_common(Versions::offered(version, oldest)) {
            Some(version) => Event::Hello {
                version,
                agent_version: "future".into(),
            },
            None => Event::Error {
                kind: ErrorKind::UnsupportedVersion,
                message: "no common version".into(),
            },
        };
        if write_frame(&mut stream, &Frame::new(frame.id, answer))
            .await
            .is_err()
        {
            break;
        }
    }
}

#[tokio::test]
async fn an_agent_of_version_1_is_greeted_again_as_version_1() {
    const {
        assert!(
            PROTOCOL_VERSION > 1 && OLDEST_PROTOCOL_VERSION == 1,
            "this build must still speak version 1, whose agents run in the field"
        )
    };
    let (host, agent) = UnixStream::pair().unwrap();
    let fake = tokio::spawn(v1_agent(agent));
    let client = AgentClient::connect(host, 1).await.unwrap();
    assert_eq!(client.version(), 1);
    drop(client);
    let seen = fake.await.unwrap();
    assert_eq!(
        seen,
        [
            serde_json::json!({"op": "hello", "version": PROTOCOL_VERSION, "oldest": 1}),
            serde_json::json!({"op": "hello", "version": 1}),
        ],
        "the ranged greeting, then the one version 1 reads"
    );
}

#[tokio::test]
async fn a_newer_agent_that_still_speaks_ours_gets_ours() {
    let (host, agent) = UnixStream::pair().unwrap();
    tokio::spawn(ranged_agent(
        agent,
        Versions {
            oldest: 1,
            newest: PROTOCOL_VERSION + 3,
        },
    ));
    let client = AgentClient::connect(host, 1).await.unwrap();
    assert_eq!(client.version(), PROTOCOL_VERSION);
}

#[tokio::test]
async fn an_agent_that_speaks_none_of_our_versions_is_refused() {
    let (host, agent) = UnixStream::pair().unwrap();
    tokio::spawn(ranged_agent(
        agent,
        Versions {
            oldest: PROTOCOL_VERSION + 1,
            newest: PROTOCOL_VERSION + 2,
        },
    ));
    match AgentClient::connect(host, 1).await {
        Err(ClientError::NoCommonVersion) => {}
        Err(other) => panic!("expected NoCommonVersion, got {other}"),
        Ok(client) => panic!("connected with version {}", client.version()),
    }
}

#[test]
fn the_highest_common_version_is_chosen() {
    let range = |oldest, newest| Versions { oldest, newest };
    assert_eq!(range(1, 2).highest_common(range(1, 1)), Some(1));
    assert_eq!(range(1, 2).highest_common(range(2, 7)), Some(2));
    assert_eq!(range(3, 5).highest_common(range(1, 4)), Some(4));
    assert_eq!(range(1, 2).highest_common(range(3, 4)), None);
    // A greeting without `oldest` offers its version alone.
    assert_eq!(Versions::offered(1, None), range(1, 1));
    assert_eq!(Versions::offered(2, Some(1)), range(1, 2));
    assert_eq!(Versions::offered(2, Some(9)), range(2, 2));
}
