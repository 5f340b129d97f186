//! W3C Trace Context (`traceparent`, `tracestate`): read from a provider's request,
//! written on the request to the application.

use http::HeaderMap;
use http::header::{HeaderName, HeaderValue};

pub const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
pub const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

/// The `sampled` bit of `trace-flags`.
const SAMPLED: u8 = 0x01;

/// One span's identity as `traceparent` carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpanContext {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    pub flags: u8,
}

impl SpanContext {
    /// Parses a `traceparent` value (W3C Trace Context level 1). Version `00` must be
    /// exactly 55 characters; a later version is read by its first four fields, as the
    /// spec asks; all-zero ids, version `ff` and upper-case hex are refused.
    pub fn parse(value: &[u8]) -> Option<SpanContext> {
        let s = std::str::from_utf8(value).ok()?.trim_matches([' ', '\t']);
        if s.len() < 55 {
            return None;
        }
        let (head, rest) = s.split_at(55);
        let version = lower_hex::<1>(&head[0..2])?[0];
        if version == 0xff || (version == 0 && !rest.is_empty()) {
            return None;
        }
        if !rest.is_empty() && !rest.starts_with('-') {
            return None;
        }
        let b = head.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let trace_id = lower_hex::<16>(&head[3..35])?;
        let span_id = lower_hex::<8>(&head[36..52])?;
        let flags = lower_hex::<1>(&head[53..55])?[0];
        if trace_id == [0; 16] || span_id == [0; 8] {
            return None;
        }
        Some(SpanContext {
            trace_id,
            span_id,
            flags,
        })
    }

    pub fn sampled(&self) -> bool {
        self.flags & SAMPLED != 0
    }

    /// The `traceparent` value naming this span (always version `00`).
    pub fn header(&self) -> HeaderValue {
        let v = format!(
            "00-{}-{}-{:02x}",
            hex::encode(self.trace_id),
            hex::encode(self.span_id),
            self.flags
        );
        HeaderValue::from_str(&v).expect("hex is a valid header value")
    }
}

/// Decodes exactly `N` bytes of lower-case hex.
fn lower_hex<const N: usize>(s: &str) -> Option<[u8; N]> {
    if s.len() != 2 * N || !s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut out = [0u8; N];
    hex::decode_to_slice(s, &mut out).ok()?;
    Some(out)
}

/// What a request carries of its caller's trace.
#[derive(Debug, Clone, Default)]
pub struct Incoming {
    /// The caller's span, when `traceparent` is present and valid (an invalid one is
    /// ignored, as the spec asks, and a new trace may start).
    pub parent: Option<SpanContext>,
    /// `tracestate`, passed on unchanged (only with a valid `traceparent`).
    pub state: Option<HeaderValue>,
}

impl Incoming {
    pub fn from_headers(h: &HeaderMap) -> Incoming {
        let mut values = h.get_all(&TRACEPARENT).iter();
        // Two `traceparent` headers: ambiguous, so neither is trusted.
        let parent = match (values.next(), values.next()) {
            (Some(v), None) => SpanContext::parse(v.as_bytes()),
            _ => None,
        };
        let state = parent.and_then(|_| h.get(&TRACESTATE).cloned());
        Incoming { parent, state }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_and_writes_the_specs_example() {
        let c = SpanContext::parse(EXAMPLE.as_bytes()).unwrap();
        assert_eq!(hex::encode(c.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex::encode(c.span_id), "00f067aa0ba902b7");
        assert!(c.sampled());
        assert_eq!(c.header().to_str().unwrap(), EXAMPLE);
    }

    #[test]
    fn refuses_what_the_spec_refuses() {
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(SpanContext::parse(bad.as_bytes()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_first_fields() {
        let v = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-what-comes";
        let c = SpanContext::parse(v.as_bytes()).unwrap();
        assert!(!c.sampled());
    }

    #[test]
    fn two_traceparents_are_ignored_and_tracestate_needs_one() {
        let mut h = HeaderMap::new();
        h.insert(TRACESTATE, HeaderValue::from_static("k=v"));
        assert!(Incoming::from_headers(&h).state.is_none());
        h.append(TRACEPARENT, HeaderValue::from_static(EXAMPLE));
        let one = Incoming::from_headers(&h);
        assert!(one.parent.is_some());
        assert_eq!(one.state.unwrap(), "k=v");
        h.append(TRACEPARENT, HeaderValue::from_static(EXAMPLE));
        assert!(Incoming::from_headers(&h).parent.is_none());
    }
}
