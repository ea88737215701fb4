//! `hl7gw tail`: reads a topic of envelopes (default the inbound topic) straight from Kafka and prints one JSON
//! line per message: its ids and header, where it came from and where it sits in Kafka; never the message
//! itself unless `--with-message` (patient data).
//!
//! Where it starts: with `--since`, at the first record at or after that time in each partition (Kafka's
//! offsets-for-times: no scan to find it), and it stops at the end the topic had when it started (or at
//! `--until`); without `--since`, at the end of the topic, waiting for new records, like `tail -f`.
//! `--follow` waits for new records after a `--since` window too. `--from-beginning` is the only way to read a
//! topic from its first record. Whatever the start, it stops after `--limit` printed messages (default 100).
//! Records are read with `isolation.level=read_committed` (aborted transactions are never shown), in order
//! within each partition, with no consumer group commit: tailing moves nobody's offsets.

use crate::when::parse_time;
use anyhow::{Context, anyhow, bail};
use hl7gw_proto::v1::Envelope;
use hl7gw_runtime::kafka::{KafkaContext, KafkaSettings};
use rdkafka::Message as _;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Headers as _};
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::types::RDKafkaErrorCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime};

/// Arguments of `hl7gw tail`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Without --since it starts at the end of the topic and prints messages as they arrive (like tail -f),
until --limit messages were printed or it is interrupted. With --since it reads from that time (Kafka's
offsets-for-times, no scan) to the end the topic had at the start, or to --until, and exits; add --follow to
keep waiting for new messages. Each line: id, received_at, type, control_id, sending/receiving application
and facility, destination, route, source (listener, peer, pod), topic, partition, offset. The message itself
only with --with-message.

Kafka: --brokers, or --kafka-config FILE, a YAML file with a `kafka:` section as the services read it
(brokers, security: TLS, mutual TLS, SASL), e.g. the ingress's own config file; HL7GW_KAFKA__... variables
override it as they do for the services.

Examples:
  hl7gw tail --since 1h --type ADT^A01
  hl7gw tail --topic hl7.out.lab --sender LAB --limit 10
  hl7gw tail --kafka-config /etc/hl7gw/ingress.yaml --since 2026-11-23T10:00:00Z --until 2026-11-23T10:05:00Z")]
pub struct TailArgs {
    /// Topic to read
    #[arg(long, default_value = "hl7.inbound")]
    topic: String,
    /// Kafka bootstrap servers (overrides --kafka-config and HL7GW_KAFKA__BROKERS; default 127.0.0.1:9092)
    #[arg(long, value_name = "HOST:PORT[,...]")]
    brokers: Option<String>,
    /// YAML file whose `kafka:` section says how to reach Kafka (the services' own format: security, properties)
    #[arg(long, value_name = "YAML")]
    kafka_config: Option<PathBuf>,
    /// From this time: RFC 3339 or a time ago (1h, 30m, 2d); without it, from the end (new messages only)
    #[arg(long, conflicts_with = "from_beginning")]
    since: Option<String>,
    /// Until this time (RFC 3339 or a time ago); with --since; default: the end the topic had at the start
    #[arg(long, requires = "since", conflicts_with = "follow")]
    until: Option<String>,
    /// Read the whole topic from its first record (slow on a big topic: prefer --since)
    #[arg(long)]
    from_beginning: bool,
    /// After the window, wait for new messages (always so without --since)
    #[arg(long)]
    follow: bool,
    /// Stop after printing this many messages (0: no limit)
    #[arg(long, value_name = "N", default_value_t = 100)]
    limit: u64,
    /// Only this message type: ADT, or ADT^A01 (MSH-9)
    #[arg(long = "type", value_name = "TYPE[^TRIGGER]")]
    message_type: Option<String>,
    /// Only from this sender: MSH-3 or MSH-4 equal to it (the whole field or its first component)
    #[arg(long, value_name = "NAME")]
    sender: Option<String>,
    /// Only from this sending application (MSH-3: the whole field or its first component)
    #[arg(long, value_name = "MSH-3")]
    sending_application: Option<String>,
    /// Only from this sending facility (MSH-4: the whole field or its first component)
    #[arg(long, value_name = "MSH-4")]
    sending_facility: Option<String>,
    /// Only this destination (records of hl7.out.<destination> and dead letters name theirs)
    #[arg(long)]
    destination: Option<String>,
    /// Only this control id (MSH-10)
    #[arg(long, value_name = "MSH-10")]
    control_id: Option<String>,
    /// Also print each message (patient data). Read straight from Kafka, not through a service: what guards
    /// it is the topic ACLs of the Kafka user in --kafka-config (docs/security.md)
    #[arg(long)]
    with_message: bool,
    /// Seconds to wait for Kafka's answers; in a window, for the next record before giving up
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
}

