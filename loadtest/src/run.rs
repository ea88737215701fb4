//! A run: connect every client, warm up, measure, merge; and the series of runs behind `--scenario`.

use crate::cli::{Args, DEFAULT_MESSAGES, Scenario, check_addr};
use crate::client::{Mode, Pace, Plan, Target, run_client};
use crate::grpc::GrpcTarget;
use crate::ids::new_run_id;
use crate::messages::MessageSet;
use crate::record::Recorder;
use crate::stats::{ClientStats, RunInfo, Summary, table};
use anyhow::{Context, anyhow, bail};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::Barrier;
use tokio::task::JoinSet;

/// Longest wait for the first connection of each client (and for each reconnect attempt).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What every run of an invocation shares.
#[derive(Debug, Clone)]
pub struct Settings {
    pub target: Target,
    pub messages: Arc<MessageSet>,
    pub warmup: u64,
    pub timeout: Duration,
    pub rate: Option<Pace>,
    /// Messages in flight per connection (`--in-flight`).
    pub in_flight: u32,
    pub max_seconds: Duration,
    pub record: Option<PathBuf>,
}

/// One run.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    pub scenario: Option<String>,
    pub clients: u32,
    pub mode: Mode,
}

/// RS7's series: 1 client × 10,000, 4 × 5,000, 8 × 5,000, then 8 clients for 30 s.
pub fn rs7() -> Vec<RunSpec> {
    let spec = |name: &str, clients, mode| RunSpec {
        scenario: Some(name.to_owned()),
        clients,
        mode,
    };
    vec![
        spec("1x10000", 1, Mode::Count(10_000)),
        spec("4x5000", 4, Mode::Count(5_000)),
        spec("8x5000", 8, Mode::Count(5_000)),
        spec("8x30s", 8, Mode::Duration(Duration::from_secs(30))),
    ]
}

impl Settings {
    /// Reads files and certificates: every usage error shows up here, before any connection.
    pub fn from_args(a: &Args) -> anyhow::Result<Self> {
        check_addr(&a.to).map_err(|e| anyhow!(e))?;
        let messages = if a.files.is_empty() {
            MessageSet::fixture(a.fixture, a.test_traffic)
        } else {
            MessageSet::from_files(&a.files)?
        };
        let connect_timeout = CONNECT_TIMEOUT.min(a.timeout);
        let (tls, grpc) = if a.grpc {
            let g = GrpcTarget::new(&a.to, &a.tls, a.token_file.as_deref(), connect_timeout)?;
            (None, Some(Arc::new(g)))
        } else {
            let tls = a
                .tls
                .client(&a.to)
                .context("client TLS")?
                .map(|(config, name)| (tokio_rustls::TlsConnector::from(config), name));
            (tls, None)
        };
        Ok(Self {
            target: Target {
                addr: a.to.clone(),
                tls,
                grpc,
                connect_timeout,
            },
            messages: Arc::new(messages),
            warmup: a.warmup,
            timeout: a.timeout,
            rate: a.rate.map(|from| match (a.rate_to, a.duration) {
                (Some(to), Some(over)) => Pace { from, to, over },
                _ => Pace::constant(from),
            }),
            in_flight: a.in_flight,
            max_seconds: a.max_seconds,
            record: a.record_acked.clone(),
        })
    }
}

/// The runs an invocation asks for.
pub fn specs(a: &Args) -> Vec<RunSpec> {
    match a.scenario {
        Some(Scenario::Rs7) => rs7(),
        None => vec![RunSpec {
            scenario: None,
            clients: a.clients,
            mode: match a.duration {
                Some(d) => Mode::Duration(d),
                None => Mode::Count(a.messages.unwrap_or(DEFAULT_MESSAGES)),
            },
        }],
    }
}

