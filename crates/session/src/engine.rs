//! The engine: its handle, the sharded cache's entry points (which shard
//! a key lives in, expiry and flush of one key), stop, and the builder.
//!
//! How a key is held and passed on is in [`crate::shard`]; the steps of a
//! session's life (load, finalize, save) are in [`crate::lifecycle`].

use crate::acquire::Acquire;
use crate::clock::{Clock, Timestamp};
use crate::config::Config;
use crate::data::State;
use crate::error::Error;
use crate::expiry::{self, message::ExpiryMsg};
use crate::guard::{SessionGuard, complete};
use crate::hooks::Hooks;
use crate::index::{DefaultIndex, ExpiryIndex};
use crate::key::SessionKey;
use crate::lifecycle::{Core, blocking};
use crate::shard::Cache;
use crate::shared::Shared;
use crate::stats::{Counters, Stats};
use crate::storage::{Storage, Write};
use crate::sync::AtomicBool;
use crate::writer::Writer;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use tokio::sync::{Notify, mpsc, oneshot};

/// The session engine: a handle that is cheap to clone.
///
/// Sessions are asked for by key. [`Engine::get`] waits its turn and gives a
/// [`SessionGuard`]; [`Engine::try_get`] answers [`Error::Busy`] at once
/// instead of waiting; [`Engine::submit`] hands a command to the engine,
/// which runs it when the session is free and delivers its result.
pub struct Engine<K: SessionKey, S: State> {
    pub(crate) shared: Arc<Shared<K, S>>,
}

impl<K: SessionKey, S: State> Clone for Engine<K, S> {
    fn clone(&self) -> Self {
        Engine {
            shared: self.shared.clone(),
        }
    }
}

impl<K: SessionKey, S: State> Engine<K, S> {
    /// Start configuring an engine over `storage`.
    pub fn builder(storage: Arc<dyn Storage>) -> Builder<K, S, DefaultIndex<K>> {
        Builder {
            storage,
            clock: Arc::new(crate::clock::SystemClock),
            hooks: Arc::new(()),
            config: Config::default(),
            index: DefaultIndex::default(),
        }
    }