/// The part of a service config file `tail` reads: its `kafka:` section (other keys are ignored).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(default)]
struct KafkaSection {
    kafka: KafkaSettings,
}

/// The Kafka settings: defaults, the file, `HL7GW_KAFKA__...` variables, then `--brokers`.
fn settings(a: &TailArgs) -> anyhow::Result<KafkaSettings> {
    let flags = json!({ "kafka": { "brokers": a.brokers } });
    let env = hl7gw_runtime::config::env();
    let s: KafkaSection =
        hl7gw_runtime::config::load_with_env(a.kafka_config.as_deref(), &flags, env).with_context(
            || match &a.kafka_config {
                Some(f) => format!("reading the Kafka settings of {}", f.display()),
                None => "reading the Kafka settings".to_owned(),
            },
        )?;
    s.kafka.validate().context("kafka settings")?;
    Ok(s.kafka)
}

/// What a message must match to be printed.
#[derive(Debug, Default)]
struct Filter {
    message_type: Option<(String, Option<String>)>,
    sender: Option<String>,
    sending_application: Option<String>,
    sending_facility: Option<String>,
    destination: Option<String>,
    control_id: Option<String>,
}

/// `field` (a whole HD such as `LAB^1.2.3^ISO`) is `want`, or its first component is.
fn hd_is(field: &str, want: &str) -> bool {
    field == want || field.split('^').next() == Some(want)
}

impl Filter {
    fn new(a: &TailArgs) -> Self {
        Self {
            message_type: a.message_type.as_ref().map(|t| match t.split_once('^') {
                Some((ty, trigger)) => (ty.to_owned(), Some(trigger.to_owned())),
                None => (t.clone(), None),
            }),
            sender: a.sender.clone(),
            sending_application: a.sending_application.clone(),
            sending_facility: a.sending_facility.clone(),
            destination: a.destination.clone(),
            control_id: a.control_id.clone(),
        }
    }

    fn is_empty(&self) -> bool {
        self.message_type.is_none()
            && self.sender.is_none()
            && self.sending_application.is_none()
            && self.sending_facility.is_none()
            && self.destination.is_none()
            && self.control_id.is_none()
    }

    /// The envelope matches; `destination` is the record's `hl7gw.destination` header when the envelope
    /// names none.
    fn matches(&self, env: &Envelope, destination: &str) -> bool {
        let h = env.header.clone().unwrap_or_default();
        if let Some((ty, trigger)) = &self.message_type {
            if !h.message_type.eq_ignore_ascii_case(ty) {
                return false;
            }
            if trigger
                .as_ref()
                .is_some_and(|t| !h.trigger_event.eq_ignore_ascii_case(t))
            {
                return false;
            }
        }
        if let Some(s) = &self.sender
            && !(hd_is(&h.sending_application, s) || hd_is(&h.sending_facility, s))
        {
            return false;
        }
        if let Some(s) = &self.sending_application
            && !hd_is(&h.sending_application, s)
        {
            return false;
        }
        if let Some(s) = &self.sending_facility
            && !hd_is(&h.sending_facility, s)
        {
            return false;
        }
        if let Some(d) = &self.destination
            && d != destination
        {
            return false;
        }
        if let Some(c) = &self.control_id
            && *c != h.control_id
        {
            return false;
        }
        true
    }
}