/// Runs one spec. An error means the run could not start (no first connection, record file unusable).
pub async fn run(settings: &Settings, spec: &RunSpec) -> anyhow::Result<Summary> {
    let run_id = new_run_id();
    let recorder = match &settings.record {
        Some(path) => Some(Recorder::open(path, &run_id)?),
        None => None,
    };
    let hard_deadline = Instant::now() + settings.max_seconds;

    let mut connecting = JoinSet::new();
    for i in 0..spec.clients {
        let target = settings.target.clone();
        connecting.spawn(async move { (i, target.connect().await) });
    }
    let mut conns = Vec::with_capacity(spec.clients as usize);
    while let Some(joined) = connecting.join_next().await {
        let (i, conn) = joined.context("connecting")?;
        let conn = conn.with_context(|| format!("connecting to {}", settings.target.addr))?;
        conns.push((i, conn));
    }

    let plan = Arc::new(Plan {
        target: settings.target.clone(),
        messages: settings.messages.clone(),
        run_id: run_id.as_bytes().to_vec(),
        warmup: settings.warmup,
        mode: spec.mode,
        timeout: settings.timeout,
        rate: settings.rate,
        in_flight: settings.in_flight as usize,
        hard_deadline,
        barrier: Barrier::new(spec.clients as usize),
    });
    let mut clients = JoinSet::new();
    for (i, conn) in conns {
        let record = recorder.as_ref().map(Recorder::handle);
        clients.spawn(run_client(i, plan.clone(), conn, record));
    }
    let mut total = ClientStats::default();
    let mut crashed = None;
    while let Some(joined) = clients.join_next().await {
        match joined {
            Ok(stats) => total.merge(&stats),
            Err(e) => crashed = Some(e),
        }
    }
    let info = RunInfo {
        scenario: spec.scenario.clone(),
        to: settings.target.addr.clone(),
        run_id,
        source: settings.messages.label().to_owned(),
        mode: match spec.mode {
            Mode::Count(_) => "count",
            Mode::Duration(_) => "duration",
        },
        clients: spec.clients,
        in_flight: settings.in_flight,
    };
    let mut summary = Summary::new(info, &total);
    if let Some(r) = recorder {
        match r.finish() {
            Ok(n) => summary.recorded = Some(n),
            Err(e) => summary.record_error = Some(format!("{e:#}")),
        }
    }
    if let Some(e) = crashed {
        bail!("a client task failed: {e}");
    }
    Ok(summary)
}

/// The whole invocation: the runs, the report, the exit status.
pub async fn main(args: Args) -> anyhow::Result<ExitCode> {
    let settings = Settings::from_args(&args)?;
    let specs = specs(&args);
    let series = args.scenario.is_some();
    let mut done = Vec::with_capacity(specs.len());
    let mut failure = None;
    for spec in &specs {
        if series {
            eprintln!(
                "hl7gw-load: {} ({} client(s)) against {}",
                spec.scenario.as_deref().unwrap_or("run"),
                spec.clients,
                settings.target.addr
            );
        }
        match run(&settings, spec).await {
            Ok(s) => {
                if series && !args.json {
                    eprint!("{}", s.text());
                }
                done.push(s);
            }
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    if args.json {
        let out = if series {
            serde_json::to_string_pretty(&done)?
        } else {
            match done.first() {
                Some(s) => serde_json::to_string_pretty(s)?,
                None => String::new(),
            }
        };
        if !out.is_empty() {
            println!("{out}");
        }
    } else if series {
        print!("{}", table(&done));
    } else if let Some(s) = done.first() {
        print!("{}", s.text());
    }
    if let Some(e) = failure {
        return Err(e);
    }
    Ok(if done.iter().all(Summary::ok) {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn rs7_series() {
        let s = rs7();
        let shape: Vec<(u32, Mode)> = s.iter().map(|r| (r.clients, r.mode)).collect();
        assert_eq!(
            shape,
            vec![
                (1, Mode::Count(10_000)),
                (4, Mode::Count(5_000)),
                (8, Mode::Count(5_000)),
                (8, Mode::Duration(Duration::from_secs(30))),
            ]
        );
    }

    #[test]
    fn single_run_specs() {
        let a = Args::parse_from(["x", "--to", "h:1", "--clients", "3"]);
        assert_eq!(specs(&a)[0].mode, Mode::Count(DEFAULT_MESSAGES));
        let a = Args::parse_from(["x", "--to", "h:1", "--duration", "2"]);
        assert_eq!(specs(&a)[0].mode, Mode::Duration(Duration::from_secs(2)));
        let a = Args::parse_from(["x", "--to", "h:1", "--scenario", "rs7"]);
        assert_eq!(specs(&a).len(), 4);
    }

    #[test]
    fn settings_reject_bad_input_before_connecting() {
        let a = Args::parse_from(["x", "--to", "nohost"]);
        assert!(Settings::from_args(&a).is_err());
        let a = Args::parse_from(["x", "--to", "h:1", "--files", "/nonexistent.hl7"]);
        assert!(Settings::from_args(&a).is_err());
        let a = Args::parse_from(["x", "--to", "h:1", "--tls", "--ca", "/nonexistent.pem"]);
        assert!(Settings::from_args(&a).is_err());
        let a = Args::parse_from(["x", "--to", "h:1", "--timeout", "2"]);
        let s = Settings::from_args(&a).expect("valid");
        assert_eq!(s.target.connect_timeout, Duration::from_secs(2));
    }
}
