//! The journal's one writer thread: it takes every change queued since its last
//! commit and writes them in one atomic batch (group commit), then tells the waiting
//! callers. Each batch reaches the OS before any caller is told (a SIGKILL loses
//! nothing answered); it is fsynced before they are told under `fsync = "always"`,
//! or within the period under `fsync = "<duration>"`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fjall::{Database, Keyspace, PersistMode};
use tokio::sync::watch;

use super::layout::{Op, Space, op};
use crate::config::FsyncPolicy;
use crate::store::StoreError;
use crate::store::memory::journal::{Change, Durable, Journal, Ticket};

/// Changes recorded but not yet handed to the writer.
#[derive(Default)]
struct Pending {
    /// The ticket the next change gets (the first is 1).
    next: Ticket,
    ops: Vec<Op>,
    closed: bool,
    /// The writer stopped on an error: changes are no longer kept (they would only pile
    /// up); every `durable` answers the error.
    failed: bool,
}

/// How far the writer got.
#[derive(Debug, Clone, Default)]
struct Committed {
    /// Every change with a ticket up to this one is written.
    upto: Ticket,
    /// The engine failed: nothing is written any more (until a restart).
    failed: Option<String>,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    committed: watch::Sender<Committed>,
    /// Since when the writer has been writing its current batch, in µs after `epoch`
    /// plus one (0: idle), so a write that outlives `store.timeout` shows in `health`
    /// while it lasts (an atomic: every claim reads it).
    busy_since: AtomicU64,
    epoch: Instant,
    /// Tests: the next commit fails as a full disk would (`tests_failure.rs`).
    #[cfg(test)]
    fail_next: std::sync::atomic::AtomicBool,
    /// Tests: commits wait while this is set, as on a stalled disk.
    #[cfg(test)]
    stalled: std::sync::atomic::AtomicBool,
}

/// The `Journal` the memory store writes through on a `file:` store.
pub(crate) struct FileJournal {
    shared: Arc<Shared>,
    /// How long a call waits for its change to be written (`store.timeout`): a
    /// stalled disk answers a store error, never a hang.
    wait: Duration,
    writer: Mutex<Option<JoinHandle<()>>>,
    /// The directory's lock file, held as long as the journal (the store, so the
    /// process) lives: not the writer's, so a writer that stopped on an error does not
    /// let a second sidecar open the directory while this one still answers.
    _lock: std::fs::File,
}

/// What the writer thread owns.
pub(super) struct Engine {
    pub(super) db: Database,
    pub(super) spaces: HashMap<Space, Keyspace>,
}

impl FileJournal {
    pub(super) fn start(
        engine: Engine,
        lock: std::fs::File,
        fsync: FsyncPolicy,
        wait: Duration,
    ) -> std::io::Result<FileJournal> {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending {
                next: 1,
                ..Pending::default()
            }),
            wake: Condvar::new(),
            committed: watch::Sender::new(Committed::default()),
            busy_since: AtomicU64::new(0),
            epoch: Instant::now(),
            #[cfg(test)]
            fail_next: std::sync::atomic::AtomicBool::new(false),
            #[cfg(test)]
            stalled: std::sync::atomic::AtomicBool::new(false),
        });
        let for_writer = shared.clone();
        let writer = std::thread::Builder::new()
            .name("idemgate-file-store".into())
            .spawn(move || write_loop(&for_writer, engine, fsync))?;
        Ok(FileJournal {
            shared,
            wait,
            writer: Mutex::new(Some(writer)),
            _lock: lock,
        })
    }

    /// Tests: commits wait while `stalled` is true, as on a stalled disk.
    #[cfg(test)]
    pub(super) fn stall_writes(&self, stalled: bool) {
        self.shared
            .stalled
            .store(stalled, std::sync::atomic::Ordering::SeqCst);
    }

    /// Tests: the writer's next commit fails as on a full disk.
    #[cfg(test)]
    pub(super) fn fail_next_write(&self) {
        self.shared
            .fail_next
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.shared.wake.notify_one();
    }
}

/// On drop the writer commits what is queued, fsyncs, and releases the directory.
impl Drop for FileJournal {
    fn drop(&mut self) {
        if let Ok(mut p) = self.shared.pending.lock() {
            p.closed = true;
        }
        self.shared.wake.notify_one();
        if let Some(w) = self.writer.lock().ok().and_then(|mut w| w.take()) {
            let _ = w.join();
        }
    }
}

impl Journal for FileJournal {
    fn record(&self, change: Change<'_>) -> Ticket {
        let op = op(change);
        // A poisoned lock means the writer is gone: the ticket is never committed, and
        // `durable` says why.
        let Ok(mut p) = self.shared.pending.lock() else {
            return Ticket::MAX;
        };
        let ticket = p.next;
        p.next += 1;
        if !p.failed {
            p.ops.push(op);
        }
        drop(p);
        self.shared.wake.notify_one();
        ticket
    }

    fn latest(&self) -> Ticket {
        self.shared
            .pending
            .lock()
            .map_or(Ticket::MAX, |p| p.next.saturating_sub(1))
    }

    fn broken(&self) -> Option<String> {
        self.shared.committed.borrow().failed.as_ref().map(|e| {
            format!("file store cannot write: {e}; it answers no delivery until a restart")
        })
    }