    /// Exclusive access to the session of `key`, waiting in its queue while
    /// another command holds it. `Ok(None)`: the session exists nowhere and
    /// `create` is false (nothing is queued then). With a shared storage,
    /// an error also when the session's deadline had passed and its
    /// finalization's save failed: the command may not go on from a
    /// session that is not the stored one. A save that was made but let
    /// the key go to another engine is not an error: the command holds the
    /// key again and goes on from the record as stored then (it fails only
    /// if that happens eight times in a row).
    pub fn get(&self, key: K, create: bool) -> Acquire<'_, K, S> {
        Acquire::new(&self.shared, key, true, create)
    }

    /// Like [`Engine::get`], but answers [`Error::Busy`] at once when
    /// another command holds the session.
    pub fn try_get(&self, key: K, create: bool) -> Acquire<'_, K, S> {
        Acquire::new(&self.shared, key, false, create)
    }

    /// Hand a command to the engine. Its place in the session's queue is
    /// taken now; the engine runs it on its own task when the session is
    /// free (even if the returned handle is dropped) and delivers its result
    /// through the handle. `Ok(None)`: no session and `create` is false.
    pub fn submit<F, Fut, R>(&self, key: K, create: bool, command: F) -> Submitted<R>
    where
        F: FnOnce(SessionGuard<K, S>) -> Fut + Send + 'static,
        Fut: Future<Output = R> + Send + 'static,
        R: Send + 'static,
    {
        let entered = self.shared.enter(key, true);
        let (tx, rx) = oneshot::channel();
        self.shared.core().runtime.spawn(async move {
            let result = match entered {
                Err(e) => Err(e),
                Ok(entered) => match complete(entered, create).await {
                    Ok(Some(guard)) => Ok(Some(command(guard).await)),
                    Ok(None) => Ok(None),
                    Err(e) => Err(e),
                },
            };
            let _ = tx.send(result);
        });
        Submitted { rx }
    }

    /// The engine's figures now.
    pub fn stats(&self) -> Stats {
        self.shared.core().counters.snapshot(
            self.shared.cache.len() as u64,
            self.shared.cache.queued() as u64,
        )
    }

    /// The clock the engine runs on.
    pub fn now(&self) -> Timestamp {
        self.shared.core().now()
    }

    /// The write that stores a session of `state` under `key`, expiring at
    /// `expires_at`, as this engine stores a new session: for a caller that
    /// writes it beside another key's step
    /// ([`Step::put_beside`](crate::storage::Step::put_beside)), which a
    /// shared storage makes as fenced as that step's own save. The engine
    /// reads it back as any stored record.
    pub fn record(
        &self,
        key: &K,
        state: S,
        expires_at: Option<Timestamp>,
    ) -> Result<crate::storage::Write, Error> {
        let core = self.shared.core();
        let mut s = core.fresh();
        s.state = state;
        s.expires_at = expires_at;
        core.put(key, &s)
    }

    /// Stop: new requests and queued commands get [`Error::Stopping`],
    /// running commands finish, then every dirty session is saved in one
    /// durable batch. An error means some sessions could not be saved, or
    /// ([`Error::StopTimedOut`]) commands still held sessions after
    /// [`Config::stop_wait`]: then nothing was saved, and `stop` can be
    /// called again.
    pub async fn stop(&self) -> Result<(), Error> {
        let cache = &self.shared.cache;
        let core = &cache.core;
        let waited = core.config.stop_wait;
        let deadline = tokio::time::Instant::now() + waited;
        core.stopping.store(true, Ordering::SeqCst);
        cache.watch_releases();
        cache.fail_waiters();
        loop {
            let notified = core.released.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if cache.locked() == 0 {
                break;
            }
            if crate::sync::before(deadline, notified).await.is_none() {
                let held = cache.locked();
                if held > 0 {
                    return Err(Error::StopTimedOut { held, waited });
                }
            }
        }
        let mut writes = Vec::new();
        // With a shared storage every save went through its step; a session
        // left dirty (its save failed) is not the stored truth to write now.
        while !core.shared && !cache.dirty_writes(&mut writes)? {
            crate::sync::yield_now().await;
        }
        let _ = core.expiry_tx.send(ExpiryMsg::Stop);
        if writes.is_empty() {
            return Ok(());
        }
        let storage = core.storage.clone();
        let batch: Vec<Write> = writes.iter().map(|(_, w)| w.clone()).collect();
        let n = batch.len() as u64;
        blocking(move || storage.write(&batch))
            .await
            .inspect_err(|_| {
                Counters::add(&core.counters.storage_errors, 1);
            })?;
        Counters::add(&core.counters.saves, n);
        Counters::add(&core.counters.save_batches, 1);
        for (key, _) in writes {
            cache.mark_saved(&key);
        }
        Ok(())
    }
}

/// The result of [`Engine::submit`]: resolves to the command's output.
pub struct Submitted<R> {
    rx: oneshot::Receiver<Result<Option<R>, Error>>,
}

impl<R> Future for Submitted<R> {
    type Output = Result<Option<R>, Error>;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.rx)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(Error::Lost)))
    }
}

/// Configures and opens an [`Engine`].
pub struct Builder<K: SessionKey, S: State, I> {
    storage: Arc<dyn Storage>,
    clock: Arc<dyn Clock>,
    hooks: Arc<dyn Hooks<K, S>>,
    config: Config,
    index: I,
}

