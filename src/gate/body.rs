//! Reading a delivery's body: all of it, under `max_body` (an announced oversize refused
//! before a byte is read) and within `body_timeout`.

use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body::Body;
use http_body_util::{BodyExt, Limited};

/// `max_body` and `body_timeout` as in force when the delivery started.
#[derive(Clone, Copy)]
pub(super) struct BodyLimits {
    pub(super) max_body: usize,
    pub(super) body_timeout: Duration,
}

/// Reads the body under `max_body` and `body_timeout`, refusing an announced oversize
/// at once.
pub(super) async fn read_body<B>(
    limits: BodyLimits,
    headers: &http::HeaderMap,
    body: B,
) -> Result<Bytes, BodyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    if let Some(len) = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        && len > limits.max_body as u64
    {
        return Err(BodyError::TooLarge);
    }
    let read = Limited::new(body, limits.max_body).collect();
    let Ok(read) = tokio::time::timeout(limits.body_timeout, read).await else {
        return Err(BodyError::Slow);
    };
    match read {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(BodyError::TooLarge)
        }
        Err(_) => Err(BodyError::Broken),
    }
}

/// Why reading a body stopped.
pub(super) enum BodyError {
    TooLarge,
    Broken,
    /// Not all of it arrived within `body_timeout`.
    Slow,
}
