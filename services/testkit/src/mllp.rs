//! An MLLP client for the tests, and what they read in an answer.

#![allow(clippy::unwrap_used)]

use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use hl7v2::MllpCodec;
use std::net::SocketAddr;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

/// An MLLP client connection.
pub struct Mllp(pub Framed<TcpStream, MllpCodec>);

impl Mllp {
    pub async fn connect(addr: SocketAddr) -> Self {
        let s = TcpStream::connect(addr).await.expect("connect");
        s.set_nodelay(true).expect("nodelay");
        Self(Framed::new(s, MllpCodec::default()))
    }

    /// A connection from another local address (e.g. 127.0.0.2: a second client machine, as the listener's
    /// per-address bounds see it).
    pub async fn connect_from(local: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<Self> {
        let socket = tokio::net::TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(local, 0))?;
        let s = socket.connect(addr).await?;
        s.set_nodelay(true)?;
        Ok(Self(Framed::new(s, MllpCodec::default())))
    }

    pub async fn send(&mut self, payload: &[u8]) {
        self.0.send(payload).await.expect("send");
    }

    /// The next ACK payload, or None on close/timeout.
    pub async fn recv(&mut self, limit: Duration) -> Option<BytesMut> {
        match tokio::time::timeout(limit, self.0.next()).await {
            Ok(Some(Ok(f))) => Some(f),
            _ => None,
        }
    }

    pub async fn call(&mut self, payload: &[u8]) -> Option<BytesMut> {
        self.send(payload).await;
        self.recv(Duration::from_secs(30)).await
    }
}

/// MSA-1 of an ACK.
pub fn ack_code(ack: &[u8]) -> String {
    field(ack, "MSA-1")
        .unwrap_or_else(|| format!("unparseable: {:?}", String::from_utf8_lossy(ack)))
}

/// The value at terser `path` (`MSH-10`, `ERR-3-1`) of a message, as text; None when the message does not
/// parse or has no such field.
pub fn field(msg: &[u8], path: &str) -> Option<String> {
    let m = hl7v2::Message::parse(msg).ok()?;
    m.get(path).map(|v| String::from_utf8_lossy(v).into_owned())
}

/// A synthetic ADT^A01 with the given control id and patient id.
pub fn adt(control_id: &str, patient: &str) -> Vec<u8> {
    format!(
        "MSH|^~\\&|TESTAPP|TESTFAC|HL7GW|HL7GW|20261122120000||ADT^A01^ADT_A01|{control_id}|P|2.5.1\r\
         EVN|A01|20261122120000\r\
         PID|1||{patient}^^^TESTFAC^MR||DOE^JANE||19700101|F\r"
    )
    .into_bytes()
}
