//! How many CPUs this process may run on (the default shard count, `doctor`'s report).
//!
//! Owns: `available_cpus`. Must not: pin or spawn anything (that is `runtime`).

/// Number of CPUs this process may run on.
pub fn available_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
