//! Keeping a claim's lease alive while its holder forwards the delivery: the one
//! renewal loop the gate, the queue worker and an operator's replay share, so their
//! timing and their handling of a lost lease cannot drift apart.

use std::future::Future;
use std::time::Duration;

use tokio::time::{Instant, MissedTickBehavior, interval_at};

use super::StoreError;

/// The shortest renewal period, so a tiny lease does not turn into a busy loop.
const MIN_PERIOD: Duration = Duration::from_millis(10);

/// What one renewal reported, for the caller's own log lines and metrics.
#[derive(Debug)]
pub enum LeaseEvent<'a> {
    /// The store no longer holds the claim for this token; no renewal follows.
    Lost,
    /// The renewal failed (store unreachable or slow); the next period tries again.
    Failed(&'a StoreError),
}

/// Runs `work` while renewing its lease with `renew` every third of `lease` (at least
/// every 10 ms), the first renewal one period after the start. A renewal that stalls
/// delays the next one instead of causing a burst of them once it returns; once a
/// renewal reports the lease lost, none is sent again. `on` hears of every loss and
/// failure. Returns `work`'s output as soon as it is ready.
pub async fn renewing<T, R, F>(
    lease: Duration,
    mut renew: R,
    work: impl Future<Output = T>,
    mut on: impl FnMut(LeaseEvent<'_>),
) -> T
where
    R: FnMut() -> F,
    F: Future<Output = Result<bool, StoreError>>,
{
    tokio::pin!(work);
    let period = (lease / 3).max(MIN_PERIOD);
    let mut ticks = interval_at(Instant::now() + period, period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut lost = false;
    loop {
        tokio::select! {
            r = &mut work => return r,
            _ = ticks.tick(), if !lost => match renew().await {
                Ok(true) => {}
                Ok(false) => {
                    lost = true;
                    on(LeaseEvent::Lost);
                }
                Err(e) => on(LeaseEvent::Failed(&e)),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;

    use super::*;

    /// Renews under `lease` while `work_for` passes, each renewal answering with the
    /// next of `answers` (then `Ok(true)`) and taking `stall` (the first one only);
    /// returns when each renewal started (from the start) and the events heard.
    async fn run(
        lease: Duration,
        work_for: Duration,
        answers: Vec<Result<bool, StoreError>>,
        stall: Duration,
    ) -> (Vec<Duration>, Vec<String>) {
        let start = Instant::now();
        let calls = RefCell::new(Vec::new());
        let answers = RefCell::new(answers.into_iter());
        let mut events = Vec::new();
        let out = renewing(
            lease,
            || {
                let first = calls.borrow().is_empty();
                calls.borrow_mut().push(start.elapsed());
                let answer = answers.borrow_mut().next().unwrap_or(Ok(true));
                async move {
                    if first {
                        tokio::time::sleep(stall).await;
                    }
                    answer
                }
            },
            async {
                tokio::time::sleep(work_for).await;
                7
            },
            |e| events.push(format!("{e:?}")),
        )
        .await;
        assert_eq!(out, 7);
        (calls.into_inner(), events)
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[tokio::test(start_paused = true)]
    async fn renews_every_third_of_the_lease_from_one_period_on() {
        let (calls, events) = run(ms(300), ms(950), vec![], Duration::ZERO).await;
        let want: Vec<Duration> = (1..=9).map(|i| ms(100 * i)).collect();
        assert_eq!(calls, want);
        assert!(events.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_tiny_lease_renews_every_ten_milliseconds() {
        let (calls, _) = run(ms(3), ms(35), vec![], Duration::ZERO).await;
        assert_eq!(calls, vec![ms(10), ms(20), ms(30)]);
    }

    #[tokio::test(start_paused = true)]
    async fn stops_renewing_once_the_lease_is_lost() {
        let answers = vec![Ok(true), Ok(false)];
        let (calls, events) = run(ms(300), ms(950), answers, Duration::ZERO).await;
        assert_eq!(calls, vec![ms(100), ms(200)]);
        assert_eq!(events, vec!["Lost"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_renewal_is_reported_and_the_next_period_tries_again() {
        let answers = vec![Err(StoreError::Unavailable("down".into()))];
        let (calls, events) = run(ms(300), ms(350), answers, Duration::ZERO).await;
        assert_eq!(calls, vec![ms(100), ms(200), ms(300)]);
        assert_eq!(events.len(), 1);
        assert!(events[0].starts_with("Failed("), "{events:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_renewal_delays_the_next_instead_of_a_burst() {
        // The first renewal takes 350 ms, three periods: the ticks it missed are not
        // made up for; the renewals go on one period apart from its end.
        let (calls, _) = run(ms(300), ms(700), vec![], ms(350)).await;
        assert_eq!(calls, vec![ms(100), ms(450), ms(550), ms(650)]);
    }
}
