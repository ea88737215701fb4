//! Where the live routes come from: a YAML file of `HL7Route` documents (re-read when it changes) or the
//! `HL7Route` resources of a namespace, watched through the Kubernetes API. Either way a route that does not
//! compile is refused with a reason and the route's previous version (if any) keeps routing.

use crate::engine::{Route, Routes};
use crate::metrics::TransformerMetrics;
use crate::route::{HL7Route, HL7RouteStatus};
use futures_util::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The routes in use, swapped whole on every change.
#[derive(Debug, Default)]
pub struct LiveRoutes {
    current: RwLock<Arc<Routes>>,
    loaded: AtomicBool,
    first_load: tokio::sync::Notify,
}

impl LiveRoutes {
    /// The current set (cheap: an `Arc` clone).
    pub fn get(&self) -> Arc<Routes> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    fn set(&self, routes: Routes) {
        let routes = Arc::new(routes);
        match self.current.write() {
            Ok(mut g) => *g = routes,
            Err(p) => *p.into_inner() = routes,
        }
        self.loaded.store(true, Ordering::Release);
        self.first_load.notify_waiters();
    }

    /// Returns once a first complete route list was loaded (at once if one was).
    pub async fn wait_loaded(&self) {
        loop {
            // Registered before the check, so a load between the check and the await is not missed.
            let notified = self.first_load.notified();
            if self.is_loaded() {
                return;
            }
            notified.await;
        }
    }

    /// True once a first set was loaded (readiness).
    pub fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }
}

/// Why a routes file could not be read at all (its routes stay as they were).
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("routes file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("routes file {path}: not YAML: {source}")]
    Yaml {
        path: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    #[error("kubernetes: {0}")]
    Kube(#[from] kube::Error),
}

/// One route document's fate at a reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    pub name: String,
    /// None: accepted; Some: refused, and why.
    pub refused: Option<String>,
}

/// A route document by name: the route, or why it could not be read.
pub type RouteDoc = (String, Result<HL7Route, String>);

/// Compiles route documents into a set. A refused route keeps its version from `previous` if there was one.
pub fn compile_all(docs: &[RouteDoc], previous: &Routes) -> (Routes, Vec<Verdict>) {
    let mut out: BTreeMap<String, Arc<Route>> = BTreeMap::new();
    let mut verdicts = Vec::new();
    for (name, doc) in docs {
        let compiled = doc
            .as_ref()
            .map_err(Clone::clone)
            .and_then(|r| Route::compile(name, &r.spec).map_err(|e| e.to_string()));
        let refused = if out.contains_key(name) {
            Some("a route with this name was defined earlier in the file".to_owned())
        } else {
            match compiled {
                Ok(route) => {
                    out.insert(name.clone(), Arc::new(route));
                    None
                }
                Err(reason) => {
                    if let Some(old) = previous.routes.iter().find(|r| r.name == *name) {
                        out.insert(name.clone(), old.clone());
                    }
                    Some(reason)
                }
            }
        };
        verdicts.push(Verdict {
            name: name.clone(),
            refused,
        });
    }
    let mut routes = Routes::new(out.into_values().collect());
    routes.files = files_fingerprint(&routes);
    (routes, verdicts)
}

/// Splits a routes file into named documents; a document that is not an `HL7Route` is refused by name.
/// Empty documents are skipped (and not counted in the `document-N` names of unnamed ones).
pub fn parse_file(text: &str) -> Result<Vec<RouteDoc>, serde_saphyr::Error> {
    let mut docs = Vec::new();
    for (i, value) in serde_saphyr::from_multiple::<serde_json::Value>(text)?
        .into_iter()
        .enumerate()
    {
        if value.is_null() {
            continue;
        }
        let name = value
            .get("metadata")
            .and_then(|m| m.get("name"))
            .and_then(|n| n.as_str())
            .map(str::to_owned)
            .unwrap_or_else(|| format!("document-{}", i + 1));
        let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
        let doc = if kind != "HL7Route" {
            Err(format!("kind {kind:?}: expected HL7Route"))
        } else {
            serde_json::from_value::<HL7Route>(value).map_err(|e| e.to_string())
        };
        docs.push((name, doc));
    }
    Ok(docs)
}

fn publish(live: &LiveRoutes, routes: Routes, verdicts: &[Verdict], metrics: &TransformerMetrics) {
    let refused = verdicts.iter().filter(|v| v.refused.is_some()).count();
    for v in verdicts {
        if let Some(reason) = &v.refused {
            tracing::warn!(route = %v.name, %reason, "route refused");
        }
    }
    metrics.routes_active.set(routes.routes.len() as i64);
    metrics.routes_refused.set(refused as i64);
    metrics
        .route_reloads
        .get_or_create(&crate::metrics::ResultLabels {
            result: if refused == 0 { "ok" } else { "refused" },
        })
        .inc();
    tracing::info!(routes = routes.routes.len(), refused, "routes loaded");
    live.set(routes);
}

/// Loads the routes file once.
pub fn load_file(
    path: &Path,
    live: &LiveRoutes,
    metrics: &TransformerMetrics,
) -> Result<Vec<Verdict>, SourceError> {
    let bytes = std::fs::read(path).map_err(|source| SourceError::Read {
        path: path.display().to_string(),
        source,
    })?;
    load_bytes(path, &bytes, live, metrics)
}

/// Loads the routes from the content of the routes file at `path`.
pub fn load_bytes(
    path: &Path,
    bytes: &[u8],
    live: &LiveRoutes,
    metrics: &TransformerMetrics,
) -> Result<Vec<Verdict>, SourceError> {
    let text = std::str::from_utf8(bytes).map_err(|e| SourceError::Read {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })?;
    let docs = parse_file(text).map_err(|source| SourceError::Yaml {
        path: path.display().to_string(),
        source: Box::new(source),
    })?;
    let (routes, verdicts) = compile_all(&docs, &live.get());
    publish(live, routes, &verdicts, metrics);
    Ok(verdicts)
}

/// Reads the routes file at start. A file that is missing, unreadable or not YAML is not fatal: the
/// transformer stays up, not ready and consuming nothing, until [`watch_file`] loads a good version. Returns
/// the content read (what `watch_file` compares against), if any.
pub fn load_file_at_start(
    path: &Path,
    live: &LiveRoutes,
    metrics: &TransformerMetrics,
) -> Option<Vec<u8>> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "routes file not readable yet: consuming nothing until it is");
            return None;
        }
    };
    if let Err(e) = load_bytes(path, &bytes, live, metrics) {
        metrics
            .route_reloads
            .get_or_create(&crate::metrics::ResultLabels { result: "error" })
            .inc();
        tracing::warn!(error = %e, "routes file not loaded: consuming nothing until it changes");
    }
    Some(bytes)
}

