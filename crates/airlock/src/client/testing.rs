//! A fake daemon for the client's tests: a loopback HTTP/1.1 listener that
//! answers a fixed number of connections, one request each, with whatever
//! its handler writes, and records the requests it saw.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A request as the fake daemon received it.
#[derive(Debug, Clone)]
pub struct Request {
    /// `GET`, `POST`, ...
    pub method: String,
    /// Path and query as sent.
    pub target: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked.
    pub body: Vec<u8>,
}

impl Request {
    /// The first value of a header (name in lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// The running fake daemon.
pub struct FakeServer {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    handle: JoinHandle<()>,
    requests: Arc<Mutex<Vec<Request>>>,
}

impl FakeServer {
    /// Serves `connections` connections, one after the other, handing each
    /// request and its socket to `handler`.
    pub fn start(
        connections: usize,
        mut handler: impl FnMut(Request, &mut TcpStream) + Send + 'static,
    ) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(Mutex::new(Vec::new()));
        let seen = Arc::clone(&requests);
        let handle = std::thread::spawn(move || {
            for _ in 0..connections {
                let (mut stream, _) = listener.accept().unwrap();
                let request = read_request(&mut stream);
                seen.lock().unwrap().push(request.clone());
                handler(request, &mut stream);
            }
        });
        FakeServer {
            url,
            handle,
            requests,
        }
    }

    /// Waits for every connection to be served; the requests seen, in order.
    pub fn finish(self) -> Vec<Request> {
        self.handle.join().unwrap();
        let requests = self.requests.lock().unwrap().clone();
        requests
    }
}

fn read_request(stream: &mut TcpStream) -> Request {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap().to_owned();
    let target = parts.next().unwrap().to_owned();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':').unwrap();
        headers.push((name.trim().to_ascii_lowercase(), value.trim().to_owned()));
    }
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if let Some(length) = find("content-length") {
        body.resize(length.parse().unwrap(), 0);
        reader.read_exact(&mut body).unwrap();
    } else if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            let size = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut chunk = vec![0; size + 2];
            reader.read_exact(&mut chunk).unwrap();
            if size == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..size]);
        }
    }
    Request {
        method,
        target,
        headers,
        body,
    }
}

/// A whole answer, closing the connection after it.
pub fn respond(stream: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.write_all(body).unwrap();
    stream.flush().unwrap();
}

/// The head of a chunked answer; follow with [`chunk`] and [`end_chunks`].
pub fn start_chunked(stream: &mut TcpStream, status: u16, content_type: &str) {
    let head = format!(
        "HTTP/1.1 {status} X\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).unwrap();
    stream.flush().unwrap();
}

/// One chunk of a chunked answer, flushed.
pub fn chunk(stream: &mut TcpStream, data: &[u8]) {
    stream
        .write_all(format!("{:x}\r\n", data.len()).as_bytes())
        .unwrap();
    stream.write_all(data).unwrap();
    stream.write_all(b"\r\n").unwrap();
    stream.flush().unwrap();
}

/// The end of a chunked answer.
pub fn end_chunks(stream: &mut TcpStream) {
    stream.write_all(b"0\r\n\r\n").unwrap();
    stream.flush().unwrap();
}
