//! The `file:` store (`store.url = "file:/var/lib/idemgate"`): the memory store, with
//! every change it makes journaled to an embedded engine (fjall, an LSM tree with
//! atomic write batches) in one directory, and loaded back at start. The memory store
//! stays the authority for every rule, so the file store keeps its semantics by
//! construction; this module only writes and reads the directory.
//!
//! One process owns a directory: `idemgate.lock` is locked at start and held while the
//! store lives (a second sidecar on the same path gets a clear error). The directory is
//! private (`private.rs`). The engine's files are under `data/`. Once a write fails the
//! store answers nothing until a restart (`Store::broken`, `/healthz`).

mod codec;
mod layout;
mod private;
mod writer;

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub(crate) use layout::Restored;
use layout::Space;
pub(crate) use writer::FileJournal;

use crate::config::FsyncPolicy;
use crate::store::memory::journal::{Change, Journal};
use crate::store::{MemoryOptions, MemoryQueue, MemoryStore, StoreError};

/// The lock file's name inside the store's directory.
pub const LOCK_FILE: &str = "idemgate.lock";

/// Why the directory cannot be used, as a sentence naming it.
fn unusable(dir: &Path, why: impl std::fmt::Display) -> String {
    format!("file store directory {}: {why}", dir.display())
}

/// Creates the directory if needed (0700), refuses one others may write in, takes
/// its lock (held as long as the returned file is open: the lock goes with the
/// process, even on SIGKILL) and proves it writable. Neither the lock file nor the
/// probe is opened through a symlink.
pub fn lock_dir(dir: &Path) -> Result<File, String> {
    private::prepare(dir).map_err(|e| unusable(dir, e))?;
    let path = dir.join(LOCK_FILE);
    let file = private::open_own(&path).map_err(|e| {
        unusable(
            dir,
            format!("cannot open {} (a symlink is refused): {e}", path.display()),
        )
    })?;
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
            return Err(unusable(
                dir,
                format!("cannot lock {}: {e}", path.display()),
            ));
        }
    }
    // Writable: the engine creates and renames files here.
    private::probe_write(dir).map_err(|e| unusable(dir, format!("cannot write in it: {e}")))?;
    Ok(file)
}

/// What `idemgate check-config` asks of a `file:` store's path: it can be created,
/// written and locked now (the lock is released at once), and others cannot write in it.
pub fn check_dir(dir: &Path) -> Result<(), String> {
    lock_dir(dir).map(drop)
}

/// Opens the `file:` store in `dir`: locks it, starts its journal, and loads every
/// delivery, queue entry, dead letter and job back into a memory store (`options`'
/// bound applies) and its queue. A call waits at most `wait` (`store.timeout`) for its
/// change to be written.
pub fn open(
    dir: &Path,
    fsync: FsyncPolicy,
    wait: Duration,
    options: MemoryOptions,
) -> Result<(MemoryStore, MemoryQueue), StoreError> {
    open_journaled(dir, fsync, wait, options).map(|(store, queue, _)| (store, queue))
}