/// The files the live routes read (a `toFhir` step's code maps) and their contents, hashed: when it changes,
/// the routes are compiled again (a code map's file, or a mounted ConfigMap's key, is hot-reloaded like the
/// routes). Small files, read every reload interval.
pub fn files_fingerprint(routes: &Routes) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for r in &routes.routes {
        for f in r.files() {
            f.hash(&mut h);
            std::fs::read(f).ok().hash(&mut h);
        }
    }
    h.finish()
}

/// [`files_fingerprint`] of the live routes, read on the blocking pool (file reads, off the watcher's task).
async fn files_now(live: &Arc<LiveRoutes>) -> u64 {
    let routes = live.get();
    tokio::task::spawn_blocking(move || files_fingerprint(&routes))
        .await
        .unwrap_or_default()
}

/// Re-reads the routes file whenever its content differs from `loaded` (what was loaded last), or a file the
/// routes read changed ([`files_fingerprint`]), until `stop`.
pub async fn watch_file(
    path: PathBuf,
    loaded: Option<Vec<u8>>,
    interval: Duration,
    live: Arc<LiveRoutes>,
    metrics: TransformerMetrics,
    stop: CancellationToken,
) {
    let mut last = loaded;
    // The routes' files as they were at the last attempt: a change is tried once, not every interval while
    // the routes file itself does not load.
    let mut tried_files = live.get().files;
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        let Some(now) = tokio::fs::read(&path).await.ok() else {
            // Missing (or being replaced): the routes loaded last keep running.
            continue;
        };
        let files = files_now(&live).await;
        if last.as_deref() == Some(now.as_slice())
            && (files == live.get().files || files == tried_files)
        {
            continue;
        }
        // A file being written (truncated, then filled) must not be taken half-written, which could remove
        // routes or a code map's rows for a moment: the change is taken once two reads a moment apart agree.
        tokio::time::sleep(interval.min(Duration::from_millis(100))).await;
        if tokio::fs::read(&path).await.ok().as_deref() != Some(now.as_slice())
            || files_now(&live).await != files
        {
            continue;
        }
        tried_files = files;
        let result = load_bytes(&path, &now, &live, &metrics);
        last = Some(now);
        if let Err(e) = result {
            metrics
                .route_reloads
                .get_or_create(&crate::metrics::ResultLabels { result: "error" })
                .inc();
            tracing::warn!(error = %e, "routes file not reloaded; the previous routes keep running");
        }
    }
}