    fn health(&self) -> Result<(), StoreError> {
        if let Some(e) = self.broken() {
            return Err(StoreError::Unavailable(e));
        }
        let since = self.shared.busy_since.load(Ordering::Relaxed);
        let busy = (since != 0).then(|| {
            self.shared
                .epoch
                .elapsed()
                .saturating_sub(Duration::from_micros(since - 1))
        });
        match busy {
            Some(busy) if busy > self.wait => Err(StoreError::Unavailable(format!(
                "file store: a write has been waiting for the disk for {} ms (store.timeout {} ms)",
                busy.as_millis(),
                self.wait.as_millis()
            ))),
            _ => Ok(()),
        }
    }

    fn durable(&self, ticket: Ticket) -> Durable<'_> {
        let mut rx = self.shared.committed.subscribe();
        let wait = self.wait;
        Box::pin(async move {
            let written = rx.wait_for(|c| c.upto >= ticket || c.failed.is_some());
            let c = tokio::time::timeout(wait, written)
                .await
                .map_err(|_| StoreError::Timeout)?
                .map_err(|_| StoreError::Unavailable("file store writer stopped".into()))?;
            match &c.failed {
                Some(e) if c.upto < ticket => Err(StoreError::Unavailable(format!(
                    "file store cannot write: {e}"
                ))),
                _ => Ok(()),
            }
        })
    }
}

/// Tells every waiting and later caller that the writer is gone, however it ended (a
/// panic inside the engine included), so none waits forever.
struct Stopped<'a>(&'a Shared);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        self.0.committed.send_modify(|c| {
            c.failed.get_or_insert_with(|| "the writer stopped".into());
        });
    }
}

fn write_loop(shared: &Shared, engine: Engine, fsync: FsyncPolicy) {
    let _stopped = Stopped(shared);
    let mut synced_at = Instant::now();
    let mut unsynced = false;
    loop {
        let (ops, upto, closed) = {
            let Ok(mut p) = shared.pending.lock() else {
                return;
            };
            while p.ops.is_empty() && !p.closed {
                let wait = match fsync {
                    FsyncPolicy::Every(period) if unsynced => {
                        period.saturating_sub(synced_at.elapsed())
                    }
                    _ => Duration::from_secs(3600),
                };
                if unsynced && wait.is_zero() {
                    break;
                }
                p = match shared.wake.wait_timeout(p, wait) {
                    Ok((p, _)) => p,
                    Err(_) => return,
                };
            }
            (std::mem::take(&mut p.ops), p.next - 1, p.closed)
        };
        let now = u64::try_from(shared.epoch.elapsed().as_micros()).unwrap_or(u64::MAX - 1);
        shared.busy_since.store(now + 1, Ordering::Relaxed);
        let written = if ops.is_empty() {
            Ok(())
        } else {
            #[cfg(test)]
            if shared
                .fail_next
                .swap(false, std::sync::atomic::Ordering::SeqCst)
            {
                return fail(shared, &"no space left on device (injected)");
            }
            #[cfg(test)]
            while shared.stalled.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(5));
            }
            commit(&engine, ops, fsync)
        };
        let written = written.and_then(|()| match fsync {
            FsyncPolicy::Always => Ok(()),
            FsyncPolicy::Every(period) => {
                unsynced = true;
                if closed || synced_at.elapsed() >= period {
                    synced_at = Instant::now();
                    unsynced = false;
                    engine.db.persist(PersistMode::SyncAll)
                } else {
                    Ok(())
                }
            }
        });
        shared.busy_since.store(0, Ordering::Relaxed);
        match written {
            Ok(()) => {
                shared.committed.send_modify(|c| c.upto = c.upto.max(upto));
            }
            Err(e) => return fail(shared, &e),
        }
        if closed {
            let _ = engine.db.persist(PersistMode::SyncAll);
            return;
        }
    }
}

/// The writer stops for good: nothing is kept any more, and every waiting and later
/// caller hears why (the store then refuses deliveries and `/healthz` fails).
fn fail(shared: &Shared, e: &dyn std::fmt::Display) {
    tracing::error!(error = %e, "file store: the write failed; the store answers no delivery (503) until a restart, and /healthz fails so the kubelet restarts it");
    if let Ok(mut p) = shared.pending.lock() {
        p.failed = true;
        p.ops = Vec::new();
    }
    shared
        .committed
        .send_modify(|c| c.failed = Some(e.to_string()));
}

/// One atomic batch, the last change of each key winning (a batch's writes share one
/// sequence number, so one key must appear once).
fn commit(engine: &Engine, ops: Vec<Op>, fsync: FsyncPolicy) -> fjall::Result<()> {
    let mut last: HashMap<(Space, Vec<u8>), Option<Vec<u8>>> = HashMap::with_capacity(ops.len());
    for op in ops {
        last.insert((op.space, op.key), op.value);
    }
    let durability = match fsync {
        FsyncPolicy::Always => Some(PersistMode::SyncAll),
        // Written to the OS at commit (a batch without a mode stays in the journal's
        // buffer, which a SIGKILL would lose).
        FsyncPolicy::Every(_) => Some(PersistMode::Buffer),
    };
    let mut batch = engine.db.batch().durability(durability);
    for ((space, key), value) in last {
        let Some(ks) = engine.spaces.get(&space) else {
            continue;
        };
        match value {
            Some(v) => batch.insert(ks, key, v),
            None => batch.remove(ks, key),
        }
    }
    batch.commit()
}
