use super::*;
use crate::store::log::LogOutcome;

/// An [`OwnedTail`] as the command carries it.
fn owned_tail(first_seen: u64, now: u64, settled: Option<&Settled>, r: &StoredResponse) -> Vec<u8> {
    let tail = OwnedTail {
        first_seen,
        now,
        settled,
        response: r,
    };
    let mut args: Vec<Vec<u8>> = Vec::new();
    redis::ToRedisArgs::write_redis_args(&tail, &mut args);
    assert_eq!(args.len(), 1, "one argument");
    args.remove(0)
}

fn answer() -> StoredResponse {
    StoredResponse {
        status: 201,
        headers: Bytes::from_static(b"content-type: a|b\r\n"),
        body: Bytes::from_static(b"x|y|z"),
    }
}

#[test]
fn records_round_trip_as_the_scripts_write_them() {
    let t = claim_token(1_700_000_000_123);
    assert_eq!(time_of(t), 1_700_000_000_123);
    let fp = hex::encode([9u8; 32]);
    let p = processing(&token_hex(t), &fp_hex(&[9u8; 32]));
    assert_eq!(p[..], *format!("P|{}|{fp}", t.to_hex()).as_bytes());
    // The scripts' owner check is the first 35 bytes: `P|` + 32 hex + `|`.
    assert_eq!(p[..35], owner_prefix(&token_hex(t)));
    assert_eq!(
        parse(&p),
        Some(Found::Processing {
            token: t.to_hex().into_bytes(),
            fp: fp.clone().into_bytes()
        })
    );
    let h = head_of(&p);
    assert_eq!(h.fp.as_deref(), Some(fp.as_str()));
    assert_eq!((h.first_seen, h.attempt), (Some(1_700_000_000_123), true));
    // complete_owner.lua: 'C|' .. fp .. tail; `|` inside headers and body is fine.
    let settled = Settled {
        outcome: LogOutcome::Forwarded,
        upstream_status: Some(200),
        latency_ms: 12,
        restore_completed: false,
    };
    let mut c = b"C|ab".to_vec();
    c.extend(owned_tail(5, 7, Some(&settled), &answer()));
    let completed = Found::Completed {
        fp: b"ab".to_vec(),
        response: answer(),
    };
    assert_eq!(parse(&c), Some(completed));
    assert_eq!(
        head_of(&c),
        Head {
            tag: b'C',
            fp: Some("ab".into()),
            attempt: true,
            first_seen: Some(5),
            last_seen: Some(7),
            outcome: Some("forwarded".into()),
            upstream_status: Some(200),
            latency_ms: Some(12),
            response_status: Some(201),
        }
    );
    // An unlogged completion leaves the log's fields empty.
    let mut c = b"C|ab".to_vec();
    c.extend(owned_tail(5, 7, None, &answer()));
    assert!(matches!(parse(&c), Some(Found::Completed { .. })));
    assert_eq!(
        (head_of(&c).outcome, head_of(&c).response_status),
        (None, Some(201))
    );
    // complete.lua: 'c|' .. fp .. tail, the earlier layout.
    let mut c = b"c|ab".to_vec();
    c.extend(completed_tail(&answer()));
    assert!(matches!(parse(&c), Some(Found::Completed { .. })));
    assert!(!head_of(&c).attempt);
    c[0] = b'r';
    assert!(matches!(parse(&c), Some(Found::Replaying { .. })));
    assert_eq!(parse(b"q|"), Some(Found::Queued { fp: vec![] }));
}

/// Records written by the previous release (`p|token|fp`, `c|…`) read as before: their
/// attempts are in the log hash, not implied by the record.
#[test]
fn the_previous_layout_still_reads() {
    let t = Token([7; 16]).to_hex();
    let p = format!("p|{t}|abcd");
    assert_eq!(
        parse(p.as_bytes()),
        Some(Found::Processing {
            token: t.into_bytes(),
            fp: b"abcd".to_vec()
        })
    );
    let h = head_of(p.as_bytes());
    assert_eq!(
        (h.fp.as_deref(), h.attempt, h.first_seen),
        (Some("abcd"), false, None)
    );
}

#[test]
fn an_unknown_fingerprint_never_differs_and_junk_is_refused() {
    assert!(!Found::Queued { fp: vec![] }.differs(b"ab"));
    assert!(Found::Queued { fp: b"cd".to_vec() }.differs(b"ab"));
    for junk in [
        &b""[..],
        b"x|1",
        b"p",
        b"c|ab|200|99|short",
        b"c|ab|two|0|",
        b"C|ab|1|2|forwarded|200",
    ] {
        assert_eq!(parse(junk), None, "{junk:?}");
    }
}
