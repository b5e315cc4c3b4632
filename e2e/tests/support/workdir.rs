//! A scenario's work directory (replica logs, the fence log): removed when the scenario passed, kept and
//! named on stderr when it did not. Hold it as the last field of the struct that owns the processes writing
//! into it, so they are gone before it is removed.

use std::path::{Path, PathBuf};

pub struct WorkDir {
    dir: PathBuf,
    passed: bool,
}

impl WorkDir {
    /// `kshard-e2e-<ns>` in the temporary directory, created.
    pub fn for_namespace(ns: &str) -> WorkDir {
        let dir = std::env::temp_dir().join(format!("kshard-e2e-{ns}"));
        std::fs::create_dir_all(&dir).expect("create the work directory");
        WorkDir { dir, passed: false }
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }

    pub fn join(&self, name: impl AsRef<Path>) -> PathBuf {
        self.dir.join(name)
    }

    /// The scenario passed: the directory is removed on drop.
    pub fn passed(&mut self) {
        self.passed = true;
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if self.passed {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!(
                "e2e: replica logs and fence log kept in {}",
                self.dir.display()
            );
        }
    }
}
