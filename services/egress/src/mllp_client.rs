//! An MLLP client for one receiver: one persistent connection (plain TCP or TLS), reconnected on the next
//! send after any failure; connect and response timeouts. An answer counts only when its MSA-2 names the
//! message sent (an empty MSA-2 names none): a late or extra ACK (an application ACK after an accept ACK) is
//! discarded, never taken as the answer to the next message.

use crate::config::Destination;
use bytes::BytesMut;
use futures_util::{SinkExt, StreamExt};
use hl7v2::MllpCodec;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustls_pki_types::ServerName;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_util::codec::Framed;

/// Why a send did not get an answer. `kind()` is a bounded label.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("connect: {0}")]
    Connect(std::io::Error),
    #[error("connect timed out")]
    ConnectTimeout,
    #[error("TLS handshake: {0}")]
    Tls(std::io::Error),
    #[error("write or read: {0}")]
    Io(String),
    #[error("no ACK within the response timeout")]
    ResponseTimeout,
    #[error("the receiver closed the connection without answering")]
    Closed,
    #[error("{0} answers in a row named other messages")]
    Unmatched(u32),
}

impl SendError {
    /// The label for metrics and status.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Connect(_) => "connect_failed",
            Self::ConnectTimeout => "connect_timeout",
            Self::Tls(_) => "tls_failed",
            Self::Io(_) => "io_error",
            Self::ResponseTimeout => "response_timeout",
            Self::Closed => "closed",
            Self::Unmatched(_) => "unmatched_acks",
        }
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// TLS settings resolved once per destination.
#[derive(Clone)]
pub struct Tls {
    pub connector: TlsConnector,
    pub name: ServerName<'static>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").field("name", &self.name).finish()
    }
}

impl Tls {
    /// Builds the connector from the PEM files of destination `name`.
    pub fn from_config(name: &str, d: &Destination) -> Result<Option<Self>, hl7gw_tls::TlsError> {
        let Some(t) = &d.tls else { return Ok(None) };
        let identity = t.cert.as_deref().zip(t.key.as_deref());
        let config = hl7gw_tls::client_config(&t.ca, identity)?;
        if let Some(cert) = &t.cert {
            hl7gw_runtime::certs::record("mllp-client", Some(name), cert);
        }
        let name = t
            .server_name
            .clone()
            .unwrap_or_else(|| hl7gw_tls::host_of(&d.address).to_owned());
        Ok(Some(Self {
            connector: TlsConnector::from(config),
            name: hl7gw_tls::server_name(&name)?,
        }))
    }
}

/// One connection's worth of state towards a receiver.
pub struct MllpClient {
    dest: Arc<Destination>,
    tls: Option<Tls>,
    conn: Option<Framed<Box<dyn Io>, MllpCodec>>,
    connected: Gauge,
    unmatched: Counter,
}

/// Most answers naming other messages read for one send before the connection is dropped and the message
/// sent again on a new one.
const MAX_UNMATCHED: u32 = 16;

impl std::fmt::Debug for MllpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MllpClient")
            .field("address", &self.dest.address)
            .field("connected", &self.conn.is_some())
            .finish()
    }
}

impl MllpClient {
    /// A client that connects on first use; `connected` counts this destination's open connections and
    /// `unmatched` the answers discarded because their MSA-2 named another message.
    pub fn new(
        dest: Arc<Destination>,
        tls: Option<Tls>,
        connected: Gauge,
        unmatched: Counter,
    ) -> Self {
        Self {
            dest,
            tls,
            conn: None,
            connected,
            unmatched,
        }
    }

    async fn connect(&mut self) -> Result<(), SendError> {
        let tcp = tokio::time::timeout(
            self.dest.connect_timeout,
            TcpStream::connect(&self.dest.address),
        )
        .await
        .map_err(|_| SendError::ConnectTimeout)?
        .map_err(SendError::Connect)?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(t) => {
                let s = tokio::time::timeout(
                    self.dest.connect_timeout,
                    t.connector.connect(t.name.clone(), tcp),
                )
                .await
                .map_err(|_| SendError::ConnectTimeout)?
                .map_err(SendError::Tls)?;
                Box::new(s)
            }
        };
        self.conn = Some(Framed::new(io, MllpCodec::default()));
        self.connected.inc();
        Ok(())
    }

    /// Drops the connection (the next send reconnects).
    pub fn disconnect(&mut self) {
        if self.conn.take().is_some() {
            self.connected.dec();
        }
    }

    /// Sends one message and waits for the receiver's answer to it: the first frame that [`answers`] it. Any
    /// failure closes the connection.
    pub async fn send(&mut self, message: &[u8], control_id: &[u8]) -> Result<BytesMut, SendError> {
        if self.conn.is_none() {
            self.connect().await?;
        }
        let timeout = self.dest.response_timeout;
        let unmatched = &self.unmatched;
        let result = match self.conn.as_mut() {
            None => Err(SendError::Closed),
            Some(conn) => {
                let exchange = async {
                    conn.send(message)
                        .await
                        .map_err(|e| SendError::Io(e.to_string()))?;
                    let mut skipped = 0;
                    loop {
                        let frame = match conn.next().await {
                            Some(Ok(frame)) => frame,
                            Some(Err(e)) => return Err(SendError::Io(e.to_string())),
                            None => return Err(SendError::Closed),
                        };
                        if answers(&frame, control_id) {
                            return Ok(frame);
                        }
                        unmatched.inc();
                        skipped += 1;
                        if skipped >= MAX_UNMATCHED {
                            return Err(SendError::Unmatched(skipped));
                        }
                    }
                };
                tokio::time::timeout(timeout, exchange)
                    .await
                    .unwrap_or(Err(SendError::ResponseTimeout))
            }
        };
        if result.is_err() {
            self.disconnect();
        }
        result
    }
}

