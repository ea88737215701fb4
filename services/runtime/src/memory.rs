//! The memory limit this process runs under (the pod's `resources.limits.memory`, as the cgroup sees it), so
//! buffers that grow with message size can be sized from it instead of from a fixed guess.

use std::path::Path;

/// The cgroup memory limit in bytes (cgroup v2 `memory.max`, else v1 `memory.limit_in_bytes`); `None` when
/// there is none (unlimited, or not in a cgroup that says).
pub fn limit() -> Option<u64> {
    limit_in(Path::new("/sys/fs/cgroup"))
}

/// [`limit`] read below `root` (tests point it at a folder of their own).
pub fn limit_in(root: &Path) -> Option<u64> {
    let read = |p: &str| std::fs::read_to_string(root.join(p)).ok();
    read("memory.max")
        .or_else(|| read("memory/memory.limit_in_bytes"))
        .and_then(|s| parse_limit(&s))
}

/// A cgroup limit file's value: "max" (v2) or a huge page-rounded number (v1's "unlimited") is no limit.
fn parse_limit(s: &str) -> Option<u64> {
    let n: u64 = s.trim().parse().ok()?;
    // cgroup v1 writes "unlimited" as LONG_MAX rounded down to a page; nothing real is above 1 PiB.
    (n > 0 && n < 1 << 50).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_v2_then_v1_and_treats_max_as_no_limit() {
        let d = tempfile::tempdir().unwrap();
        assert_eq!(limit_in(d.path()), None);
        std::fs::create_dir(d.path().join("memory")).unwrap();
        std::fs::write(
            d.path().join("memory/memory.limit_in_bytes"),
            "9223372036854771712\n",
        )
        .unwrap();
        assert_eq!(limit_in(d.path()), None);
        std::fs::write(d.path().join("memory/memory.limit_in_bytes"), "536870912\n").unwrap();
        assert_eq!(limit_in(d.path()), Some(512 << 20));
        std::fs::write(d.path().join("memory.max"), "max\n").unwrap();
        assert_eq!(limit_in(d.path()), None);
        std::fs::write(d.path().join("memory.max"), "268435456\n").unwrap();
        assert_eq!(limit_in(d.path()), Some(256 << 20));
    }
}
