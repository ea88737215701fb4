//! Who is calling and whether they may: static bearer tokens, client certificates, Kubernetes
//! ServiceAccount tokens (TokenReview + SubjectAccessReview, cached and bounded), and the allow lists.

use super::audit::{audit, peer};
use super::caller::{Caller, ConnInfo};
use super::settings::GrpcSettings;
use super::tokens::Tokens;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tonic::Status;

/// The permission to receive message bodies (patient data): a `grpc.allow` entry that is not a method and, for
/// Kubernetes callers, `get messages.hl7gw.io`; asked on top of the method's own when a call wants bodies (the
/// egress's `ListDeadLetters` with `include_envelope`).
pub const READ_MESSAGES: &str = "ReadMessages";

/// The `hl7gw.io` resource and verb a SubjectAccessReview asks about for each method, and for
/// `ReadMessages`: not a method but the permission to receive message bodies (patient data), asked on top of
/// the method's own when a call wants them (`ListDeadLetters` with `include_envelope`).
pub fn kubernetes_resource(method: &str) -> Option<(&'static str, &'static str)> {
    Some(match method {
        "Status" => ("destinations", "get"),
        "ListDeadLetters" => ("deadletters", "list"),
        READ_MESSAGES => ("messages", "get"),
        "Replay" => ("replays", "create"),
        "Transform" => ("dryruns", "create"),
        "Ingest" => ("messages", "create"),
        "Senders" => ("senders", "get"),
        "Trace" => ("traces", "get"),
        _ => return None,
    })
}

/// The authorisation of one service's gRPC methods.
pub struct Auth {
    tokens: Option<Tokens>,
    allow: BTreeMap<String, Vec<String>>,
    kubernetes: Option<KubeAuth>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("allow", &self.allow)
            .field("tokens", &self.tokens)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// `defaults`: who may call each method when `grpc.allow` does not say (methods absent: nobody).
    pub fn new(settings: &GrpcSettings, defaults: &[(&str, &[&str])]) -> Self {
        let mut allow: BTreeMap<String, Vec<String>> = defaults
            .iter()
            .map(|(m, who)| {
                (
                    (*m).to_owned(),
                    who.iter().map(|w| (*w).to_owned()).collect(),
                )
            })
            .collect();
        allow.extend(settings.allow.clone());
        Self {
            tokens: settings
                .tokens_file
                .as_ref()
                .map(|p| Tokens::new(p.clone())),
            allow,
            kubernetes: settings.kubernetes_auth.then(KubeAuth::default),
        }
    }

    /// The bearer token of a call, if it sent one.
    fn bearer<T>(req: &tonic::Request<T>) -> Result<Option<&str>, Status> {
        let Some(v) = req.metadata().get("authorization") else {
            return Ok(None);
        };
        v.to_str()
            .ok()
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(|t| Some(t.trim()))
            .ok_or_else(|| Status::unauthenticated("authorization must be `Bearer <token>`"))
    }

    /// Who is calling, without Kubernetes: a static bearer token (which must be known), else the client
    /// certificate, else anonymous.
    pub fn authenticate<T>(&self, req: &tonic::Request<T>) -> Result<Caller, Status> {
        if let Some(token) = Self::bearer(req)? {
            return self
                .tokens
                .as_ref()
                .and_then(|t| t.name_of(token))
                .map(Caller::Token)
                .ok_or_else(|| Status::unauthenticated("unknown token"));
        }
        if let Some(cn) = req
            .extensions()
            .get::<ConnInfo>()
            .and_then(|c| c.client_cn.clone())
        {
            return Ok(Caller::Cert(cn));
        }
        Ok(Caller::Anonymous)
    }