/// True when `frame` is the answer to the message sent with MSH-10 `control_id`: an ACK whose MSA-2 is not empty
/// and equals it, or a frame that is no ACK at all (the caller counts it unreadable and sends again; it can never
/// settle a message). An ACK with an empty MSA-2 names no message: taken as the answer, a late AA for another
/// message would settle this one, so it is discarded like one naming another message.
fn answers(frame: &[u8], control_id: &[u8]) -> bool {
    match hl7v2::read_ack(frame) {
        Some((_, id)) => !id.is_empty() && id == control_id,
        None => true,
    }
}

impl Drop for MllpClient {
    fn drop(&mut self) {
        self.disconnect();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use std::time::Duration;

    /// A receiver on a local port that answers the first message with `acks`, in order.
    async fn receiver(acks: Vec<&'static str>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (s, _) = l.accept().await.unwrap();
            let mut f = Framed::new(s, MllpCodec::default());
            let _ = f.next().await;
            for msa in acks {
                let ack = format!("MSH|^~\\&|R|R|G|G|20260101||ACK|A1|P|2.5\rMSA|{msa}\r");
                if f.send(ack.as_bytes()).await.is_err() {
                    return;
                }
            }
            // Keep the connection open until the client is done.
            let _ = f.next().await;
        });
        addr
    }

    fn client(address: String) -> (MllpClient, Counter) {
        let dest = Destination {
            address,
            url: None,
            http: Default::default(),
            tls: None,
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(1),
            ..Destination::default()
        };
        let unmatched = Counter::default();
        (
            MllpClient::new(Arc::new(dest), None, Gauge::default(), unmatched.clone()),
            unmatched,
        )
    }

    #[test]
    fn only_a_non_empty_msa2_equal_to_the_control_id_answers() {
        let ack = |msa: &str| format!("MSH|^~\\&|R|R|G|G|20260101||ACK|A1|P|2.5\rMSA|{msa}\r");
        for (msa, ours) in [
            ("AA|C7", true),
            ("AE|C7|text", true),
            ("AA|", false),
            ("AA", false),
            ("AA|C8", false),
            ("AA|C7X", false),
        ] {
            assert_eq!(answers(ack(msa).as_bytes(), b"C7"), ours, "{msa}");
        }
        // Nothing can match a message sent without a control id.
        assert!(!answers(ack("AA|").as_bytes(), b""));
        // Not an ACK: handed to the caller, which resends.
        assert!(answers(
            b"MSH|^~\\&|R|R|G|G|20260101||ORU^R01|X|P|2.5\r",
            b"C7"
        ));
    }

    const MSG: &[u8] = b"MSH|^~\\&|A|F|B|G|20260101||ADT^A01|C7|P|2.5\rPID|1||P1\r";

    /// Issue 24, item 14: an ACK with an empty MSA-2 names no message, so it is not the answer to the one in
    /// flight (a late AA for an earlier message would otherwise settle this one); the answer naming it is.
    #[tokio::test]
    async fn an_empty_msa2_is_not_the_answer() {
        let addr = receiver(vec!["AA|", "AA", "AE|OTHER", "AR|C7"]).await;
        let (mut c, unmatched) = client(addr);
        let frame = c.send(MSG, b"C7").await.expect("an answer");
        assert_eq!(
            hl7v2::read_ack(&frame).map(|(code, id)| (code.as_str(), id.to_vec())),
            Some(("AR", b"C7".to_vec())),
            "the answer naming C7, not an earlier one"
        );
        assert_eq!(unmatched.get(), 3);
    }

    /// Only empty-MSA-2 answers: none is taken, the send times out (and is retried by the caller).
    #[tokio::test]
    async fn only_empty_msa2_answers_time_out() {
        let addr = receiver(vec!["AA|", "AA|"]).await;
        let (mut c, _) = client(addr);
        let r = c.send(MSG, b"C7").await;
        assert!(matches!(r, Err(SendError::ResponseTimeout)), "{r:?}");
    }
}
