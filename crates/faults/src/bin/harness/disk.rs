//! Disk-full episodes: the server's data folder on a size-limited tmpfs
//! (mounted by the harness, which must run as root), filled up with a
//! ballast file for a moment and then freed.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The size of the tmpfs.
const SIZE: &str = "64m";

/// A mounted tmpfs; unmounted on drop.
pub(crate) struct Tmpfs {
    at: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of [`SIZE`] at `at` (an empty folder).
    pub(crate) fn mount(at: &Path) -> anyhow::Result<Tmpfs> {
        std::fs::create_dir_all(at)?;
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={SIZE}"), "tmpfs"])
            .arg(at)
            .status()
            .context("running mount")?;
        if !status.success() {
            bail!(
                "mounting a tmpfs at {} failed (root needed): {status}",
                at.display()
            );
        }
        Ok(Tmpfs { at: at.to_owned() })
    }

    /// Fills the file system with a ballast file until it is full; the
    /// bytes written.
    pub(crate) fn fill(&self) -> anyhow::Result<u64> {
        let mut file = std::fs::File::create(self.ballast())?;
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        loop {
            match file.write(&chunk) {
                Ok(0) => return Ok(written),
                Ok(n) => written += n as u64,
                // ENOSPC: full.
                Err(_) => return Ok(written),
            }
        }
    }

    /// Removes the ballast: the disk has room again.
    pub(crate) fn free(&self) -> anyhow::Result<()> {
        match std::fs::remove_file(self.ballast()) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
            _ => Ok(()),
        }
    }

    /// Outside every mailbox: no id starts with a dot.
    fn ballast(&self) -> PathBuf {
        self.at.join(".harness-ballast")
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
    }
}