    /// Authenticates the caller and checks `method`'s allow list (or, for a Kubernetes token, RBAC):
    /// UNAUTHENTICATED for an anonymous caller where one is needed or an unknown token, PERMISSION_DENIED for
    /// a known caller not allowed.
    pub async fn authorize<T>(
        &self,
        req: &tonic::Request<T>,
        method: &str,
    ) -> Result<Caller, Status> {
        if let (Some(kube), Some(token)) = (&self.kubernetes, Self::bearer(req)?) {
            let is_static = self
                .tokens
                .as_ref()
                .is_some_and(|t| t.name_of(token).is_some());
            if !is_static {
                let peer = peer(req).map(|p| p.ip());
                return kube.authorize(token, method, peer).await;
            }
        }
        let caller = self.authenticate(req)?;
        let allowed = self
            .allow
            .get(method)
            .map(Vec::as_slice)
            .unwrap_or_default();
        let ok = allowed.iter().any(|a| match a.as_str() {
            "anonymous" => true,
            "authenticated" => caller != Caller::Anonymous,
            who => who == caller.to_string(),
        });
        match (ok, &caller) {
            (true, _) => Ok(caller),
            (false, Caller::Anonymous) => Err(Status::unauthenticated(format!(
                "{method} needs a token or a client certificate"
            ))),
            (false, c) => Err(Status::permission_denied(format!(
                "{c} may not call {method}"
            ))),
        }
    }

    /// [`Auth::authorize`] for an admin method, with the audit line of a refusal.
    pub async fn admin<T>(
        &self,
        req: &tonic::Request<T>,
        method: &str,
        what: &str,
    ) -> Result<Caller, Status> {
        self.authorize(req, method).await.inspect_err(|s| {
            audit(
                "refused caller",
                peer(req),
                method,
                what,
                &format!("refused: {:?}: {}", s.code(), s.message()),
            );
        })
    }
}

/// How long a decision about a token the API server authenticated (allowed, or denied by RBAC) is reused.
const KUBE_CACHE_TTL: Duration = Duration::from_secs(10);

/// How long "unknown token" is remembered: briefly (a token just issued is known a moment later), but a
/// caller repeating a made-up token costs no review meanwhile.
const KUBE_NEGATIVE_TTL: Duration = Duration::from_secs(5);

/// Decisions kept at most in each of the two caches; the least recently used goes first. Unknown tokens
/// have their own cache, so a flood of made-up tokens cannot push out the decisions of real callers.
const KUBE_CACHE_MAX: usize = 4096;

/// TokenReviews/SubjectAccessReviews in flight at most per service.
const KUBE_REVIEWS_IN_FLIGHT: usize = 16;

/// Reviews in flight at most for one peer (IP address): one client sending made-up tokens cannot take the
/// reviews every other caller needs.
const KUBE_REVIEWS_PER_PEER: usize = 2;

/// How long a review (TokenReview, then SubjectAccessReview) may take before the call gets UNAVAILABLE.
const KUBE_REVIEW_TIMEOUT: Duration = Duration::from_secs(5);

type KubeDecision = Result<Caller, (tonic::Code, String)>;

