//! A real full disk for tests: a size-limited tmpfs mounted by the test,
//! unmounted on drop, and a ballast file that fills it. Mounting needs
//! root: CI runs as root, and elsewhere these tests fail saying so rather
//! than pass without running.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs; unmounted when dropped, whatever the test's outcome.
pub struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts a tmpfs of `size` (e.g. `8m`) at `at`, an empty folder;
    /// panics when it cannot (not root: run the tests as root, as CI does).
    pub fn mount(at: &Path, size: &str) -> Tmpfs {
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status()
            .unwrap();
        assert!(
            mounted.success(),
            "mounting a tmpfs at {} failed ({mounted}): this test needs root (CI runs as root)",
            at.display()
        );
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Writes `path` until the file system is full.
pub fn fill(path: &Path) {
    let mut f = std::fs::File::create(path).unwrap();
    let chunk = vec![0u8; 64 * 1024];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
}
