//! A deadline on a new connection's first bytes, read through the connection itself:
//! for a TLS stream, whose plaintext a TCP `peek` (src/server.rs's `first_bytes`, on
//! which its admin listener's classification relies) cannot see. The injector uses it
//! after its TLS handshake.
//!
//! hyper's HTTP/1 header timeout starts only once hyper knows the connection is
//! HTTP/1, and hyper-util's HTTP/1-or-2 detection (which reads up to the 24 bytes of
//! the HTTP/2 preface) has no deadline of its own: without this, a connection that
//! never sends a byte, or only part of the preface, would hold its connection slot
//! until the idle limit.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// The first bytes of every HTTP/2 prior-knowledge connection.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A connection whose reads fail with `TimedOut` once `deadline` has passed, until it
/// has sent enough to tell HTTP/1 from HTTP/2 (a byte that is not the HTTP/2
/// preface's, or the whole preface); from then on, a plain connection.
pub struct FirstBytes<IO> {
    io: IO,
    /// Until the first bytes are in; `None` after.
    deadline: Option<Pin<Box<Sleep>>>,
    /// How much of the HTTP/2 preface has come so far.
    preface: usize,
}

impl<IO> FirstBytes<IO> {
    pub fn new(io: IO, deadline: Instant) -> Self {
        FirstBytes {
            io,
            deadline: Some(Box::pin(tokio::time::sleep_until(deadline))),
            preface: 0,
        }
    }

    /// Notes bytes just read; the deadline goes once they tell HTTP/1 from HTTP/2.
    fn saw(&mut self, bytes: &[u8]) {
        let n = bytes.len().min(H2_PREFACE.len() - self.preface);
        if bytes[..n] != H2_PREFACE[self.preface..self.preface + n] {
            self.deadline = None;
            return;
        }
        self.preface += n;
        if self.preface == H2_PREFACE.len() {
            self.deadline = None;
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for FirstBytes<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let before = buf.filled().len();
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.deadline.is_some() && buf.filled().len() > before {
                    this.saw(&buf.filled()[before..]);
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let passed = this
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready());
                if passed {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no request began in time",
                    )));
                }
                Poll::Pending
            }
            ready => ready,
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for FirstBytes<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt, duplex};

    use super::*;

    const WITHIN: Duration = Duration::from_secs(10);

    /// What a read gets after the client wrote `sent` and then nothing for `wait`.
    async fn read_after(sent: &[u8], wait: Duration) -> io::Result<Vec<u8>> {
        let (mut client, server) = duplex(64);
        let mut conn = FirstBytes::new(server, Instant::now() + WITHIN);
        client.write_all(sent).await.unwrap();
        let mut got = vec![0u8; sent.len()];
        conn.read_exact(&mut got).await?;
        tokio::time::sleep(wait).await;
        let mut more = [0u8; 1];
        tokio::time::timeout(Duration::from_secs(60), conn.read(&mut more))
            .await
            .map_err(|_| io::Error::other("no deadline: still waiting"))??;
        Ok(got)
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_or_part_of_the_http2_preface_times_out_at_the_deadline() {
        for sent in [&b""[..], b"PRI * HTTP/2.0\r\n"] {
            let started = Instant::now();
            let err = read_after(sent, Duration::ZERO).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{sent:?}: {err}");
            assert_eq!(started.elapsed(), WITHIN, "{sent:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn once_http1_or_the_whole_preface_came_there_is_no_deadline() {
        for sent in [&b"G"[..], b"PRX", &H2_PREFACE[..]] {
            let err = read_after(sent, WITHIN * 2).await.unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::Other, "{sent:?}: {err}");
        }
    }
}
