//! [`BodyRoom`]: room for the message bodies held at once, so that many
//! large uploads and prepares under way together cannot take the server's
//! memory past the `bodies_in_flight_mb` setting.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Room for the message bodies held at once: each takes its declared
/// length (the route's limit when it declares none) until its request is
/// answered.
pub struct BodyRoom {
    /// Kibibytes of room.
    room: Arc<Semaphore>,
    /// Its size in KiB: no body takes more than all of it.
    size_kib: u32,
}

impl BodyRoom {
    /// Room for `bytes` of bodies at once.
    pub fn new(bytes: usize) -> BodyRoom {
        let size_kib = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        BodyRoom {
            room: Arc::new(Semaphore::new(size_kib as usize)),
            size_kib,
        }
    }

    /// Room for a body of `bytes`, waiting at most `patience` for it.
    pub async fn take(&self, bytes: usize, patience: Duration) -> Option<OwnedSemaphorePermit> {
        let kib = u32::try_from(bytes.div_ceil(1024))
            .unwrap_or(u32::MAX)
            .min(self.size_kib);
        tokio::time::timeout(patience, self.room.clone().acquire_many_owned(kib))
            .await
            .ok()?
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn bodies_wait_for_room_and_none_takes_more_than_all_of_it() {
        let room = BodyRoom::new(10 * 1024);
        let patience = Duration::from_secs(5);
        let first = room.take(6 * 1024, patience).await.unwrap();
        assert!(room.take(6 * 1024, patience).await.is_none(), "no room");
        drop(first);
        let all = room.take(1 << 30, patience).await.unwrap();
        assert!(room.take(1, patience).await.is_none());
        drop(all);
        assert!(room.take(1, patience).await.is_some());
    }
}
