//! One delivery's entry as bytes: the memory store keeps each entry in this form (one
//! exact-size allocation per delivery, so a small completed delivery costs a few
//! hundred bytes), and the journal of a durable store writes the same bytes.
//!
//! Layout (version 1): a version byte, the status, a flags byte, then the fields the
//! flags say are present; counts and times as LEB128 varints, times as Unix ms (an
//! `Instant` does not survive a restart), byte strings length-prefixed.

use bytes::Bytes;

use super::Entry;
use super::log::Extra;
use crate::store::log::{KeptRequest, LogOutcome};
use crate::store::{Status, StoredResponse, Token};

/// The first byte of every encoded entry; a decoder refuses any other.
pub const VERSION: u8 = 1;

const HAS_FP: u8 = 1;
const HAS_OWNER: u8 = 1 << 1;
const HAS_RESPONSE: u8 = 1 << 2;
const HAS_REQUEST: u8 = 1 << 3;
const HAS_UPSTREAM: u8 = 1 << 4;
const HAS_LATENCY: u8 = 1 << 5;
const RESTORE: u8 = 1 << 6;

const OUTCOMES: [LogOutcome; 4] = [
    LogOutcome::Forwarded,
    LogOutcome::UpstreamError,
    LogOutcome::OperatorReplay,
    LogOutcome::OperatorReplayFailed,
];

fn status_code(s: Status) -> u8 {
    match s {
        Status::Processing => 0,
        Status::Completed => 1,
        Status::Released => 2,
        Status::Queued => 3,
    }
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    varint(out, b.len() as u64);
    out.extend_from_slice(b);
}

/// Appends `e`'s encoding to `out`.
pub(super) fn encode(e: &Entry, out: &mut Vec<u8>) {
    let x = &e.log;
    let mut flags = 0;
    for (on, bit) in [
        (e.fp.is_some(), HAS_FP),
        (e.owner.is_some(), HAS_OWNER),
        (e.response.is_some(), HAS_RESPONSE),
        (x.request.is_some(), HAS_REQUEST),
        (x.upstream_status.is_some(), HAS_UPSTREAM),
        (x.latency_ms.is_some(), HAS_LATENCY),
        (e.restore, RESTORE),
    ] {
        if on {
            flags |= bit;
        }
    }
    out.extend_from_slice(&[VERSION, status_code(e.status), flags]);
    if let Some(fp) = &e.fp {
        out.extend_from_slice(fp);
    }
    if let Some((token, until)) = e.owner {
        out.extend_from_slice(&token.0);
        varint(out, until);
    }
    for v in [e.attempts, e.duplicates, x.replays] {
        varint(out, v);
    }
    for v in [e.first_seen, e.last_seen, e.expires_at] {
        varint(out, v);
    }
    let outcome = x
        .outcome
        .and_then(|o| OUTCOMES.iter().position(|k| *k == o))
        .map_or(0, |i| i as u8 + 1);
    out.push(outcome);
    if let Some(s) = x.upstream_status {
        out.extend_from_slice(&s.to_le_bytes());
    }
    if let Some(l) = x.latency_ms {
        varint(out, l);
    }
    if let Some(r) = &e.response {
        out.extend_from_slice(&r.status.to_le_bytes());
        bytes(out, &r.headers);
        bytes(out, &r.body);
    }
    if let Some(k) = &x.request {
        bytes(out, k.method.as_bytes());
        bytes(out, k.path.as_bytes());
        bytes(out, &k.headers);
        bytes(out, &k.body);
    }
}

/// A reader over an encoded entry that fails (rather than panics) on short input.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err("entry is truncated".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn byte(&mut self) -> Result<u8, String> {
        Ok(self.take(1)?[0])
    }

    fn u16(&mut self) -> Result<u16, String> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = self.byte()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("entry has an overlong number".into())
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = usize::try_from(self.varint()?).map_err(|_| "entry length too large")?;
        self.take(n)
    }

    fn text(&mut self) -> Result<String, String> {
        String::from_utf8(self.bytes()?.to_vec()).map_err(|_| "entry text is not UTF-8".into())
    }
}

