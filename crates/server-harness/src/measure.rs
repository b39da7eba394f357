//! The sizes a bench measures at, picked from the environment so a run can
//! be made smaller or larger without editing the bench.

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
