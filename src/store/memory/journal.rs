//! The seam through which a durable store hears of every change the in-memory store
//! makes, so the `file:` store keeps the same state on disk and the memory store's
//! semantics (and its conformance suites) are the file store's too.

use std::future::Future;
use std::pin::Pin;

use crate::store::{DeliveryKey, StoreError};

/// A change's place in the journal, for `Journal::durable`.
pub type Ticket = u64;

/// A future that resolves once changes are as durable as the journal's policy says.
pub type Durable<'a> = Pin<Box<dyn Future<Output = Result<(), StoreError>> + Send + 'a>>;

/// One change of the in-memory state, as the journal stores it.
#[derive(Debug, Clone, Copy)]
// Read by a journal's implementation: the `file:` store, and this crate's tests.
#[cfg_attr(not(test), allow(dead_code))]
pub enum Change<'a> {
    /// A delivery's entry in the memory store's own encoding (`codec`, read back by
    /// `MemoryStore::restore_entry`); `None`: the key was forgotten (expired, evicted,
    /// or forgotten by an operator).
    Entry {
        key: &'a DeliveryKey,
        entry: Option<&'a [u8]>,
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
}
