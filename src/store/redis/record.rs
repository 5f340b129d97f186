//! The claim record: one string per delivery, `{prefix}:{<route>:<key>}:claim`, the
//! one value every claim decides on. A first delivery or a copy claims with a plain
//! `SET record p|token|fp NX PX lease GET`: a nil reply means this caller owns the key;
//! otherwise the old record comes back in the same reply and says what to answer. No
//! Lua runs on that path (BENCHMARKS.md, "Lua-free claims").
//!
//! Layouts (the fingerprint is hex, empty when unknown; an empty one never mismatches):
//!
//! - `p|<token hex>|<fp>`: processing, a first delivery's claim; its TTL is the lease.
//! - `q|<fp>`: an async route's delivery, queued (or being delivered by a worker, who
//!   holds the lock key).
//! - `c|<fp>|<status>|<headers length>|<headers><body>`: completed, for `retention`.
//! - `r|…` as `c`: an operator's replay of a completed key; the replay holds the lock
//!   key, and while it does copies are told "in flight"; once it is gone (released,
//!   lapsed) the record answers with its old answer, as `c`.
//!
//! The scripts that change a record (complete, release, renew, replay, forget, the
//! queue's) read the same layouts; the prefix lengths below are theirs too.

use bytes::Bytes;

use crate::store::StoredResponse;

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

/// The processing record a claim writes: `p|<token hex>|<fp hex>`.
pub(crate) fn processing(token_hex: &str, fp_hex: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + token_hex.len() + 1 + fp_hex.len());
    v.extend_from_slice(b"p|");
    v.extend_from_slice(token_hex.as_bytes());
    v.push(b'|');
    v.extend_from_slice(fp_hex.as_bytes());
    v
}

/// The fingerprint in the head of a record (its first bytes, as the log reads them
/// without the stored answer), if it holds one.
pub(crate) fn fp_in_head(head: &[u8]) -> Option<String> {
    let rest = head.get(2..)?;
    let fp = match head.first()? {
        b'p' => rest.get(33..)?,
        _ => rest.split(|&c| c == b'|').next()?,
    };
    String::from_utf8(fp.to_vec())
        .ok()
        .filter(|s| !s.is_empty())
}

/// What follows the fingerprint in a completed record (complete.lua prepends
/// `c|<fp>`): `|<status>|<headers length>|<headers><body>`.
pub(crate) fn completed_tail(response: &StoredResponse) -> Vec<u8> {
    let mut v = Vec::with_capacity(16 + response.headers.len() + response.body.len());
    v.push(b'|');
    v.extend_from_slice(response.status.to_string().as_bytes());
    v.push(b'|');
    v.extend_from_slice(response.headers.len().to_string().as_bytes());
    v.push(b'|');
    v.extend_from_slice(&response.headers);
    v.extend_from_slice(&response.body);
    v
}

/// Reads a record; `None` for bytes no script writes (a foreign value under our key).
pub(crate) fn parse(raw: &[u8]) -> Option<Found> {
    let (&tag, rest) = raw.split_first()?;
    let rest = rest.strip_prefix(b"|")?;
    match tag {
        b'p' => {
            let (token, fp) = split_once(rest)?;
            Some(Found::Processing {
                token: token.to_vec(),
                fp: fp.to_vec(),
            })
        }
        b'q' => Some(Found::Queued { fp: rest.to_vec() }),
        b'c' | b'r' => {
            let (fp, rest) = split_once(rest)?;
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
            Some(if tag == b'c' {
                Found::Completed { fp, response }
            } else {
                Found::Replaying { fp, response }
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
mod tests {
    use super::*;

    fn answer() -> StoredResponse {
        StoredResponse {
            status: 201,
            headers: Bytes::from_static(b"content-type: a|b\r\n"),
            body: Bytes::from_static(b"x|y|z"),
        }
    }

    #[test]
    fn records_round_trip_as_the_scripts_write_them() {
        let t = crate::store::Token([7; 16]);
        let fp = hex::encode([9u8; 32]);
        let p = processing(&t.to_hex(), &fp);
        // The scripts' owner check is the first 35 bytes: `p|` + 32 hex + `|`.
        assert_eq!(&p[..35], format!("p|{}|", t.to_hex()).as_bytes());
        assert_eq!(
            parse(&p),
            Some(Found::Processing {
                token: t.to_hex().into_bytes(),
                fp: fp.clone().into_bytes()
            })
        );
        assert_eq!(fp_in_head(&p), Some(fp));
        // complete.lua: 'c|' .. fp .. tail; `|` inside headers and body is fine.
        let mut c = b"c|ab".to_vec();
        c.extend(completed_tail(&answer()));
        assert_eq!(
            parse(&c),
            Some(Found::Completed {
                fp: b"ab".to_vec(),
                response: answer()
            })
        );
        c[0] = b'r';
        assert!(matches!(parse(&c), Some(Found::Replaying { .. })));
        assert_eq!(parse(b"q|"), Some(Found::Queued { fp: vec![] }));
    }

    #[test]
    fn an_unknown_fingerprint_never_differs_and_junk_is_refused() {
        assert!(!Found::Queued { fp: vec![] }.differs(b"ab"));
        assert!(Found::Queued { fp: b"cd".to_vec() }.differs(b"ab"));
        for junk in [&b""[..], b"x|1", b"p", b"c|ab|200|99|short", b"c|ab|two|0|"] {
            assert_eq!(parse(junk), None, "{junk:?}");
        }
    }
}
