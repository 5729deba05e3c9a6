//! The process memory limit and the default byte budget derived from it.
//!
//! Owns: detecting the limit (cgroup v2 `memory.max`, cgroup v1 `memory.limit_in_bytes`, else
//! `/proc/meminfo` `MemTotal`) and the [`default_budget`] policy.
//! Must not: be called on the hot path (it reads files; call it once at startup/config load), keep
//! state, or split the budget across shards (that is `Admission::new`'s job).
//!
//! Detection rules:
//! - cgroup v2: the `0::<path>` line of `/proc/self/cgroup`; `memory.max` is read for that cgroup and
//!   every ancestor up to `/sys/fs/cgroup` (the smallest wins; `max` means unlimited). Inside a
//!   container with a private cgroup namespace the path is `/`, so `/sys/fs/cgroup/memory.max` is
//!   the container's own limit.
//! - cgroup v1: the line whose controller list contains `memory`;
//!   `/sys/fs/cgroup/memory/<path>/memory.limit_in_bytes` (falling back to the hierarchy root).
//!   Values ≥ 2^60 are the kernel's "unlimited" sentinel and are ignored.
//! - The result is never above `MemTotal` (a cgroup limit larger than the host means nothing).

use std::fs;

pub use super::size::parse_size;

/// Share of the detected limit given to the byte budget: 50 %. The other half covers the binary,
/// per-connection state, allocator slack, TLS, pool free lists and the kernel's socket buffers.
pub const BUDGET_FRACTION_PERCENT: u64 = 50;
/// The default budget is never below this (16 MiB), even on tiny limits.
pub const MIN_BUDGET: u64 = 16 << 20;
/// The default budget is never above this (32 GiB); configure explicitly for more.
pub const MAX_BUDGET: u64 = 32 << 30;
/// Budget used when no limit can be detected at all (no `/proc`, no cgroup): 256 MiB.
pub const FALLBACK_BUDGET: u64 = 256 << 20;
/// cgroup v1 reports "unlimited" as a huge page-aligned number; anything at or above this is ignored.
const ABSURD_LIMIT: u64 = 1 << 60;

/// Where a detected limit came from (for the startup/doctor line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitSource {
    /// cgroup v2 `memory.max`.
    CgroupV2,
    /// cgroup v1 `memory.limit_in_bytes`.
    CgroupV1,
    /// `/proc/meminfo` `MemTotal`.
    MemTotal,
}

impl LimitSource {
    /// A short label: `cgroup2`, `cgroup1` or `meminfo`.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::CgroupV2 => "cgroup2",
            LimitSource::CgroupV1 => "cgroup1",
            LimitSource::MemTotal => "meminfo",
        }
    }
}

/// A detected memory limit in bytes and its source.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimit {
    /// The limit in bytes.
    pub bytes: u64,
    /// Where it came from.
    pub source: LimitSource,
}

/// Detects the memory limit of this process from the real filesystem.
pub fn memory_limit() -> Option<MemoryLimit> {
    detect_with(|p| fs::read_to_string(p).ok())
}

/// The default process-wide byte budget: [`BUDGET_FRACTION_PERCENT`] of [`memory_limit`], clamped
/// to [`MIN_BUDGET`]..=[`MAX_BUDGET`]; [`FALLBACK_BUDGET`] when nothing can be detected.
pub fn default_budget() -> u64 {
    budget_for(memory_limit().map(|l| l.bytes))
}

/// The default-budget policy applied to a (possibly unknown) limit.
pub fn budget_for(limit: Option<u64>) -> u64 {
    match limit {
        None => FALLBACK_BUDGET,
        Some(l) => (l / 100)
            .saturating_mul(BUDGET_FRACTION_PERCENT)
            .clamp(MIN_BUDGET, MAX_BUDGET),
    }
}

/// Detection against an arbitrary file reader (`path -> contents`), so it can be tested.
pub fn detect_with(read: impl Fn(&str) -> Option<String>) -> Option<MemoryLimit> {
    let host = read("/proc/meminfo").and_then(|s| parse_meminfo_total(&s));
    let cgroup = read("/proc/self/cgroup").unwrap_or_default();
    let mut cg: Option<MemoryLimit> = None;
    if let Some(path) = v2_path(&cgroup) {
        cg = min_over_ancestors(&read, "/sys/fs/cgroup", path, "memory.max").map(|bytes| {
            MemoryLimit {
                bytes,
                source: LimitSource::CgroupV2,
            }
        });
    }
    if cg.is_none() {
        if let Some(path) = v1_path(&cgroup) {
            cg = min_over_ancestors(
                &read,
                "/sys/fs/cgroup/memory",
                path,
                "memory.limit_in_bytes",
            )
            .map(|bytes| MemoryLimit {
                bytes,
                source: LimitSource::CgroupV1,
            });
        }
    }
    match (cg, host) {
        (Some(c), Some(h)) if c.bytes < h => Some(c),
        (Some(_), Some(h)) | (None, Some(h)) => Some(MemoryLimit {
            bytes: h,
            source: LimitSource::MemTotal,
        }),
        (Some(c), None) => Some(c),
        (None, None) => None,
    }
}

/// Reads `<root><dir>/<file>` for `dir` = `path` and each ancestor of it; returns the smallest
/// finite limit found. The root itself is always tried (covers private cgroup namespaces where
/// `/proc/self/cgroup` names a path that is not mounted).
fn min_over_ancestors(
    read: &impl Fn(&str) -> Option<String>,
    root: &str,
    path: &str,
    file: &str,
) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut dir = path.trim_end_matches('/');
    loop {
        let full = format!("{root}{dir}/{file}");
        if let Some(v) = read(&full).and_then(|s| parse_limit_value(&s)) {
            best = Some(best.map_or(v, |b| b.min(v)));
        }
        if dir.is_empty() {
            break;
        }
        dir = match dir.rfind('/') {
            Some(i) => &dir[..i],
            None => "",
        };
    }
    best
}

