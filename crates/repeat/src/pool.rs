//! The worker pool: a bounded number of workers whose
//! free count the dispatcher reads and waits on.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A bounded set of workers. Clones share the same workers, so the pool can
/// also bound other work of the caller.
#[derive(Debug, Clone)]
pub struct WorkerPool {
    permits: Arc<Semaphore>,
    size: usize,
}

/// One busy worker; it becomes free again when dropped.
#[derive(Debug)]
pub struct Worker {
    _permit: OwnedSemaphorePermit,
}

impl WorkerPool {
    /// A pool of `size` workers (at least one).
    pub fn new(size: usize) -> Self {
        let size = size.max(1);
        Self {
            permits: Arc::new(Semaphore::new(size)),
            size,
        }
    }

    /// The number of workers.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The number of workers free right now.
    pub fn free(&self) -> usize {
        self.permits.available_permits()
    }

    /// Takes a free worker, if there is one.
    pub fn try_acquire(&self) -> Option<Worker> {
        Arc::clone(&self.permits)
            .try_acquire_owned()
            .ok()
            .map(|permit| Worker { _permit: permit })
    }

    /// Waits (without spinning) until a worker is free and takes it.
    pub async fn acquire(&self) -> Worker {
        match Arc::clone(&self.permits).acquire_owned().await {
            Ok(permit) => Worker { _permit: permit },
            // The semaphore is private and never closed.
            Err(_) => unreachable!("the worker pool's semaphore is never closed"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn free_count_follows_workers() {
        let pool = WorkerPool::new(2);
        assert_eq!(pool.free(), 2);
        let a = pool.try_acquire().unwrap();
        let _b = pool.acquire().await;
        assert_eq!(pool.free(), 0);
        assert!(pool.try_acquire().is_none());
        drop(a);
        assert_eq!(pool.free(), 1);
        assert_eq!(WorkerPool::new(0).size(), 1);
    }
}
