//! The protobuf contract as consumers see it. `proto/hl7gw.v1.binpb` is the `FileDescriptorSet` the build
//! compiles from proto/ (for Kafka UIs and schema registries that want descriptors rather than .proto files),
//! and nothing in proto/ may break a reader built against the last release, whose descriptors are kept in
//! `proto/released/` (the rules of `buf breaking`'s WIRE_JSON category, checked here with prost-types).
//!
//! After a deliberate change to proto/: `HL7GW_UPDATE_DESCRIPTOR=1 cargo test -p hl7gw-runtime --test contract`
//! rewrites `proto/hl7gw.v1.binpb`. When a release is cut, copy it to `proto/released/v<version>.binpb`.

use prost::Message;
use prost_types::field_descriptor_proto::Label;
use prost_types::{DescriptorProto, EnumDescriptorProto, FileDescriptorSet};
use std::collections::BTreeMap;
use std::path::PathBuf;

fn proto_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../proto")
}

fn built() -> FileDescriptorSet {
    FileDescriptorSet::decode(hl7gw_runtime::proto::DESCRIPTOR_SET)
        .expect("the built descriptor set")
}

/// The newest release's descriptor set in proto/released (by version, `v<major>.<minor>.<patch>.binpb`).
fn last_release() -> (String, FileDescriptorSet) {
    let mut releases: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(proto_dir().join("released"))
        .expect("proto/released")
        .filter_map(|e| {
            let path = e.ok()?.path();
            let version = path
                .file_name()?
                .to_str()?
                .strip_prefix('v')?
                .strip_suffix(".binpb")?;
            let parts = version
                .split('.')
                .map(|p| p.parse().ok())
                .collect::<Option<Vec<u64>>>()?;
            Some((parts, path))
        })
        .collect();
    releases.sort();
    let (_, path) = releases.pop().expect("a release in proto/released");
    let bytes = std::fs::read(&path).expect("the release's descriptor set");
    let name = path
        .file_name()
        .unwrap_or_default()
        .to_string_lossy()
        .into_owned();
    (
        name,
        FileDescriptorSet::decode(bytes.as_slice()).expect("a FileDescriptorSet"),
    )
}

#[test]
fn the_shipped_descriptor_set_is_the_one_the_build_compiles() {
    let path = proto_dir().join("hl7gw.v1.binpb");
    if std::env::var_os("HL7GW_UPDATE_DESCRIPTOR").is_some() {
        std::fs::write(&path, hl7gw_runtime::proto::DESCRIPTOR_SET)
            .expect("writing proto/hl7gw.v1.binpb");
    }
    let shipped = std::fs::read(&path).expect("proto/hl7gw.v1.binpb");
    assert!(
        shipped == hl7gw_runtime::proto::DESCRIPTOR_SET,
        "proto/hl7gw.v1.binpb is not what proto/ compiles to: after a deliberate change run \
         HL7GW_UPDATE_DESCRIPTOR=1 cargo test -p hl7gw-runtime --test contract"
    );
    let names: Vec<String> = built().file.iter().filter_map(|f| f.name.clone()).collect();
    for f in ["envelope", "ingest", "transform", "egress"] {
        assert!(names.contains(&format!("hl7gw/v1/{f}.proto")), "{names:?}");
    }
}

#[test]
fn proto_changes_since_the_last_release_break_no_reader() {
    let (release, old) = last_release();
    let problems = breaking_changes(&old, &built());
    assert!(
        problems.is_empty(),
        "proto/ breaks readers built against {release}:\n{}",
        problems.join("\n")
    );
}

/// The checker itself: each kind of breaking change is reported, additions are not.
#[test]
fn the_breaking_check_sees_what_breaks_a_reader() {
    let old = built();
    let change = |edit: &dyn Fn(&mut FileDescriptorSet)| {
        let mut new = old.clone();
        edit(&mut new);
        breaking_changes(&old, &new)
    };
    fn envelope(s: &mut FileDescriptorSet) -> &mut DescriptorProto {
        s.file
            .iter_mut()
            .flat_map(|f| f.message_type.iter_mut())
            .find(|m| m.name() == "Envelope")
            .expect("Envelope")
    }
    assert!(change(&|_| {}).is_empty());
    // A new field: fine.
    let added = change(&|s| {
        let m = envelope(s);
        let mut f = m.field[0].clone();
        f.name = Some("added_later".into());
        f.json_name = Some("addedLater".into());
        f.number = Some(999);
        m.field.push(f);
    });
    assert!(added.is_empty(), "{added:?}");
    // A field removed without reserving its number and name.
    let removed = change(&|s| {
        envelope(s).field.remove(0);
    });
    assert_eq!(removed.len(), 1, "{removed:?}");
    // Reserved: fine.
    let reserved = change(&|s| {
        let m = envelope(s);
        let f = m.field.remove(0);
        m.reserved_range
            .push(prost_types::descriptor_proto::ReservedRange {
                start: f.number,
                end: f.number.map(|n| n + 1),
            });
        m.reserved_name.push(f.name().to_owned());
    });
    assert!(reserved.is_empty(), "{reserved:?}");
    // Retyped, renamed (the JSON name changes), made repeated: one problem each.
    let retyped = change(&|s| {
        envelope(s).field[0].r#type =
            Some(prost_types::field_descriptor_proto::Type::Fixed64 as i32);
    });
    let renamed = change(&|s| envelope(s).field[0].name = Some("renamed".into()));
    let repeated = change(&|s| envelope(s).field[0].label = Some(Label::Repeated as i32));
    for got in [retyped, renamed, repeated] {
        assert_eq!(got.len(), 1, "{got:?}");
    }
    // A message and the RPCs removed.
    let gone = change(&|s| {
        for f in &mut s.file {
            f.message_type.retain(|m| m.name() != "Rejection");
            f.service.iter_mut().for_each(|svc| svc.method.truncate(0));
        }
    });
    assert!(gone.iter().any(|p| p.contains("Rejection")), "{gone:?}");
    assert!(gone.iter().any(|p| p.contains("rpc")), "{gone:?}");
}

