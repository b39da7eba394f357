//! The sizes a bench measures at, picked from the environment so a run can
//! be made smaller or larger without editing the bench; the disk it writes
//! on and the runtime it measures on; the CPU time a process and the
//! machine spent, and the load average, from `/proc`.

use std::path::PathBuf;
use std::time::Duration;

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

/// The load average over the last minute (NaN if `/proc/loadavg` cannot
/// be read), which each bench prints beside its figures.
pub fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// One clock tick of `/proc`'s CPU times (Linux's `USER_HZ` is 100).
pub const TICK: Duration = Duration::from_millis(10);

/// The CPU time the process `pid` (`"self"` for this one) spent so far,
/// all its threads, user and kernel, in [`TICK`]s; 0 if it cannot be read.
pub fn process_cpu_ticks(pid: &str) -> u64 {
    process_cpu(pid).total()
}

/// A process's CPU time so far, all its threads, in [`TICK`]s, split
/// between its own code and the kernel's work on its behalf (system
/// calls, page faults): on a virtual machine, a profiler's samples
/// under-count the kernel's side, `/proc` does not.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessCpu {
    /// In the process's own code (`utime`).
    pub user: u64,
    /// In the kernel, for the process (`stime`).
    pub kernel: u64,
}

impl ProcessCpu {
    /// User and kernel time together.
    pub fn total(self) -> u64 {
        self.user + self.kernel
    }

    /// The time spent between `before` and `self`.
    pub fn since(self, before: ProcessCpu) -> ProcessCpu {
        ProcessCpu {
            user: self.user.saturating_sub(before.user),
            kernel: self.kernel.saturating_sub(before.kernel),
        }
    }
}

/// The CPU time the process `pid` (`"self"` for this one) spent so far
/// (all zero if it cannot be read).
pub fn process_cpu(pid: &str) -> ProcessCpu {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command's name (in parentheses, which may hold
    // spaces): utime and stime are the 12th and 13th of them.
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let mut times = after
        .split_whitespace()
        .skip(11)
        .map(|f| f.parse::<u64>().unwrap_or(0));
    ProcessCpu {
        user: times.next().unwrap_or(0),
        kernel: times.next().unwrap_or(0),
    }
}

/// The machine's CPU time so far, every core, in [`TICK`]s.
#[derive(Clone, Copy, Debug, Default)]
pub struct MachineTicks {
    /// What ran on the cores: user, nice, system, irq and softirq (not
    /// idle, not waiting for the disk, not taken by the host).
    pub busy: u64,
    /// Taken from the cores by a virtual machine's host (`steal`).
    pub stolen: u64,
    /// Every core's time, idle included.
    pub all: u64,
}

/// The machine's CPU time so far (all zero if `/proc/stat` cannot be read).
pub fn machine_ticks() -> MachineTicks {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    // user, nice, system, idle, iowait, irq, softirq, steal (guests' time
    // is counted in user and nice already).
    let field = |i: usize| fields.get(i).copied().unwrap_or(0);
    MachineTicks {
        busy: [0, 1, 2, 5, 6].into_iter().map(field).sum(),
        stolen: field(7),
        all: (0..8).map(field).sum(),
    }
}
