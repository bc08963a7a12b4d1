//! The host side of the protocol: many requests at once over one stream.
//!
//! [`AgentClient`] owns a connection to an agent (directly, or through a
//! supervisor's socket). One task writes frames, one reads them and routes
//! each event to the request that opened it by id. A request's events end
//! with its final event; if the connection drops first, the request sees
//! [`ClientError::Closed`] instead of hanging.
//!
//! Each request buffers a bounded number of events; a request whose events
//! nobody reads holds up the router (and so the connection) once its buffer
//! is full. That is backpressure by design: the daemon reads every stream it
//! opens, and a slow client of the daemon must slow the agent down, not grow
//! memory.

use crate::{read_frame, write_frame, ErrorKind, Event, Frame, FrameError, Request, Versions};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Frames queued towards the agent before senders wait.
const OUTBOUND_QUEUE: usize = 64;
/// Events buffered per request before the router waits for its reader.
const EVENTS_PER_REQUEST: usize = 64;

/// A request could not be carried out over the connection.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the connection to the agent closed")]
    Closed,
    /// The agent speaks none of the versions this host speaks.
    #[error(
        "the agent speaks none of this host's protocol versions ({})",
        Versions::OURS
    )]
    NoCommonVersion,
    /// The agent chose a version this host did not offer.
    #[error(
        "the agent chose protocol version {0}, which this host does not speak ({ours})",
        ours = Versions::OURS
    )]
    Version(u32),
    #[error("the agent answered the greeting with {0:?}")]
    Greeting(Box<Event>),
}

type Routes = Arc<Mutex<HashMap<u64, mpsc::Sender<Frame<Event>>>>>;

/// A multiplexed connection to one agent. Clones share the connection;
/// when the last one is dropped the connection is shut down.
#[derive(Clone)]
pub struct AgentClient {
    outbound: mpsc::Sender<Frame<Request>>,
    routes: Routes,
    next_id: Arc<AtomicU64>,
    /// Set by the router when the connection is gone, before it drops the
    /// routes; a request registered after that sees it and fails at once.
    closed: Arc<AtomicBool>,
    /// The protocol version the greeting settled on.
    version: u32,
}

/// The events of one request, in order, ending with its final event.
pub struct Events {
    id: u64,
    inbound: mpsc::Receiver<Frame<Event>>,
    done: bool,
}

impl Events {
    /// The id of the request.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The next event; `Ok(None)` after the final one.
    pub async fn next(&mut self) -> Result<Option<Frame<Event>>, ClientError> {
        if self.done {
            return Ok(None);
        }
        match self.inbound.recv().await {
            Some(frame) => {
                self.done = frame.msg.is_final();
                Ok(Some(frame))
            }
            None => Err(ClientError::Closed),
        }
    }

    /// Waits for the final event, discarding the others.
    pub async fn finish(mut self) -> Result<Event, ClientError> {
        let mut last = None;
        while let Some(frame) = self.next().await? {
            last = Some(frame.msg);
        }
        last.ok_or(ClientError::Closed)
    }
}