/// A map that keeps at most `cap` entries, each for `ttl`, forgetting the least recently used first.
#[derive(Debug)]
struct Lru<K, V> {
    cap: usize,
    ttl: Duration,
    tick: u64,
    /// key → (when stored, last use, value)
    map: std::collections::HashMap<K, (Instant, u64, V)>,
    /// last use → key, oldest first
    order: BTreeMap<u64, K>,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> Lru<K, V> {
    fn new(cap: usize, ttl: Duration) -> Self {
        Self {
            cap: cap.max(1),
            ttl,
            tick: 0,
            map: std::collections::HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    /// The value of `key` if stored less than `ttl` ago (it becomes the most recently used).
    fn get(&mut self, key: &K) -> Option<V> {
        let (at, used, v) = self.map.get_mut(key)?;
        if at.elapsed() >= self.ttl {
            let used = *used;
            self.map.remove(key);
            self.order.remove(&used);
            return None;
        }
        self.tick += 1;
        self.order.remove(&*used);
        *used = self.tick;
        let v = v.clone();
        self.order.insert(self.tick, key.clone());
        Some(v)
    }

    /// Stores `value` under `key`, forgetting the least recently used entry when full.
    fn insert(&mut self, key: K, value: V) {
        self.tick += 1;
        if let Some((_, used, _)) = self.map.get(&key) {
            let used = *used;
            self.order.remove(&used);
        } else if self.map.len() >= self.cap
            && let Some((_, oldest)) = self.order.pop_first()
        {
            self.map.remove(&oldest);
        }
        self.map
            .insert(key.clone(), (Instant::now(), self.tick, value));
        self.order.insert(self.tick, key);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.map.len()
    }
}

/// What the reviews decided lately: the decisions about tokens the API server knows, per (SHA-256 of the
/// token, method), and the tokens it did not know, per SHA-256, each bounded on its own.
#[derive(Debug)]
struct KubeCache {
    known: Lru<([u8; 32], String), KubeDecision>,
    unknown: Lru<[u8; 32], (tonic::Code, String)>,
}

impl Default for KubeCache {
    fn default() -> Self {
        Self {
            known: Lru::new(KUBE_CACHE_MAX, KUBE_CACHE_TTL),
            unknown: Lru::new(KUBE_CACHE_MAX, KUBE_NEGATIVE_TTL),
        }
    }
}

impl KubeCache {
    fn get(&mut self, digest: [u8; 32], method: &str) -> Option<KubeDecision> {
        if let Some(refusal) = self.unknown.get(&digest) {
            return Some(Err(refusal));
        }
        self.known.get(&(digest, method.to_owned()))
    }

    fn insert(&mut self, digest: [u8; 32], method: &str, decision: KubeDecision) {
        match decision {
            Err((code @ tonic::Code::Unauthenticated, m)) => self.unknown.insert(digest, (code, m)),
            d => self.known.insert((digest, method.to_owned()), d),
        }
    }
}

/// Reviews in flight per peer address, at most `max` each.
#[derive(Debug)]
struct PeerReviews {
    max: usize,
    in_flight: std::sync::Mutex<std::collections::HashMap<Option<std::net::IpAddr>, usize>>,
}

impl PeerReviews {
    fn new(max: usize) -> Self {
        Self {
            max,
            in_flight: std::sync::Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// A place for one review of `peer`'s, or `None` when it has `max` in flight.
    fn try_start(&self, peer: Option<std::net::IpAddr>) -> Option<PeerReview<'_>> {
        let mut m = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = m.entry(peer).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(PeerReview { of: self, peer })
    }
}

/// One review in flight for a peer, until dropped.
struct PeerReview<'a> {
    of: &'a PeerReviews,
    peer: Option<std::net::IpAddr>,
}

impl Drop for PeerReview<'_> {
    fn drop(&mut self) {
        let mut m = self.of.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = m.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                m.remove(&self.peer);
            }
        }
    }
}

/// Kubernetes authentication (TokenReview) and authorisation (SubjectAccessReview), with a short cache.
struct KubeAuth {
    client: tokio::sync::OnceCell<(kube::Client, String)>,
    cache: std::sync::Mutex<KubeCache>,
    /// Reviews in flight at most: unknown tokens cannot flood the API server.
    reviews: tokio::sync::Semaphore,
    /// Reviews in flight per peer.
    per_peer: PeerReviews,
}

impl Default for KubeAuth {
    fn default() -> Self {
        Self {
            client: tokio::sync::OnceCell::new(),
            cache: std::sync::Mutex::new(KubeCache::default()),
            reviews: tokio::sync::Semaphore::new(KUBE_REVIEWS_IN_FLIGHT),
            per_peer: PeerReviews::new(KUBE_REVIEWS_PER_PEER),
        }
    }
}

/// The audience a Kubernetes token must be issued for (`kubectl create token <sa> --audience hl7gw`): a token
/// for the API server itself is refused, so a caller never hands the gateway a credential for the cluster.
pub const KUBERNETES_AUDIENCE: &str = "hl7gw";

