//! Routes from a REAL Kubernetes API server (scripts/cluster.sh: etcd + kube-apiserver + controller-manager on
//! 127.0.0.1): the CRD generated from the Rust type is applied with kubectl, the running transformer picks up
//! an HL7Route and writes an accepted status; a bad version is refused in status while the old one keeps
//! routing; deleting it stops routing. The dry run is authorised by the same API server: a ServiceAccount token
//! checked with a TokenReview, the call with a SubjectAccessReview on `dryruns.hl7gw.io` (issue 11).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use hl7gw_testkit as support;

use hl7gw_runtime::proto::v1::transform_client::TransformClient;
use hl7gw_runtime::proto::v1::{Envelope, TransformRequest};
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::{broker, read_topic, repo_root};

const API_PORT: &str = "7543";

/// The test's own control plane, stopped when the test ends.
struct Cluster {
    dir: PathBuf,
}

impl Cluster {
    fn up() -> Self {
        let dir = repo_root().join(format!(".cache/cluster-{API_PORT}"));
        let status = Command::new("bash")
            .arg(repo_root().join("scripts/cluster.sh"))
            .arg("up")
            .env("CLUSTER_API_PORT", API_PORT)
            .status()
            .unwrap();
        assert!(status.success(), "scripts/cluster.sh up failed");
        Self { dir }
    }

    fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String) {
        let kubectl = repo_root().join(".cache/k8s-v1.36.3/bin/kubectl");
        let mut child = Command::new(kubectl)
            .args(args)
            .env("KUBECONFIG", self.kubeconfig())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(s) = stdin {
            child.stdin.take().unwrap().write_all(s.as_bytes()).unwrap();
        }
        drop(child.stdin.take());
        let out = child.wait_with_output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    }

    fn apply(&self, ns: &str, yaml: &str) {
        let (ok, out) = self.kubectl(&["apply", "-n", ns, "-f", "-"], Some(yaml));
        assert!(ok, "kubectl apply: {out}");
    }

    /// Waits until `jsonpath` of the route reads `want`.
    fn wait_field(&self, ns: &str, name: &str, jsonpath: &str, want: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (_, out) = self.kubectl(
                &[
                    "get",
                    "hl7route",
                    name,
                    "-n",
                    ns,
                    "-o",
                    &format!("jsonpath={jsonpath}"),
                ],
                None,
            );
            if out.trim() == want {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "{name} {jsonpath}: {out:?}, wanted {want:?}"
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(repo_root().join("scripts/cluster.sh"))
            .arg("down")
            .env("CLUSTER_API_PORT", API_PORT)
            .status();
    }
}

fn route(name: &str, destination: &str) -> String {
    format!(
        "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: {name}}}\nspec:\n  match: {{messageTypes: ['ADT^*']}}\n  transforms: [{{set: {{path: MSH-5, value: FROM-CRD}}}}]\n  destinations: [{destination}]\n"
    )
}

const ADT: &[u8] = b"MSH|^~\\&|APP|FAC|X|Y|20260101||ADT^A01|K8S-1|P|2.5\rPID|1||P1\r";