/// What in `new` breaks a reader of `old`: removed or renumbered messages, fields, enum values, services and
/// RPCs; a field's type, label or name (its JSON name) changed. A removed field or enum value is allowed when
/// its number and name are reserved.
fn breaking_changes(old: &FileDescriptorSet, new: &FileDescriptorSet) -> Vec<String> {
    let messages = |s: &FileDescriptorSet| -> BTreeMap<String, DescriptorProto> {
        let mut out = BTreeMap::new();
        for f in &s.file {
            for m in &f.message_type {
                collect_messages(&format!(".{}", f.package()), m, &mut out);
            }
        }
        out
    };
    let enums = |s: &FileDescriptorSet| -> BTreeMap<String, EnumDescriptorProto> {
        let mut out = BTreeMap::new();
        for f in &s.file {
            for e in &f.enum_type {
                out.insert(format!(".{}.{}", f.package(), e.name()), e.clone());
            }
        }
        for (name, m) in messages(s) {
            for e in &m.enum_type {
                out.insert(format!("{name}.{}", e.name()), e.clone());
            }
        }
        out
    };
    /// The old definitions still in `new`, each with its new self; a "removed" problem for each one gone.
    fn kept<T: Clone>(
        kind: &str,
        old: BTreeMap<String, T>,
        new: &BTreeMap<String, T>,
        problems: &mut Vec<String>,
    ) -> Vec<(String, T, T)> {
        let mut out = Vec::new();
        for (name, o) in old {
            match new.get(&name) {
                Some(n) => out.push((name, o, n.clone())),
                None => problems.push(format!("{kind} {name} removed")),
            }
        }
        out
    }
    let mut problems = Vec::new();
    for (name, m, n) in kept("message", messages(old), &messages(new), &mut problems) {
        for f in &m.field {
            let reserved = n
                .reserved_range
                .iter()
                .any(|r| (r.start()..r.end()).contains(&f.number()))
                && n.reserved_name.iter().any(|r| r == f.name());
            match n.field.iter().find(|g| g.number() == f.number()) {
                None if reserved => {}
                None => problems.push(format!(
                    "{name}.{} (field {}) removed without reserving its number and name",
                    f.name(),
                    f.number()
                )),
                Some(g) => {
                    if (g.r#type(), g.type_name()) != (f.r#type(), f.type_name()) {
                        problems.push(format!("{name}.{}: type changed", f.name()));
                    }
                    if g.label() != f.label() {
                        problems.push(format!("{name}.{}: label changed", f.name()));
                    }
                    if g.name() != f.name() || g.json_name() != f.json_name() {
                        problems.push(format!(
                            "{name}.{}: renamed to {} (the JSON form changes)",
                            f.name(),
                            g.name()
                        ));
                    }
                }
            }
        }
    }
    for (name, e, n) in kept("enum", enums(old), &enums(new), &mut problems) {
        for v in &e.value {
            let kept = n
                .value
                .iter()
                .any(|w| w.number() == v.number() && w.name() == v.name());
            let reserved = n
                .reserved_range
                .iter()
                .any(|r| (r.start()..=r.end()).contains(&v.number()))
                && n.reserved_name.iter().any(|r| r == v.name());
            if !kept && !reserved {
                problems.push(format!(
                    "{name}.{} = {} removed or renumbered",
                    v.name(),
                    v.number()
                ));
            }
        }
    }
    for f in &old.file {
        for s in &f.service {
            let full = format!("{}.{}", f.package(), s.name());
            let found = new
                .file
                .iter()
                .filter(|g| g.package() == f.package())
                .flat_map(|g| &g.service)
                .find(|t| t.name() == s.name());
            let Some(t) = found else {
                problems.push(format!("service {full} removed"));
                continue;
            };
            for m in &s.method {
                let same = t.method.iter().any(|n| {
                    n.name() == m.name()
                        && n.input_type() == m.input_type()
                        && n.output_type() == m.output_type()
                        && n.client_streaming() == m.client_streaming()
                        && n.server_streaming() == m.server_streaming()
                });
                if !same {
                    problems.push(format!("rpc {full}.{} removed or changed", m.name()));
                }
            }
        }
    }
    problems
}

fn collect_messages(
    prefix: &str,
    m: &DescriptorProto,
    out: &mut BTreeMap<String, DescriptorProto>,
) {
    let name = format!("{prefix}.{}", m.name());
    for nested in &m.nested_type {
        collect_messages(&name, nested, out);
    }
    out.insert(name, m.clone());
}