/// Parses a cgroup limit file: a decimal number, or `max` (unlimited → `None`). Values at or above
/// 2^60 (the v1 "unlimited" sentinel) are `None`.
pub fn parse_limit_value(s: &str) -> Option<u64> {
    let t = s.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|&v| v > 0 && v < ABSURD_LIMIT)
}

/// Parses `MemTotal:  16318480 kB` out of `/proc/meminfo`.
pub fn parse_meminfo_total(s: &str) -> Option<u64> {
    let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
    let mut parts = line["MemTotal:".len()..].split_whitespace();
    let n: u64 = parts.next()?.parse().ok()?;
    match parts.next() {
        Some(u) if u.eq_ignore_ascii_case("kb") => n.checked_mul(1024),
        None => Some(n),
        Some(_) => None,
    }
}

/// The cgroup v2 path: the `0::<path>` line.
fn v2_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The cgroup v1 memory-controller path: `N:<controllers>:<path>` with `memory` in the list.
fn v1_path(cgroup: &str) -> Option<&str> {
    cgroup.lines().find_map(|l| {
        let mut it = l.splitn(3, ':');
        let _id = it.next()?;
        let ctrls = it.next()?;
        let path = it.next()?;
        ctrls.split(',').any(|c| c == "memory").then_some(path)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const MEMINFO: &str = "MemTotal:        8000000 kB\nMemFree:  100 kB\n";

    fn fs(files: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = files
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |p: &str| map.get(p).cloned()
    }

    /// The limit detected on a host with `MEMINFO`, in the cgroup `cgroup` (the line of
    /// `/proc/self/cgroup`), with the cgroup `files`.
    fn in_cgroup(cgroup: &str, files: &[(&str, &str)]) -> Option<MemoryLimit> {
        let mut all = vec![("/proc/meminfo", MEMINFO), ("/proc/self/cgroup", cgroup)];
        all.extend_from_slice(files);
        detect_with(fs(&all))
    }

    #[test]
    fn meminfo_only() {
        let l = detect_with(fs(&[("/proc/meminfo", MEMINFO)]));
        assert_eq!(
            l,
            Some(MemoryLimit {
                bytes: 8_000_000 * 1024,
                source: LimitSource::MemTotal
            })
        );
    }

    #[test]
    fn cgroup_v2_namespace_root() {
        let l = in_cgroup("0::/\n", &[("/sys/fs/cgroup/memory.max", "1073741824\n")]);
        assert_eq!(
            l,
            Some(MemoryLimit {
                bytes: 1 << 30,
                source: LimitSource::CgroupV2
            })
        );
    }

    #[test]
    fn cgroup_v2_nested_takes_smallest_ancestor() {
        let l = in_cgroup(
            "0::/system.slice/rg.service\n",
            &[
                ("/sys/fs/cgroup/system.slice/rg.service/memory.max", "max\n"),
                ("/sys/fs/cgroup/system.slice/memory.max", "536870912\n"),
            ],
        );
        assert_eq!(
            l,
            Some(MemoryLimit {
                bytes: 512 << 20,
                source: LimitSource::CgroupV2
            })
        );
    }

    #[test]
    fn cgroup_v2_max_falls_back_to_meminfo() {
        let l = in_cgroup(
            "0::/user.slice\n",
            &[("/sys/fs/cgroup/user.slice/memory.max", "max")],
        );
        assert_eq!(l.map(|l| l.source), Some(LimitSource::MemTotal));
    }

    #[test]
    fn cgroup_v1_and_absurd_values() {
        let cg = "12:cpu,cpuacct:/docker/abc\n5:memory:/docker/abc\n";
        let l = in_cgroup(
            cg,
            &[(
                "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "268435456",
            )],
        );
        assert_eq!(
            l,
            Some(MemoryLimit {
                bytes: 256 << 20,
                source: LimitSource::CgroupV1
            })
        );
        let l = in_cgroup(
            cg,
            &[(
                "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "9223372036854771712",
            )],
        );
        assert_eq!(l.map(|l| l.source), Some(LimitSource::MemTotal));
    }

    #[test]
    fn cgroup_above_host_is_ignored() {
        let l = in_cgroup("0::/\n", &[("/sys/fs/cgroup/memory.max", "1099511627776")]);
        assert_eq!(l.map(|l| l.source), Some(LimitSource::MemTotal));
    }

    #[test]
    fn nothing_detectable() {
        assert_eq!(detect_with(fs(&[])), None);
        assert_eq!(budget_for(None), FALLBACK_BUDGET);
    }

    #[test]
    fn budget_policy() {
        assert_eq!(budget_for(Some(1 << 30)), (1 << 30) / 100 * 50);
        assert_eq!(budget_for(Some(10 << 20)), MIN_BUDGET);
        assert_eq!(budget_for(Some(1 << 50)), MAX_BUDGET);
        let real = default_budget();
        assert!((MIN_BUDGET..=MAX_BUDGET).contains(&real));
    }

    #[test]
    fn limit_values() {
        assert_eq!(parse_limit_value("max\n"), None);
        assert_eq!(parse_limit_value("0"), None);
        assert_eq!(parse_limit_value("garbage"), None);
        assert_eq!(parse_limit_value(" 4096 \n"), Some(4096));
        assert_eq!(parse_meminfo_total("MemTotal: 12 kB"), Some(12 * 1024));
        assert_eq!(parse_meminfo_total("MemFree: 12 kB"), None);
        assert_eq!(parse_size("1KiB"), Ok(1024));
    }
}
