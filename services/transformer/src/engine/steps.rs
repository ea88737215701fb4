//! Running a route's transform steps on a message: edits, plugins, `toJson`, `toFhir`.

use super::compile::output_key;
use super::json::to_json;
use super::types::Applied;
use super::types::FHIR_CONTENT_TYPE;
use super::types::HL7_CONTENT_TYPE;
use super::types::JSON_CONTENT_TYPE;
use super::types::PluginCaller;
use super::types::Route;
use super::types::Step;
use super::types::StepError;
use super::types::StepsDone;
use crate::route::OnFailure;
use hl7gw_runtime::proto::v1::{Envelope, TransformRequest};
use hl7v2::{Charset, Message, Path};
use sha2::{Digest, Sha256};

impl Route {
    /// Runs the steps on `raw` and returns the result and its content type.
    pub async fn apply<P: PluginCaller>(
        &self,
        env: &Envelope,
        raw: &[u8],
        charset: Charset,
        plugins: &P,
    ) -> Result<(Vec<u8>, &'static str), StepError> {
        self.run(env, raw, charset, plugins)
            .await
            .map(|a| (a.message, a.content_type))
    }

    /// Runs the steps on `raw` and returns the result, its content type and its output key.
    pub async fn run<P: PluginCaller>(
        &self,
        env: &Envelope,
        raw: &[u8],
        charset: Charset,
        plugins: &P,
    ) -> Result<Applied, StepError> {
        let (message, content_type, last_hl7, plugins_skipped, fhir_unmapped, skipped_unsupported) =
            self.steps_on(env, raw, charset, plugins).await?;
        let key = if self.key_paths.is_empty() || skipped_unsupported {
            None
        } else {
            let hl7 = last_hl7.as_deref().unwrap_or(message.as_slice());
            let msg = Message::parse(hl7).map_err(|e| StepError {
                route: self.name.clone(),
                step: self.steps.len(),
                kind: "key",
                detail: format!("keyPaths: {e}"),
            })?;
            Some(output_key(&msg, &self.key_paths))
        };
        Ok(Applied {
            message,
            content_type,
            key,
            plugins_skipped,
            fhir_unmapped,
            skipped_unsupported,
        })
    }

    /// Runs the steps; also returns the last HL7 form when the result is not HL7 (for the key).
    pub(super) async fn steps_on<P: PluginCaller>(
        &self,
        env: &Envelope,
        raw: &[u8],
        charset: Charset,
        plugins: &P,
    ) -> Result<StepsDone, StepError> {
        let mut last_hl7: Option<Vec<u8>> = None;
        let mut skipped = 0usize;
        let mut unmapped = Vec::new();
        let mut cur = raw.to_vec();
        let mut content_type = HL7_CONTENT_TYPE;
        for (i, step) in self.steps.iter().enumerate() {
            let fail = |kind: &'static str, detail: String| StepError {
                route: self.name.clone(),
                step: i,
                kind,
                detail,
            };
            if let Step::Plugin(p) = step {
                let req = TransformRequest {
                    message: cur.clone().into(),
                    envelope: Some(Envelope {
                        raw: Default::default(),
                        content_type: content_type.to_owned(),
                        ..env.clone()
                    }),
                    route: self.name.clone(),
                    params: p.params.clone().into_iter().collect(),
                };
                match plugins.call(p, req).await {
                    Ok((out, ct)) => {
                        if content_type == HL7_CONTENT_TYPE && ct == JSON_CONTENT_TYPE {
                            last_hl7 = Some(std::mem::take(&mut cur));
                        }
                        cur = out;
                        content_type = match ct.as_str() {
                            JSON_CONTENT_TYPE => JSON_CONTENT_TYPE,
                            FHIR_CONTENT_TYPE => FHIR_CONTENT_TYPE,
                            _ => HL7_CONTENT_TYPE,
                        };
                    }
                    Err(reason) => match p.on_failure {
                        OnFailure::Skip => {
                            skipped += 1;
                            tracing::warn!(route = %self.name, step = i, %reason, "plugin failed: step skipped");
                        }
                        OnFailure::DeadLetter => return Err(fail("plugin_failed", reason)),
                    },
                }
                continue;
            }
            if content_type != HL7_CONTENT_TYPE {
                return Err(fail("not_hl7", "the message is no longer HL7".into()));
            }
            let msg = Message::parse(&cur).map_err(|e| fail("parse", e.to_string()))?;
            let next = match step {
                Step::ToJson => {
                    content_type = JSON_CONTENT_TYPE;
                    last_hl7 = Some(cur.clone());
                    to_json(env, &msg, charset).map_err(|e| fail("to_json", e.to_string()))?
                }
                Step::ToFhir(fhir) => {
                    content_type = FHIR_CONTENT_TYPE;
                    last_hl7 = Some(cur.clone());
                    let received = env.received_at.as_ref().map(|ts| ts.to_string());
                    let mut out = Vec::with_capacity(cur.len() * 4);
                    let done = match hl7gw_fhir::convert_received(
                        &msg,
                        charset,
                        &fhir.options,
                        received.as_deref(),
                        &mut out,
                    ) {
                        Ok(done) => done,
                        Err(hl7gw_fhir::FhirError::Unsupported(_)) if fhir.skip_unsupported => {
                            return Ok((
                                Vec::new(),
                                FHIR_CONTENT_TYPE,
                                None,
                                skipped,
                                unmapped,
                                true,
                            ));
                        }
                        Err(e) => return Err(fail(e.kind(), e.to_string())),
                    };
                    unmapped = done.unmapped;
                    out
                }
                other => edit(other, &msg, charset).map_err(|(k, d)| fail(k, d))?,
            };
            cur = next;
        }
        if content_type == HL7_CONTENT_TYPE {
            last_hl7 = None;
        }
        Ok((cur, content_type, last_hl7, skipped, unmapped, false))
    }
}

