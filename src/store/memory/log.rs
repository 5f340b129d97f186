//! The delivery log in memory: the same fields as on Redis, kept on each
//! entry, so the admin API, the console and their tests work on `store.url = "memory"`
//! (one replica's deliveries only). Listing reads each route's recent index
//! (recent.rs), a bounded number of items per page.

use super::table::Admit;
use super::{Entry, MemoryStore, later};
use std::time::Duration;

use super::recent::Reading;
use crate::providers::Fingerprint;
use crate::store::log::{
    Cursor, Forgot, KeptRequest, ListQuery, LogEntry, LogOutcome, Page, SCAN_BUDGET, Settled,
};
use crate::store::{Claim, DeliveryKey, Lifetimes, Status, StoreError, Token, unix_millis};

/// What the log adds to an entry.
#[derive(Debug, Clone, Default)]
pub(super) struct Extra {
    pub(super) outcome: Option<LogOutcome>,
    pub(super) upstream_status: Option<u16>,
    pub(super) latency_ms: Option<u64>,
    pub(super) replays: u64,
    pub(super) request: Option<KeptRequest>,
}

fn entry_of(key: &DeliveryKey, e: &Entry, now: u64, with_request: bool) -> LogEntry {
    let claimed = e.live_owner(now).is_some();
    LogEntry {
        route: key.route.to_string(),
        key: key.key.clone(),
        status: e.status_at(now),
        claimed,
        fingerprint: e.fp.map(hex::encode).unwrap_or_default(),
        attempts: e.attempts,
        duplicates: e.duplicates,
        replays: e.log.replays,
        first_seen: e.first_seen,
        last_seen: e.last_seen,
        outcome: e.log.outcome.map(|o| o.as_str().to_string()),
        upstream_status: e.log.upstream_status,
        latency_ms: e.log.latency_ms,
        response_status: e.response.as_ref().map(|r| r.status),
        has_request: e.log.request.is_some(),
        request: if with_request {
            e.log.request.clone()
        } else {
            None
        },
    }
}

impl Entry {
    /// Records how the upstream call went (the log's fields), when the caller logs.
    pub(super) fn note(&mut self, settled: Option<&Settled>) {
        if let Some(settled) = settled {
            self.log.outcome = Some(settled.outcome);
            self.log.upstream_status = settled.upstream_status;
            self.log.latency_ms = Some(settled.latency_ms);
        }
    }
}

impl MemoryStore {
    /// An operator's replay re-claims the delivery it read, with the same answers as
    /// replay.lua: gone or another payload → `Mismatch`, queued → `Queued`, a live
    /// claim → `InFlight`. Over a completed key it keeps the old answer to go back to
    /// (`restore`). (A provider's logged claim is `claim_in` with the kept request.)
    pub(super) async fn replay_claim(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
    ) -> Result<Claim, StoreError> {
        let Lifetimes { lease, retention } = self.lifetimes.of(&key.route);
        self.change(key, Admit::Always, |slot, now| {
            let Some(entry) = slot else {
                return Claim::Mismatch;
            };
            let status = entry.status_at(now);
            if status == Status::Queued {
                if entry.differs(fp) {
                    return Claim::Mismatch;
                }
                entry.duplicates += 1;
                entry.last_seen = now;
                return Claim::Queued;
            }
            if entry.fp != Some(*fp) {
                return Claim::Mismatch;
            }
            match entry.live_owner(now) {
                None => {
                    let token = Token::random();
                    entry.restore = status == Status::Completed;
                    entry.status = Status::Processing;
                    entry.owner = Some((token, later(now, lease)));
                    entry.attempts += 1;
                    entry.log.replays += 1;
                    entry.last_seen = now;
                    entry.expires_at = later(now, retention.max(lease));
                    Claim::Claimed(token)
                }
                Some((_, until)) => Claim::InFlight {
                    remaining: Duration::from_millis(until.saturating_sub(now)),
                },
            }
        })
        .await
    }

    pub(super) fn read_log_entry(&self, key: &DeliveryKey) -> Result<Option<LogEntry>, StoreError> {
        let now = unix_millis();
        self.inner.read(key, |e| {
            e.filter(|e| e.live(now))
                .map(|e| entry_of(key, &e, now, true))
        })
    }

    pub(super) fn read_recent(&self, q: &ListQuery) -> Result<Page, StoreError> {
        let limit = q.limit.max(1);
        let budget = (SCAN_BUDGET / q.routes.len().max(1)).max(1);
        let (mut all, mut stopped) = (Vec::new(), None::<Cursor>);
        for route in &q.routes {
            let reading = Reading {
                route,
                cursor: q.cursor.as_ref(),
                since: q.filter.since,
                until: q.filter.until,
                budget,
                want: limit + 1,
            };
            let found = self.read_route(
                &reading,
                |k, e, now| entry_of(k, e, now, false),
                |e| q.matches(e),
            )?;
            all.extend(found.items);
            if let Some(low) = found.stopped
                && stopped.as_ref().is_none_or(|s| low.order() > s.order())
            {
                stopped = Some(low);
            }
        }
        Ok(Page::from_candidates(all, limit, stopped))
    }

    pub(super) async fn forget_key(&self, key: &DeliveryKey) -> Result<Forgot, StoreError> {
        self.change(key, Admit::Always, |slot, now| match slot {
            Some(e) if e.live_owner(now).is_some() => Forgot::InFlight,
            Some(_) => {
                *slot = None;
                Forgot::Forgotten
            }
            None => Forgot::NotFound,
        })
        .await
    }
}
