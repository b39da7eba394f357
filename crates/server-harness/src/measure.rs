//! The sizes a bench measures at, picked from the environment so a run can
//! be made smaller or larger without editing the bench; the disk it writes
//! on and the runtime it measures on.

use std::path::PathBuf;

/// The sizes a measurement runs at: the comma-separated list in the
/// environment variable `name` (`_` allowed in numbers), else `default`.
pub fn sizes(name: &str, default: &[u64]) -> Vec<u64> {
    std::env::var(name)
        .ok()
        .map(|v| {
            v.split(',')
                .map(|n| n.replace('_', "").trim().parse().unwrap())
                .collect()
        })
        .unwrap_or_else(|| default.to_vec())
}

/// The folder a bench keeps its data under: `BENCH_DIR` (the disk to
/// measure), else the system's temporary folder.
pub fn bench_dir() -> PathBuf {
    std::env::var_os("BENCH_DIR").map_or_else(std::env::temp_dir, PathBuf::from)
}

/// A multi-threaded runtime of two worker threads, the machine these
/// benches model.
pub fn two_threads() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}
