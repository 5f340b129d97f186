//! The upstream connection's socket, counting the bytes it reads: a request that failed
//! before any byte of its answer arrived may be sent once more (`pool::Resend`), one
//! whose answer had begun never is.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// A `TcpStream` that adds every byte it reads to a counter shared with its `Conn`.
pub(super) struct Counted {
    stream: TcpStream,
    read: Arc<AtomicU64>,
}

impl Counted {
    pub(super) fn new(stream: TcpStream, read: Arc<AtomicU64>) -> Self {
        Counted { stream, read }
    }
}

impl AsyncRead for Counted {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.stream).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            // Read by the caller after the answer (or the error) came through hyper's
            // channel, which orders it after this write.
            this.read.fetch_add(n as u64, Ordering::Relaxed);
        }
        r
    }
}

impl AsyncWrite for Counted {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
