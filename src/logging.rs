//! Log lines written in batches by a background thread.
//!
//! A delivery logs one `info` line. Written with a `write(2)` on the delivery's thread
//! that line cost ≈ a third of the throughput; handed to tracing-appender's worker
//! through a channel it still cost a futex wake-up per line, and the worker spun
//! (`sched_yield` ×4) and parked again after each one (BENCHMARKS.md, "What holds the
//! figures"). Here a line is appended to a shared buffer under a mutex; the writer
//! thread is woken only when the buffer goes from empty to non-empty, then waits
//! [`GATHER`] for more lines and writes them with one `write(2)`. Under load that is one
//! wake-up and one write per [`GATHER`], whatever the rate.
//!
//! Nothing is dropped: past [`HIGH_WATER`] bytes the logging thread writes the batch
//! itself (so a stalled stderr slows deliveries down rather than growing memory), and
//! dropping the [`Guard`] writes what is left before the process exits.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the writer thread gathers lines after the first one of a batch.
pub const GATHER: Duration = Duration::from_millis(10);
/// Buffered bytes past which the logging thread writes the batch itself.
pub const HIGH_WATER: usize = 1024 * 1024;

type Out = Box<dyn Write + Send>;

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// Held while a batch is taken and written, so batches reach `out` in order.
    out: Mutex<Out>,
}

#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    closed: bool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain bytes behind; keep logging.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    /// Takes what is buffered and writes it. Write errors are ignored: there is nowhere
    /// left to report them, and a delivery must not fail because stderr did.
    fn write_batch(&self) {
        let mut out = lock(&self.out);
        let batch = std::mem::take(&mut lock(&self.pending).buf);
        if !batch.is_empty() {
            let _ = out.write_all(&batch);
            let _ = out.flush();
        }
    }
}

/// The `MakeWriter` handed to `tracing_subscriber::fmt`; cheap to clone.
#[derive(Clone)]
pub struct Batched {
    shared: Arc<Shared>,
}

/// Writes what is left and stops the writer thread when dropped.
pub struct Guard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// A batched writer over `out` (stderr in the binary) and the guard that flushes it.
pub fn batched(out: impl Write + Send + 'static) -> (Batched, Guard) {
    let shared = Arc::new(Shared {
        pending: Mutex::new(Pending::default()),
        wake: Condvar::new(),
        out: Mutex::new(Box::new(out)),
    });
    let worker = shared.clone();
    let thread = std::thread::Builder::new()
        .name("idemgate-log".into())
        .spawn(move || run(&worker))
        .expect("spawn the log writer thread");
    (
        Batched {
            shared: shared.clone(),
        },
        Guard {
            shared,
            thread: Some(thread),
        },
    )
}

fn run(shared: &Shared) {
    loop {
        let closed = {
            let mut p = lock(&shared.pending);
            while p.buf.is_empty() && !p.closed {
                p = shared.wake.wait(p).unwrap_or_else(|e| e.into_inner());
            }
            p.closed
        };
        if !closed {
            std::thread::sleep(GATHER);
        }
        shared.write_batch();
        if closed {
            return;
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        lock(&self.shared.pending).closed = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Lines logged after the thread ended (by other threads, at exit).
        self.shared.write_batch();
    }
}

impl Write for Batched {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let (was_empty, len) = {
            let mut p = lock(&self.shared.pending);
            let was_empty = p.buf.is_empty();
            p.buf.extend_from_slice(data);
            (was_empty, p.buf.len())
        };
        if len >= HIGH_WATER {
            self.shared.write_batch();
        } else if was_empty {
            self.shared.wake.notify_one();
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Batched {
    type Writer = Batched;

    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

/// Sets the log filter in force: installed by the binary around its subscriber's
/// filter (`tracing_subscriber::reload`), called at start and by a live reload.
type LevelControl = Box<dyn Fn(&str) -> Result<(), String> + Send + Sync>;

/// The process's level control, once the binary installed one.
static LEVEL: std::sync::OnceLock<LevelControl> = std::sync::OnceLock::new();

/// Installs the control of the process's log filter (once; later calls are ignored).
pub fn install_level_control(control: LevelControl) {
    let _ = LEVEL.set(control);
}

/// Puts `filter` (a `tracing` filter: `info`, `warn,idemgate=debug`) in force for
/// every line logged from now on. Without an installed control (a library user, a
/// test) there is nothing to set: `Ok`.
pub fn set_level(filter: &str) -> Result<(), String> {
    match LEVEL.get() {
        Some(control) => control(filter),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// A `Write` into shared memory, counting the `write` calls that reach it.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<(Vec<u8>, usize)>>);

    impl Write for Sink {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            let mut s = self.0.lock().unwrap();
            s.0.extend_from_slice(data);
            s.1 += 1;
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn every_line_of_every_thread_arrives_whole_and_in_order() {
        let sink = Sink::default();
        let (w, guard) = batched(sink.clone());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let mut w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..20_000 {
                        w.write_all(
                            format!("t{t} line {i:05} {}\n", "x".repeat(i % 97)).as_bytes(),
                        )
                        .unwrap();
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        drop(guard);
        let (bytes, writes) = sink.0.lock().unwrap().clone();
        let text = String::from_utf8(bytes).unwrap();
        let mut next = [0usize; 4];
        for line in text.lines() {
            let (t, rest) = line.split_once(" line ").unwrap();
            let t: usize = t[1..].parse().unwrap();
            let i: usize = rest[..5].parse().unwrap();
            assert_eq!(i, next[t], "thread {t}'s lines out of order or missing");
            assert_eq!(rest.len(), 6 + i % 97, "a line was torn: {line}");
            next[t] += 1;
        }
        assert_eq!(next, [20_000; 4]);
        // 80,000 lines reached the sink in far fewer writes: they were batched.
        assert!(writes < 8_000, "{writes} writes for 80,000 lines");
    }

    #[test]
    fn a_lone_line_is_written_without_waiting_for_more() {
        let sink = Sink::default();
        let (mut w, _guard) = batched(sink.clone());
        w.write_all(b"only line\n").unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while sink.0.lock().unwrap().0.is_empty() {
            assert!(Instant::now() < deadline, "the line never reached the sink");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(sink.0.lock().unwrap().0, b"only line\n");
    }

    #[test]
    fn past_the_high_water_mark_the_caller_writes_and_nothing_is_lost() {
        /// A sink that blocks until released, like a stderr nobody reads.
        #[derive(Clone)]
        struct Stalled(Arc<Mutex<bool>>, Sink);
        impl Write for Stalled {
            fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
                while !*self.0.lock().unwrap() {
                    std::thread::sleep(Duration::from_millis(1));
                }
                self.1.write(data)
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let open = Arc::new(Mutex::new(false));
        let sink = Sink::default();
        let (w, guard) = batched(Stalled(open.clone(), sink.clone()));
        let line = [b'y'; 1023];
        let writer = {
            let mut w = w.clone();
            std::thread::spawn(move || {
                for _ in 0..2 * HIGH_WATER / 1024 {
                    w.write_all(&line).unwrap();
                    w.write_all(b"\n").unwrap();
                }
            })
        };
        std::thread::sleep(Duration::from_millis(100));
        // The writer is held at the mark: the buffer stops growing while out is stuck.
        assert!(lock(&w.shared.pending).buf.len() <= HIGH_WATER + 1024);
        assert!(!writer.is_finished());
        *open.lock().unwrap() = true;
        writer.join().unwrap();
        drop(guard);
        assert_eq!(sink.0.lock().unwrap().0.len(), 2 * HIGH_WATER);
    }
}
