//! A content claim's scope: the headers hashed with the body, because one body may
//! legitimately arrive as several events (Shopify's topics, Bitbucket's event keys).
//! They are unsigned: `gate::scopes` bounds how many one signed body may take.

use http::HeaderMap;
use sha2::{Digest, Sha256};

use super::{ClaimKey, Fingerprint, Route};

impl Route {
    /// Whether content claims also cover unsigned scope headers (`gate::scopes`).
    pub fn has_scope(&self) -> bool {
        !self.content_scope.is_empty() && self.claim_key == ClaimKey::Content
    }

    /// The payload fingerprint (the body's SHA-256 for most presets, so a provider's
    /// retry that rewrites delivery fields is the same content), or, with a content
    /// scope, SHA-256 over each scope header's `name:value\n`, a blank line, then the body.
    pub(super) fn content_hash(&self, headers: &HeaderMap, body: &[u8]) -> Fingerprint {
        if self.content_scope.is_empty() {
            return self.fingerprint.fingerprint(body);
        }
        let mut h = Sha256::new();
        for name in self.content_scope {
            h.update(name.as_bytes());
            h.update(b":");
            if let Some(v) = headers.get(*name) {
                h.update(v.as_bytes());
            }
            h.update(b"\n");
        }
        h.update(b"\n");
        h.update(body);
        h.finalize().into()
    }
}
