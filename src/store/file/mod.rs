//! The `file:` store (`store.url = "file:/var/lib/idemgate"`): the memory store, with
//! every change it makes journaled to an embedded engine (fjall, an LSM tree with
//! atomic write batches) in one directory, and loaded back at start. The memory store
//! stays the authority for every rule, so the file store keeps its semantics by
//! construction; this module only writes and reads the directory.
//!
//! One process owns a directory: `idemgate.lock` is locked at start (a second sidecar
//! on the same path gets a clear error). The engine's files are under `data/`.

mod codec;
mod layout;
mod writer;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};

pub(crate) use layout::Restored;
use layout::Space;
pub(crate) use writer::FileJournal;

use crate::config::FsyncPolicy;
use crate::store::StoreError;

/// The lock file's name inside the store's directory.
pub const LOCK_FILE: &str = "idemgate.lock";

/// Why the directory cannot be used, as a sentence naming it.
fn unusable(dir: &Path, why: impl std::fmt::Display) -> String {
    format!("file store directory {}: {why}", dir.display())
}

/// Creates the directory if needed, proves it writable and takes its lock, held as
/// long as the returned file is open (the lock goes with the process, even on SIGKILL).
pub fn lock_dir(dir: &Path) -> Result<File, String> {
    std::fs::create_dir_all(dir).map_err(|e| unusable(dir, format!("cannot create it: {e}")))?;
    let path = dir.join(LOCK_FILE);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| unusable(dir, format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(unusable(
                dir,
                format!(
                    "another process holds its lock ({}): one sidecar per directory; stop the other one or give this one its own path",
                    path.display()
                ),
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(unusable(dir, format!("cannot lock {}: {e}", path.display())));
        }
    }
    // Writable: the engine creates and renames files here.
    let probe = dir.join(".idemgate-write-check");
    std::fs::write(&probe, b"ok")
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| unusable(dir, format!("cannot write in it: {e}")))?;
    Ok(file)
}

/// What `idemgate check-config` asks of a `file:` store's path: it can be created,
/// written and locked now (the lock is released at once).
pub fn check_dir(dir: &Path) -> Result<(), String> {
    lock_dir(dir).map(drop)
}

/// An opened, locked directory, read back before the journal starts writing.
pub(crate) struct FileDir {
    dir: PathBuf,
    engine: writer::Engine,
}

impl FileDir {
    /// Locks `dir` and opens (or creates, or recovers after a crash) its engine.
    pub(crate) fn open(dir: &Path) -> Result<FileDir, StoreError> {
        let lock = lock_dir(dir).map_err(StoreError::Unavailable)?;
        let db = fjall::Database::builder(dir.join("data"))
            // Read only at start: a small cache.
            .cache_size(4 << 20)
            // The memtables hold what the memory store holds again; keep them small.
            .max_write_buffer_size(Some(16 << 20))
            .max_journaling_size(64 << 20)
            .open()
            .map_err(|e| StoreError::Unavailable(unusable(dir, format!("cannot open: {e}"))))?;
        let mut spaces = HashMap::new();
        for space in Space::ALL {
            let ks = db
                .keyspace(space.name(), fjall::KeyspaceCreateOptions::default)
                .map_err(|e| StoreError::Unavailable(unusable(dir, e)))?;
            spaces.insert(space, ks);
        }
        Ok(FileDir {
            dir: dir.to_path_buf(),
            engine: writer::Engine {
                db,
                spaces,
                _lock: lock,
            },
        })
    }

    /// Hands every stored record to `restore`; a record that does not read back is an
    /// error naming the directory (skipping it would forget a delivery).
    pub(crate) fn load(&self, mut restore: impl FnMut(Restored)) -> Result<u64, StoreError> {
        let mut n = 0;
        for space in Space::ALL {
            let Some(ks) = self.engine.spaces.get(&space) else {
                continue;
            };
            for kv in ks.iter() {
                let (k, v) = kv
                    .into_inner()
                    .map_err(|e| StoreError::Unavailable(unusable(&self.dir, e)))?;
                let r = layout::restored(space, &k, &v).ok_or_else(|| {
                    StoreError::Unavailable(unusable(
                        &self.dir,
                        format!("a record of {} does not read back", space.name()),
                    ))
                })?;
                restore(r);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Starts the writer: from now on the journal owns the directory.
    pub(crate) fn into_journal(self, fsync: FsyncPolicy) -> Result<FileJournal, StoreError> {
        let dir = self.dir;
        FileJournal::start(self.engine, fsync).map_err(|e| {
            StoreError::Unavailable(unusable(&dir, format!("cannot start its writer: {e}")))
        })
    }
}

#[cfg(test)]
mod tests;