impl<K: SessionKey, S: State, I: ExpiryIndex<K>> Builder<K, S, I> {
    /// The clock (default: the system's wall clock).
    pub fn clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The application's hooks (default: none; expired sessions end).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks<K, S>>) -> Self {
        self.hooks = hooks;
        self
    }

    /// Limits and batching (default: [`Config::default`]).
    pub fn config(mut self, config: Config) -> Self {
        self.config = config;
        self
    }

    /// The expiry index (default: [`DefaultIndex`]).
    pub fn index<J: ExpiryIndex<K>>(self, index: J) -> Builder<K, S, J> {
        Builder {
            storage: self.storage,
            clock: self.clock,
            hooks: self.hooks,
            config: self.config,
            index,
        }
    }

    /// Open the engine: rebuild the expiry index from storage and start the
    /// expiry manager on the current tokio runtime.
    pub async fn open(self) -> Result<Engine<K, S>, Error> {
        Ok(self.load().await?.start())
    }

    /// Rebuild the expiry index from storage, and start nothing yet:
    /// [`Loaded::start`] does not wait, so the engine can be made inside a
    /// synchronous constructor (`Arc::new_cyclic`, for hooks that refer to
    /// what owns the engine).
    pub async fn load(mut self) -> Result<Loaded<K, S, I>, Error> {
        // A shared storage's deadlines are read from it as they come due
        // (`Shared::due`): nothing to load, whatever the store holds.
        let storage = self.storage.clone();
        let deadlines = match storage.shared() {
            Some(_) => Vec::new(),
            None => blocking(move || storage.deadlines()).await?,
        };
        for (kb, t) in deadlines {
            match K::from_bytes(&kb) {
                Some(k) => self.index.touch(&k, Some(t), None),
                None => tracing::warn!(key = ?kb, "stored session key does not decode; ignored"),
            }
        }
        Ok(Loaded { builder: self })
    }

    /// The engine and what its background tasks would run on, with
    /// nothing running yet.
    pub(crate) fn assemble(self, runtime: tokio::runtime::Handle) -> Parts<K, S, I> {
        let (expiry_tx, expiry_rx) = mpsc::unbounded_channel();
        let counters = Arc::new(Counters::default());
        let writer = Arc::new(Writer::new(
            Arc::clone(&self.storage),
            Arc::clone(&counters),
            self.config.max_batch,
        ));
        let core = Core {
            hasher: foldhash::fast::RandomState::default(),
            generation: self.storage.generation(),
            shared: self.storage.shared().is_some(),
            storage: self.storage,
            clock: self.clock,
            hooks: self.hooks,
            config: self.config,
            stopping: AtomicBool::new(false),
            released: Notify::new(),
            wake_expiry: Arc::new(Notify::new()),
            next_wake: AtomicU64::new(0),
            expiry_tx,
            writer,
            counters,
            runtime,
        };
        let cache = Arc::new(Cache::new(core));
        Parts {
            engine: Engine {
                shared: Arc::new(Shared { cache }),
            },
            index: self.index,
            expiry_rx,
        }
    }
}

/// A builder whose expiry index is read from storage ([`Builder::load`]).
pub struct Loaded<K: SessionKey, S: State, I> {
    builder: Builder<K, S, I>,
}

impl<K: SessionKey, S: State, I: ExpiryIndex<K>> Loaded<K, S, I> {
    /// The application's hooks (default: none; expired sessions end).
    pub fn hooks(mut self, hooks: Arc<dyn Hooks<K, S>>) -> Self {
        self.builder.hooks = hooks;
        self
    }

    /// Start the expiry manager on the current tokio runtime (call it
    /// inside one), whose blocking threads also commit the saves.
    pub fn start(self) -> Engine<K, S> {
        let runtime = tokio::runtime::Handle::current();
        let parts = self.builder.assemble(runtime.clone());
        runtime.spawn(expiry::run(
            Arc::downgrade(&parts.engine.shared),
            parts.index,
            parts.expiry_rx,
        ));
        parts.engine
    }
}

/// An engine not started yet: the expiry manager's inputs are still
/// here.
pub(crate) struct Parts<K: SessionKey, S: State, I> {
    pub(crate) engine: Engine<K, S>,
    pub(crate) index: I,
    pub(crate) expiry_rx: mpsc::UnboundedReceiver<ExpiryMsg<K>>,
}