/// The entry `b` encodes (copies its byte strings into exact-size allocations).
pub(super) fn decode(b: &[u8]) -> Result<Entry, String> {
    let mut r = Reader(b);
    let version = r.byte()?;
    if version != VERSION {
        return Err(format!("entry version {version} is not {VERSION}"));
    }
    let status = match r.byte()? {
        0 => Status::Processing,
        1 => Status::Completed,
        2 => Status::Released,
        3 => Status::Queued,
        s => return Err(format!("entry status {s} is unknown")),
    };
    let flags = r.byte()?;
    let on = |bit: u8| flags & bit != 0;
    let fp = if on(HAS_FP) {
        let mut fp = [0u8; 32];
        fp.copy_from_slice(r.take(32)?);
        Some(fp)
    } else {
        None
    };
    let owner = if on(HAS_OWNER) {
        let mut t = [0u8; 16];
        t.copy_from_slice(r.take(16)?);
        Some((Token(t), r.varint()?))
    } else {
        None
    };
    let (attempts, duplicates, replays) = (r.varint()?, r.varint()?, r.varint()?);
    let (first_seen, last_seen, expires_at) = (r.varint()?, r.varint()?, r.varint()?);
    let outcome = match r.byte()? {
        0 => None,
        i => Some(
            *OUTCOMES
                .get(usize::from(i) - 1)
                .ok_or_else(|| format!("entry outcome {i} is unknown"))?,
        ),
    };
    let upstream_status = on(HAS_UPSTREAM).then(|| r.u16()).transpose()?;
    let latency_ms = on(HAS_LATENCY).then(|| r.varint()).transpose()?;
    let response = if on(HAS_RESPONSE) {
        Some(StoredResponse {
            status: r.u16()?,
            headers: Bytes::copy_from_slice(r.bytes()?),
            body: Bytes::copy_from_slice(r.bytes()?),
        })
    } else {
        None
    };
    let request = if on(HAS_REQUEST) {
        Some(KeptRequest {
            method: r.text()?,
            path: r.text()?,
            headers: Bytes::copy_from_slice(r.bytes()?),
            body: Bytes::copy_from_slice(r.bytes()?),
        })
    } else {
        None
    };
    if !r.0.is_empty() {
        return Err("entry has trailing bytes".into());
    }
    Ok(Entry {
        status,
        fp,
        owner,
        response,
        attempts,
        duplicates,
        first_seen,
        last_seen,
        expires_at,
        log: Extra {
            outcome,
            upstream_status,
            latency_ms,
            replays,
            request,
        },
        restore: on(RESTORE),
    })
}

/// The status an encoded entry holds, read without decoding the rest.
pub(super) fn status_of(b: &[u8]) -> Option<Status> {
    match b.get(1)? {
        0 => Some(Status::Processing),
        1 => Some(Status::Completed),
        2 => Some(Status::Released),
        3 => Some(Status::Queued),
        _ => None,
    }
}

/// What the store's bookkeeping reads of an entry (sweeping, eviction), without
/// decoding the rest.
pub(super) struct Head {
    pub status: Status,
    pub owner_until: Option<u64>,
    pub expires_at: u64,
}

impl Head {
    /// Whether the entry is remembered at `now` (as `Entry::live`).
    pub fn live(&self, now: u64) -> bool {
        self.expires_at > now || self.owner_until.is_some_and(|u| u > now)
    }

    /// Whether eviction must leave it: a live claim, or a delivery in the queue.
    pub fn protected(&self, now: u64) -> bool {
        self.status == Status::Queued || self.owner_until.is_some_and(|u| u > now)
    }
}

/// The head of an encoded entry.
pub(super) fn head(b: &[u8]) -> Result<Head, String> {
    let mut r = Reader(b);
    if r.byte()? != VERSION {
        return Err("entry version is unknown".into());
    }
    let status = status_of(b).ok_or("entry status is unknown")?;
    r.byte()?;
    let flags = r.byte()?;
    if flags & HAS_FP != 0 {
        r.take(32)?;
    }
    let owner_until = if flags & HAS_OWNER != 0 {
        r.take(16)?;
        Some(r.varint()?)
    } else {
        None
    };
    for _ in 0..5 {
        r.varint()?;
    }
    Ok(Head {
        status,
        owner_until,
        expires_at: r.varint()?,
    })
}