/// A Kafka header's value as text.
fn header_text(m: &BorrowedMessage<'_>, name: &str) -> Option<String> {
    let hs = m.headers()?;
    hs.iter()
        .find(|h| h.key == name)
        .and_then(|h| h.value)
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The message as text in its charset (one char per byte when it is not valid in it).
fn message_text(env: &Envelope) -> String {
    match hl7v2::Charset::from_msh18(env.charset.as_bytes()) {
        Ok(cs) => hl7gw_runtime::envelope::text(&env.raw, cs),
        Err(_) => String::from_utf8_lossy(&env.raw).into_owned(),
    }
}

/// The JSON line of an envelope read at `topic`/`partition`/`offset`.
fn line(env: &Envelope, destination: &str, m: &BorrowedMessage<'_>, with_message: bool) -> Value {
    let h = env.header.clone().unwrap_or_default();
    let src = env.source.clone().unwrap_or_default();
    let ty = if h.trigger_event.is_empty() {
        h.message_type.clone()
    } else {
        format!("{}^{}", h.message_type, h.trigger_event)
    };
    let mut l = json!({
        "id": env.id,
        "received_at": crate::when::rfc3339(env.received_at.as_ref()),
        "type": ty,
        "control_id": h.control_id,
        "sending_application": h.sending_application,
        "sending_facility": h.sending_facility,
        "receiving_application": h.receiving_application,
        "receiving_facility": h.receiving_facility,
        "destination": destination,
        "route": env.route,
        "source": {
            "listener": src.listener,
            "peer": src.peer,
            "pod": src.pod,
        },
        "topic": m.topic(),
        "partition": m.partition(),
        "offset": m.offset(),
    });
    if let Some(r) = &env.rejection {
        l["rejection"] = json!({ "stage": r.stage, "reason": r.reason });
    }
    if with_message {
        l["message"] = json!(message_text(env));
    }
    l
}

/// Where each partition starts and (for a window) where it ends.
#[derive(Debug)]
struct Plan {
    /// (partition, start offset).
    starts: Vec<(i32, Offset)>,
    /// Partition to the offset it stops before; empty when following.
    ends: HashMap<i32, i64>,
}

/// The offsets in each partition of the first record at or after `at` (ms since the epoch); `None` for a
/// partition with none.
fn offsets_at(
    c: &BaseConsumer<KafkaContext>,
    topic: &str,
    parts: &[i32],
    at: i64,
    t: Duration,
) -> anyhow::Result<HashMap<i32, Option<i64>>> {
    hl7gw_runtime::kafka::offsets::offsets_at_time(c, topic, parts, at, t)
        .context("asking Kafka for offsets by time")
}

fn millis(t: SystemTime) -> i64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn plan(
    c: &BaseConsumer<KafkaContext>,
    a: &TailArgs,
    follow: bool,
    t: Duration,
) -> anyhow::Result<Plan> {
    let md = c
        .fetch_metadata(Some(&a.topic), t)
        .with_context(|| format!("reading the metadata of topic {}", a.topic))?;
    let topic = md
        .topics()
        .iter()
        .find(|x| x.name() == a.topic)
        .ok_or_else(|| anyhow!("topic {} not found", a.topic))?;
    if let Some(e) = topic.error() {
        bail!("topic {}: {:?}", a.topic, RDKafkaErrorCode::from(e));
    }
    let mut parts: Vec<i32> = topic.partitions().iter().map(|p| p.id()).collect();
    parts.sort_unstable();
    if parts.is_empty() {
        bail!("topic {} has no partitions", a.topic);
    }
    let now = SystemTime::now();
    let mut highs = HashMap::new();
    for p in &parts {
        let (_, high) = c
            .fetch_watermarks(&a.topic, *p, t)
            .with_context(|| format!("reading the end of {}/{p}", a.topic))?;
        highs.insert(*p, high);
    }
    let starts: Vec<(i32, Offset)> = if a.from_beginning {
        parts.iter().map(|p| (*p, Offset::Beginning)).collect()
    } else if let Some(since) = &a.since {
        let since = millis(parse_time(since, now).context("--since")?);
        let found = offsets_at(c, &a.topic, &parts, since, t)?;
        parts
            .iter()
            .map(|p| {
                let start = found
                    .get(p)
                    .copied()
                    .flatten()
                    .unwrap_or_else(|| highs.get(p).copied().unwrap_or(0));
                (*p, Offset::Offset(start))
            })
            .collect()
    } else {
        parts
            .iter()
            .map(|p| (*p, Offset::Offset(highs.get(p).copied().unwrap_or(0))))
            .collect()
    };
    let mut ends = HashMap::new();
    if !follow {
        let until = match &a.until {
            Some(u) => Some(offsets_at(
                c,
                &a.topic,
                &parts,
                millis(parse_time(u, now).context("--until")?),
                t,
            )?),
            None => None,
        };
        for p in &parts {
            let high = highs.get(p).copied().unwrap_or(0);
            let end = until
                .as_ref()
                .and_then(|u| u.get(p).copied().flatten())
                .map_or(high, |o| o.min(high));
            ends.insert(*p, end);
        }
    }
    Ok(Plan { starts, ends })
}

/// `hl7gw tail`.
pub fn run(a: TailArgs) -> anyhow::Result<ExitCode> {
    let s = settings(&a)?;
    let follow = a.follow || (a.since.is_none() && !a.from_beginning);
    let t = Duration::from_secs(a.timeout);
    let mut cfg = hl7gw_runtime::kafka::reader_config("hl7gw-tail", "hl7gw-tail", &s)
        .context("kafka settings")?;
    cfg.set("enable.partition.eof", "true");
    let c: BaseConsumer<KafkaContext> = cfg
        .create_with_context(KafkaContext)
        .context("creating the Kafka consumer")?;
    let plan = plan(&c, &a, follow, t)?;
    let mut tpl = TopicPartitionList::new();
    let mut open: HashMap<i32, i64> = HashMap::new();
    for (p, start) in &plan.starts {
        match plan.ends.get(p) {
            Some(&end) => {
                if let Offset::Offset(o) = start
                    && *o >= end
                {
                    continue;
                }
                open.insert(*p, end);
            }
            None => {
                open.insert(*p, i64::MAX);
            }
        }
        tpl.add_partition_offset(&a.topic, *p, *start)?;
    }
    log!(
        "reading {} from {}{}",
        a.topic,
        if a.from_beginning {
            "its beginning"
        } else if a.since.is_some() {
            "--since"
        } else {
            "its end"
        },
        if follow {
            ", waiting for new messages"
        } else {
            ""
        }
    );
    let filter = Filter::new(&a);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let (mut printed, mut read, mut undecodable) = (0u64, 0u64, 0u64);
    if !open.is_empty() {
        c.assign(&tpl).context("assigning the partitions")?;
    }
    let mut last = Instant::now();
    while !open.is_empty() && (a.limit == 0 || printed < a.limit) {
        let Some(r) = c.poll(Duration::from_millis(200)) else {
            if !follow {
                // Past the last record (transaction markers at the end of a window are not delivered).
                let pos = c.position()?;
                open.retain(|p, end| {
                    !matches!(
                        pos.find_partition(&a.topic, *p).map(|e| e.offset()),
                        Some(Offset::Offset(o)) if o >= *end
                    )
                });
                if last.elapsed() > t && !open.is_empty() {
                    log!(
                        "no record for {}s before the end of the window (an open transaction?); stopping",
                        a.timeout
                    );
                    break;
                }
            }
            continue;
        };
        let m = match r {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(p)) => {
                if !follow {
                    open.remove(&p);
                }
                continue;
            }
            Err(e) => return Err(e).context("reading the topic"),
        };
        last = Instant::now();
        let Some(&end) = open.get(&m.partition()) else {
            continue;
        };
        if m.offset() >= end {
            open.remove(&m.partition());
            continue;
        }
        if m.offset() + 1 >= end {
            open.remove(&m.partition());
        }
        read += 1;
        let value = m.payload().unwrap_or_default();
        match hl7gw_runtime::envelope::decode(value) {
            Ok(env) => {
                let destination = if env.destination.is_empty() {
                    header_text(&m, hl7gw_runtime::envelope::headers::DESTINATION)
                        .unwrap_or_default()
                } else {
                    env.destination.clone()
                };
                if filter.matches(&env, &destination) {
                    writeln!(out, "{}", line(&env, &destination, &m, a.with_message))?;
                    out.flush()?;
                    printed += 1;
                }
            }
            Err(e) => {
                undecodable += 1;
                if filter.is_empty() {
                    let l = json!({
                        "topic": m.topic(),
                        "partition": m.partition(),
                        "offset": m.offset(),
                        "error": format!("not an hl7gw envelope: {e}"),
                    });
                    writeln!(out, "{l}")?;
                    out.flush()?;
                    printed += 1;
                }
            }
        }
    }
    log!(
        "{printed} message(s) printed of {read} read{}{}",
        if undecodable > 0 {
            format!(", {undecodable} not envelopes")
        } else {
            String::new()
        },
        if a.limit != 0 && printed >= a.limit {
            " (--limit reached)"
        } else {
            ""
        }
    );
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hl7gw_proto::v1::Header;

    fn env(ty: &str, trigger: &str, app: &str, fac: &str) -> Envelope {
        Envelope {
            header: Some(Header {
                message_type: ty.into(),
                trigger_event: trigger.into(),
                sending_application: app.into(),
                sending_facility: fac.into(),
                control_id: "C1".into(),
                ..Header::default()
            }),
            ..Envelope::default()
        }
    }

    #[test]
    fn filters() {
        let f = |t: Option<&str>, s: Option<&str>| Filter {
            message_type: t.map(|t| match t.split_once('^') {
                Some((a, b)) => (a.into(), Some(b.into())),
                None => (t.into(), None),
            }),
            sender: s.map(Into::into),
            ..Filter::default()
        };
        let e = env("ADT", "A01", "LAB^1.2.3^ISO", "HOSP");
        assert!(f(None, None).matches(&e, ""));
        assert!(f(Some("ADT"), None).matches(&e, ""));
        assert!(f(Some("adt^a01"), None).matches(&e, ""));
        assert!(!f(Some("ADT^A08"), None).matches(&e, ""));
        assert!(!f(Some("ORU"), None).matches(&e, ""));
        assert!(f(None, Some("LAB")).matches(&e, ""));
        assert!(f(None, Some("LAB^1.2.3^ISO")).matches(&e, ""));
        assert!(f(None, Some("HOSP")).matches(&e, ""));
        assert!(!f(None, Some("LA")).matches(&e, ""));
        let d = Filter {
            destination: Some("ehr".into()),
            ..Filter::default()
        };
        assert!(d.matches(&e, "ehr"));
        assert!(!d.matches(&e, "lab"));
    }
}