/// Watches `HL7Route`s in a namespace and keeps `live` and each route's status in step, until `stop`.
pub async fn watch_kubernetes(
    api: Api<HL7Route>,
    live: Arc<LiveRoutes>,
    interval: Duration,
    metrics: TransformerMetrics,
    stop: CancellationToken,
) {
    let mut objects: BTreeMap<String, HL7Route> = BTreeMap::new();
    let mut init: Option<BTreeMap<String, HL7Route>> = None;
    let mut tried_files = live.get().files;
    let stream = watcher(api.clone(), watcher::Config::default()).default_backoff();
    futures_util::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = stream.next() => Some(ev),
            // A file a route reads (a mounted ConfigMap's code map) changed: the routes are compiled again.
            _ = tokio::time::sleep(interval) => None,
        };
        let Some(ev) = ev else {
            let routes = live.get();
            let files = files_now(&live).await;
            if objects.is_empty() || files == routes.files || files == tried_files {
                continue;
            }
            // Taken once two reads a moment apart agree (a file being written), and tried once per change.
            tokio::time::sleep(interval.min(Duration::from_millis(100))).await;
            if files_now(&live).await != files {
                continue;
            }
            tried_files = files;
            for v in compile_objects(&objects, &live, &metrics) {
                if let Some(o) = objects.get(&v.name) {
                    write_status(&api, o, &v).await;
                }
            }
            continue;
        };
        let changed = match ev {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "HL7Route watch error; retrying");
                continue;
            }
            Some(Ok(watcher::Event::Init)) => {
                init = Some(BTreeMap::new());
                false
            }
            Some(Ok(watcher::Event::InitApply(o))) => {
                if let Some(m) = init.as_mut() {
                    m.insert(o.name_any(), o);
                }
                false
            }
            Some(Ok(watcher::Event::InitDone)) => {
                objects = init.take().unwrap_or_default();
                true
            }
            Some(Ok(watcher::Event::Apply(o))) => {
                objects.insert(o.name_any(), o);
                true
            }
            Some(Ok(watcher::Event::Delete(o))) => {
                objects.remove(&o.name_any());
                true
            }
        };
        if !changed {
            continue;
        }
        for v in compile_objects(&objects, &live, &metrics) {
            if let Some(o) = objects.get(&v.name) {
                write_status(&api, o, &v).await;
            }
        }
    }
}

/// Compiles the watched `HL7Route`s and makes them the live set; what became of each.
fn compile_objects(
    objects: &BTreeMap<String, HL7Route>,
    live: &LiveRoutes,
    metrics: &TransformerMetrics,
) -> Vec<Verdict> {
    let docs: Vec<RouteDoc> = objects
        .iter()
        .map(|(n, o)| (n.clone(), Ok(o.clone())))
        .collect();
    let (routes, verdicts) = compile_all(&docs, &live.get());
    publish(live, routes, &verdicts, metrics);
    verdicts
}