/// Appends a delivery key (route, then key, each length-prefixed): the prefix of the
/// memory store's record of a delivery, before the entry.
pub(super) fn encode_key(route: &str, key: &str, out: &mut Vec<u8>) {
    bytes(out, route.as_bytes());
    bytes(out, key.as_bytes());
}

/// A record's parts: route, key, entry bytes.
pub(super) type Parts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// A record's route, key and entry bytes (the inverse of `encode_key` + `encode`).
pub(super) fn split_record(b: &[u8]) -> Result<Parts<'_>, String> {
    let mut r = Reader(b);
    let route = r.bytes()?;
    let key = r.bytes()?;
    Ok((route, key, r.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full() -> Entry {
        Entry {
            status: Status::Processing,
            fp: Some([7; 32]),
            owner: Some((Token([9; 16]), 1_700_000_123_456)),
            response: Some(StoredResponse {
                status: 201,
                headers: Bytes::from_static(b"content-type: text/plain\r\n"),
                body: Bytes::from(vec![0xffu8; 300]),
            }),
            attempts: 3,
            duplicates: 200,
            first_seen: 1_700_000_000_000,
            last_seen: 1_700_000_000_500,
            expires_at: u64::MAX,
            log: Extra {
                outcome: Some(LogOutcome::OperatorReplayFailed),
                upstream_status: Some(502),
                latency_ms: Some(12_345),
                replays: 1,
                request: Some(KeptRequest {
                    method: "POST".into(),
                    path: "/hooks?a=é".into(),
                    headers: Bytes::from_static(b"idempotency-key: k\r\n"),
                    body: Bytes::from_static(b"{}"),
                }),
            },
            restore: true,
        }
    }

    fn roundtrip(e: &Entry) -> Entry {
        let mut b = Vec::new();
        encode(e, &mut b);
        assert_eq!(b[0], VERSION);
        assert_eq!(status_of(&b), Some(e.status));
        decode(&b).expect("decodes")
    }

    #[test]
    fn every_field_survives_a_roundtrip() {
        let e = full();
        assert_eq!(format!("{:?}", roundtrip(&e)), format!("{e:?}"));
        let bare = Entry::fresh(None, Status::Released, 5, 6);
        assert_eq!(format!("{:?}", roundtrip(&bare)), format!("{bare:?}"));
    }

    #[test]
    fn a_small_completed_entry_encodes_small() {
        let mut e = Entry::fresh(Some([1; 32]), Status::Completed, 1_700_000_000_000, 0);
        e.expires_at = 1_700_259_200_000;
        e.attempts = 1;
        e.response = Some(StoredResponse {
            status: 200,
            headers: Bytes::new(),
            body: Bytes::from_static(b"ok"),
        });
        let mut b = Vec::new();
        encode(&e, &mut b);
        assert!(b.len() < 70, "{} bytes", b.len());
    }

    #[test]
    fn damaged_bytes_are_an_error_not_a_panic() {
        let mut b = Vec::new();
        encode(&full(), &mut b);
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "prefix of {n} bytes");
        }
        let mut other = b.clone();
        other[0] = 2;
        assert!(decode(&other).unwrap_err().contains("version"));
        b.push(0);
        assert!(decode(&b).is_err());
    }

    #[test]
    fn the_head_and_the_key_prefix_read_back() {
        let e = full();
        let mut b = Vec::new();
        encode_key("stripe", "evt_1", &mut b);
        encode(&e, &mut b);
        let (route, key, entry) = split_record(&b).unwrap();
        assert_eq!((route, key), (&b"stripe"[..], &b"evt_1"[..]));
        let h = head(entry).unwrap();
        assert_eq!(h.status, Status::Processing);
        assert_eq!(h.owner_until, Some(1_700_000_123_456));
        assert_eq!(h.expires_at, u64::MAX);
        assert!(h.live(u64::MAX - 1) && h.protected(1_700_000_123_455));
        assert!(!h.protected(1_700_000_123_456));
    }
}
