//! The file store's byte layout: length-prefixed fields, so any key or value (an
//! idempotency key with any byte, a binary body) round-trips, and keys of one route
//! sort together.

/// Appends fields to a byte string.
#[derive(Default)]
pub(super) struct Put(pub(super) Vec<u8>);

impl Put {
    pub(super) fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(&(b.len() as u32).to_be_bytes());
        self.0.extend_from_slice(b);
        self
    }

    pub(super) fn u64(mut self, n: u64) -> Self {
        self.0.extend_from_slice(&n.to_be_bytes());
        self
    }

    /// The last field, unprefixed (a key's tail: it needs no length).
    pub(super) fn rest(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
}

/// Reads fields in the order `Put` wrote them; `None` when the bytes end early.
pub(super) struct Take<'a>(pub(super) &'a [u8]);

impl<'a> Take<'a> {
    pub(super) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = u32::from_be_bytes(self.0.get(..4)?.try_into().ok()?) as usize;
        let b = self.0.get(4..4 + n)?;
        self.0 = &self.0[4 + n..];
        Some(b)
    }

    pub(super) fn text(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }

    pub(super) fn u64(&mut self) -> Option<u64> {
        let n = u64::from_be_bytes(self.0.get(..8)?.try_into().ok()?);
        self.0 = &self.0[8..];
        Some(n)
    }

    pub(super) fn rest(self) -> &'a [u8] {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_round_trip_and_short_input_is_none() {
        let b = Put::default().bytes(b"wh\0x").u64(7).rest(b"tail").0;
        let mut t = Take(&b);
        assert_eq!(t.bytes(), Some(&b"wh\0x"[..]));
        assert_eq!(t.u64(), Some(7));
        assert_eq!(t.rest(), b"tail");
        assert_eq!(Take(&b[..3]).bytes(), None);
        assert_eq!(Take(&b[..7]).bytes(), None);
        let mut short = Take(&b[..10]);
        assert!(short.bytes().is_some());
        assert_eq!(short.u64(), None);
    }
}
