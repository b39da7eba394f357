//! [`LoginThrottle`]: failed dashboard logins counted per client address,
//! so that an address that keeps giving wrong admin tokens waits longer
//! and longer between tries.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// Wrong admin tokens a client address may try before it must wait.
pub const FREE_FAILURES: u32 = 3;
/// The wait after the first failure past [`FREE_FAILURES`]; it doubles
/// with each further failure.
pub const FIRST_DELAY: Duration = Duration::from_secs(1);
/// The longest wait between two tries.
pub const MAX_DELAY: Duration = Duration::from_secs(15 * 60);
/// An address with no failure for this long starts afresh.
pub const FORGET_AFTER: Duration = Duration::from_secs(60 * 60);
/// The most addresses remembered; past it, the one whose last failure is
/// oldest is forgotten first.
pub const MAX_ADDRESSES: usize = 10_000;

/// The wait that `failures` wrong tokens in a row impose before the next
/// try: none for the first [`FREE_FAILURES`], then [`FIRST_DELAY`]
/// doubling up to [`MAX_DELAY`].
pub fn delay_after(failures: u32) -> Duration {
    match failures.checked_sub(FREE_FAILURES) {
        None => Duration::ZERO,
        Some(extra) => FIRST_DELAY
            .saturating_mul(2u32.saturating_pow(extra))
            .min(MAX_DELAY),
    }
}

/// Failed dashboard logins by client address (an IPv6 client by its /64,
/// the block one host usually has), for a growing wait between tries.
#[derive(Default)]
pub struct LoginThrottle {
    map: Mutex<HashMap<IpAddr, Failures>>,
}

#[derive(Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

/// The key of a client address: IPv4 as it is (also when mapped into
/// IPv6), IPv6 by its /64 prefix.
fn client_key(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

impl LoginThrottle {
    /// How long `addr` must still wait at `now` before it may try a token
    /// (`None`: it may try now).
    pub fn wait(&self, addr: IpAddr, now: Instant) -> Option<Duration> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        let f = map.get(&client_key(addr))?;
        let until = f.last + delay_after(f.count);
        (until > now).then(|| until - now)
    }

    /// `addr` gave a wrong token at `now`.
    pub fn failed(&self, addr: IpAddr, now: Instant) {
        let key = client_key(addr);
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if !map.contains_key(&key) && map.len() >= MAX_ADDRESSES {
            map.retain(|_, f| now.duration_since(f.last) < FORGET_AFTER);
            if map.len() >= MAX_ADDRESSES
                && let Some(oldest) = map.iter().min_by_key(|(_, f)| f.last).map(|(k, _)| *k)
            {
                map.remove(&oldest);
            }
        }
        let f = map.entry(key).or_insert(Failures {
            count: 0,
            last: now,
        });
        if now.duration_since(f.last) >= FORGET_AFTER {
            f.count = 0;
        }
        f.count = f.count.saturating_add(1);
        f.last = now;
    }

    /// `addr` logged in: it starts afresh.
    pub fn succeeded(&self, addr: IpAddr) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&client_key(addr));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_grows_with_each_failure_up_to_a_bound() {
        let waits: Vec<u64> = (0..8).map(|n| delay_after(n).as_secs()).collect();
        assert_eq!(waits, [0, 0, 0, 1, 2, 4, 8, 16]);
        assert_eq!(delay_after(30), MAX_DELAY);
        assert_eq!(delay_after(u32::MAX), MAX_DELAY);
    }

    #[test]
    fn failures_throttle_their_address_until_the_wait_is_over() {
        let t = LoginThrottle::default();
        let a: IpAddr = "192.0.2.1".parse().unwrap();
        let b: IpAddr = "192.0.2.2".parse().unwrap();
        let t0 = Instant::now();
        for _ in 0..FREE_FAILURES {
            assert_eq!(t.wait(a, t0), None);
            t.failed(a, t0);
        }
        assert_eq!(t.wait(a, t0), Some(FIRST_DELAY));
        assert_eq!(t.wait(b, t0), None, "another address is not affected");
        let t1 = t0 + FIRST_DELAY;
        assert_eq!(t.wait(a, t1), None);
        t.failed(a, t1);
        assert_eq!(t.wait(a, t1), Some(2 * FIRST_DELAY), "the wait doubles");
        t.succeeded(a);
        assert_eq!(t.wait(a, t1), None, "a login starts afresh");

        // The same client over IPv4 mapped into IPv6, and one IPv6 host's /64.
        let mapped: IpAddr = "::ffff:192.0.2.3".parse().unwrap();
        let v6a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let v6b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..FREE_FAILURES {
            t.failed(mapped, t1);
            t.failed(v6a, t1);
        }
        assert!(t.wait("192.0.2.3".parse().unwrap(), t1).is_some());
        assert!(t.wait(v6b, t1).is_some());
        assert_eq!(t.wait("2001:db8:1:3::1".parse().unwrap(), t1), None);

        // Old failures are forgotten.
        let later = t1 + FORGET_AFTER;
        t.failed(v6a, later);
        assert_eq!(t.wait(v6a, later), None);
    }

    #[test]
    fn the_addresses_remembered_are_bounded() {
        let t = LoginThrottle::default();
        let t0 = Instant::now();
        let addr = |i: usize| IpAddr::from((i as u32).to_be_bytes());
        for i in 0..MAX_ADDRESSES + 10 {
            t.failed(addr(i), t0 + Duration::from_millis(i as u64));
        }
        let map = t.map.lock().unwrap();
        assert_eq!(map.len(), MAX_ADDRESSES);
        assert!(!map.contains_key(&addr(0)), "the oldest went first");
        assert!(map.contains_key(&addr(MAX_ADDRESSES + 9)));
    }
}
