//! Times as operators write them on the command line, and as the commands print them.

use anyhow::Context;

/// A time as operators write it: RFC 3339 (`2026-11-23T10:00:00Z`), a time ago (`1h`, `30m`, `2d 4h`), or `now`.
pub(crate) fn parse_time(
    t: &str,
    now: std::time::SystemTime,
) -> anyhow::Result<std::time::SystemTime> {
    let t = t.trim();
    if t == "now" {
        return Ok(now);
    }
    if let Ok(ago) = humantime::parse_duration(t.trim_end_matches(" ago")) {
        return now
            .checked_sub(ago)
            .with_context(|| format!("{t:?} is too long ago"));
    }
    humantime::parse_rfc3339_weak(t).with_context(|| {
        format!("{t:?} is not a time like 2026-11-23T10:00:00Z, nor a time ago like 1h or 30m")
    })
}

pub(crate) fn timestamp(s: &Option<String>) -> anyhow::Result<Option<prost_types::Timestamp>> {
    let now = std::time::SystemTime::now();
    s.as_deref()
        .map(|t| parse_time(t, now).map(prost_types::Timestamp::from))
        .transpose()
}

pub(crate) fn rfc3339(t: Option<&prost_types::Timestamp>) -> String {
    t.and_then(|t| std::time::SystemTime::try_from(*t).ok())
        .map(|t| humantime::format_rfc3339_millis(t).to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_or_a_time_ago() {
        let now = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_800_000_000);
        let t = |s| parse_time(s, now).unwrap();
        assert_eq!(now.duration_since(t("1h")).unwrap().as_secs(), 3600);
        assert_eq!(now.duration_since(t("2d 4h")).unwrap().as_secs(), 52 * 3600);
        assert_eq!(now.duration_since(t("30m ago")).unwrap().as_secs(), 1800);
        assert_eq!(t("now"), now);
        assert_eq!(
            t("2026-11-23T10:00:00Z"),
            humantime::parse_rfc3339("2026-11-23T10:00:00Z").unwrap()
        );
        assert!(parse_time("yesterday-ish", now).is_err());
    }
}