impl std::fmt::Debug for KubeAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeAuth").finish_non_exhaustive()
    }
}

impl KubeAuth {
    async fn client(&self) -> Result<&(kube::Client, String), Status> {
        self.client
            .get_or_try_init(|| async {
                let client = kube::Client::try_default().await.map_err(|e| {
                    tracing::error!(error = %e, "no Kubernetes client for grpc.kubernetes_auth");
                    Status::unavailable("Kubernetes authentication is unavailable")
                })?;
                let ns = std::env::var("POD_NAMESPACE")
                    .unwrap_or_else(|_| client.default_namespace().to_owned());
                Ok((client, ns))
            })
            .await
    }

    async fn authorize(
        &self,
        token: &str,
        method: &str,
        peer: Option<std::net::IpAddr>,
    ) -> Result<Caller, Status> {
        // A ServiceAccount token is a JWT: three dot-separated parts. Anything else is not worth a review.
        if token.split('.').count() != 3 {
            return Err(Status::unauthenticated("unknown token"));
        }
        let digest: [u8; 32] = {
            use sha2::Digest;
            sha2::Sha256::digest(token.as_bytes()).into()
        };
        let cached = self
            .cache
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(digest, method);
        if let Some(d) = cached {
            return d.map_err(|(c, m)| Status::new(c, m));
        }
        let Some(_peer) = self.per_peer.try_start(peer) else {
            return Err(Status::unavailable(
                "too many authentication reviews in flight from this address; retry",
            ));
        };
        let Ok(_permit) = self.reviews.try_acquire() else {
            return Err(Status::unavailable(
                "too many authentication reviews in flight; retry",
            ));
        };
        let decision = tokio::time::timeout(KUBE_REVIEW_TIMEOUT, self.review(token, method))
            .await
            .map_err(|_| {
                tracing::warn!("Kubernetes review timed out");
                Status::unavailable("Kubernetes authentication timed out; retry")
            })??;
        self.cache.lock().unwrap_or_else(|p| p.into_inner()).insert(
            digest,
            method,
            decision.clone(),
        );
        decision.map_err(|(c, m)| Status::new(c, m))
    }

