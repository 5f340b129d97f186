//! The `file:` store for the conformance suites: a memory store journaled to its own
//! temporary directory (`fsync = "always"`), removed when the fixture drops.

use idemgate::config::FsyncPolicy;
use idemgate::store::{MemoryOptions, MemoryQueue, MemoryStore, RouteLifetimes};
use tempfile::TempDir;

/// A file store and its queue; the directory goes last (after the journal stopped).
pub struct FileStore {
    pub store: MemoryStore,
    pub queue: MemoryQueue,
    _dir: TempDir,
}

impl FileStore {
    /// A new file store in a new directory.
    pub fn open(lifetimes: impl Into<RouteLifetimes>) -> FileStore {
        let dir = tempfile::tempdir().expect("temp dir");
        let (store, queue) = idemgate::store::file::open(
            dir.path(),
            FsyncPolicy::Always,
            std::time::Duration::from_secs(5),
            MemoryOptions::new(lifetimes),
        )
        .expect("file store opens");
        FileStore {
            store,
            queue,
            _dir: dir,
        }
    }
}
