//! The delivery log in memory (issue 8): the same fields as on Redis, kept on each
//! entry, so the admin API, the console and their tests work on `store.url = "memory"`
//! (one replica's deliveries only). Listing scans the map: fine for the single,
//! local process this store is for.

use super::{Entry, MemoryStore};
use crate::deliveries::{Forgot, KeptRequest, ListQuery, LogEntry, Page, Settled};
use crate::providers::Fingerprint;
use crate::store::{
    Claim, DeliveryKey, Lifetimes, Status, Store, StoreError, StoredResponse, Token, unix_millis,
};

/// What the log adds to an entry.
#[derive(Debug, Clone, Default)]
pub(super) struct Extra {
    outcome: Option<String>,
    upstream_status: Option<u16>,
    latency_ms: Option<u64>,
    replays: u64,
    request: Option<KeptRequest>,
}

fn entry_of(key: &DeliveryKey, e: &Entry, claimed: bool, with_request: bool) -> LogEntry {
    LogEntry {
        route: key.route.to_string(),
        key: key.key.clone(),
        status: e.status,
        claimed,
        fingerprint: hex::encode(e.fp),
        attempts: e.attempts,
        duplicates: e.duplicates,
        replays: e.log.replays,
        first_seen: e.first_seen,
        last_seen: e.last_seen,
        outcome: e.log.outcome.clone(),
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

impl MemoryStore {
    /// A provider's claim is `claim` itself (plus the kept request); an operator's
    /// forced claim re-claims a completed key, still only when no live claim holds it.
    pub(super) async fn claim_with_log(
        &self,
        key: &DeliveryKey,
        fp: &Fingerprint,
        kept: Option<&KeptRequest>,
        force: bool,
    ) -> Result<Claim, StoreError> {
        if !force {
            let claim = self.claim(key, fp).await?;
            if let (Claim::Claimed(token), Some(k)) = (&claim, kept) {
                self.owned(key, *token, |e, _| e.log.request = Some(k.clone()))?;
            }
            return Ok(claim);
        }
        let Lifetimes { lease, retention } = self.lifetimes;
        self.with_entries(|map, now| {
            let Some(entry) = map
                .get_mut(key)
                .filter(|e| e.expires_at > now || e.live_owner(now).is_some())
            else {
                return Claim::Mismatch;
            };
            match entry.live_owner(now) {
                None if entry.fp == *fp => {
                    let token = Token::random();
                    entry.status = Status::Processing;
                    entry.owner = Some((token, now + lease));
                    entry.attempts += 1;
                    entry.log.replays += 1;
                    entry.last_seen = unix_millis();
                    entry.expires_at = now + retention;
                    Claim::Claimed(token)
                }
                None => Claim::Mismatch,
                Some((_, until)) => Claim::InFlight {
                    remaining: until - now,
                },
            }
        })
    }

    fn note(&self, key: &DeliveryKey, settled: &Settled) -> Result<(), StoreError> {
        self.with_entries(|map, _| {
            if let Some(e) = map.get_mut(key) {
                e.log.outcome = Some(settled.outcome.to_string());
                e.log.upstream_status = settled.upstream_status;
                e.log.latency_ms = Some(settled.latency_ms);
                if settled.restore_completed && e.status == Status::Released && e.response.is_some()
                {
                    e.status = Status::Completed;
                }
            }
        })
    }

    pub(super) async fn complete_with_log(
        &self,
        key: &DeliveryKey,
        token: Token,
        response: &StoredResponse,
        settled: &Settled,
    ) -> Result<bool, StoreError> {
        let owned = self.complete(key, token, response).await?;
        if owned {
            self.note(key, settled)?;
        }
        Ok(owned)
    }

    pub(super) async fn release_with_log(
        &self,
        key: &DeliveryKey,
        token: Token,
        settled: &Settled,
    ) -> Result<bool, StoreError> {
        let owned = self.release(key, token).await?;
        if owned {
            self.note(key, settled)?;
        }
        Ok(owned)
    }

    pub(super) fn read_log_entry(&self, key: &DeliveryKey) -> Result<Option<LogEntry>, StoreError> {
        self.with_entries(|map, now| {
            map.get(key)
                .filter(|e| e.expires_at > now || e.live_owner(now).is_some())
                .map(|e| entry_of(key, e, e.live_owner(now).is_some(), true))
        })
    }

    pub(super) fn read_recent(&self, q: &ListQuery) -> Result<Page, StoreError> {
        let all = self.with_entries(|map, now| {
            map.iter()
                .filter(|(k, e)| {
                    (e.expires_at > now || e.live_owner(now).is_some())
                        && q.routes.iter().any(|r| **r == *k.route)
                })
                .map(|(k, e)| {
                    (
                        e.last_seen,
                        entry_of(k, e, e.live_owner(now).is_some(), false),
                    )
                })
                .filter(|(score, e)| {
                    q.matches(e)
                        && q.cursor
                            .as_ref()
                            .is_none_or(|c| (*score, e.route.as_str(), e.key.as_str()) < c.order())
                })
                .collect::<Vec<_>>()
        })?;
        Ok(Page::from_candidates(all, q.limit.max(1)))
    }

    pub(super) fn forget_key(&self, key: &DeliveryKey) -> Result<Forgot, StoreError> {
        self.with_entries(|map, now| match map.get(key) {
            Some(e) if e.live_owner(now).is_some() => Forgot::InFlight,
            Some(e) if e.expires_at > now => {
                map.remove(key);
                Forgot::Forgotten
            }
            Some(_) => {
                map.remove(key);
                Forgot::NotFound
            }
            None => Forgot::NotFound,
        })
    }
}