    /// The decision, or UNAVAILABLE (not cached) when the API server could not be asked.
    async fn review(&self, token: &str, method: &str) -> Result<KubeDecision, Status> {
        use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
        use k8s_openapi::api::authorization::v1::{
            ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
        };
        let (client, ns) = self.client().await?;
        let unavailable = |e: kube::Error| {
            tracing::warn!(error = %e, "Kubernetes review failed");
            Status::unavailable("Kubernetes authentication is unavailable; retry")
        };
        let tr = kube::Api::<TokenReview>::all(client.clone())
            .create(
                &kube::api::PostParams::default(),
                &TokenReview {
                    spec: TokenReviewSpec {
                        token: token.to_owned(),
                        audiences: Some(vec![KUBERNETES_AUDIENCE.to_owned()]),
                    },
                    ..TokenReview::default()
                },
            )
            .await
            .map_err(unavailable)?;
        let status = tr.status.unwrap_or_default();
        let audience_ok = status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|x| x == KUBERNETES_AUDIENCE));
        let Some(user) = status
            .user
            .filter(|_| status.authenticated == Some(true) && audience_ok)
        else {
            return Ok(Err((tonic::Code::Unauthenticated, "unknown token".into())));
        };
        let name = user.username.clone().unwrap_or_default();
        let Some((resource, verb)) = kubernetes_resource(method) else {
            return Ok(Err((
                tonic::Code::PermissionDenied,
                format!("no RBAC resource for {method}"),
            )));
        };
        let sar = kube::Api::<SubjectAccessReview>::all(client.clone())
            .create(
                &kube::api::PostParams::default(),
                &SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: user.username,
                        groups: user.groups,
                        uid: user.uid,
                        extra: user.extra,
                        resource_attributes: Some(ResourceAttributes {
                            group: Some("hl7gw.io".into()),
                            resource: Some(resource.into()),
                            verb: Some(verb.into()),
                            namespace: Some(ns.clone()),
                            ..ResourceAttributes::default()
                        }),
                        ..SubjectAccessReviewSpec::default()
                    },
                    ..SubjectAccessReview::default()
                },
            )
            .await
            .map_err(unavailable)?;
        if sar.status.is_some_and(|s| s.allowed) {
            Ok(Ok(Caller::Kubernetes(name)))
        } else {
            Ok(Err((
                tonic::Code::PermissionDenied,
                format!("k8s:{name} may not {verb} {resource}.hl7gw.io in namespace {ns}"),
            )))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(auth: Option<&str>, cn: Option<&str>) -> tonic::Request<()> {
        let mut r = tonic::Request::new(());
        if let Some(a) = auth {
            r.metadata_mut()
                .insert("authorization", a.parse().expect("ascii"));
        }
        r.extensions_mut().insert(ConnInfo {
            remote: None,
            client_cn: cn.map(str::to_owned),
            client_subject: None,
        });
        r
    }

    #[tokio::test]
    async fn admin_methods_are_denied_by_default_and_allow_lists_decide() {
        let tokens = "# ops\nops 0123456789abcdef0123\nviewer fedcba9876543210fedc\n";
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("tokens");
        std::fs::write(&file, tokens).expect("write");
        let settings = GrpcSettings {
            tokens_file: Some(file.clone()),
            allow: [(
                "Replay".to_owned(),
                vec!["token:ops".to_owned(), "cert:ops-cli".to_owned()],
            )]
            .into(),
            ..GrpcSettings::default()
        };
        settings
            .validate(&["Replay", "Status", "Ingest"])
            .expect("valid");
        let auth = Auth::new(
            &settings,
            &[("Ingest", &["anonymous"]), ("Status", &["authenticated"])],
        );
        let code = |r: Result<Caller, Status>| r.map_err(|s| s.code());
        use tonic::Code::{PermissionDenied, Unauthenticated};
        let (ops, viewer) = (
            Some("Bearer 0123456789abcdef0123"),
            Some("Bearer fedcba9876543210fedc"),
        );
        let cases = [
            (None, None, "Replay", Err(Unauthenticated)),
            (ops, None, "Replay", Ok(Caller::Token("ops".into()))),
            (viewer, None, "Replay", Err(PermissionDenied)),
            (Some("Bearer nope"), None, "Status", Err(Unauthenticated)),
            (
                None,
                Some("ops-cli"),
                "Replay",
                Ok(Caller::Cert("ops-cli".into())),
            ),
            (None, Some("other"), "Replay", Err(PermissionDenied)),
            (
                None,
                Some("other"),
                "Status",
                Ok(Caller::Cert("other".into())),
            ),
            (None, None, "Ingest", Ok(Caller::Anonymous)),
            (None, None, "ListDeadLetters", Err(Unauthenticated)),
        ];
        for (bearer, cert, method, want) in cases {
            let got = code(auth.authorize(&req(bearer, cert), method).await);
            assert_eq!(got, want, "{bearer:?} {cert:?} {method}");
        }
        // Rotated: the old token stops working, the new one works.
        let rotated = Some("Bearer 11112222333344445555");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "ops 11112222333344445555\n").expect("write");
        assert_eq!(
            code(auth.authorize(&req(ops, None), "Replay").await),
            Err(Unauthenticated)
        );
        assert!(code(auth.authorize(&req(rotated, None), "Replay").await).is_ok());
        // Debug output never holds a token.
        let debug = format!("{auth:?}");
        assert!(!debug.contains("11112222333344445555"), "{debug}");
        // A revocation that leaves a bad line fails closed: no token works until the file is fixed.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&file, "ops 11112222333344445555\nbroken-line\n").expect("write");
        assert_eq!(
            code(auth.authorize(&req(rotated, None), "Replay").await),
            Err(Unauthenticated)
        );
        // So does a file that is gone.
        std::fs::write(&file, "ops 11112222333344445555\n").expect("write");
        assert!(code(auth.authorize(&req(rotated, None), "Replay").await).is_ok());
        std::fs::remove_file(&file).expect("remove");
        assert_eq!(
            code(auth.authorize(&req(rotated, None), "Replay").await),
            Err(Unauthenticated)
        );
    }

    /// Issue 36, item 1: message bodies are their own RBAC permission (`messages get`), apart from the
    /// listing's (`deadletters list`) that the viewer role holds.
    #[test]
    fn reading_messages_is_its_own_rbac_permission() {
        assert_eq!(
            kubernetes_resource("ReadMessages"),
            Some(("messages", "get"))
        );
        assert_ne!(
            kubernetes_resource("ReadMessages"),
            kubernetes_resource("ListDeadLetters")
        );
        assert_ne!(
            kubernetes_resource("ReadMessages"),
            kubernetes_resource("Ingest")
        );
    }

    #[test]
    fn the_review_cache_forgets_the_least_recently_used_and_keeps_unknown_tokens_apart() {
        let mut lru = Lru::new(3, Duration::from_secs(60));
        for k in 0..3 {
            lru.insert(k, k * 10);
        }
        assert_eq!(lru.get(&0), Some(0), "0 is now the most recently used");
        lru.insert(3, 30);
        assert_eq!(lru.get(&1), None, "1 was the least recently used");
        assert_eq!(
            (lru.get(&0), lru.get(&2), lru.get(&3)),
            (Some(0), Some(20), Some(30))
        );
        assert_eq!(lru.len(), 3);
        let mut short = Lru::new(3, Duration::from_millis(20));
        short.insert("k", 1);
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!(short.get(&"k"), None, "expired");
        assert_eq!(short.len(), 0);

        // A flood of made-up tokens (refused as unknown) never pushes out a real caller's decision.
        let mut cache = KubeCache::default();
        let good = [7u8; 32];
        let caller = Caller::Kubernetes("system:serviceaccount:ns:sa".into());
        cache.insert(good, "Status", Ok(caller.clone()));
        for i in 0..(3 * KUBE_CACHE_MAX as u32) {
            let mut junk = [0u8; 32];
            junk[..4].copy_from_slice(&i.to_be_bytes());
            cache.insert(
                junk,
                "Status",
                Err((tonic::Code::Unauthenticated, "unknown token".into())),
            );
        }
        assert_eq!(cache.get(good, "Status"), Some(Ok(caller)));
        assert!(cache.unknown.len() <= KUBE_CACHE_MAX);
        // The last junk token is remembered as unknown, for any method: no second review.
        let mut last = [0u8; 32];
        last[..4].copy_from_slice(&(3 * KUBE_CACHE_MAX as u32 - 1).to_be_bytes());
        assert!(matches!(
            cache.get(last, "Replay"),
            Some(Err((tonic::Code::Unauthenticated, _)))
        ));
        // An RBAC refusal of a known token is a decision about a real caller: kept with them.
        cache.insert(
            [8u8; 32],
            "Replay",
            Err((tonic::Code::PermissionDenied, "no".into())),
        );
        assert_eq!(cache.known.len(), 2);
    }

    #[test]
    fn one_peer_cannot_take_every_review() {
        let reviews = PeerReviews::new(2);
        let a = Some(std::net::IpAddr::from([10, 0, 0, 1]));
        let b = Some(std::net::IpAddr::from([10, 0, 0, 2]));
        let first = reviews.try_start(a).expect("a: 1");
        let _second = reviews.try_start(a).expect("a: 2");
        assert!(reviews.try_start(a).is_none(), "a third review for a");
        assert!(reviews.try_start(b).is_some(), "b is not held up by a");
        drop(first);
        assert!(reviews.try_start(a).is_some(), "a again once one finished");
        assert_eq!(
            reviews.in_flight.lock().expect("map").len(),
            1,
            "peers without reviews are forgotten"
        );
    }
}
