//! Doctor: the machine — kernel, io_uring (and what blocks it), the driver each shard would
//! get, open-file and locked-memory limits, the memory limit and the budget that follows, the
//! CPUs this process may use and the shard count.
//!
//! Owns: reading `/proc` for those and judging them. Must not: change limits or sysctls.

use super::{human, Report};
use crate::admit::memlimit;
use crate::config::Config;
use crate::runtime::{self, DriverChoice};

pub fn check(r: &mut Report, cfg: Option<&Config>) {
    r.section("system");
    let release = read("/proc/sys/kernel/osrelease").unwrap_or_else(|| "unknown".into());
    let (major, minor) = kernel_version(&release);
    r.ok(format!("kernel {release}"));

    // io_uring: the sysctl, seccomp, then the driver a shard would really get
    let disabled = read("/proc/sys/kernel/io_uring_disabled").and_then(|v| v.parse::<u8>().ok());
    let seccomp = status_field("Seccomp").and_then(|v| v.parse::<u8>().ok());
    let choice = DriverChoice::resolve(cfg.map_or("auto", |c| c.server.driver.get_ref()));
    let (driver, why) = runtime::probe_driver(choice);
    let shards = cfg
        .and_then(|c| c.server.shards)
        .unwrap_or_else(crate::util::cpus::available_cpus)
        .max(1);
    let context = format!(
        "kernel.io_uring_disabled = {}, seccomp {}",
        disabled.map_or("n/a".into(), |d| d.to_string()),
        match seccomp {
            Some(0) | None => "off",
            Some(1) => "strict",
            _ => "filter",
        }
    );
    if driver.starts_with("io_uring") {
        r.ok(format!(
            "driver: {driver} on each of {shards} shard(s) ({context})"
        ));
    } else if choice == DriverChoice::Epoll {
        r.ok(format!(
            "driver: epoll on each of {shards} shard(s) (chosen by server.driver / RINGGATE_DRIVER)"
        ));
    } else if driver == "epoll" {
        let fix = if disabled == Some(2) || (disabled == Some(1) && !is_root()) {
            "sysctl -w kernel.io_uring_disabled=0 (or accept epoll: RINGGATE_DRIVER=epoll)"
                .to_string()
        } else if seccomp == Some(2) {
            "the seccomp filter blocks io_uring (Docker's default profile does): run with a profile that allows io_uring_setup, io_uring_enter and io_uring_register, or accept epoll".to_string()
        } else if (major, minor) < (5, 11) {
            "kernel >= 5.11 for io_uring (>= 6.0 for the task-run flags), or accept epoll"
                .to_string()
        } else {
            "raise the locked-memory limit (LimitMEMLOCK=infinity, tuning/limits.conf), or accept epoll".to_string()
        };
        r.warn(
            format!(
                "driver: epoll on each of {shards} shard(s) — io_uring unavailable: {} ({context})",
                why.join("; ")
            ),
            fix,
        );
    } else {
        r.problem(
            format!("no usable I/O driver: {}", why.join("; ")),
            "check that the process may create epoll instances and timers (seccomp, rlimits)",
        );
    }

    // limits
    let limits = read("/proc/self/limits").unwrap_or_default();
    let max_conns = cfg.map_or(16_384, |c| c.server.max_connections) as u64;
    match limit(&limits, "Max open files") {
        Some((soft, hard)) => {
            let need = max_conns + 1024;
            let text = format!(
                "open files: soft {}, hard {} (max_connections {max_conns} + upstream and spare fds want >= {need})",
                show(soft),
                show(hard)
            );
            if soft.is_some_and(|s| s < need) {
                r.warn(
                    text,
                    "ulimit -n 1048576 before starting, or LimitNOFILE=1048576 in the unit (tuning/ringgate.service, tuning/limits.conf)",
                );
            } else {
                r.ok(text);
            }
        }
        None => r.info("open files: limit not readable"),
    }
    if let Some((soft, _)) = limit(&limits, "Max locked memory") {
        // Before 5.12 io_uring rings are charged to RLIMIT_MEMLOCK (~128 KiB per shard ring).
        let need = shards as u64 * (256 << 10);
        let text = format!("locked memory: soft {}", show(soft));
        if (major, minor) < (5, 12) && soft.is_some_and(|s| s < need) {
            r.warn(
                format!(
                    "{text} — kernel {major}.{minor} charges io_uring rings to it (want >= {})",
                    human(need)
                ),
                "LimitMEMLOCK=infinity in the unit, or ulimit -l unlimited (tuning/limits.conf)",
            );
        } else {
            r.ok(format!(
                "{text} (kernel >= 5.12 charges io_uring rings to the memory cgroup, not this limit)"
            ));
        }
    }

    // memory
    let budget = cfg.map(|c| c.admission.memory_budget);
    match memlimit::memory_limit() {
        Some(l) => {
            let b = budget.unwrap_or_else(memlimit::default_budget);
            let text = format!(
                "memory: limit {} ({}) → admission budget {} ({}% of it), {} per shard",
                human(l.bytes),
                l.source.as_str(),
                human(b),
                b.saturating_mul(100) / l.bytes.max(1),
                human(b / shards as u64)
            );
            if b > l.bytes {
                r.warn(
                    text,
                    "admission.memory_budget above the memory limit invites the OOM killer: remove it (default: 50%) or lower it",
                );
            } else {
                r.ok(text);
            }
        }
        None => r.info("memory: no limit detectable (no cgroup, no /proc/meminfo): budget 256 MiB"),
    }

    // CPUs
    let allowed = status_field("Cpus_allowed_list").unwrap_or_else(|| "?".into());
    let cpus = crate::util::cpus::available_cpus();
    let pin = cfg.is_none_or(|c| c.server.pin);
    let text = format!(
        "cpus: {cpus} usable (affinity {allowed}) → {shards} shard(s){}",
        if pin { ", pinned" } else { ", not pinned" }
    );
    if shards > cpus {
        r.warn(
            text,
            format!("server.shards = {cpus} (more shards than CPUs share cores and add latency)"),
        );
    } else {
        r.ok(text);
    }
}

fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

fn is_root() -> bool {
    status_field("Uid").is_some_and(|u| u.split_whitespace().nth(1) == Some("0"))
}

/// A field of `/proc/self/status`.
fn status_field(name: &str) -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == name).then(|| v.trim().to_string())
    })
}

/// (major, minor) of a kernel release string like `6.1.0-18-amd64`.
pub fn kernel_version(release: &str) -> (u32, u32) {
    let mut it = release
        .split(|c: char| !c.is_ascii_digit())
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// (soft, hard) of a `/proc/self/limits` row; `None` = unlimited.
pub fn limit(limits: &str, row: &str) -> Option<(Option<u64>, Option<u64>)> {
    let line = limits.lines().find(|l| l.starts_with(row))?;
    let mut cols = line[row.len()..].split_whitespace();
    let parse = |v: Option<&str>| match v {
        Some("unlimited") => Some(None),
        Some(n) => n.parse::<u64>().ok().map(Some),
        None => None,
    };
    Some((parse(cols.next())?, parse(cols.next())?))
}

fn show(v: Option<u64>) -> String {
    v.map_or("unlimited".into(), |n| n.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_and_limits() {
        assert_eq!(kernel_version("6.1.0-18-amd64"), (6, 1));
        assert_eq!(kernel_version("5.4.0"), (5, 4));
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max open files            1024                 524288               files     \n\
                      Max locked memory         unlimited            unlimited            bytes     \n";
        assert_eq!(
            limit(limits, "Max open files"),
            Some((Some(1024), Some(524288)))
        );
        assert_eq!(limit(limits, "Max locked memory"), Some((None, None)));
        assert_eq!(limit(limits, "Max processes"), None);
    }
}
