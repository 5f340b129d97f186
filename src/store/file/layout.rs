//! How each journaled change is laid out in the engine: which keyspace, which key,
//! which value (`None`: removed), and how a stored pair reads back at start.

use bytes::Bytes;

use super::codec::{Put, Take};
use crate::store::DeliveryKey;
use crate::store::jobs::{JobRecord, JobState};
use crate::store::memory::journal::{Change, QueueId};
use crate::store::queue::{DeadLetter, QueueEntry};

/// The engine's keyspaces, one per kind of record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Space {
    Entries,
    Queued,
    Dead,
    Attempts,
    Jobs,
    JobItems,
    JobMarks,
}

impl Space {
    pub(super) const ALL: [Space; 7] = [
        Space::Entries,
        Space::Queued,
        Space::Dead,
        Space::Attempts,
        Space::Jobs,
        Space::JobItems,
        Space::JobMarks,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Space::Entries => "entries",
            Space::Queued => "queued",
            Space::Dead => "dead",
            Space::Attempts => "attempts",
            Space::Jobs => "jobs",
            Space::JobItems => "job_items",
            Space::JobMarks => "job_marks",
        }
    }
}

/// One write of a group commit.
#[derive(Debug)]
pub(super) struct Op {
    pub(super) space: Space,
    pub(super) key: Vec<u8>,
    pub(super) value: Option<Vec<u8>>,
}

/// A stored record as read back at start, in the terms the memory store restores.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Restored {
    Entry(DeliveryKey, Vec<u8>),
    Queued(String, QueueId, QueueEntry),
    Dead(String, QueueId, DeadLetter),
    Attempts(DeliveryKey, QueueId, u64),
    Job(JobRecord),
    JobItems(String, Vec<String>),
    JobMark(String, String, String),
}

fn route_id(route: &str, id: QueueId) -> Vec<u8> {
    Put::default().bytes(route.as_bytes()).u64(id.0).u64(id.1).0
}

fn queue_entry(p: Put, e: &QueueEntry) -> Put {
    let p = p
        .bytes(e.key.as_bytes())
        .bytes(e.method.as_bytes())
        .bytes(e.path.as_bytes())
        .bytes(&e.headers)
        .bytes(&e.body)
        .u64(e.received_at);
    match &e.order {
        Some(o) => p.u64(1).bytes(o.as_bytes()),
        None => p.u64(0),
    }
}

fn read_queue_entry(t: &mut Take<'_>) -> Option<QueueEntry> {
    Some(QueueEntry {
        key: t.text()?,
        method: t.text()?,
        path: t.text()?,
        headers: Bytes::copy_from_slice(t.bytes()?),
        body: Bytes::copy_from_slice(t.bytes()?),
        received_at: t.u64()?,
        order: match t.u64()? {
            0 => None,
            _ => Some(t.text()?),
        },
    })
}

fn job_record(r: &JobRecord) -> Vec<u8> {
    Put::default()
        .bytes(r.kind.as_bytes())
        .bytes(r.route.as_bytes())
        .bytes(r.filter.as_bytes())
        .bytes(r.state.as_str().as_bytes())
        .u64(r.total)
        .u64(r.done)
        .u64(r.failed)
        .bytes(r.owner.as_bytes())
        .u64(r.beat)
        .u64(r.created)
        .bytes(r.error.as_bytes())
        .0
}

/// The write a change makes.
pub(super) fn op(change: Change<'_>) -> Op {
    let (space, key, value) = match change {
        Change::Entry { key, entry } => (
            Space::Entries,
            Put::default()
                .bytes(key.route.as_bytes())
                .rest(key.key.as_bytes())
                .0,
            entry.map(<[u8]>::to_vec),
        ),
        Change::Queued { route, id, entry } => (
            Space::Queued,
            route_id(route, id),
            entry.map(|e| queue_entry(Put::default(), e).0),
        ),
        Change::Dead { route, id, dead } => (
            Space::Dead,
            route_id(route, id),
            dead.map(|d| {
                queue_entry(Put::default(), &d.entry)
                    .u64(d.attempts)
                    .bytes(d.last_error.as_bytes())
                    .u64(d.dead_at)
                    .0
            }),
        ),
        Change::Attempts { key, id, count } => (
            Space::Attempts,
            Put::default()
                .bytes(key.route.as_bytes())
                .bytes(key.key.as_bytes())
                .u64(id.0)
                .u64(id.1)
                .0,
            count.map(|n| n.to_be_bytes().to_vec()),
        ),
        Change::Job { id, record } => (Space::Jobs, id.as_bytes().to_vec(), record.map(job_record)),
        Change::JobItems { id, items } => (
            Space::JobItems,
            id.as_bytes().to_vec(),
            items.map(|items| {
                items
                    .iter()
                    .fold(Put::default(), |p, i| p.bytes(i.as_bytes()))
                    .0
            }),
        ),
        Change::JobMark { id, item, mark } => (
            Space::JobMarks,
            Put::default().bytes(id.as_bytes()).rest(item.as_bytes()).0,
            mark.map(|m| m.as_bytes().to_vec()),
        ),
    };
    Op { space, key, value }
}

fn text(b: &[u8]) -> Option<String> {
    String::from_utf8(b.to_vec()).ok()
}

/// Reads one stored pair back; `None` when it is not in this layout (a damaged
/// directory, or another program's files).
pub(super) fn restored(space: Space, key: &[u8], value: &[u8]) -> Option<Restored> {
    let mut k = Take(key);
    let mut v = Take(value);
    Some(match space {
        Space::Entries => {
            let route = k.text()?;
            Restored::Entry(DeliveryKey::new(route, text(k.rest())?), value.to_vec())
        }
        Space::Queued => {
            Restored::Queued(k.text()?, (k.u64()?, k.u64()?), read_queue_entry(&mut v)?)
        }
        Space::Dead => {
            let (route, id) = (k.text()?, (k.u64()?, k.u64()?));
            let entry = read_queue_entry(&mut v)?;
            let dead = DeadLetter {
                id: format!("{}-{}", id.0, id.1),
                entry,
                attempts: v.u64()?,
                last_error: v.text()?,
                dead_at: v.u64()?,
            };
            Restored::Dead(route, id, dead)
        }
        Space::Attempts => {
            let key = DeliveryKey::new(k.text()?, k.text()?);
            Restored::Attempts(key, (k.u64()?, k.u64()?), v.u64()?)
        }
        Space::Jobs => Restored::Job(JobRecord {
            id: text(key)?,
            kind: v.text()?,
            route: v.text()?,
            filter: v.text()?,
            state: JobState::parse(&v.text()?)?,
            total: v.u64()?,
            done: v.u64()?,
            failed: v.u64()?,
            owner: v.text()?,
            beat: v.u64()?,
            created: v.u64()?,
            error: v.text()?,
        }),
        Space::JobItems => {
            let mut items = Vec::new();
            while !v.0.is_empty() {
                items.push(v.text()?);
            }
            Restored::JobItems(text(key)?, items)
        }
        Space::JobMarks => {
            let id = k.text()?;
            Restored::JobMark(id, text(k.rest())?, text(value)?)
        }
    })
}
