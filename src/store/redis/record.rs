//! The claim record: one string per delivery, `{prefix}:{<route>:<key>}:claim`, the
//! one value every claim decides on. A first delivery or a copy claims with a plain
//! `SET record P|token|fp NX PX lease GET`: a nil reply means this caller owns the key;
//! otherwise the old record comes back in the same reply and says what to answer. No
//! Lua runs on that path (BENCHMARKS.md, "Lua-free claims").
//!
//! Layouts (the fingerprint is hex, empty when unknown; an empty one never mismatches).
//! An upper-case tag is a record that also carries the delivery log's fields of its
//! claim (so a first delivery writes no log hash at all: log.rs); a lower-case one is
//! the earlier layout, whose log fields are in the log hash:
//!
//! - `P|<token hex>|<fp>`: processing, a first delivery's claim; its TTL is the lease.
//!   The token's first 8 bytes are the claim's time (Unix ms, big-endian: the log's
//!   `first_seen`), its last 8 random. The claim counts as one attempt.
//! - `C|<fp>|<first seen>|<last seen>|<outcome>|<upstream status>|<latency ms>|<status>|
//!   <headers length>|<headers><body>`: completed by its `P` claim's owner (the one-key
//!   completion, complete_owner.lua), for `retention`; one attempt more than the hash
//!   counts. The log's fields come before the answer, so the log's head read
//!   (`GETRANGE`) finds them.
//! - `p|<token hex>|<fp>`: processing, the earlier layout (an operator's replay of a
//!   released key writes it too: its attempt is counted in the hash).
//! - `q|<fp>`: an async route's delivery, queued (or being delivered by a worker, who
//!   holds the lock key).
//! - `c|<fp>|<status>|<headers length>|<headers><body>`: completed, the earlier layout
//!   (and a lock holder's completion: an operator's replay, a queue worker), for
//!   `retention`.
//! - `r|…` as `c`: an operator's replay of a completed key; the replay holds the lock
//!   key, and while it does copies are told "in flight"; once it is gone (released,
//!   lapsed) the record answers with its old answer, as `c`.
//!
//! The scripts that change a record (complete, release, renew, replay, forget, the
//! queue's) read the same layouts; the prefix lengths below are theirs too.

use std::io::Write;

use bytes::Bytes;

use crate::store::log::Settled;
use crate::store::{StoredResponse, Token};

/// What a claim found in the record (or `Absent`: the caller's `SET NX` took the key).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found {
    Absent,
    Processing {
        token: Vec<u8>,
        fp: Vec<u8>,
    },
    Queued {
        fp: Vec<u8>,
    },
    Completed {
        fp: Vec<u8>,
        response: StoredResponse,
    },
    Replaying {
        fp: Vec<u8>,
        response: StoredResponse,
    },
}

impl Found {
    /// Whether the record holds another payload's fingerprint than `fp` (hex).
    pub(crate) fn differs(&self, fp: &[u8]) -> bool {
        let held = match self {
            Found::Absent => return false,
            Found::Processing { fp, .. }
            | Found::Queued { fp }
            | Found::Completed { fp, .. }
            | Found::Replaying { fp, .. } => fp,
        };
        !held.is_empty() && held != fp
    }
}

/// A claim's token: its time (`now`, Unix ms) then 8 random bytes, so the record
/// carries the delivery's `first_seen` without a field of its own.
pub(crate) fn claim_token(now: u64) -> Token {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&now.to_be_bytes());
    t[8..].copy_from_slice(&rand::random::<[u8; 8]>());
    Token(t)
}

/// The claim time a [`claim_token`] carries.
pub(crate) fn time_of(token: Token) -> u64 {
    let mut t = [0u8; 8];
    t.copy_from_slice(&token.0[..8]);
    u64::from_be_bytes(t)
}

/// A token in hex, on the stack.
pub(crate) fn token_hex(token: Token) -> [u8; 32] {
    let mut h = [0u8; 32];
    // 16 bytes always fit 32 hex digits.
    let _ = hex::encode_to_slice(token.0, &mut h);
    h
}

/// A fingerprint in hex, on the stack.
pub(crate) fn fp_hex(fp: &[u8; 32]) -> [u8; 64] {
    let mut h = [0u8; 64];
    let _ = hex::encode_to_slice(fp, &mut h);
    h
}

/// The claim time a [`claim_token`] carries, read from its hex (its first 16 digits).
pub(crate) fn time_of_token(token_hex: &[u8]) -> Option<u64> {
    let digits = std::str::from_utf8(token_hex.get(..16)?).ok()?;
    u64::from_str_radix(digits, 16).ok()
}

/// The processing record a claim writes, `P|<token hex>|<fp hex>`, on the stack.
pub(crate) fn processing(token_hex: &[u8; 32], fp_hex: &[u8; 64]) -> [u8; 99] {
    let mut v = [b'|'; 99];
    v[0] = b'P';
    v[2..34].copy_from_slice(token_hex);
    v[35..].copy_from_slice(fp_hex);
    v
}

/// The owner check of every script: the first 35 bytes of the owner's `P` record.
pub(crate) fn owner_prefix(token_hex: &[u8; 32]) -> [u8; 35] {
    let mut v = [b'|'; 35];
    v[0] = b'P';
    v[2..34].copy_from_slice(token_hex);
    v
}

/// What follows the fingerprint in the `C` record complete_owner.lua writes (it
/// prepends `C|<fp>`): the log's fields, then the answer. `first_seen` is the claim's
/// time (from its token), `now` the completion's. Written straight into the command's
/// buffer (one argument, no buffer of its own).
pub(crate) struct OwnedTail<'a> {
    pub first_seen: u64,
    pub now: u64,
    pub settled: Option<&'a Settled>,
    pub response: &'a StoredResponse,
}