/// Writes a route's status unless it already says the same for this generation.
async fn write_status(api: &Api<HL7Route>, o: &HL7Route, v: &Verdict) {
    let status = HL7RouteStatus {
        accepted: v.refused.is_none(),
        reason: v.refused.clone(),
        observed_generation: o.metadata.generation,
    };
    if o.status.as_ref() == Some(&status) {
        return;
    }
    let patch = serde_json::json!({ "status": status });
    if let Err(e) = api
        .patch_status(&v.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        tracing::warn!(route = %v.name, error = %e, "could not write the route's status");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {name: adt}
spec:
  match: {messageTypes: ["ADT^A0*"]}
  destinations: [lab]
---
apiVersion: hl7gw.io/v1alpha1
kind: HL7Route
metadata: {name: oru}
spec:
  destinations: [archive]
"#;

    #[test]
    fn a_bad_route_keeps_its_previous_version_and_the_others_run() {
        let docs = parse_file(GOOD).unwrap();
        let (first, v) = compile_all(&docs, &Routes::default());
        assert!(v.iter().all(|v| v.refused.is_none()), "{v:?}");
        assert_eq!(first.routes.len(), 2);

        let bad = GOOD.replace("destinations: [lab]", "destinations: [\"no spaces\"]");
        let docs = parse_file(&bad).unwrap();
        let (second, v) = compile_all(&docs, &first);
        assert_eq!(second.routes.len(), 2, "the old adt route keeps routing");
        let adt = v.iter().find(|v| v.name == "adt").unwrap();
        assert!(adt.refused.as_deref().unwrap().contains("destinations"));
        assert_eq!(second.routes[0].destinations, ["lab"]);

        let (fresh, _) = compile_all(&docs, &Routes::default());
        assert_eq!(fresh.routes.len(), 1, "a new bad route is simply refused");
    }

    struct NoPlugins;
    impl crate::engine::PluginCaller for NoPlugins {
        async fn call(
            &self,
            _: &crate::engine::Plugin,
            _: hl7gw_runtime::proto::v1::TransformRequest,
        ) -> Result<(Vec<u8>, String), String> {
            Err("no plugins here".into())
        }
    }

    /// The Patient's gender in the Bundle the first live route makes of an A04 whose PID-8 is the local `9`
    /// (and the ZPI-2 its field map writes).
    async fn gender(live: &LiveRoutes) -> String {
        let raw = b"MSH|^~\\&|A|F|B|G|20260101||ADT^A04|C1|P|2.5\rPID|1||1^^^H^MR||DOE^J||19700101|9\rZPI|1|ST MARY\r";
        let env = hl7gw_runtime::proto::v1::Envelope::default();
        let routes = live.get();
        let (out, _) = routes.routes[0]
            .apply(&env, raw, hl7v2::Charset::Utf8, &NoPlugins)
            .await
            .unwrap();
        let b: serde_json::Value = serde_json::from_slice(&out).unwrap();
        // The Z-segment's field, where the route's field map puts it.
        assert_eq!(
            b["entry"][0]["resource"]["extension"][0]["valueString"], "ST MARY",
            "{b}"
        );
        b["entry"][0]["resource"]["gender"]
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// A route's code map (a file) and field map change the Bundle; the code map is read again when its file
    /// changes, as the routes file is: no restart, no rebuild.
    #[tokio::test]
    async fn a_changed_code_map_file_is_picked_up_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let map = dir.path().join("sex.csv");
        let write_map = |fhir: &str| {
            std::fs::write(
                &map,
                format!("h,,,,,,,,,\nh,,,,,,,,,\n9,x,L,,,,{fhir},,,http://hl7.org/fhir/administrative-gender\n"),
            )
            .unwrap();
        };
        write_map("unknown");
        let routes_file = dir.path().join("routes.yaml");
        std::fs::write(
            &routes_file,
            format!(
                "apiVersion: hl7gw.io/v1alpha1\nkind: HL7Route\nmetadata: {{name: fhir}}\nspec:\n  \
                 transforms: [{{toFhir: {{codeMaps: {{AdministrativeSex: '{}'}}, fieldMaps: [{{from: ZPI-2, \
                 to: 'Patient.extension[https://hospital.example/fhir/StructureDefinition/parish].valueString'}}]}}}}]\n  \
                 destinations: [fhir]\n",
                map.display()
            ),
        )
        .unwrap();
        let (_reg, metrics) = TransformerMetrics::registered();
        let live = Arc::new(LiveRoutes::default());
        let loaded = load_file_at_start(&routes_file, &live, &metrics);
        assert_eq!(gender(&live).await, "unknown");
        let stop = CancellationToken::new();
        let watcher = tokio::spawn(watch_file(
            routes_file,
            loaded,
            Duration::from_millis(50),
            live.clone(),
            metrics,
            stop.clone(),
        ));
        write_map("other");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while gender(&live).await != "other" {
            assert!(
                std::time::Instant::now() < deadline,
                "the changed map was not read again"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stop.cancel();
        watcher.await.unwrap();
    }

    #[test]
    fn unknown_keys_and_kinds_are_refused_by_name() {
        let text = "kind: HL7Route\nmetadata: {name: x}\nspec: {destinations: [a], colour: red}\n---\nkind: ConfigMap\nmetadata: {name: y}\n";
        let docs = parse_file(text).unwrap();
        let (routes, v) = compile_all(&docs, &Routes::default());
        assert!(routes.routes.is_empty());
        assert!(v[0].refused.as_deref().unwrap().contains("colour"));
        assert!(v[1].refused.as_deref().unwrap().contains("ConfigMap"));
    }
}