/// `open`, and the journal itself (tests reach its writer through it).
pub(crate) fn open_journaled(
    dir: &Path,
    fsync: FsyncPolicy,
    wait: Duration,
    options: MemoryOptions,
) -> Result<(MemoryStore, MemoryQueue, Arc<FileJournal>), StoreError> {
    let mut files = FileDir::open(dir)?;
    let file_journal = Arc::new(files.start_journal(fsync, wait)?);
    let journal: Arc<dyn Journal> = file_journal.clone();
    let store = MemoryStore::with_options(MemoryOptions {
        journal: Some(journal.clone()),
        ..options
    });
    let queue = MemoryQueue::with_journal(store.clone(), Some(journal.clone()));
    let mut entries = Vec::new();
    let loaded = files.load(|r| match r {
        Restored::Entry(key, bytes) => entries.push((key, bytes)),
        Restored::Queued(route, id, entry) => queue.restore_queued(&route, id, entry),
        Restored::Dead(route, id, dead) => queue.restore_dead(&route, id, dead),
        Restored::Attempts(key, id, n) => queue.restore_attempts(key, id, n),
        Restored::Job(record) => queue.restore_job(record),
        Restored::JobItems(id, items) => queue.restore_job_items(&id, items),
        Restored::JobMark(id, item, mark) => queue.restore_job_mark(&id, item, mark),
    })?;
    // In age order, not the engine's key order; what expired while the sidecar was
    // down leaves the disk too (the directory holds what memory holds).
    let expired = store.restore_entries(entries).map_err(|e| {
        StoreError::Unavailable(unusable(dir, format!("a delivery does not load back: {e}")))
    })?;
    for key in &expired {
        journal.record(Change::Entry { key, entry: None });
    }
    tracing::info!(dir = %dir.display(), records = loaded, deliveries = store.len(), expired = expired.len(), "file store opened");
    Ok((store, queue, file_journal))
}

/// An opened, locked directory: read back at start, written by its journal.
pub(crate) struct FileDir {
    dir: PathBuf,
    db: fjall::Database,
    spaces: HashMap<Space, fjall::Keyspace>,
    /// Handed to the journal's writer when it starts (it holds it for its life).
    lock: Option<File>,
}

impl FileDir {
    /// Locks `dir` and opens (or creates, or recovers after a crash) its engine.
    pub(crate) fn open(dir: &Path) -> Result<FileDir, StoreError> {
        let lock = lock_dir(dir).map_err(StoreError::Unavailable)?;
        let tightened =
            private::seal(dir).map_err(|e| StoreError::Unavailable(unusable(dir, e)))?;
        if tightened > 0 {
            tracing::warn!(dir = %dir.display(), files = tightened, "file store: took group and other permissions off what an earlier version left readable");
        }
        let db = fjall::Database::builder(dir.join("data"))
            // Read only at start: a small cache.
            .cache_size(4 << 20)
            .max_journaling_size(64 << 20)
            .open()
            .map_err(|e| StoreError::Unavailable(unusable(dir, format!("cannot open: {e}"))))?;
        let mut spaces = HashMap::new();
        for space in Space::ALL {
            let ks = db
                // The memtables hold what the memory store holds again: keep them small.
                .keyspace(space.name(), || {
                    fjall::KeyspaceCreateOptions::default().max_memtable_size(8 << 20)
                })
                .map_err(|e| StoreError::Unavailable(unusable(dir, e)))?;
            spaces.insert(space, ks);
        }
        Ok(FileDir {
            dir: dir.to_path_buf(),
            db,
            spaces,
            lock: Some(lock),
        })
    }

    /// Hands every stored record to `restore`; a record that does not read back is an
    /// error naming the directory (skipping it would forget a delivery).
    pub(crate) fn load(&self, mut restore: impl FnMut(Restored)) -> Result<u64, StoreError> {
        let mut n = 0;
        for space in Space::ALL {
            let Some(ks) = self.spaces.get(&space) else {
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

    /// Starts the writer (once): from then on the journal owns the directory's lock,
    /// for as long as it lives (the writer stopping does not release it).
    pub(crate) fn start_journal(
        &mut self,
        fsync: FsyncPolicy,
        wait: Duration,
    ) -> Result<FileJournal, StoreError> {
        let lock = self.lock.take().ok_or_else(|| {
            StoreError::Unavailable(unusable(&self.dir, "its journal is already started"))
        })?;
        let engine = writer::Engine {
            db: self.db.clone(),
            spaces: self.spaces.clone(),
        };
        FileJournal::start(engine, lock, fsync, wait).map_err(|e| {
            StoreError::Unavailable(unusable(&self.dir, format!("cannot start its writer: {e}")))
        })
    }
}

#[cfg(test)]
mod tests;
/// A writer that fails: the store's answers, its lock, a restart.
#[cfg(test)]
mod tests_failure;
