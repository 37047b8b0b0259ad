//! A connection whose client stops reading is closed. A response the client does not
//! read fills the socket's send buffer; the server's write then waits for ever, holding
//! the connection, its buffers and its file descriptor (an event stream a tab left
//! open on a frozen machine, or a client that asks and never reads). Under
//! [`WriteStall`] every write must make progress within the stall time, else it fails
//! and hyper closes the connection. HTTP/2 streams a client does not read are held back
//! by their flow control before they reach the socket, so only a client that reads
//! nothing at all is cut. Used by the HTTP API and by the route proxy's hyper path.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a write to a client may wait for it to read before the connection closes.
pub const WRITE_STALL: Duration = Duration::from_secs(30);

pub struct WriteStall<I> {
    inner: I,
    stall: Duration,
    /// Called once when a write fails for the stall (the caller's metric).
    on_stall: fn(),
    /// Armed while a write waits; fires after `stall` without progress.
    timer: Option<Pin<Box<Sleep>>>,
}

impl<I> WriteStall<I> {
    pub fn new(inner: I, stall: Duration, on_stall: fn()) -> Self {
        WriteStall { inner, stall, on_stall, timer: None }
    }

    /// A write that made progress disarms the timer; one that waits arms it, and fails
    /// once it fired.
    fn poll_progress<T>(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if r.is_ready() {
            self.timer = None;
            return r;
        }
        let stall = self.stall;
        let timer = self.timer.get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + stall)));
        if timer.as_mut().poll(cx).is_ready() {
            (self.on_stall)();
            let e = io::Error::new(io::ErrorKind::TimedOut, "the client read nothing for the stall time");
            return Poll::Ready(Err(e));
        }
        Poll::Pending
    }
}

impl<I: AsyncRead + Unpin> AsyncRead for WriteStall<I> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for WriteStall<I> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.poll_progress(cx, r)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.poll_progress(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let r = Pin::new(&mut self.inner).poll_flush(cx);
        self.poll_progress(cx, r)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // Closing TLS writes its close_notify: a client that reads nothing holds that too.
        let r = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.poll_progress(cx, r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_write_the_reader_never_takes_fails_after_the_stall_time_and_one_it_takes_does_not() {
        let (client, server) = tokio::io::duplex(1024);
        let mut w = WriteStall::new(server, Duration::from_millis(200), || {});
        w.write_all(&[0u8; 1024]).await.unwrap();
        let started = std::time::Instant::now();
        let e = w.write_all(&[0u8; 16]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(started.elapsed() >= Duration::from_millis(200));

        // A reader that keeps reading, however slowly, keeps the writer going.
        let (mut client2, server2) = tokio::io::duplex(64);
        let mut w = WriteStall::new(server2, Duration::from_millis(200), || {});
        let reader = tokio::spawn(async move {
            let mut buf = [0u8; 64];
            let mut total = 0;
            while total < 4096 {
                tokio::time::sleep(Duration::from_millis(20)).await;
                total += tokio::io::AsyncReadExt::read(&mut client2, &mut buf).await.unwrap();
            }
        });
        w.write_all(&[1u8; 4096]).await.unwrap();
        reader.await.unwrap();
        drop(client);
    }
}