/// Applies one editing step; errors are `(kind, detail)`.
pub(super) fn edit(
    step: &Step,
    msg: &Message<'_>,
    charset: Charset,
) -> Result<Vec<u8>, (&'static str, String)> {
    let mut e = msg.edit();
    let ed = |r: Result<(), hl7v2::EditError>| r.map_err(|err| ("edit", err.to_string()));
    let text = |p: &Path| {
        msg.get_path_decoded(p)
            .map(|v| hl7gw_runtime::envelope::text(&v, charset))
            .unwrap_or_default()
    };
    let present = |p: &Path| msg.get_path(p).is_some_and(|v| !v.is_empty());
    match step {
        Step::Set(p, v) => ed(e.set(&p.to_string(), v.as_bytes()))?,
        Step::Copy(from, to) => {
            if let Some(v) = msg.get_path_decoded(from) {
                ed(e.set(&to.to_string(), &v))?;
            } else if msg.segment(&seg(to), to.occurrence).is_some() {
                ed(e.clear(&to.to_string()))?;
            }
        }
        Step::Clear(p) => {
            if present(p) {
                ed(e.clear(&p.to_string()))?;
            }
        }
        Step::Map {
            path: p,
            table,
            default,
        } => {
            let v = text(p);
            let out = table.get(&v).or(default.as_ref());
            if let Some(out) = out
                && msg.segment(&seg(p), p.occurrence).is_some()
            {
                ed(e.set(&p.to_string(), out.as_bytes()))?;
            }
        }
        Step::DeleteSegment(name) => {
            while msg_has(&e, name) {
                ed(e.remove_segment(name, 1))?;
            }
        }
        Step::RenameSegment(from, to) => {
            while msg_has(&e, from) {
                ed(e.rename_segment(from, 1, to))?;
            }
        }
        Step::Mask(p, with) => {
            if present(p) {
                ed(e.set(&p.to_string(), with.as_bytes()))?;
            }
        }
        Step::Hash(p, salt) => {
            if present(p) {
                let mut h = Sha256::new();
                h.update(salt.as_bytes());
                h.update(text(p).as_bytes());
                let hex = hex::encode(h.finalize());
                ed(e.set(&p.to_string(), hex.as_bytes()))?;
            }
        }
        Step::ToJson | Step::ToFhir(_) | Step::Plugin(_) => {}
    }
    Ok(e.encode())
}

pub(super) fn seg(p: &Path) -> String {
    String::from_utf8_lossy(p.segment()).into_owned()
}

pub(super) fn msg_has(e: &hl7v2::Edit<'_>, name: &str) -> bool {
    e.has_segment(name, 1)
}
