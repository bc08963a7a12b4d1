//! The sandbox's only resolver: answers the names its policy could allow,
//! from host-side lookups, and nothing else. Queries are never forwarded.

use crate::{EgressEvent, Shared};
use airlock_policy::always_denied;
use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use std::net::IpAddr;
use std::sync::Arc;
use tokio::net::UdpSocket;

/// Time to live of the answers: short, so a policy change shows soon.
const TTL: u32 = 30;

/// Answers queries until the attachment is dropped.
pub(crate) async fn serve(socket: UdpSocket, shared: Arc<Shared>) {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
            continue;
        };
        // Past the sandbox's rate or lookups at once the query is dropped
        // unanswered (its resolver retries later), before it is even
        // parsed, so a flood costs neither tasks nor host lookups nor audit
        // events in proportion to its size.
        let permit = match shared.dns.enter() {
            Ok(permit) => permit,
            Err(refused) => {
                if refused.report() {
                    let name = Message::from_vec(&buf[..n])
                        .ok()
                        .and_then(|q| q.queries().first().map(|q| q.name().to_ascii()))
                        .map(|name| name.trim_end_matches('.').to_owned())
                        .unwrap_or_default();
                    shared.limited("dns", &name, 53, refused);
                }
                continue;
            }
        };
        let Ok(query) = Message::from_vec(&buf[..n]) else {
            continue;
        };
        let socket = Arc::clone(&socket);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let _permit = permit;
            let answer = answer(&query, &shared).await;
            if let Ok(bytes) = answer.to_vec() {
                let _ = socket.send_to(&bytes, peer).await;
            }
        });
    }
}

/// The answer to one query.
pub(crate) async fn answer(query: &Message, shared: &Shared) -> Message {
    let mut response = Message::new();
    response
        .set_id(query.id())
        .set_message_type(MessageType::Response)
        .set_op_code(OpCode::Query)
        .set_recursion_desired(query.recursion_desired())
        .set_recursion_available(true);
    response.add_queries(query.queries().iter().cloned());
    let [question] = query.queries() else {
        response.set_response_code(ResponseCode::FormErr);
        return response;
    };
    if query.op_code() != OpCode::Query || query.message_type() != MessageType::Query {
        response.set_response_code(ResponseCode::NotImp);
        return response;
    }
    let name = question.name().to_ascii();
    let name = name.trim_end_matches('.').to_ascii_lowercase();
    let policy = shared.policy();
    if !policy.allows_name(&name) {
        shared.refuse("dns", &name, 53, policy.name_refusal().code());
        response.set_response_code(ResponseCode::NXDomain);
        return response;
    }
    shared.report(EgressEvent {
        sandbox: shared.sandbox.clone(),
        protocol: "dns",
        destination: name.clone(),
        port: 53,
        allowed: true,
        reason: "allowed",
        rule: None,
    });
    let wanted = question.query_type();
    if wanted != RecordType::A && wanted != RecordType::AAAA {
        // The name exists as far as the sandbox may know; nothing else of
        // it is told (no MX, TXT… that could carry data).
        response.set_response_code(ResponseCode::NoError);
        return response;
    }
    match shared.resolver.lookup(&name).await {
        Ok(ips) => {
            for ip in ips {
                if always_denied(ip).is_some() || crate::is_host_address(ip) {
                    continue;
                }
                let rdata = match (ip, wanted) {
                    (IpAddr::V4(v4), RecordType::A) => RData::A(A(v4)),
                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(AAAA(v6)),
                    _ => continue,
                };
                response.add_answer(Record::from_rdata(question.name().clone(), TTL, rdata));
            }
            response.set_response_code(ResponseCode::NoError);
        }
        Err(e) => {
            tracing::debug!("egress dns: {e}");
            response.set_response_code(ResponseCode::ServFail);
        }
    }
    response
}