impl AgentClient {
    /// Starts the client on a connection and greets the agent. Request ids
    /// start at `first_id`, so a daemon that reconnects after a restart can
    /// pick ids no old request of the agent still uses.
    pub async fn connect<S>(stream: S, first_id: u64) -> Result<AgentClient, ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(stream);
        let mut client = AgentClient::start(reader, writer, first_id);
        client.version = client.greet().await?;
        Ok(client)
    }

    /// The client's two tasks on a split connection, before any greeting.
    fn start<R, W>(mut reader: R, mut writer: W, first_id: u64) -> AgentClient
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let (outbound, mut queue) = mpsc::channel::<Frame<Request>>(OUTBOUND_QUEUE);
        tokio::spawn(async move {
            while let Some(frame) = queue.recv().await {
                if write_frame(&mut writer, &frame).await.is_err() {
                    break;
                }
            }
            // Every handle is gone: tell the agent, which ends the session.
            let _ = writer.shutdown().await;
        });
        let routes: Routes = Arc::default();
        let router = Arc::clone(&routes);
        let closed = Arc::new(AtomicBool::new(false));
        let router_closed = Arc::clone(&closed);
        tokio::spawn(async move {
            loop {
                let frame: Frame<Event> = match read_frame(&mut reader).await {
                    Ok(frame) => frame,
                    Err(FrameError::Decode(_)) => continue,
                    Err(_) => break,
                };
                let route = {
                    let routes = router.lock().unwrap_or_else(|p| p.into_inner());
                    routes.get(&frame.id).cloned()
                };
                let Some(route) = route else {
                    continue; // keepalives and events of requests nobody waits for
                };
                let last = frame.msg.is_final();
                let id = frame.id;
                let _ = route.send(frame).await;
                if last {
                    router.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
                }
            }
            // Dropping every route ends every waiting request with Closed.
            router_closed.store(true, Ordering::SeqCst);
            router.lock().unwrap_or_else(|p| p.into_inner()).clear();
        });
        AgentClient {
            outbound,
            routes,
            next_id: Arc::new(AtomicU64::new(first_id.max(1))),
            closed,
            version: 0,
        }
    }

    /// [`AgentClient::connect`] and a first request, sent right behind the
    /// greeting instead of after its answer: one round trip less on a path
    /// that starts a sandbox to run one command. Only for an agent of this
    /// very build (one the caller just launched from its own install),
    /// which speaks [`Versions::OURS`]: the request is encoded for the
    /// newest version before the agent has said which it speaks.
    pub async fn connect_with<S>(
        stream: S,
        first_id: u64,
        request: Request,
    ) -> Result<(AgentClient, Events), ClientError>
    where
        S: AsyncRead + AsyncWrite + Send + 'static,
    {
        let (reader, writer) = tokio::io::split(stream);
        let mut client = AgentClient::start(reader, writer, first_id);
        let greeting = client.send_hello().await?;
        let events = client.request(request).await?;
        client.version = client.chosen_version(greeting).await?;
        Ok((client, events))
    }

    /// The protocol version both sides speak on this connection: gate
    /// anything newer than [`crate::OLDEST_PROTOCOL_VERSION`] on it.
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Offers the versions this host speaks and returns the one the agent
    /// chose. An agent of version 1 knows no ranges and refuses the ranged
    /// greeting (as a request it cannot read, or a version it does not
    /// speak) but goes on serving; it is greeted again as hosts of version
    /// 1 greeted it.
    async fn greet(&self) -> Result<u32, ClientError> {
        let greeting = self.send_hello().await?;
        self.chosen_version(greeting).await
    }

    /// Sends the ranged greeting: every version this host speaks.
    async fn send_hello(&self) -> Result<Events, ClientError> {
        let ours = Versions::OURS;
        self.request(Request::Hello {
            version: ours.newest,
            oldest: Some(ours.oldest),
        })
        .await
    }

    /// The version the agent chose in its answer to [`Self::send_hello`],
    /// greeting an agent of version 1 again as it expects.
    async fn chosen_version(&self, greeting: Events) -> Result<u32, ClientError> {
        const FIRST: u32 = 1;
        let ours = Versions::OURS;
        let chosen = match greeting.finish().await? {
            Event::Hello { version, .. } => version,
            Event::Error {
                kind: ErrorKind::UnsupportedVersion | ErrorKind::InvalidArgument,
                ..
            } if ours.contains(FIRST) && ours.newest > FIRST => {
                let plain = Request::Hello {
                    version: FIRST,
                    oldest: None,
                };
                match self.request(plain).await?.finish().await? {
                    Event::Hello { version, .. } => version,
                    Event::Error {
                        kind: ErrorKind::UnsupportedVersion,
                        ..
                    } => return Err(ClientError::NoCommonVersion),
                    other => return Err(ClientError::Greeting(Box::new(other))),
                }
            }
            Event::Error {
                kind: ErrorKind::UnsupportedVersion,
                ..
            } => return Err(ClientError::NoCommonVersion),
            other => return Err(ClientError::Greeting(Box::new(other))),
        };
        if ours.contains(chosen) {
            Ok(chosen)
        } else {
            Err(ClientError::Version(chosen))
        }
    }

    /// Sends a request and returns its events.
    pub async fn request(&self, request: Request) -> Result<Events, ClientError> {
        self.request_with_payload(request, Vec::new()).await
    }

    /// Sends a request carrying bytes (stdin, the first chunk of a file).
    pub async fn request_with_payload(
        &self,
        request: Request,
        payload: Vec<u8>,
    ) -> Result<Events, ClientError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (route, inbound) = mpsc::channel(EVENTS_PER_REQUEST);
        self.routes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, route);
        if self.closed.load(Ordering::SeqCst)
            || self
                .outbound
                .send(Frame::with_payload(id, request, payload))
                .await
                .is_err()
        {
            self.routes
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Err(ClientError::Closed);
        }
        Ok(Events {
            id,
            inbound,
            done: false,
        })
    }

    /// Sends a follow-up frame of an open request (`write_data`, `write_end`).
    pub async fn send(
        &self,
        id: u64,
        request: Request,
        payload: Vec<u8>,
    ) -> Result<(), ClientError> {
        self.outbound
            .send(Frame::with_payload(id, request, payload))
            .await
            .map_err(|_| ClientError::Closed)
    }
}