impl OwnedTail<'_> {
    fn write_to(&self, v: &mut impl Write) -> std::io::Result<()> {
        let outcome = self.settled.map_or("", |s| s.outcome.as_str());
        write!(v, "|{}|{}|{outcome}|", self.first_seen, self.now)?;
        if let Some(s) = self.settled {
            if let Some(up) = s.upstream_status {
                write!(v, "{up}")?;
            }
            write!(v, "|{}", s.latency_ms)?;
        } else {
            v.write_all(b"|")?;
        }
        let r = self.response;
        write!(v, "|{}|{}|", r.status, r.headers.len())?;
        v.write_all(&r.headers)?;
        v.write_all(&r.body)
    }
}

impl redis::ToRedisArgs for OwnedTail<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        // Writing into the command's buffer cannot fail.
        let _ = self.write_to(&mut out.writer_for_next_arg());
    }
}

/// What follows the fingerprint in a `c` record (complete.lua prepends `c|<fp>`):
/// `|<status>|<headers length>|<headers><body>`.
pub(crate) fn completed_tail(response: &StoredResponse) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + response.headers.len() + response.body.len());
    answer_into(&mut v, response);
    v
}

/// `|<status>|<headers length>|<headers><body>`.
fn answer_into(v: &mut Vec<u8>, response: &StoredResponse) {
    let _ = write!(v, "|{}|{}|", response.status, response.headers.len());
    v.extend_from_slice(&response.headers);
    v.extend_from_slice(&response.body);
}

/// What the log reads off a record's head (its first bytes, without the stored
/// answer, as `GETRANGE` returns them; see log.rs).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Head {
    /// The layout's tag (`P`, `C`, `p`, `q`, `c`, `r`), 0 without a record.
    pub tag: u8,
    pub fp: Option<String>,
    /// The record's own attempt, not counted in the log hash (`P`, `C`).
    pub attempt: bool,
    pub first_seen: Option<u64>,
    pub last_seen: Option<u64>,
    pub outcome: Option<String>,
    pub upstream_status: Option<u16>,
    pub latency_ms: Option<u64>,
    pub response_status: Option<u16>,
}

/// Reads a record's head; an empty head (no record) or junk gives `tag` 0 or only
/// what could be read.
pub(crate) fn head_of(head: &[u8]) -> Head {
    let Some((&tag, rest)) = head.split_first() else {
        return Head::default();
    };
    let mut h = Head {
        tag,
        ..Head::default()
    };
    let Some(rest) = rest.strip_prefix(b"|") else {
        return h;
    };
    let mut fields = rest.split(|&c| c == b'|');
    let text = |b: Option<&[u8]>| {
        b.and_then(|b| std::str::from_utf8(b).ok())
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    };
    let num = |b: Option<&[u8]>| text(b).and_then(|s| s.parse::<u64>().ok());
    match tag {
        b'P' | b'p' => {
            let token = fields.next();
            h.fp = text(fields.next());
            if tag == b'P' {
                h.attempt = true;
                h.first_seen = token.and_then(time_of_token);
                h.last_seen = h.first_seen;
            }
        }
        b'C' => {
            h.attempt = true;
            h.fp = text(fields.next());
            h.first_seen = num(fields.next());
            h.last_seen = num(fields.next());
            h.outcome = text(fields.next());
            h.upstream_status = num(fields.next()).and_then(|s| u16::try_from(s).ok());
            h.latency_ms = num(fields.next());
            h.response_status = num(fields.next()).and_then(|s| u16::try_from(s).ok());
        }
        b'c' | b'r' => {
            h.fp = text(fields.next());
            h.response_status = num(fields.next()).and_then(|s| u16::try_from(s).ok());
        }
        _ => h.fp = text(fields.next()),
    }
    h
}

/// Reads a record; `None` for bytes no script writes (a foreign value under our key).
pub(crate) fn parse(raw: &[u8]) -> Option<Found> {
    let (&tag, rest) = raw.split_first()?;
    let rest = rest.strip_prefix(b"|")?;
    match tag {
        b'p' | b'P' => {
            let (token, fp) = split_once(rest)?;
            Some(Found::Processing {
                token: token.to_vec(),
                fp: fp.to_vec(),
            })
        }
        b'q' => Some(Found::Queued { fp: rest.to_vec() }),
        b'c' | b'r' | b'C' => {
            let (fp, mut rest) = split_once(rest)?;
            if tag == b'C' {
                // first seen, last seen, outcome, upstream status, latency
                for _ in 0..5 {
                    rest = split_once(rest)?.1;
                }
            }
            let (status, rest) = split_once(rest)?;
            let (hlen, rest) = split_once(rest)?;
            let status: u16 = std::str::from_utf8(status).ok()?.parse().ok()?;
            let hlen: usize = std::str::from_utf8(hlen).ok()?.parse().ok()?;
            if hlen > rest.len() {
                return None;
            }
            let (headers, body) = rest.split_at(hlen);
            let response = StoredResponse {
                status,
                headers: Bytes::copy_from_slice(headers),
                body: Bytes::copy_from_slice(body),
            };
            let fp = fp.to_vec();
            Some(if tag == b'r' {
                Found::Replaying { fp, response }
            } else {
                Found::Completed { fp, response }
            })
        }
        _ => None,
    }
}

fn split_once(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = b.iter().position(|&c| c == b'|')?;
    Some((&b[..i], &b[i + 1..]))
}

#[cfg(test)]
mod tests;
