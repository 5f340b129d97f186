//! The seam through which a durable store hears of every change the in-memory store
//! makes, so the `file:` store keeps the same state on disk and the memory store's
//! semantics (and its conformance suites) are the file store's too.

use std::future::Future;
use std::pin::Pin;

use crate::store::jobs::JobRecord;
use crate::store::queue::{DeadLetter, QueueEntry};
use crate::store::{DeliveryKey, StoreError};

/// A queue entry's or dead letter's ID: (Unix ms, sequence), as `ms-seq`.
pub type QueueId = (u64, u64);

/// A change's place in the journal, for `Journal::durable`.
pub type Ticket = u64;

/// A future that resolves once changes are as durable as the journal's policy says.
pub type Durable<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// One change of the in-memory state, as the journal stores it.
#[derive(Debug, Clone, Copy)]
pub enum Change<'a> {
    /// A delivery's entry in the memory store's own encoding (`codec`, read back by
    /// `MemoryStore::restore_entry`); `None`: the key was forgotten (expired, evicted,
    /// or forgotten by an operator).
    Entry {
        key: &'a DeliveryKey,
        entry: Option<&'a [u8]>,
    },
    /// An async route's queue entry (`None`: it left the queue, delivered or
    /// dead-lettered). Who holds it is not journaled: after a restart every entry is
    /// free to be read again.
    Queued {
        route: &'a str,
        id: QueueId,
        entry: Option<&'a QueueEntry>,
    },
    /// A dead letter (`None`: redriven).
    Dead {
        route: &'a str,
        id: QueueId,
        dead: Option<&'a DeadLetter>,
    },
    /// How many delivery attempts a key's queue entry has had (`None`: forgotten).
    Attempts {
        key: &'a DeliveryKey,
        id: QueueId,
        count: Option<u64>,
    },
    /// An operator's bulk job's record (`None`: the job is forgotten).
    Job {
        id: &'a str,
        record: Option<&'a JobRecord>,
    },
    /// A job's work list, written once when the job is created (`None`: forgotten).
    JobItems {
        id: &'a str,
        items: Option<&'a [String]>,
    },
    /// A job's mark on one item (`None`: forgotten with the job).
    JobMark {
        id: &'a str,
        item: &'a str,
        mark: Option<&'a str>,
    },
}

/// What the memory store tells a journal.
///
/// `record` is called under the lock that orders the key's changes, so one key's
/// changes reach the journal in order; it must not block (it queues the change and
/// returns its ticket). A store method whose answer promises the change (a completion
/// answered 2xx, an acknowledged async delivery) awaits `durable` after the lock is
/// released and before it answers (the memory store's every mutating call does). The
/// store's own forgetting (expiry sweeps, evictions under `max_memory`) is recorded
/// the same way and not awaited.
pub trait Journal: Send + Sync + 'static {
    fn record(&self, change: Change<'_>) -> Ticket;
    fn durable(&self, ticket: Ticket) -> Durable<'_>;
    /// The last ticket handed out: an answer read from state that changed nothing
    /// waits for it, since the change it read may not be written yet.
    fn latest(&self) -> Ticket;
    /// Why the journal can write nothing any more (its writer stopped on an error),
    /// for good: the store refuses every change and `/healthz` fails.
    fn broken(&self) -> Option<String> {
        None
    }
    /// Whether the journal writes now: `broken`, or a write outliving its wait.
    fn health(&self) -> Result<(), StoreError> {
        match self.broken() {
            Some(e) => Err(StoreError::Unavailable(e)),
            None => Ok(()),
        }
    }
}
