//! The per host and type window: a fixed limit, or an AIMD one that shrinks on
//! errors and slow answers and grows back on fast successes.

use std::time::Duration;

use crate::config::Adaptive;

/// The current window of one request type at one host.
#[derive(Debug)]
pub(crate) struct Window {
    current: usize,
    adaptive: Option<Adaptive>,
    /// Fast successes since the last change; a full window of them adds one.
    credit: usize,
}

impl Window {
    pub(crate) fn new(start: usize, adaptive: Option<Adaptive>) -> Self {
        Self {
            current: start,
            adaptive,
            credit: 0,
        }
    }

    /// The current limit on entries in flight.
    pub(crate) fn limit(&self) -> usize {
        self.current
    }

    /// Records how one entry ended: `latency` is `Some` for a success.
    pub(crate) fn record(&mut self, latency: Option<Duration>) {
        let Some(a) = &self.adaptive else { return };
        match latency {
            Some(l) if l <= a.latency_target => {
                self.credit += 1;
                if self.credit >= self.current {
                    self.credit = 0;
                    self.current = (self.current + 1).min(a.max);
                }
            }
            _ => {
                self.credit = 0;
                self.current = (self.current / 2).max(a.min);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aimd(start: usize) -> Window {
        Window::new(
            start,
            Some(Adaptive {
                min: 2,
                max: 6,
                latency_target: Duration::from_millis(100),
            }),
        )
    }

    #[test]
    fn fixed_window_never_moves() {
        let mut w = Window::new(3, None);
        w.record(None);
        w.record(Some(Duration::ZERO));
        assert_eq!(w.limit(), 3);
    }

    #[test]
    fn errors_halve_down_to_min() {
        let mut w = aimd(6);
        w.record(None);
        assert_eq!(w.limit(), 3);
        w.record(Some(Duration::from_secs(1)));
        assert_eq!(w.limit(), 2);
        w.record(None);
        assert_eq!(w.limit(), 2);
    }

    #[test]
    fn a_window_of_fast_successes_adds_one_up_to_max() {
        let mut w = aimd(4);
        for _ in 0..3 {
            w.record(Some(Duration::from_millis(5)));
        }
        assert_eq!(w.limit(), 4);
        w.record(Some(Duration::from_millis(5)));
        assert_eq!(w.limit(), 5);
        for _ in 0..100 {
            w.record(Some(Duration::from_millis(5)));
        }
        assert_eq!(w.limit(), 6);
    }
}