/// The ServiceAccount token the dry runs are made with (`ops`, bound to a Role allowing dryruns).
static OPS_TOKEN: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// A dry run of ADT with `token` (none: anonymous).
async fn dry_run(
    grpc: &str,
    token: Option<&str>,
) -> Result<hl7gw_runtime::proto::v1::TransformResponse, tonic::Status> {
    let mut c = TransformClient::connect(grpc.to_owned()).await.unwrap();
    let mut req = tonic::Request::new(TransformRequest {
        message: ADT.to_vec().into(),
        ..TransformRequest::default()
    });
    if let Some(t) = token {
        req.metadata_mut()
            .insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    c.transform(req).await.map(tonic::Response::into_inner)
}

/// The destinations the live routes send ADT to (a dry run over gRPC).
async fn destinations(grpc: &str) -> Vec<String> {
    let r = dry_run(grpc, OPS_TOKEN.get().map(String::as_str))
        .await
        .unwrap();
    r.outputs.into_iter().map(|o| o.destination).collect()
}

async fn wait_destinations(grpc: &str, want: &[&str]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let got = destinations(grpc).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "routing {got:?}, wanted {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_follow_hl7route_resources_and_their_status_says_why() {
    let cluster = Cluster::up();
    let crd = Command::new(env!("CARGO_BIN_EXE_hl7gw-transformer"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(crd.status.success());
    let (ok, out) = cluster.kubectl(
        &["apply", "-f", "-"],
        Some(&String::from_utf8_lossy(&crd.stdout)),
    );
    assert!(ok, "CRD: {out}");
    let (ok, out) = cluster.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "crd/hl7routes.hl7gw.io",
            "--timeout=30s",
        ],
        None,
    );
    assert!(ok, "CRD established: {out}");
    let ns = "hl7gw-test";
    let (ok, out) = cluster.kubectl(&["create", "namespace", ns], None);
    assert!(ok, "namespace: {out}");
    // Callers of the dry run: `ops` may (a Role on dryruns.hl7gw.io), `nobody` may not.
    cluster.apply(
        ns,
        "apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: ops}\n---\n\
         apiVersion: v1\nkind: ServiceAccount\nmetadata: {name: nobody}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: Role\nmetadata: {name: dry-run}\n\
         rules: [{apiGroups: [hl7gw.io], resources: [dryruns], verbs: [create]}]\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: ops-dry-run}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: dry-run}\n\
         subjects: [{kind: ServiceAccount, name: ops, namespace: hl7gw-test}]\n",
    );
    let token = |sa: &str| {
        let (ok, out) = cluster.kubectl(
            &["create", "token", sa, "-n", ns, "--audience", "hl7gw"],
            None,
        );
        assert!(ok, "token for {sa}: {out}");
        out.trim().to_owned()
    };
    let nobody = token("nobody");
    // The same ServiceAccount's token for the API server (the default audience): never accepted, so no caller
    // hands the gateway a credential for the cluster.
    let (ok, api_token) = cluster.kubectl(&["create", "token", "ops", "-n", ns], None);
    assert!(ok, "{api_token}");
    OPS_TOKEN.set(token("ops")).unwrap();

    // The transformer, watching the namespace, with its own topics.
    let id = uuid::Uuid::now_v7().simple().to_string();
    let inbound = format!("k{id}.inbound");
    let out_prefix = format!("k{id}.out.");
    let (_transformer, line) = support::spawn_listening(
        Command::new(env!("CARGO_BIN_EXE_hl7gw-transformer"))
            .args(["--grpc-addr", "127.0.0.1:0", "--admin-addr", "127.0.0.1:0"])
            .env("KUBECONFIG", cluster.kubeconfig())
            .env("HL7GW_KAFKA__BROKERS", broker())
            .env("HL7GW_INBOUND_TOPIC", &inbound)
            .env("HL7GW_DLQ_TOPIC", format!("k{id}.dlq"))
            .env("HL7GW_OUT_TOPIC_PREFIX", &out_prefix)
            .env("HL7GW_GROUP_ID", format!("k{id}"))
            .env("HL7GW_TRANSACTIONAL_ID", format!("k{id}-0"))
            .env("HL7GW_ROUTES__KUBERNETES", "true")
            .env("HL7GW_ROUTES__NAMESPACE", ns)
            .env("HL7GW_GRPC__KUBERNETES_AUTH", "true")
            .env("POD_NAMESPACE", ns)
            .env("RUST_LOG", "warn"),
    );
    let grpc = format!("http://{}", support::listening_field(&line, "grpc"));

    // An HL7Route: accepted in its status, and routing.
    cluster.apply(ns, &route("adt", "lab"));
    cluster.wait_field(ns, "adt", "{.status.accepted}", "true");
    cluster.wait_field(ns, "adt", "{.status.observedGeneration}", "1");
    wait_destinations(&grpc, &["lab"]).await;

    // The dry run runs the salted hash step: only callers RBAC allows.
    let code = |r: Result<_, tonic::Status>| r.map(|_| ()).map_err(|s| s.code());
    assert_eq!(
        code(dry_run(&grpc, None).await),
        Err(tonic::Code::Unauthenticated)
    );
    assert_eq!(
        code(dry_run(&grpc, Some("not-a-real-token-0123456789")).await),
        Err(tonic::Code::Unauthenticated)
    );
    assert_eq!(
        code(dry_run(&grpc, Some(&nobody)).await),
        Err(tonic::Code::PermissionDenied)
    );
    assert_eq!(
        code(dry_run(&grpc, Some(api_token.trim())).await),
        Err(tonic::Code::Unauthenticated)
    );

    // And through Kafka: an inbound envelope comes out on the route's topic, transformed.
    let env = Envelope {
        id: "k8s-1".into(),
        raw: ADT.to_vec().into(),
        header: Some(hl7gw_runtime::envelope::header(
            hl7v2::Message::parse(ADT).unwrap().header(),
            hl7v2::Charset::Utf8,
        )),
        key: "FAC|P1".into(),
        ..Envelope::default()
    };
    support::produce_envelope(broker(), &inbound, "FAC|P1", &env).await;
    let records = read_topic(
        broker(),
        &format!("{out_prefix}lab"),
        1,
        Duration::from_secs(60),
    );
    assert_eq!(records.len(), 1);
    let out = hl7v2::Message::parse(&records[0].envelope.raw)
        .unwrap()
        .get("MSH-5")
        .map(<[u8]>::to_vec);
    assert_eq!(out.as_deref(), Some(&b"FROM-CRD"[..]));
    assert_eq!(records[0].envelope.route, "adt");

    // A bad new version: refused in status with the reason; the old version keeps routing.
    cluster.apply(ns, &route("adt", "'not a topic name'"));
    cluster.wait_field(ns, "adt", "{.status.accepted}", "false");
    let (_, reason) = cluster.kubectl(
        &[
            "get",
            "hl7route",
            "adt",
            "-n",
            ns,
            "-o",
            "jsonpath={.status.reason}",
        ],
        None,
    );
    assert!(reason.contains("destinations"), "{reason}");
    cluster.wait_field(ns, "adt", "{.status.observedGeneration}", "2");
    assert_eq!(destinations(&grpc).await, ["lab"]);

    // Fixed: accepted again and routing to the new destination; deleted: routing stops.
    cluster.apply(ns, &route("adt", "billing"));
    cluster.wait_field(ns, "adt", "{.status.accepted}", "true");
    wait_destinations(&grpc, &["billing"]).await;
    let (ok, out) = cluster.kubectl(&["delete", "hl7route", "adt", "-n", ns], None);
    assert!(ok, "{out}");
    wait_destinations(&grpc, &[]).await;

    made_up_tokens_from_one_address_do_not_keep_a_service_account_out(&grpc).await;
}

/// Issue 24, item 11: 64 callers on 127.0.0.1 send made-up JWT-shaped tokens as fast as they are refused
/// (each one a TokenReview), while `ops` calls from 127.0.0.2 for 12 s, past the 10 s its decision is cached:
/// every one of its calls is served (the flood gets 2 reviews in flight, not all 16).
async fn made_up_tokens_from_one_address_do_not_keep_a_service_account_out(grpc: &str) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let stop = Arc::new(AtomicBool::new(false));
    let reviews_asked = Arc::new(AtomicU64::new(0));
    let mut flood = Vec::new();
    for f in 0..64 {
        let (grpc, stop, asked) = (grpc.to_owned(), stop.clone(), reviews_asked.clone());
        flood.push(tokio::spawn(async move {
            let mut c = TransformClient::connect(grpc).await.unwrap();
            while !stop.load(Ordering::Relaxed) {
                let token = format!("eyJhbGciOiJSUzI1NiJ9.{}.{f}", uuid::Uuid::now_v7().simple());
                let mut req = tonic::Request::new(TransformRequest {
                    message: ADT.to_vec().into(),
                    ..TransformRequest::default()
                });
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {token}").parse().unwrap());
                let r = c.transform(req).await;
                assert!(r.is_err(), "a made-up token was let in");
                asked.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    let ops = TransformClient::new(
        tonic::transport::Endpoint::from_shared(grpc.to_owned())
            .unwrap()
            .local_address(Some([127, 0, 0, 2].into()))
            .connect()
            .await
            .unwrap(),
    );
    let token = OPS_TOKEN.get().unwrap();
    let (start, mut calls, mut refused) = (Instant::now(), 0, Vec::new());
    while start.elapsed() < Duration::from_secs(12) {
        let mut req = tonic::Request::new(TransformRequest {
            message: ADT.to_vec().into(),
            ..TransformRequest::default()
        });
        req.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        calls += 1;
        if let Err(s) = ops.clone().transform(req).await {
            refused.push(format!("{:?} {}", s.code(), s.message()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    for f in flood {
        f.await.unwrap();
    }
    let asked = reviews_asked.load(Ordering::Relaxed);
    assert!(asked > 100, "the flood made only {asked} calls");
    assert!(
        refused.is_empty(),
        "ops was refused {} of {calls} calls during a flood of {asked} made-up tokens: {:?}",
        refused.len(),
        &refused[..refused.len().min(5)]
    );
}
